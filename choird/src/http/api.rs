//! What handlers see of HTTP: requests and replies, the [`Handler`] trait
//! (judge a head, then answer a request), and the one mapping from
//! [`ApiError`] to a status code.

use std::io::Read;

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
    /// `metrics_listen`: `GET /metrics` only.
    Metrics,
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
    /// A replicated event choird cannot store (422 `event_refused`, naming
    /// its sequence number). Not retried: the agent replaces it with a
    /// placeholder.
    #[error("event {seq} cannot be stored: {reason}")]
    EventRefused {
        /// The event's sequence number.
        seq: u64,
        /// Why.
        reason: String,
    },
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
            ApiError::EventRefused { .. } => (422, "event_refused"),
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
        let event_seq = match &self {
            ApiError::EventRefused { seq, .. } => Some(*seq),
            _ => None,
        };
        let body =
            ErrorBody { error: ErrorInfo { code: code.to_owned(), message: self.to_string(), retryable, event_seq } };
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
        // The detail (hosts, sockets, SQL) stays in choird's log: an agent or a
        // client learns only that it may try again.
        log::error!("{e}");
        ApiError::Unavailable("choird's database is unavailable, try again".into())
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
    fn admit(&self, kind: &ListenerKind, head: &Head) -> Result<Admitted<Self::Route>, ApiError>;
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
}
