//! choird's domain error: what went wrong with a request or an operation,
//! as a category the caller can act on and a message shown to it as is.
//! It says nothing about HTTP: the HTTP edge maps it to a status code
//! (`http::status_of`), in one place.
//!
//! **Invariant:** a message never carries a secret, an internal URL or a
//! database detail; those stay in choird's log (see `From<DbError>`).

use crate::db::DbError;

/// What went wrong. The variant is the category (and the stable code a
/// client sees, [`Error::code`]); the message is shown to the caller as is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Missing, wrong or expired lease token. Not retryable.
    #[error("{0}")]
    Unauthorized(String),
    /// Authenticated but not allowed. Not retryable.
    #[error("{0}")]
    Forbidden(String),
    /// No such route or object. Not retryable.
    #[error("{0}")]
    NotFound(String),
    /// The request itself is malformed (syntax, types, a bad parameter).
    /// Not retryable.
    #[error("{0}")]
    Malformed(String),
    /// Conflicts with current state, e.g. agent already running. Not retryable.
    #[error("{0}")]
    Conflict(String),
    /// Over a size cap. Not retryable.
    #[error("{0}")]
    TooLarge(String),
    /// Well-formed, but its content is invalid (a proposal that fails
    /// validation). Not retried: the content must change.
    #[error("{0}")]
    Invalid(String),
    /// A replicated event choird cannot store (naming its sequence number).
    /// Not retried: the agent replaces it with a placeholder.
    #[error("event {seq} cannot be stored: {reason}")]
    EventRefused {
        /// The event's sequence number.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// Over a rate limit or budget. Retryable after `retry_after_s` when set.
    #[error("{message}")]
    RateLimited {
        /// Explanation.
        message: String,
        /// Seconds to wait; `None` means the budget is spent for this session.
        retry_after_s: Option<u64>,
    },
    /// Something this choird does not implement. Not retryable.
    #[error("{0}")]
    NotImplemented(String),
    /// A dependency (database, a service) is down. Retryable.
    #[error("{0}")]
    Unavailable(String),
    /// An upstream (the model API, a web service) answered badly. Retryable.
    #[error("{0}")]
    Upstream(String),
    /// A model's provider refused or failed a relayed call: the message
    /// names the lane, the model, the provider's status and its words
    /// (never the endpoint's key or address). Retryable when the provider's
    /// status says a later try may succeed (after `wait_ms`, when it asked).
    #[error("{message}")]
    Provider {
        /// Explanation.
        message: String,
        /// Whether a later try may succeed.
        retryable: bool,
        /// The wait the provider asked for, in milliseconds.
        wait_ms: Option<u64>,
    },
    /// Waited too long. Retryable.
    #[error("{0}")]
    Timeout(String),
    /// A bug. Not retryable.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The stable code clients and the audit log see.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Unauthorized(_) => "unauthorized",
            Error::Forbidden(_) => "forbidden",
            Error::NotFound(_) => "not_found",
            Error::Malformed(_) => "bad_request",
            Error::Conflict(_) => "conflict",
            Error::TooLarge(_) => "payload_too_large",
            Error::Invalid(_) => "invalid",
            Error::EventRefused { .. } => "event_refused",
            Error::RateLimited { retry_after_s: Some(_), .. } => "rate_limited",
            Error::RateLimited { retry_after_s: None, .. } => "budget_exhausted",
            Error::NotImplemented(_) => "not_implemented",
            Error::Unavailable(_) => "unavailable",
            Error::Upstream(_) => "bad_gateway",
            Error::Provider { .. } => "provider_refused",
            Error::Timeout(_) => "timeout",
            Error::Internal(_) => "internal",
        }
    }

    /// Whether retrying the same request later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Error::RateLimited { retry_after_s: Some(_), .. }
                | Error::Unavailable(_)
                | Error::Upstream(_)
                | Error::Timeout(_)
                | Error::Provider { retryable: true, .. }
        )
    }
}

impl From<DbError> for Error {
    fn from(e: DbError) -> Self {
        if let DbError::Dimensions { .. } = e {
            return Error::Conflict(e.to_string());
        }
        if let DbError::Busy { .. } = e {
            // Said as it is (no detail of the database in it); not logged
            // per request: a flooding agent would flood the journal.
            log::debug!("{e}");
            return Error::Unavailable(e.to_string());
        }
        // The detail (hosts, sockets, SQL) stays in choird's log: an agent or a
        // client learns only that it may try again.
        log::error!("{e}");
        Error::Unavailable("choird's database is unavailable, try again".into())
    }
}
