//! The client of the upstream LLM endpoints: one place that builds a request
//! to a lane's endpoint (URL, key, timeout), for the relay and for the
//! completions choird asks for on an agent's behalf.
//!
//! **Invariant:** the API key exists only in choird's memory and in the
//! upstream request; an error returned from here names the lane, never the
//! endpoint's address (that goes to choird's log).

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
    /// A client.
    pub fn new() -> Upstream {
        Upstream { agent: crate::resolver::agent(ureq::config::Config::builder().http_status_as_error(false)) }
    }

    /// POSTs `body` (JSON) to `<lane's base_url>/chat/completions` with the
    /// lane's key; `who` names the caller in choird's log.
    pub fn chat(
        &self,
        config: &Config,
        secrets: &Secrets,
        lane: Lane,
        body: &[u8],
        who: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, Error> {
        let endpoint = config.endpoint(lane);
        let mut request = self
            .agent
            .post(&format!("{}/chat/completions", endpoint.base_url.trim_end_matches('/')))
            .config()
            .timeout_global(Some(Duration::from_secs(endpoint.timeout_s)))
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
            match e {
                ureq::Error::Timeout(_) => Error::Timeout(format!(
                    "the {} model did not answer within {} s",
                    lane.as_str(),
                    endpoint.timeout_s
                )),
                _ => Error::Upstream(format!("the {} model's endpoint cannot be reached", lane.as_str())),
            }
        })
    }
}
