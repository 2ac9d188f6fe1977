//! The LLM client: OpenAI-compatible chat completions through choird's relay
//! (`/llm/<lane>/v1/chat/completions`), with retries on rate limits, server
//! errors and transport failures (exponential backoff with jitter, honouring
//! `Retry-After`). The API key is added by choird; the agent never has it.

use std::sync::Arc;
use std::time::Duration;

use choir_common::openai::{ChatRequest, ChatResponse};

use crate::rpc::{refusal, Rpc, RpcError};

/// Attempts per model call.
const ATTEMPTS: u32 = 4;
/// Longest single wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time allowed for one model call.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// A model call failed for good.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The relay or the provider refused, after retries where retrying made sense.
    #[error("the model call failed: {0}")]
    Rpc(#[from] RpcError),
    /// The provider's answer is not a chat completion.
    #[error("the model's answer is not a valid chat completion: {0}")]
    Malformed(String),
}

/// The client.
pub struct Llm {
    rpc: Arc<Rpc>,
}

impl Llm {
    /// A client over the agent's RPC connection.
    pub fn new(rpc: Arc<Rpc>) -> Llm {
        Llm { rpc }
    }

    /// One completion for `lane` (`edge` or `core`).
    pub fn complete(&self, lane: &str, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let path = format!("/llm/{lane}/v1/chat/completions");
        let body = serde_json::to_vec(req).map_err(|e| LlmError::Malformed(e.to_string()))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let err = match self.rpc.post_raw(&path, &body, CALL_TIMEOUT) {
                Ok(answer) if answer.status == 200 => {
                    return serde_json::from_slice(&answer.body).map_err(|e| LlmError::Malformed(e.to_string()));
                }
                Ok(answer) => refusal("LLM", &answer),
                Err(e) => e,
            };
            if !err.retryable() || attempt >= ATTEMPTS {
                return Err(err.into());
            }
            let wait = match &err {
                RpcError::Refused { retry_after_s: Some(s), .. } => Duration::from_secs(*s),
                _ => backoff(attempt),
            }
            .min(MAX_BACKOFF);
            log::warn!("model call attempt {attempt} failed ({err}); retrying in {wait:?}");
            std::thread::sleep(wait);
        }
    }
}

/// 500 ms · 2^(attempt-1), plus up to 50% jitter.
fn backoff(attempt: u32) -> Duration {
    let base = 500u64.saturating_mul(1 << (attempt - 1).min(10));
    let mut b = [0u8; 2];
    let jitter = if getrandom::fill(&mut b).is_ok() { u64::from(u16::from_le_bytes(b)) % (base / 2 + 1) } else { 0 };
    Duration::from_millis(base + jitter)
}
