//! The client of the upstream LLM endpoints: one place that builds a request
//! to a lane's endpoint (URL, key, patience), for the relay and for the
//! completions choird asks for on an agent's behalf, and reads a provider's
//! refusal ([`refusal`]).
//!
//! Two patiences: a streamed answer may be silent for at most the
//! endpoint's `timeout_s` at a time (before its first byte and between any
//! two) and may take `answer_timeout_s` in all; a whole answer has
//! `answer_timeout_s`.
//!
//! **Invariant:** the API key exists only in choird's memory and in the
//! upstream request; an error returned from here names the lane, never the
//! endpoint's address (that goes to choird's log).

pub mod refusal;

use std::time::Duration;

use crate::config::{Config, Lane};
use crate::error::Error;
use crate::secrets::Secrets;

/// The upstream HTTP client (non-2xx statuses are answers, not errors).
pub struct Upstream {
    agent: ureq::Agent,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream::new()
    }
}

impl Upstream {
    /// The endpoint's key for `lane`, if it has one and it is set.
    pub fn key<'s>(config: &Config, secrets: &'s Secrets, lane: Lane) -> Option<&'s str> {
        config.endpoint(lane).api_key_secret.as_deref().and_then(|name| secrets.get(name))
    }

    /// A client.
    pub fn new() -> Upstream {
        Upstream { agent: crate::resolver::agent(ureq::config::Config::builder().http_status_as_error(false)) }
    }

    /// POSTs `body` (JSON) to `<lane's base_url>/chat/completions` with the
    /// lane's key; `streamed` when the body asks for a streamed answer;
    /// `who` names the caller in choird's log.
    pub fn chat(
        &self,
        config: &Config,
        secrets: &Secrets,
        lane: Lane,
        body: &[u8],
        streamed: bool,
        who: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, Error> {
        let endpoint = config.endpoint(lane);
        let mut request = self
            .agent
            .post(&format!("{}/chat/completions", endpoint.base_url.trim_end_matches('/')))
            .config()
            .timeout_global(Some(Duration::from_secs(endpoint.answer_timeout_s())))
            .timeout_per_read(streamed.then(|| Duration::from_secs(endpoint.timeout_s)))
            .build()
            .header("Content-Type", "application/json");
        if let Some(name) = &endpoint.api_key_secret {
            let key = secrets.get(name).ok_or_else(|| {
                Error::Unavailable(format!(
                    "the {} lane's API key secret {name:?} is not set in secrets.json",
                    lane.as_str()
                ))
            })?;
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        request.send(body).map_err(|e| {
            log::warn!("{who}: LLM endpoint {} ({} lane): {e}", endpoint.base_url, lane.as_str());
            let message = match e {
                ureq::Error::Timeout(ureq::Timeout::PerRead) => format!(
                    "the {} model's endpoint was silent for more than {} s (its timeout_s)",
                    lane.as_str(),
                    endpoint.timeout_s
                ),
                ureq::Error::Timeout(_) => format!(
                    "the {} model did not answer within {} s (its answer_timeout_s)",
                    lane.as_str(),
                    endpoint.answer_timeout_s()
                ),
                _ => format!("the {} model's endpoint cannot be reached", lane.as_str()),
            };
            Error::Provider { message, retryable: true, wait_ms: None }
        })
    }
}
