//! The network of a stdio MCP server granted hosts: an HTTPS proxy on the
//! agent's loopback (`HTTPS_PROXY` in that server's environment only) whose
//! every `CONNECT` becomes a tunnel through choird, which checks the
//! server's grant and the agent's egress policy itself ([`McpHost::tunnel`]).
//! The container has no network of its own; this is its only way out.
//!
//! **Invariants:** only `CONNECT` is served (TLS stays end to end; plain
//! HTTP is refused, so nothing readable crosses in clear); a client must
//! present the server's proxy credential (a random token in the server's
//! environment); at most [`MAX_CONNECTIONS`] tunnels at once per server; a
//! request head is read to [`MAX_HEAD`] bytes within [`HEAD_WAIT`]. The
//! credential keeps other local users out under the process runtime; inside
//! the container it does not stop the agent's own shell (same user), which
//! is why choird, not this proxy, decides.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use choir_common::splice::{splice, Limits};

use super::host::McpHost;

/// Tunnels a server holds at once.
pub const MAX_CONNECTIONS: usize = 8;
/// Largest `CONNECT` head read.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its head.
const HEAD_WAIT: Duration = Duration::from_secs(10);
/// How long choird may take to open a tunnel.
const OPEN_WAIT: Duration = Duration::from_secs(20);

/// A running proxy for one server.
pub struct Proxy {
    port: u16,
    token: String,
    stop: Arc<AtomicBool>,
}

struct State {
    server: String,
    host: Arc<dyn McpHost>,
    expected: String,
    active: AtomicUsize,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts a proxy for `server` on an ephemeral loopback port.
    pub fn start(server: &str, host: Arc<dyn McpHost>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let token = hex::encode(raw);
        let expected = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("choir:{token}")));
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State {
            server: server.to_owned(),
            host,
            expected,
            active: AtomicUsize::new(0),
            stop: stop.clone(),
        });
        std::thread::Builder::new().name("mcp-proxy".into()).spawn(move || accept_loop(&listener, &state))?;
        Ok(Proxy { port, token, stop })
    }

    /// The proxy URL the server is given (`HTTPS_PROXY`), its credential in it.
    pub fn url(&self) -> String {
        format!("http://choir:{}@127.0.0.1:{}", self.token, self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>) {
    for conn in listener.incoming() {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        if state.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            state.active.fetch_sub(1, Ordering::SeqCst);
            reply(&mut conn, "503 Service Unavailable", &format!("at most {MAX_CONNECTIONS} tunnels at once"));
            continue;
        }
        let st = state.clone();
        let spawned = std::thread::Builder::new().name("mcp-tunnel".into()).spawn(move || {
            serve(&st, conn);
            st.active.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            state.active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn reply(conn: &mut TcpStream, status: &str, why: &str) {
    let body = format!("{why}\n");
    let _ = conn.write_all(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}

/// The head (up to its blank line) and the bytes after it; `None` when the
/// client sent none in time, or too much.
fn read_head(conn: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    conn.set_read_timeout(Some(HEAD_WAIT)).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = got.split_off(i + 4);
            return Some((String::from_utf8_lossy(&got).into_owned(), rest));
        }
        if got.len() > MAX_HEAD {
            return None;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// `host:port` of a `CONNECT` target (`[v6]:port` kept bracketless).
fn target(authority: &str) -> Option<(String, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    (!host.is_empty() && host.len() <= 253).then(|| (host.to_owned(), port))
}

fn serve(state: &State, mut conn: TcpStream) {
    let Some((head, early)) = read_head(&mut conn) else {
        reply(&mut conn, "400 Bad Request", "no request head in time");
        return;
    };
    let mut lines = head.lines();
    let first: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    let authorized = lines.any(|l| {
        l.split_once(':')
            .is_some_and(|(k, v)| k.eq_ignore_ascii_case("proxy-authorization") && v.trim() == state.expected)
    });
    if !authorized {
        reply(&mut conn, "407 Proxy Authentication Required", "this proxy is for one MCP server, with its credential");
        return;
    }
    let Some((host, port)) =
        (first.first() == Some(&"CONNECT")).then(|| first.get(1).and_then(|a| target(a))).flatten()
    else {
        reply(&mut conn, "405 Method Not Allowed", "only CONNECT (https) goes through Choir's proxy");
        return;
    };
    let (site, from_site) = match state.host.tunnel(&state.server, &host, port, OPEN_WAIT) {
        Ok(t) => t,
        Err(why) => {
            log::warn!("MCP server {}: tunnel to {host}:{port} refused: {why}", state.server);
            reply(&mut conn, "403 Forbidden", &why);
            return;
        }
    };
    if conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err()
        || (!from_site.is_empty() && conn.write_all(&from_site).is_err())
    {
        return;
    }
    let mut site = site;
    if !early.is_empty() && site.write_all(&early).is_err() {
        return;
    }
    let _ = conn.set_read_timeout(None);
    // choird bounds the tunnel too; this side only needs to end with it.
    let limits = Limits { idle: Duration::from_secs(120), max_bytes: u64::MAX };
    let _ = splice(Box::new(conn), site, limits);
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use serde_json::Value;

    /// A host whose tunnels go straight to `site` (or are refused).
    struct Direct {
        site: Option<std::net::SocketAddr>,
        asked: Mutex<Vec<(String, String, u16)>>,
    }

    impl McpHost for Direct {
        fn file(&self, _: Value, _: String) -> Result<(), String> {
            Ok(())
        }
        fn tunnel(
            &self,
            server: &str,
            host: &str,
            port: u16,
            _: Duration,
        ) -> Result<(Box<dyn choir_common::splice::Duplex>, Vec<u8>), String> {
            self.asked.lock().push((server.into(), host.into(), port));
            match self.site {
                Some(a) => Ok((Box::new(TcpStream::connect(a).map_err(|e| e.to_string())?), Vec::new())),
                None => Err("MCP server s is not granted that host".into()),
            }
        }
    }

    fn site() -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut b = [0u8; 5];
                if s.read_exact(&mut b).is_ok() {
                    let _ = s.write_all(b"pong:");
                    let _ = s.write_all(&b);
                }
            }
        });
        a
    }

    fn ask(proxy: &Proxy, head: &str) -> String {
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    fn auth(proxy: &Proxy) -> String {
        format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(format!("choir:{}", proxy.token))
        )
    }

    #[test]
    fn a_connect_with_the_credential_is_tunnelled_to_the_site() {
        let host = Arc::new(Direct { site: Some(site()), asked: Mutex::default() });
        let proxy = Proxy::start("s", host.clone()).unwrap();
        let out = ask(&proxy, &format!("CONNECT example.org:443 HTTP/1.1\r\n{}\r\nhello", auth(&proxy)));
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with("pong:hello"), "{out}");
        assert_eq!(host.asked.lock().as_slice(), [("s".to_owned(), "example.org".to_owned(), 443)]);
    }

    #[test]
    fn no_credential_plain_http_and_a_refused_host_get_clear_answers_and_no_tunnel() {
        let host = Arc::new(Direct { site: None, asked: Mutex::default() });
        let proxy = Proxy::start("s", host.clone()).unwrap();
        let out = ask(&proxy, "CONNECT example.org:443 HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 407"), "{out}");
        let wrong = "Proxy-Authorization: Basic Y2hvaXI6d3Jvbmc=\r\n";
        let out = ask(&proxy, &format!("CONNECT example.org:443 HTTP/1.1\r\n{wrong}\r\n"));
        assert!(out.starts_with("HTTP/1.1 407"), "{out}");
        let out = ask(&proxy, &format!("GET http://example.org/ HTTP/1.1\r\n{}\r\n", auth(&proxy)));
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        assert!(host.asked.lock().is_empty(), "nothing reached choird before the checks passed");
        // Negative control: with the credential, choird is asked, and its refusal is passed on.
        let out = ask(&proxy, &format!("CONNECT example.org:443 HTTP/1.1\r\n{}\r\n", auth(&proxy)));
        assert!(out.starts_with("HTTP/1.1 403") && out.contains("not granted"), "{out}");
        assert_eq!(host.asked.lock().len(), 1);
    }
}
