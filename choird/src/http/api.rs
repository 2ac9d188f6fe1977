//! What handlers see of HTTP: requests and replies, the [`Handler`] trait
//! (judge a head, then answer a request), and the one mapping from
//! choird's domain [`Error`] to a status code ([`status_of`]).

use std::io::Read;

use choir_common::ids::AgentId;
use choir_common::rpc::{ErrorBody, ErrorInfo};
use serde::Serialize;

use crate::error::Error;

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
    /// `metrics_listen`: `GET /metrics` only.
    Metrics,
    /// `socks/console.sock`: the operator's console, when opened.
    Console,
}

/// The HTTP status an [`Error`] is answered with: the one place a domain
/// error becomes a status code.
pub fn status_of(e: &Error) -> u16 {
    match e {
        Error::Unauthorized(_) => 401,
        Error::Forbidden(_) => 403,
        Error::NotFound(_) => 404,
        Error::Malformed(_) => 400,
        Error::Conflict(_) => 409,
        Error::TooLarge(_) => 413,
        Error::Invalid(_) | Error::EventRefused { .. } => 422,
        Error::RateLimited { .. } => 429,
        Error::NotImplemented(_) => 501,
        Error::Unavailable(_) => 503,
        Error::Upstream(_) | Error::Provider { .. } => 502,
        Error::Timeout(_) => 504,
        Error::Internal(_) => 500,
    }
}

impl From<Error> for Response {
    /// The reply for an error: its status, and a body with its stable code,
    /// its message and whether to retry.
    fn from(e: Error) -> Response {
        let status = status_of(&e);
        let retryable = e.retryable();
        let mut headers = Vec::new();
        if let Error::RateLimited { retry_after_s: Some(s), .. } = &e {
            headers.push(("Retry-After".to_owned(), s.to_string()));
        }
        if let Error::Provider { wait_ms: Some(ms), .. } = &e {
            headers.push(("Retry-After".to_owned(), ms.div_ceil(1000).to_string()));
            headers.push(("retry-after-ms".to_owned(), ms.to_string()));
        }
        let event_seq = match &e {
            Error::EventRefused { seq, .. } => Some(*seq),
            _ => None,
        };
        let body =
            ErrorBody { error: ErrorInfo { code: e.code().to_owned(), message: e.to_string(), retryable, event_seq } };
        let mut resp = Response::json(status, &body);
        resp.headers = headers;
        resp
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
    /// The connection the request came on, to ask whether its client still
    /// waits (a long piece of work for nobody is given up).
    pub peer: Option<Peer>,
}

/// A second handle on a request's connection.
pub enum Peer {
    /// A Unix socket client.
    Unix(std::os::unix::net::UnixStream),
    /// A TCP client.
    Tcp(std::net::TcpStream),
}

impl Peer {
    /// Whether the client closed its end: a peek that does not wait reads
    /// end-of-stream (or a reset). Nothing is consumed.
    pub fn gone(&self) -> bool {
        use std::os::fd::AsFd;
        let fd = match self {
            Peer::Unix(s) => s.as_fd(),
            Peer::Tcp(s) => s.as_fd(),
        };
        let mut one = [0u8; 1];
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        match rustix::net::recv(fd, &mut one, flags) {
            Ok((0, _)) => true,
            Ok(_) => false,
            Err(e) => matches!(e, rustix::io::Errno::CONNRESET | rustix::io::Errno::PIPE),
        }
    }
}

impl Request {
    /// A query parameter.
    pub fn query(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Parses the body as JSON into `T`, with a message naming the problem.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        let de = &mut serde_json::Deserializer::from_slice(&self.body);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            Error::Malformed(format!("invalid request body at {path}: {}", e.into_inner()))
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
    /// A tunnel: after the head (no body), the connection is handed to it
    /// with the bytes the client sent past its request, and is never
    /// read as HTTP again.
    pub tunnel: Option<Tunnel>,
}

/// What takes over a connection whose reply opened a tunnel.
pub type Tunnel = Box<dyn FnOnce(Box<dyn choir_common::splice::Duplex>, Vec<u8>) + Send>;

impl Response {
    /// A streamed plain-text reply (e.g. build progress), status 200.
    pub fn streaming(reader: impl Read + Send + 'static) -> Response {
        Response {
            status: 200,
            body: Vec::new(),
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            stream: Some(Box::new(reader)),
            tunnel: None,
        }
    }

    /// A JSON reply.
    pub fn json<T: Serialize>(status: u16, value: &T) -> Response {
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        Response { status, body, content_type: "application/json", headers: Vec::new(), stream: None, tunnel: None }
    }

    /// 200 with a JSON body.
    pub fn ok<T: Serialize>(value: &T) -> Response {
        Response::json(200, value)
    }
}

/// What the server tells the handler about a request before its body is read.
#[derive(Debug, Clone)]
pub struct Head {
    /// HTTP method.
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Query parameters.
    pub query: Vec<(String, String)>,
    /// Bearer token, if one was sent.
    pub bearer: Option<String>,
    /// Declared body length.
    pub content_length: usize,
    /// What a browser sends that the console decides on.
    pub browser: BrowserHeaders,
}

/// The headers a browser sends that the console checks (absent on every
/// other client's request; only the console reads them).
#[derive(Debug, Clone, Default)]
pub struct BrowserHeaders {
    /// `Host`.
    pub host: Option<String>,
    /// `Origin`.
    pub origin: Option<String>,
    /// `Sec-Fetch-Site`.
    pub fetch_site: Option<String>,
    /// `Cookie`.
    pub cookie: Option<String>,
}

/// The handler's verdict on a head: read a body of at most `max_body` bytes,
/// then serve the request (with `caller` set when it authenticated one).
#[derive(Debug, Clone)]
pub struct Admitted<R> {
    /// The largest body this route takes.
    pub max_body: usize,
    /// Where the request goes, decided from its head once, with what
    /// admission established (the authenticated agent, parsed ids).
    pub route: R,
}

/// The agent a request authenticated as (its lease token checked from the
/// head, before any body byte was read).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The agent.
    pub agent: AgentId,
    /// Its session.
    pub session: i64,
}

/// What serves requests on a listener.
pub trait Handler: Send + Sync + 'static {
    /// What admission decides about a request and hands to [`Handler::handle`].
    type Route: Send;
    /// Judges a request from its head alone: its route, authentication, rate
    /// limits and the body cap of its route. A refusal is answered without
    /// reading the body.
    fn admit(&self, kind: &ListenerKind, head: &Head) -> Result<Admitted<Self::Route>, Error>;
    /// Answers one admitted request on the route admission decided.
    fn handle(&self, kind: &ListenerKind, route: Self::Route, req: Request) -> Response;
}

/// Largest body accepted on any listener; per-route caps are smaller.
pub const MAX_BODY: usize = 32 * 1024 * 1024;

/// `s` with control characters (including newlines, escape sequences and
/// bidi overrides) shown as escapes, at most 200 characters: for log lines
/// and messages that carry a string a client chose.
pub fn printable(s: &str) -> String {
    choir_common::text::clipped(s, 200)
}

/// A query string's pairs, decoded (`application/x-www-form-urlencoded`:
/// `+` is a space; a `%` not followed by two hex digits stays as it is;
/// bytes that are not UTF-8 become U+FFFD).
pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    url::form_urlencoded::parse(q.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
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
        let one = |q: &str| parse_query(q).remove(0).1;
        assert_eq!(one("q=100%"), "100%");
        assert_eq!(one("q=%4"), "%4");
        assert_eq!(one("q=a+b%2Bc"), "a b+c");
        assert_eq!(one("q=%FF"), "\u{fffd}");
        // What choirctl encodes comes back as it was.
        for text in ["a b&c=d#e+f", "100%", "été \u{202e}", "x=y&z", ""] {
            assert_eq!(one(&format!("q={}", choir_common::unix_http::query_value(text))), text);
        }
    }

    #[test]
    fn a_domain_error_becomes_its_status_and_stable_code_only_at_the_edge() {
        let reply = |e: Error| {
            let r = Response::from(e);
            let body: ErrorBody = serde_json::from_slice(&r.body).unwrap();
            (r.status, body.error.code, body.error.retryable, r.headers)
        };
        assert_eq!(reply(Error::Malformed("x".into())).0, 400);
        assert_eq!(reply(Error::Invalid("x".into())).1, "invalid");
        let (status, code, retryable, headers) =
            reply(Error::RateLimited { message: "slow down".into(), retry_after_s: Some(3) });
        assert_eq!((status, code.as_str(), retryable), (429, "rate_limited", true));
        assert_eq!(headers, vec![("Retry-After".to_owned(), "3".to_owned())]);
        let (status, code, retryable, headers) =
            reply(Error::RateLimited { message: "spent".into(), retry_after_s: None });
        assert_eq!((status, code.as_str(), retryable), (429, "budget_exhausted", false));
        assert!(headers.is_empty(), "a spent budget names no time to retry");
        let (status, code, retryable, _) = reply(Error::Upstream("bad".into()));
        assert_eq!((status, code.as_str(), retryable), (502, "bad_gateway", true));
        let r = Response::from(Error::EventRefused { seq: 9, reason: "too big".into() });
        let body: ErrorBody = serde_json::from_slice(&r.body).unwrap();
        assert_eq!((r.status, body.error.event_seq), (422, Some(9)));
    }
}
