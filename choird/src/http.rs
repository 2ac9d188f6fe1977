//! The HTTP plumbing shared by every listener: a fixed pool of named worker
//! threads per listener pulling requests from tiny_http, body size caps, panic
//! containment, and the one mapping from [`ApiError`] to a status code.
//!
//! **Invariant:** a panicking handler is answered with 500 and the worker keeps
//! serving; the daemon never dies because of one request.

use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use choir_common::ids::AgentId;
use choir_common::rpc::{ErrorBody, ErrorInfo};
use serde::Serialize;

use crate::db::DbError;

/// Which API a listener exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerKind {
    /// `socks/choird.sock`: the admin API, plus the agent RPC for agents that
    /// were told to use it.
    Admin,
    /// `socks/agents/<id>.sock`: the agent RPC for that one agent only.
    Agent(AgentId),
    /// Loopback TCP (`http_listen`): the agent RPC only.
    Tcp,
}

/// An error answered to a client. The variant decides the status code; the
/// message is shown to the caller as is.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Missing, wrong or expired lease token (401). Not retryable.
    #[error("{0}")]
    Unauthorized(String),
    /// Authenticated but not allowed (403). Not retryable.
    #[error("{0}")]
    Forbidden(String),
    /// No such path or object (404). Not retryable.
    #[error("{0}")]
    NotFound(String),
    /// Malformed request (400). Not retryable.
    #[error("{0}")]
    BadRequest(String),
    /// Conflicts with current state, e.g. agent already running (409). Not retryable.
    #[error("{0}")]
    Conflict(String),
    /// Body over the cap (413). Not retryable.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// Well-formed, but its content is invalid (a proposal that fails
    /// validation). Not retried: the content must change.
    #[error("{0}")]
    Unprocessable(String),
    /// Over a rate limit or budget (429). Retryable after `retry_after_s` when set.
    #[error("{message}")]
    RateLimited {
        /// Explanation.
        message: String,
        /// Seconds to wait; `None` means the budget is spent for this session.
        retry_after_s: Option<u64>,
    },
    /// A verb this choird does not implement yet (501). Not retryable.
    #[error("{0}")]
    NotImplemented(String),
    /// A dependency (database, upstream) is down (503). Retryable.
    #[error("{0}")]
    Unavailable(String),
    /// The upstream answered badly (502). Retryable.
    #[error("{0}")]
    BadGateway(String),
    /// Waited too long (504). Retryable.
    #[error("{0}")]
    Timeout(String),
    /// A bug (500). Not retryable.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// HTTP status and stable code.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            ApiError::Unauthorized(_) => (401, "unauthorized"),
            ApiError::Forbidden(_) => (403, "forbidden"),
            ApiError::NotFound(_) => (404, "not_found"),
            ApiError::BadRequest(_) => (400, "bad_request"),
            ApiError::Conflict(_) => (409, "conflict"),
            ApiError::PayloadTooLarge(_) => (413, "payload_too_large"),
            ApiError::Unprocessable(_) => (422, "invalid"),
            ApiError::RateLimited { retry_after_s: Some(_), .. } => (429, "rate_limited"),
            ApiError::RateLimited { retry_after_s: None, .. } => (429, "budget_exhausted"),
            ApiError::NotImplemented(_) => (501, "not_implemented"),
            ApiError::Unavailable(_) => (503, "unavailable"),
            ApiError::BadGateway(_) => (502, "bad_gateway"),
            ApiError::Timeout(_) => (504, "timeout"),
            ApiError::Internal(_) => (500, "internal"),
        }
    }

    /// Whether retrying the same request later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            ApiError::RateLimited { retry_after_s: Some(_), .. }
                | ApiError::Unavailable(_)
                | ApiError::BadGateway(_)
                | ApiError::Timeout(_)
        )
    }

    /// The reply for this error.
    pub fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let retryable = self.retryable();
        let mut headers = Vec::new();
        if let ApiError::RateLimited { retry_after_s: Some(s), .. } = &self {
            headers.push(("Retry-After".to_owned(), s.to_string()));
        }
        let body = ErrorBody { error: ErrorInfo { code: code.to_owned(), message: self.to_string(), retryable } };
        let mut resp = Response::json(status, &body);
        resp.headers = headers;
        resp
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        if let DbError::Dimensions { .. } = e {
            return ApiError::Conflict(e.to_string());
        }
        log::error!("{e}");
        ApiError::Unavailable(format!("choird's database is unavailable, try again: {e}"))
    }
}

/// A request as handlers see it: the body is already read (within the cap).
pub struct Request {
    /// HTTP method.
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Query parameters.
    pub query: Vec<(String, String)>,
    /// Bearer token, if one was sent.
    pub bearer: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A query parameter.
    pub fn query(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Parses the body as JSON into `T`, with a message naming the problem.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, ApiError> {
        let de = &mut serde_json::Deserializer::from_slice(&self.body);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            ApiError::BadRequest(format!("invalid request body at {path}: {}", e.into_inner()))
        })
    }
}

/// A reply: status, body and extra headers.
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Content type.
    pub content_type: &'static str,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// A body streamed to the client as it is produced (chunked), instead of `body`.
    pub stream: Option<Box<dyn Read + Send>>,
}

impl Response {
    /// A streamed plain-text reply (e.g. build progress), status 200.
    pub fn streaming(reader: impl Read + Send + 'static) -> Response {
        Response {
            status: 200,
            body: Vec::new(),
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            stream: Some(Box::new(reader)),
        }
    }

    /// A JSON reply.
    pub fn json<T: Serialize>(status: u16, value: &T) -> Response {
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        Response { status, body, content_type: "application/json", headers: Vec::new(), stream: None }
    }

    /// 200 with a JSON body.
    pub fn ok<T: Serialize>(value: &T) -> Response {
        Response::json(200, value)
    }
}

/// What serves requests on a listener.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request.
    fn handle(&self, kind: &ListenerKind, req: Request) -> Response;
}

/// Largest body accepted on any listener; per-route caps are smaller.
pub const MAX_BODY: usize = 32 * 1024 * 1024;

/// Starts `workers` named threads serving `server`. They stop when
/// `server.unblock()` has been called once per worker after `stop` is set.
pub fn serve(
    server: Arc<tiny_http::Server>,
    kind: ListenerKind,
    handler: Arc<dyn Handler>,
    workers: usize,
    name: &str,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for i in 0..workers {
        let (server, kind, handler, stop) = (server.clone(), kind.clone(), handler.clone(), stop.clone());
        let t = std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || loop {
            match server.recv() {
                Ok(rq) => serve_one(&kind, handler.as_ref(), rq),
                Err(e) => {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    log::debug!("listener error: {e}");
                }
            }
        })?;
        threads.push(t);
    }
    Ok(threads)
}

fn serve_one(kind: &ListenerKind, handler: &dyn Handler, mut rq: tiny_http::Request) {
    let url = rq.url().to_owned();
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p.to_owned(), parse_query(q)),
        None => (url.clone(), Vec::new()),
    };
    let bearer = rq
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer ").map(str::to_owned));
    let method = rq.method().as_str().to_owned();

    let response = if rq.body_length().is_some_and(|n| n > MAX_BODY) {
        ApiError::PayloadTooLarge(format!("request body over {MAX_BODY} bytes")).into_response()
    } else {
        let mut body = Vec::new();
        let read = rq.as_reader().take(MAX_BODY as u64 + 1).read_to_end(&mut body);
        match read {
            Err(e) => ApiError::BadRequest(format!("cannot read request body: {e}")).into_response(),
            Ok(_) if body.len() > MAX_BODY => {
                ApiError::PayloadTooLarge(format!("request body over {MAX_BODY} bytes")).into_response()
            }
            Ok(_) => {
                let req = Request { method, path: path.clone(), query, bearer, body };
                match catch_unwind(AssertUnwindSafe(|| handler.handle(kind, req))) {
                    Ok(r) => r,
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        log::error!("handler for {path} panicked: {what}");
                        ApiError::Internal("internal error (a bug in choird; see choird.log)".into()).into_response()
                    }
                }
            }
        }
    };
    let mut headers: Vec<tiny_http::Header> = Vec::new();
    if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", response.content_type) {
        headers.push(h);
    }
    for (k, v) in &response.headers {
        if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
            headers.push(h);
        }
    }
    let sent = match response.stream {
        // Written by hand, one flushed chunk per read: tiny_http's own chunked
        // encoder would hold events back until 8 KiB had gathered.
        Some(reader) => stream_chunked(rq, response.status, response.content_type, reader),
        None => {
            let mut out = tiny_http::Response::from_data(response.body).with_status_code(response.status);
            for h in headers {
                out.add_header(h);
            }
            rq.respond(out)
        }
    };
    if let Err(e) = sent {
        log::debug!("client went away before the reply to {path}: {e}");
    }
}

/// Sends a `Transfer-Encoding: chunked` reply, flushing each piece the reader
/// yields as soon as it has it.
fn stream_chunked(
    rq: tiny_http::Request,
    status: u16,
    content_type: &str,
    mut reader: Box<dyn Read + Send>,
) -> std::io::Result<()> {
    use std::io::Write;
    let reason = if status == 200 { "OK" } else { "Status" };
    let mut w = rq.into_writer();
    write!(
        w,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
    )?;
    w.flush()?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::debug!("stream source failed: {e}");
                break;
            }
        };
        write!(w, "{n:x}\r\n")?;
        w.write_all(&buf[..n])?;
        w.write_all(b"\r\n")?;
        w.flush()?;
    }
    w.write_all(b"0\r\n\r\n")?;
    w.flush()
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b == b'+' { b' ' } else { b });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        assert_eq!(
            parse_query("after=3&agent=a%20b&x"),
            vec![("after".into(), "3".into()), ("agent".into(), "a b".into()), ("x".into(), String::new())]
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4"), "%4");
    }
}
