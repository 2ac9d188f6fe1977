//! The admin client: JSON over HTTP on choird's Unix socket, with errors worded
//! for an operator (what failed, and what to do about it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use choir_common::rpc::ErrorBody;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A connection to choird's admin socket.
pub struct Client {
    agent: ureq::Agent,
    socket: PathBuf,
    home: PathBuf,
}

impl Client {
    /// A client for the choird serving `home`.
    pub fn new(home: &Path) -> Client {
        let socket = home.join("socks").join("choird.sock");
        Client {
            agent: choir_common::unix_http::agent_for_socket(&socket, Some(Duration::from_secs(3700))),
            socket,
            home: home.to_owned(),
        }
    }

    /// The home this client's choird serves.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// GET `path` (under `/admin/v1/`).
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let resp = self.agent.get(&format!("http://localhost/admin/v1/{path}")).call();
        self.finish(resp)
    }

    /// PUT `body` to `path`.
    pub fn put<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        let resp = self.agent.put(&format!("http://localhost/admin/v1/{path}")).send_json(body);
        self.finish(resp)
    }

    /// DELETE `path`.
    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let resp = self.agent.delete(&format!("http://localhost/admin/v1/{path}")).call();
        self.finish(resp)
    }

    /// POST `body` to `path`.
    pub fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        let resp = self.agent.post(&format!("http://localhost/admin/v1/{path}")).send_json(body);
        self.finish(resp)
    }

    /// POST to `path` and print the streamed plain-text reply line by line; the
    /// last line is `OK …` or `ERROR …`, which decides the outcome.
    pub fn post_streaming(&self, path: &str, mut on_line: impl FnMut(&str)) -> anyhow::Result<String> {
        use std::io::BufRead;
        let resp = self.agent.post(&format!("http://localhost/admin/v1/{path}")).send_empty();
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        if resp.status().as_u16() != 200 {
            return Err(refusal(&mut resp));
        }
        let reader = std::io::BufReader::new(streamed(resp));
        let mut last = String::new();
        for line in reader.lines() {
            let line = line?;
            if let Some(err) = line.strip_prefix("ERROR ") {
                anyhow::bail!("{err}");
            }
            if let Some(ok) = line.strip_prefix("OK ") {
                last = ok.to_owned();
                continue;
            }
            on_line(&line);
        }
        Ok(last)
    }

    /// POST `body` and hand each line of the streamed JSON-lines reply to `on_line`.
    pub fn post_ndjson<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        mut on_line: impl FnMut(serde_json::Value),
    ) -> anyhow::Result<()> {
        use std::io::BufRead;
        let resp = self.agent.post(&format!("http://localhost/admin/v1/{path}")).send_json(body);
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        if resp.status().as_u16() != 200 {
            return Err(refusal(&mut resp));
        }
        for line in std::io::BufReader::new(streamed(resp)).lines() {
            on_line(serde_json::from_str(&line?)?);
        }
        Ok(())
    }

    /// GET `path` and hand each line of the streamed reply to `on_line`
    /// (no time limit: a follower runs until stopped).
    pub fn get_lines(&self, path: &str, mut on_line: impl FnMut(&str) -> anyhow::Result<()>) -> anyhow::Result<()> {
        use std::io::BufRead;
        let url = format!("http://localhost/admin/v1/{path}");
        let resp = self.agent.get(&url).config().timeout_global(None).build().call();
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        if resp.status().as_u16() != 200 {
            return Err(refusal(&mut resp));
        }
        for line in std::io::BufReader::new(streamed(resp)).lines() {
            on_line(&line?)?;
        }
        Ok(())
    }

    /// GET `path` and copy the streamed reply to `out` as it comes.
    pub fn get_to(&self, path: &str, out: &mut dyn std::io::Write) -> anyhow::Result<u64> {
        let resp = self.agent.get(&format!("http://localhost/admin/v1/{path}")).call();
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        if resp.status().as_u16() != 200 {
            return Err(refusal(&mut resp));
        }
        Ok(std::io::copy(&mut streamed(resp), out)?)
    }

    /// POST `body` to `path` and copy the streamed reply to `out`; returns
    /// the bytes copied and the reply's `header`.
    pub fn post_to<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        header: &str,
        out: &mut dyn std::io::Write,
    ) -> anyhow::Result<(u64, Option<String>)> {
        let resp = self.agent.post(&format!("http://localhost/admin/v1/{path}")).send_json(body);
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        if resp.status().as_u16() != 200 {
            return Err(refusal(&mut resp));
        }
        let value = resp.headers().get(header).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok((std::io::copy(&mut streamed(resp), out)?, value))
    }

    fn finish<T: DeserializeOwned>(
        &self,
        resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<T> {
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let body = resp.body_mut().with_config().limit(256 * 1024 * 1024).read_to_vec()?;
        if status != 200 {
            return Err(refusal_of(status, &body));
        }
        Ok(serde_json::from_slice(&body)?)
    }

    fn transport_error(&self, e: ureq::Error) -> anyhow::Error {
        let not_running = match &e {
            ureq::Error::Io(io) => {
                matches!(io.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused)
            }
            _ => false,
        };
        if not_running {
            anyhow::Error::new(NotListening { socket: self.socket.clone(), home: self.home.clone() })
        } else if matches!(&e, ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::PermissionDenied) {
            anyhow::anyhow!(
                "permission denied on {}: run choirctl as the user that runs choird (sudo -u choir), as root, or as a \
                 member of the group config.json admin_group names",
                self.socket.display()
            )
        } else {
            anyhow::anyhow!("cannot talk to choird on {}: {e}", self.socket.display())
        }
    }
}

/// Nothing answers on the admin socket: choird is down, or (its instance
/// lock held by a live choird) still starting or stopping. Callers that can
/// do their work from the files (`logs`) look for this error.
#[derive(Debug)]
pub struct NotListening {
    socket: PathBuf,
    home: PathBuf,
}

impl std::fmt::Display for NotListening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match lock_holder(&self.home) {
            Some((pid, since)) => write!(
                f,
                "choird is starting or stopping (pid {pid}, since {since}): its admin socket {} answers once the \
                 database is ready; try again in a moment (`choirctl logs` reads its log meanwhile)",
                self.socket.display()
            ),
            None => write!(
                f,
                "choird is not running (nothing listens on {}); start it with `choird --home {}` or `systemctl start \
                 choird`",
                self.socket.display(),
                self.home.display()
            ),
        }
    }
}

impl std::error::Error for NotListening {}

/// The live choird holding the home's instance lock, and since when (the
/// lock file is written when taken), without taking the lock (a lock taken
/// here, even shared and for an instant, could make a starting choird think
/// another runs).
fn lock_holder(home: &Path) -> Option<(u32, String)> {
    let lock = home.join("choird.lock");
    let pid: u32 = std::fs::read_to_string(&lock).ok()?.trim().parse().ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    if comm.trim() != "choird" {
        return None;
    }
    let taken = std::fs::metadata(&lock).ok()?.modified().ok()?;
    let ts = jiff::Timestamp::try_from(taken).ok()?;
    Some((pid, crate::term::when(ts)))
}

/// The body of a streamed answer. choird ends a stream it could not finish
/// without its last chunk, so a cut answer is a read error, never a short
/// whole one; this says so in the operator's words instead of the HTTP
/// library's.
fn streamed(resp: ureq::http::Response<ureq::Body>) -> impl std::io::Read {
    Streamed(resp.into_body().into_reader())
}

struct Streamed<R>(R);

impl<R: std::io::Read> std::io::Read for Streamed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                // choirctl's own time limit, not choird cutting the answer.
                return e;
            }
            std::io::Error::new(
                e.kind(),
                format!(
                    "choird's answer broke off before its end ({e}): what arrived is incomplete; choird's log says why"
                ),
            )
        })
    }
}

/// choird's refusal as an error: its message, or the status and body.
fn refusal(resp: &mut ureq::http::Response<ureq::Body>) -> anyhow::Error {
    let status = resp.status().as_u16();
    match resp.body_mut().with_config().limit(1024 * 1024).read_to_vec() {
        Ok(body) => refusal_of(status, &body),
        Err(e) => anyhow::anyhow!("choird answered {status}, and its answer could not be read: {e}"),
    }
}

fn refusal_of(status: u16, body: &[u8]) -> anyhow::Error {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => anyhow::anyhow!("{}", e.error.message),
        Err(_) => anyhow::anyhow!("choird answered {status}: {}", String::from_utf8_lossy(body)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};

    /// A choird stand-in on `home`'s socket that answers one request with
    /// `head` and the chunks `body`, then hangs up without the last chunk.
    fn cut_after(home: &Path, body: &'static str) -> std::thread::JoinHandle<()> {
        std::fs::create_dir_all(home.join("socks")).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(home.join("socks").join("choird.sock")).unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
                line.clear();
            }
            write!(conn, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n", body.len())
                .unwrap();
        })
    }

    #[test]
    fn a_stream_choird_cut_is_an_error_that_says_so() {
        let dir = std::env::temp_dir().join(format!("choirctl-cut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let server = cut_after(&dir.join("a"), "part of a backup");
        let mut out = Vec::new();
        let err = Client::new(&dir.join("a")).get_to("backup", &mut out).unwrap_err().to_string();
        server.join().unwrap();
        assert!(err.starts_with("choird's answer broke off before its end"), "{err}");
        assert_eq!(out, b"part of a backup", "what arrived is still handed on");

        let server = cut_after(&dir.join("b"), "step one\n");
        let mut lines = Vec::new();
        let err =
            Client::new(&dir.join("b")).post_streaming("build", |l| lines.push(l.to_owned())).unwrap_err().to_string();
        server.join().unwrap();
        assert!(err.starts_with("choird's answer broke off before its end"), "{err}");
        assert_eq!(lines, ["step one"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
