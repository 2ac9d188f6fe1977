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

pub mod anthropic;
pub mod refusal;

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::time::{Duration, Instant};

use crate::config::{Lane, LlmEndpoint, Protocol};
use crate::error::Error;
use crate::secrets::Secrets;

/// The upstream HTTP client (non-2xx statuses are answers, not errors),
/// and the fallbacks it took per agent (for `agent status`).
pub struct Upstream {
    agent: ureq::Agent,
    fallbacks: parking_lot::Mutex<HashMap<String, Vec<Fallback>>>,
}

/// One switch to a fallback model.
#[derive(Debug, Clone)]
struct Fallback {
    at: Instant,
    lane: Lane,
    to: String,
}

/// How long a fallback is told in `agent status`.
const FALLBACKS_SHOWN: Duration = Duration::from_secs(24 * 3600);
/// Fallbacks remembered per agent (the oldest forgotten first).
const FALLBACKS_KEPT: usize = 1000;

impl Default for Upstream {
    fn default() -> Self {
        Upstream::new()
    }
}

impl Upstream {
    /// `endpoint`'s key, if it has one and it is set.
    pub fn key<'s>(endpoint: &LlmEndpoint, secrets: &'s Secrets) -> Option<&'s str> {
        endpoint.api_key_secret.as_deref().and_then(|name| secrets.get(name))
    }

    /// A client.
    pub fn new() -> Upstream {
        Upstream {
            agent: crate::resolver::agent(ureq::config::Config::builder().http_status_as_error(false)),
            fallbacks: parking_lot::Mutex::default(),
        }
    }

    /// Notes that `agent`'s `lane` call went to the fallback model `to`.
    pub fn fell_back(&self, agent: &str, lane: Lane, to: &str) {
        let mut all = self.fallbacks.lock();
        let seen = all.entry(agent.to_owned()).or_default();
        seen.retain(|f| f.at.elapsed() < FALLBACKS_SHOWN);
        if seen.len() >= FALLBACKS_KEPT {
            seen.remove(0);
        }
        seen.push(Fallback { at: Instant::now(), lane, to: to.to_owned() });
    }

    /// `agent`'s fallbacks of the last day, in words (`None`: none).
    pub fn fallbacks_of(&self, agent: &str) -> Option<String> {
        let all = self.fallbacks.lock();
        let seen: Vec<&Fallback> = all.get(agent)?.iter().filter(|f| f.at.elapsed() < FALLBACKS_SHOWN).collect();
        let last = seen.last()?;
        Some(format!(
            "{} in the last 24 h; the last: the {} lane to {}, {} ago",
            seen.len(),
            last.lane.as_str(),
            last.to,
            choir_common::text::human_duration(last.at.elapsed())
        ))
    }

    /// POSTs `body` (an OpenAI chat request, JSON) to `endpoint` (one of
    /// `lane`'s) with its key, in the endpoint's protocol (`<base_url>/chat/completions`,
    /// or Anthropic's `<base_url>/messages`, see [`anthropic`]); `streamed`
    /// when the body asks for a streamed answer; `who` names the caller in
    /// choird's log. A 200 answer reads as OpenAI's, whatever the protocol.
    pub fn chat(
        &self,
        endpoint: &LlmEndpoint,
        secrets: &Secrets,
        lane: Lane,
        body: &[u8],
        streamed: bool,
        who: &str,
    ) -> Result<Answer, Error> {
        let anthropic = endpoint.protocol == Protocol::Anthropic;
        let base = endpoint.base_url.trim_end_matches('/');
        let url = if anthropic { format!("{base}/messages") } else { format!("{base}/chat/completions") };
        let mut request = self
            .agent
            .post(&url)
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
            request = if anthropic {
                request.header("x-api-key", key)
            } else {
                request.header("Authorization", &format!("Bearer {key}"))
            };
        }
        let translated;
        let body = if anthropic {
            request = request.header("anthropic-version", anthropic::VERSION);
            let openai: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| Error::Malformed(format!("the model request is not JSON: {e}")))?;
            translated = anthropic::request(&openai, endpoint.thinking_budget_tokens).to_string().into_bytes();
            &translated[..]
        } else {
            body
        };
        let answer = request.send(body).map_err(|e| {
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
        })?;
        let status = answer.status().as_u16();
        let (parts, body) = answer.into_parts();
        let reader = body.into_reader();
        let body: Box<dyn Read + Send> = match (anthropic, status, streamed) {
            (true, 200, true) => Box::new(anthropic::Events::new(BufReader::new(reader))),
            (true, 200, false) => {
                let mut whole = Vec::new();
                reader.take(MAX_WHOLE).read_to_end(&mut whole).map_err(|e| {
                    log::warn!("{who}: the {} model's answer could not be read: {e}", lane.as_str());
                    Error::Upstream(format!("the {} model's answer could not be read", lane.as_str()))
                })?;
                let message: serde_json::Value = serde_json::from_slice(&whole)
                    .map_err(|_| Error::Upstream(format!("the {} model's answer is not JSON", lane.as_str())))?;
                Box::new(std::io::Cursor::new(anthropic::answer(&message).to_string().into_bytes()))
            }
            _ => Box::new(reader),
        };
        Ok(Answer { status, headers: parts.headers, body })
    }
}

/// Largest whole answer translated from another protocol.
const MAX_WHOLE: u64 = 32 * 1024 * 1024;

/// An endpoint's answer: its status, its headers, and its body (a 200's
/// read as OpenAI's chat completion or chunk events).
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    headers: ureq::http::HeaderMap,
    /// The body.
    pub body: Box<dyn Read + Send>,
}

impl Answer {
    /// A header's value, by name.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
    }

    /// The whole body, refused past `limit` bytes.
    pub fn read_to_vec(&mut self, limit: u64) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.body.by_ref().take(limit + 1).read_to_end(&mut out)?;
        if out.len() as u64 > limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the answer is over {limit} bytes"),
            ));
        }
        Ok(out)
    }
}
