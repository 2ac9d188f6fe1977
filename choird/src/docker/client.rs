//! A synchronous Docker Engine API client over the engine's Unix socket
//! (R-LIFE-1), pinned to API version [`API_VERSION`] (Docker 20.10, Debian 12's
//! `docker.io`). choird never runs the `docker` CLI; every engine call of the
//! project goes through this type.
//!
//! Engine failures become [`EngineError`]s worded for an operator: a missing
//! socket, a permission problem, a missing image and a name conflict each say
//! what to do.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use choir_common::unix_http::query_value;
use serde_json::{json, Value};

/// The Engine API version every request names.
pub const API_VERSION: &str = "v1.41";

/// An engine call failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The socket does not exist: no engine, or a wrong path. Retryable once the engine runs.
    #[error(
        "no Docker engine at {0}: install and start it (apt install docker.io), or set docker.socket in config.json"
    )]
    NoSocket(PathBuf),
    /// The socket exists but we may not use it. Not retryable.
    #[error("permission denied on the Docker socket {0}: run choird as a user in the docker group (make install adds the choir user)")]
    Permission(PathBuf),
    /// An image is missing. Not retryable.
    #[error("image {0} does not exist: {1}")]
    NoImage(String, String),
    /// A container or other object is missing. Not retryable.
    #[error("{0}")]
    NotFound(String),
    /// A name is taken. Not retryable.
    #[error("{0}")]
    Conflict(String),
    /// The engine refused or failed a request.
    #[error("Docker engine error ({status}) on {what}: {message}")]
    Api {
        /// What we asked.
        what: String,
        /// HTTP status.
        status: u16,
        /// The engine's message.
        message: String,
    },
    /// The connection broke. Retryable.
    #[error("lost the connection to the Docker engine ({what}): {reason}")]
    Transport {
        /// What we asked.
        what: String,
        /// Why.
        reason: String,
    },
    /// An image build failed; the message is the build's own error.
    #[error("image build failed: {0}")]
    Build(String),
}

/// The engine client.
#[derive(Clone)]
pub struct Engine {
    socket: PathBuf,
    agent: ureq::Agent,
}

impl Engine {
    /// A client for the engine listening on `socket`.
    pub fn new(socket: &Path) -> Engine {
        Engine { socket: socket.to_owned(), agent: choir_common::unix_http::agent_for_socket(socket, None) }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn url(&self, path: &str) -> String {
        format!("http://localhost/{API_VERSION}{path}")
    }

    fn transport(&self, what: &str, e: ureq::Error) -> EngineError {
        if let ureq::Error::Io(io) = &e {
            match io.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    return EngineError::NoSocket(self.socket.clone())
                }
                std::io::ErrorKind::PermissionDenied => return EngineError::Permission(self.socket.clone()),
                _ => {}
            }
        }
        EngineError::Transport { what: what.to_owned(), reason: e.to_string() }
    }

    /// Sends a request and returns (status, body) for anything the engine answered.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Option<Duration>,
    ) -> Result<(u16, Value), EngineError> {
        let what = format!("{method} {path}");
        let url = self.url(path);
        let result = match (method, body) {
            ("GET", _) => self.agent.get(&url).config().timeout_global(timeout).build().call(),
            ("DELETE", _) => self.agent.delete(&url).config().timeout_global(timeout).build().call(),
            (_, Some(b)) => self.agent.post(&url).config().timeout_global(timeout).build().send_json(b),
            (_, None) => self.agent.post(&url).config().timeout_global(timeout).build().send_empty(),
        };
        let mut resp = result.map_err(|e| self.transport(&what, e))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| self.transport(&what, e))?;
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, value))
    }

    fn check(&self, what: &str, status: u16, body: &Value) -> Result<(), EngineError> {
        if (200..300).contains(&status) || status == 304 {
            return Ok(());
        }
        let message =
            body.get("message").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| body.to_string());
        Err(match status {
            404 if message.contains("No such image") => {
                EngineError::NoImage(message.trim_start_matches("No such image: ").to_owned(), "build it first".into())
            }
            404 => EngineError::NotFound(message),
            409 => EngineError::Conflict(message),
            _ => EngineError::Api { what: what.to_owned(), status, message },
        })
    }

    /// `GET /_ping`: the engine is reachable.
    pub fn ping(&self) -> Result<(), EngineError> {
        let (status, body) = self.call("GET", "/_ping", None, Some(Duration::from_secs(10)))?;
        self.check("ping", status, &body)
    }

    /// `GET /version`: the engine's version and the API versions it speaks.
    pub fn version(&self) -> Result<Value, EngineError> {
        let (status, body) = self.call("GET", "/version", None, Some(Duration::from_secs(10)))?;
        self.check("version", status, &body)?;
        Ok(body)
    }

    /// `GET /info`: the engine's configuration.
    pub fn info(&self) -> Result<Value, EngineError> {
        let (status, body) = self.call("GET", "/info", None, Some(Duration::from_secs(10)))?;
        self.check("info", status, &body)?;
        Ok(body)
    }

    /// Image metadata, or `None` when there is no such image.
    pub fn image(&self, name: &str) -> Result<Option<Value>, EngineError> {
        let (status, body) = self.call("GET", &format!("/images/{name}/json"), None, Some(Duration::from_secs(30)))?;
        if status == 404 {
            return Ok(None);
        }
        self.check("inspect image", status, &body)?;
        Ok(Some(body))
    }

    /// Removes an image (and its untagged parents).
    pub fn remove_image(&self, name: &str) -> Result<(), EngineError> {
        let (status, body) =
            self.call("DELETE", &format!("/images/{name}?force=1"), None, Some(Duration::from_secs(60)))?;
        if status == 404 {
            return Ok(());
        }
        self.check("remove image", status, &body)
    }

    /// Image names with `repo` as their repository (`repo:*`).
    pub fn images_of(&self, repo: &str) -> Result<Vec<String>, EngineError> {
        let filters = json!({"reference": [repo]}).to_string();
        let (status, body) = self.call(
            "GET",
            &format!("/images/json?filters={}", query_value(&filters)),
            None,
            Some(Duration::from_secs(30)),
        )?;
        self.check("list images", status, &body)?;
        Ok(body
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|i| i["RepoTags"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t.as_str().map(str::to_owned))
            .collect())
    }

    /// `POST /build` with a tar context; `progress` gets each line of build
    /// output as it streams.
    pub fn build(
        &self,
        context: Vec<u8>,
        tag: &str,
        labels: &Value,
        buildargs: &Value,
        mut progress: impl FnMut(&str),
    ) -> Result<(), EngineError> {
        let path = format!(
            "/build?t={}&rm=1&forcerm=1&labels={}&buildargs={}",
            query_value(tag),
            query_value(&labels.to_string()),
            query_value(&buildargs.to_string())
        );
        let what = "POST /build".to_owned();
        let resp = self
            .agent
            .post(&self.url(&path))
            .header("Content-Type", "application/x-tar")
            .send(&context[..])
            .map_err(|e| self.transport(&what, e))?;
        let status = resp.status().as_u16();
        let mut reader = BufReader::new(resp.into_body().into_reader());
        if status != 200 {
            let mut text = String::new();
            let _ = reader.read_to_string(&mut text);
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            self.check("build", status, &body)?;
        }
        for line in reader.lines() {
            let line = line.map_err(|e| EngineError::Transport { what: what.clone(), reason: e.to_string() })?;
            let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
            if let Some(err) = v.get("error").and_then(Value::as_str) {
                return Err(EngineError::Build(err.trim().to_owned()));
            }
            if let Some(s) = v.get("stream").and_then(Value::as_str) {
                for l in s.lines().filter(|l| !l.trim().is_empty()) {
                    progress(l);
                }
            }
        }
        Ok(())
    }

    /// `POST /containers/create`; returns the container id.
    pub fn create(&self, name: &str, config: &Value) -> Result<String, EngineError> {
        let (status, body) = self.call(
            "POST",
            &format!("/containers/create?name={}", query_value(name)),
            Some(config),
            Some(Duration::from_secs(60)),
        )?;
        if status == 404 {
            let image = config["Image"].as_str().unwrap_or_default().to_owned();
            return Err(EngineError::NoImage(image, "build it with `choirctl agent build <id>`".into()));
        }
        self.check("create container", status, &body)?;
        Ok(body["Id"].as_str().unwrap_or_default().to_owned())
    }

    /// `POST /containers/{id}/start`.
    pub fn start(&self, id: &str) -> Result<(), EngineError> {
        let (status, body) =
            self.call("POST", &format!("/containers/{id}/start"), None, Some(Duration::from_secs(60)))?;
        self.check("start container", status, &body)
    }

    /// `POST /containers/{id}/stop` (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(&self, id: &str, grace: Duration) -> Result<(), EngineError> {
        let t = grace.as_secs();
        let (status, body) =
            self.call("POST", &format!("/containers/{id}/stop?t={t}"), None, Some(grace + Duration::from_secs(30)))?;
        self.check("stop container", status, &body)
    }

    /// `POST /containers/{id}/kill`.
    pub fn kill(&self, id: &str, signal: &str) -> Result<(), EngineError> {
        let (status, body) =
            self.call("POST", &format!("/containers/{id}/kill?signal={signal}"), None, Some(Duration::from_secs(30)))?;
        self.check("kill container", status, &body)
    }

    /// `DELETE /containers/{id}?force=1&v=1`; a missing container is fine.
    pub fn remove(&self, id: &str) -> Result<(), EngineError> {
        let (status, body) =
            self.call("DELETE", &format!("/containers/{id}?force=1&v=1"), None, Some(Duration::from_secs(60)))?;
        if status == 404 {
            return Ok(());
        }
        self.check("remove container", status, &body)
    }

    /// `GET /containers/{id}/json`, or `None` if it does not exist.
    pub fn inspect(&self, id: &str) -> Result<Option<Value>, EngineError> {
        let (status, body) =
            self.call("GET", &format!("/containers/{id}/json"), None, Some(Duration::from_secs(30)))?;
        if status == 404 {
            return Ok(None);
        }
        self.check("inspect container", status, &body)?;
        Ok(Some(body))
    }

    /// `POST /containers/{id}/wait`: blocks until the container stops; returns
    /// its exit code.
    pub fn wait(&self, id: &str) -> Result<i64, EngineError> {
        let (status, body) = self.call("POST", &format!("/containers/{id}/wait"), None, None)?;
        self.check("wait for container", status, &body)?;
        Ok(body["StatusCode"].as_i64().unwrap_or(-1))
    }

    /// `GET /containers/{id}/logs`: stdout and stderr, demultiplexed.
    pub fn logs(&self, id: &str) -> Result<String, EngineError> {
        let what = "GET logs".to_owned();
        let mut resp = self
            .agent
            .get(&self.url(&format!("/containers/{id}/logs?stdout=1&stderr=1")))
            .call()
            .map_err(|e| self.transport(&what, e))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .map_err(|e| self.transport(&what, e))?;
        if status != 200 {
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            self.check("logs", status, &body)?;
        }
        Ok(String::from_utf8_lossy(&demux(&bytes)).into_owned())
    }

    /// `GET /containers/{id}/logs?follow=1`: the container's output from
    /// `since` (Unix seconds) on, as the engine streams it (frames, see
    /// [`crate::logs::lines::read_frames`]), until the container stops.
    pub fn follow_logs(&self, id: &str, since: f64) -> Result<impl std::io::Read + Send + use<>, EngineError> {
        let what = "GET logs (follow)".to_owned();
        let url = self.url(&format!("/containers/{id}/logs?follow=1&stdout=1&stderr=1&since={since:.6}"));
        let resp = self.agent.get(&url).call().map_err(|e| self.transport(&what, e))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(EngineError::Api { what, status, message: format!("the engine answered {status}") });
        }
        Ok(resp.into_body().into_reader())
    }

    /// Containers (running or not) carrying `label` (`key=value`).
    pub fn containers_with_label(&self, label: &str) -> Result<Vec<Value>, EngineError> {
        let filters = json!({"label": [label]}).to_string();
        let (status, body) = self.call(
            "GET",
            &format!("/containers/json?all=1&filters={}", query_value(&filters)),
            None,
            Some(Duration::from_secs(30)),
        )?;
        self.check("list containers", status, &body)?;
        Ok(body.as_array().cloned().unwrap_or_default())
    }

    /// Streams `GET /events` with `filters` between two Unix times (the engine
    /// closes the stream at `until`), calling `on_event` for each event until
    /// it returns false or the stream ends.
    pub fn events_between(
        &self,
        filters: &Value,
        since: f64,
        until: f64,
        mut on_event: impl FnMut(Value) -> bool,
    ) -> Result<(), EngineError> {
        let what = "GET /events".to_owned();
        let resp = self
            .agent
            .get(&self.url(&format!(
                "/events?since={since:.3}&until={until:.3}&filters={}",
                query_value(&filters.to_string())
            )))
            .call()
            .map_err(|e| self.transport(&what, e))?;
        let reader = BufReader::new(resp.into_body().into_reader());
        for line in reader.lines() {
            let line = line.map_err(|e| EngineError::Transport { what: what.clone(), reason: e.to_string() })?;
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if !on_event(v) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Attaches to a container's stdin (a hijacked HTTP connection, which ureq
    /// does not do) and writes `data`, then closes it.
    pub fn write_stdin(&self, id: &str, data: &[u8]) -> Result<(), EngineError> {
        let what = "POST attach".to_owned();
        let io = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                EngineError::NoSocket(self.socket.clone())
            }
            std::io::ErrorKind::PermissionDenied => EngineError::Permission(self.socket.clone()),
            _ => EngineError::Transport { what: what.clone(), reason: e.to_string() },
        };
        let mut stream = UnixStream::connect(&self.socket).map_err(io)?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(io)?;
        write!(
            stream,
            "POST /{API_VERSION}/containers/{id}/attach?stream=1&stdin=1 HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
        )
        .map_err(io)?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).map_err(io)? == 0 {
                break;
            }
            head.push(byte[0]);
            if head.len() > 16 * 1024 {
                break;
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        if !(head.starts_with("HTTP/1.1 101") || head.starts_with("HTTP/1.1 200")) {
            return Err(EngineError::Api {
                what,
                status: 0,
                message: head.lines().next().unwrap_or_default().to_owned(),
            });
        }
        stream.write_all(data).map_err(io)?;
        stream.flush().map_err(io)?;
        // Closing our side ends stdin for the container (StdinOnce).
        stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
        Ok(())
    }

    /// Runs `cmd` in a running container and returns (exit code, output):
    /// for tests and diagnostics.
    pub fn exec(&self, id: &str, cmd: &[&str]) -> Result<(i64, String), EngineError> {
        self.exec_as(id, "", cmd)
    }

    /// [`Engine::exec`] as `user` (empty: the container's user).
    pub fn exec_as(&self, id: &str, user: &str, cmd: &[&str]) -> Result<(i64, String), EngineError> {
        let create = json!({"AttachStdout": true, "AttachStderr": true, "Tty": false, "Cmd": cmd, "User": user});
        let (status, body) =
            self.call("POST", &format!("/containers/{id}/exec"), Some(&create), Some(Duration::from_secs(30)))?;
        self.check("create exec", status, &body)?;
        let exec_id = body["Id"].as_str().unwrap_or_default().to_owned();
        let what = "start exec".to_owned();
        let mut resp = self
            .agent
            .post(&self.url(&format!("/exec/{exec_id}/start")))
            .send_json(json!({"Detach": false, "Tty": false}))
            .map_err(|e| self.transport(&what, e))?;
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .map_err(|e| self.transport(&what, e))?;
        let (status, info) = self.call("GET", &format!("/exec/{exec_id}/json"), None, Some(Duration::from_secs(30)))?;
        self.check("inspect exec", status, &info)?;
        Ok((info["ExitCode"].as_i64().unwrap_or(-1), String::from_utf8_lossy(&demux(&bytes)).into_owned()))
    }
}

/// Undoes the engine's stream multiplexing (8-byte frame headers: stream,
/// 0, 0, 0, big-endian length) for containers without a TTY.
pub fn demux(mut bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    while bytes.len() >= 8 && bytes[0] <= 2 && bytes[1..4] == [0, 0, 0] {
        let len = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
        let end = (8 + len).min(bytes.len());
        out.extend_from_slice(&bytes[8..end]);
        bytes = &bytes[end..];
    }
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_demultiplexed() {
        let mut framed = vec![1, 0, 0, 0, 0, 0, 0, 3];
        framed.extend_from_slice(b"abc");
        framed.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 2]);
        framed.extend_from_slice(b"de");
        assert_eq!(demux(&framed), b"abcde");
        assert_eq!(demux(b"plain text"), b"plain text");
    }

    #[test]
    fn a_missing_socket_is_explained() {
        let e = Engine::new(Path::new("/nonexistent/docker.sock")).ping().unwrap_err();
        assert!(e.to_string().contains("no Docker engine at /nonexistent/docker.sock"), "{e}");
    }
}
