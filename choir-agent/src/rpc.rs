//! The agent's side of the choird RPC: typed calls of the eight verbs and raw
//! posts to the LLM relay, over the Unix socket (default) or loopback TCP, with
//! the lease token on every request.

use std::path::PathBuf;
use std::time::Duration;

use choir_common::rpc::{ErrorBody, Verb};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Where choird is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket.
    Unix(PathBuf),
    /// An HTTP base URL, e.g. `http://127.0.0.1:9400`.
    Tcp(String),
}

impl Endpoint {
    /// Parses `unix:/path` or `http://host:port`.
    pub fn parse(s: &str) -> Option<Endpoint> {
        if let Some(p) = s.strip_prefix("unix:") {
            Some(Endpoint::Unix(PathBuf::from(p)))
        } else if s.starts_with("http://") {
            Some(Endpoint::Tcp(s.trim_end_matches('/').to_owned()))
        } else {
            None
        }
    }
}

/// An RPC failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The lease is gone (401): the session is over. Not retryable.
    #[error("choird refused our lease: {0}")]
    Unauthorized(String),
    /// choird answered with an error.
    #[error("{verb}: {message} ({status} {code})")]
    Refused {
        /// What was called.
        verb: String,
        /// HTTP status.
        status: u16,
        /// Stable error code.
        code: String,
        /// choird's message.
        message: String,
        /// Whether a retry may succeed.
        retryable: bool,
        /// How long choird asked us to wait (`retry-after-ms`, else
        /// `Retry-After` in seconds).
        retry_after: Option<Duration>,
    },
    /// choird cannot store one of the replicated events (not retryable as
    /// is: the event is replaced by a placeholder).
    #[error("choird cannot store event {seq}: {message}")]
    EventRefused {
        /// The event.
        seq: u64,
        /// Why.
        message: String,
    },
    /// choird could not be reached (retryable).
    #[error("cannot reach choird: {0}")]
    Transport(String),
    /// choird's answer did not parse.
    #[error("bad answer from choird: {0}")]
    Decode(String),
}

impl RpcError {
    /// Whether retrying later may help.
    pub fn retryable(&self) -> bool {
        match self {
            RpcError::Unauthorized(_) | RpcError::Decode(_) | RpcError::EventRefused { .. } => false,
            RpcError::Refused { retryable, .. } => *retryable,
            RpcError::Transport(_) => true,
        }
    }
}

/// A streamed answer: status, the wait asked for, the fallback model that
/// answered (when not the lane's first), and the body.
pub type StreamedAnswer = (u16, Option<Duration>, Option<String>, Box<dyn std::io::BufRead + Send>);

/// What an answer's head says.
struct Head {
    status: u16,
    retry_after: Option<Duration>,
    fallback: Option<String>,
}

/// How long a request may take: in all, and (when set) of silence between
/// two reads of its answer.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// The whole request, answer included.
    pub whole: Duration,
    /// Longest silence while its answer arrives.
    pub silence: Option<Duration>,
}

impl From<Duration> for Patience {
    fn from(whole: Duration) -> Patience {
        Patience { whole, silence: None }
    }
}

/// A raw HTTP answer.
pub struct RawAnswer {
    /// Status.
    pub status: u16,
    /// The wait asked for (`retry-after-ms`, else `Retry-After` seconds).
    pub retry_after: Option<Duration>,
    /// The fallback model that answered, when not the lane's first
    /// (choird's `X-Choir-Fallback`).
    pub fallback: Option<String>,
    /// Body.
    pub body: Vec<u8>,
}

/// Connections to choird the agent's main client keeps open between
/// requests: enough for the edge's model call, link-poll, link-push,
/// link-reply, status reports and host tools (the edge's and the core jobs') at once. Each is a
/// waiting thread in choird (closed after 30 s idle); past this many
/// requests at once, a connection closes after use and the next request
/// opens a new one (choird starts a thread for it). The core jobs' model
/// calls have a client of their own, sized to `max_core_jobs`
/// ([`Rpc::with_idle`]).
const IDLE_CONNECTIONS: usize = 12;

/// The RPC client.
pub struct Rpc {
    agent: ureq::Agent,
    base: String,
    token: String,
    endpoint: Endpoint,
}

impl Rpc {
    /// A client for `endpoint` using `token`.
    pub fn new(endpoint: &Endpoint, token: String) -> Rpc {
        Rpc::with_idle(endpoint, token, IDLE_CONNECTIONS)
    }

    /// A client keeping up to `idle` connections open between requests:
    /// as many as requests it will carry at once.
    pub fn with_idle(endpoint: &Endpoint, token: String, idle: usize) -> Rpc {
        match endpoint {
            Endpoint::Unix(path) => Rpc {
                agent: choir_common::unix_http::pooled_agent_for_socket(path, None, idle),
                base: "http://localhost".to_owned(),
                token,
                endpoint: endpoint.clone(),
            },
            Endpoint::Tcp(base) => Rpc {
                agent: ureq::Agent::new_with_config(
                    ureq::config::Config::builder()
                        .http_status_as_error(false)
                        .max_idle_connections(idle)
                        .max_idle_connections_per_host(idle)
                        .input_buffer_size(choir_common::unix_http::SOCKET_BUFFER)
                        .output_buffer_size(choir_common::unix_http::SOCKET_BUFFER)
                        .max_response_header_size(choir_common::unix_http::SOCKET_MAX_HEAD)
                        .build(),
                ),
                base: base.clone(),
                token,
                endpoint: endpoint.clone(),
            },
        }
    }

    /// Opens a tunnel through choird (`POST path`, no body): on `200` the
    /// connection itself, with the bytes that came past the answer's head;
    /// on anything else, choird's reason.
    pub fn tunnel(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<(Box<dyn choir_common::splice::Duplex>, Vec<u8>), String> {
        use std::io::{Read, Write};
        let mut conn: Box<dyn choir_common::splice::Duplex> = match &self.endpoint {
            Endpoint::Unix(p) => Box::new(std::os::unix::net::UnixStream::connect(p).map_err(|e| e.to_string())?),
            Endpoint::Tcp(base) => {
                let hostport = base.trim_start_matches("http://").trim_end_matches('/');
                Box::new(std::net::TcpStream::connect(hostport).map_err(|e| e.to_string())?)
            }
        };
        conn.read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Length: 0\r\n\r\n",
            self.token
        );
        conn.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if got.len() > choir_common::unix_http::SOCKET_MAX_HEAD {
                return Err("choird's answer head is too long".into());
            }
            match conn.read(&mut buf) {
                Ok(0) => return Err("choird closed the tunnel before answering".into()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e.to_string()),
            }
        };
        let head = String::from_utf8_lossy(&got[..end]).into_owned();
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        if status == 200 {
            conn.read_timeout(None).map_err(|e| e.to_string())?;
            return Ok((conn, got[end..].to_vec()));
        }
        // A refusal: its JSON body says why (read to its length, bounded).
        let length = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            .min(64 * 1024);
        let mut body = got[end..].to_vec();
        if body.len() < length {
            let _ = conn.take((length - body.len()) as u64).read_to_end(&mut body);
        }
        let answer = RawAnswer { status, retry_after: None, fallback: None, body };
        Err(refusal("tunnel", &answer).to_string())
    }

    /// POSTs `body` to `path`, returning whatever choird answered.
    pub fn post_raw(&self, path: &str, body: &[u8], timeout: impl Into<Patience>) -> Result<RawAnswer, RpcError> {
        let (Head { status, retry_after, fallback }, mut answer) = self.send(path, body, timeout.into())?;
        let body = answer
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .map_err(|e| RpcError::Transport(e.to_string()))?;
        Ok(RawAnswer { status, retry_after, fallback, body })
    }

    /// POSTs `body` to `path` and returns the status, `Retry-After` and the
    /// body as a reader (for streamed answers).
    pub fn post_reader(&self, path: &str, body: &[u8], timeout: Patience) -> Result<StreamedAnswer, RpcError> {
        let (Head { status, retry_after, fallback }, answer) = self.send(path, body, timeout)?;
        let reader = std::io::BufReader::new(answer.into_body().into_reader());
        Ok((status, retry_after, fallback, Box::new(reader)))
    }

    /// POSTs `body` to `path`: the status, the wait asked for and the
    /// answer, its body unread.
    fn send(
        &self,
        path: &str,
        body: &[u8],
        timeout: Patience,
    ) -> Result<(Head, ureq::http::Response<ureq::Body>), RpcError> {
        let answer = self
            .agent
            .post(&format!("{}{path}", self.base))
            .config()
            .timeout_global(Some(timeout.whole))
            .timeout_per_read(timeout.silence)
            .build()
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Content-Type", "application/json")
            .send(body)
            .map_err(|e| RpcError::Transport(e.to_string()))?;
        let status = answer.status().as_u16();
        let header = |name: &str| {
            answer.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|s| s.trim().parse::<u64>().ok())
        };
        let retry_after = header("retry-after-ms")
            .map(Duration::from_millis)
            .or_else(|| header("retry-after").map(Duration::from_secs));
        let fallback = answer
            .headers()
            .get("x-choir-fallback")
            .and_then(|v| v.to_str().ok())
            .map(|m| m.chars().take(200).collect::<String>());
        Ok((Head { status, retry_after, fallback }, answer))
    }

    /// Calls a verb.
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        verb: Verb,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RpcError> {
        let body = serde_json::to_vec(req).map_err(|e| RpcError::Decode(e.to_string()))?;
        let answer = self.post_raw(&verb.path(), &body, timeout)?;
        if answer.status == 200 {
            return serde_json::from_slice(&answer.body).map_err(|e| RpcError::Decode(format!("{}: {e}", verb.name())));
        }
        Err(refusal(verb.name(), &answer))
    }
}

/// Turns a non-200 answer into an error.
pub fn refusal(what: &str, answer: &RawAnswer) -> RpcError {
    let parsed: Option<ErrorBody> = serde_json::from_slice(&answer.body).ok();
    if let Some(ErrorBody { error }) = &parsed {
        if let (422, Some(seq)) = (answer.status, error.event_seq) {
            return RpcError::EventRefused { seq, message: error.message.clone() };
        }
    }
    let (code, message, retryable) = match parsed {
        Some(b) => (b.error.code, b.error.message, b.error.retryable),
        None => (
            "unknown".to_owned(),
            String::from_utf8_lossy(&answer.body).chars().take(300).collect(),
            answer.status == 429 || answer.status >= 500,
        ),
    };
    if answer.status == 401 {
        return RpcError::Unauthorized(message);
    }
    RpcError::Refused {
        verb: what.to_owned(),
        status: answer.status,
        code,
        message,
        retryable,
        retry_after: answer.retry_after,
    }
}

/// Test support for choird stand-ins: one HTTP request read from `reader`,
/// its target and body; `None` once the client has closed the connection.
#[cfg(test)]
pub(crate) fn read_request(reader: &mut impl std::io::BufRead) -> Option<(String, Vec<u8>)> {
    use std::io::Read;
    let (mut length, mut target) = (0u64, String::new());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if target.is_empty() {
            target = line.split(' ').nth(1).unwrap_or_default().to_owned();
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = Vec::new();
    reader.by_ref().take(length).read_to_end(&mut body).ok()?;
    Some((target, body))
}
