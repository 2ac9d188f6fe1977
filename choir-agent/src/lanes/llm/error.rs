//! How a model call failed for good, and the words its user is told.

use std::time::Duration;

use crate::rpc::RpcError;

use super::answer::Verdict;

/// How a [`LlmError::Cut`] begins, for the edge's words to the user.
pub const CUT_PREFIX: &str = "the model's answer was cut off";
/// The code of choird's error for a provider's refusal (its message names
/// the provider's status and words).
pub const PROVIDER_CODE: &str = "provider_refused";

/// A model call failed for good.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The relay refused or could not be reached, after retries where
    /// retrying made sense.
    #[error("the model call failed: {0}")]
    Rpc(RpcError),
    /// The model's provider refused or failed (its status and words, as
    /// choird names them), after retries where retrying made sense.
    #[error("{0}")]
    Provider(String),
    /// The provider's answer is not a chat completion.
    #[error("the model's answer is not a valid chat completion: {0}")]
    Malformed(String),
    /// Every attempt's stream ended before the model finished its answer
    /// (nothing of it was used).
    #[error("the model's answer was cut off before it finished, {attempts} time(s): {why}")]
    // (The edge tells the user so: see [`CUT_PREFIX`].)
    Cut {
        /// How many attempts were cut.
        attempts: u32,
        /// The last cut, as seen.
        why: String,
    },
    /// The provider's content filter stopped the answer.
    #[error("the model provider's content filter stopped the answer")]
    Filtered,
    /// The model declined, saying this.
    #[error("the model declined: {0}")]
    Refused(String),
    /// The provider asked to wait longer than anyone waits for an answer.
    #[error("the model's provider asks to wait {} before trying again ({why})", human(*wait))]
    WaitTooLong {
        /// The wait asked for.
        wait: Duration,
        /// What failed.
        why: Box<LlmError>,
    },
    /// The lane was cancelled while it waited.
    #[error("cancelled while waiting for the model")]
    Cancelled,
}

/// `d` in the largest whole unit.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..=119 => format!("{s} s"),
        120..=3599 => format!("{} min", s.div_ceil(60)),
        _ => format!("{} h", s / 3600),
    }
}

impl LlmError {
    /// A relay error: a provider's refusal named as the provider's.
    pub(super) fn from_rpc(e: RpcError) -> LlmError {
        match e {
            RpcError::Refused { code, message, .. } if code == PROVIDER_CODE => LlmError::Provider(message),
            e => LlmError::Rpc(e),
        }
    }

    /// What the user is told when this ended their turn.
    pub fn user_words(&self) -> String {
        match self {
            LlmError::Cut { .. } => {
                let e = self.to_string();
                let rest = e.strip_prefix(CUT_PREFIX).unwrap_or(&e);
                format!("Sorry, my model's answer was cut off{rest}")
            }
            LlmError::Provider(m) => format!("Sorry, no answer from my model: {m}"),
            LlmError::Filtered => "Sorry, my model provider's content filter stopped the answer.".into(),
            LlmError::Refused(said) => format!("My model declined to answer: {said}"),
            LlmError::WaitTooLong { wait, why } => format!(
                "Sorry, my model's provider asks me to wait {} before trying again ({}). Please ask again later.",
                human(*wait),
                match why.as_ref() {
                    LlmError::Provider(m) => m.clone(),
                    other => other.to_string(),
                }
            ),
            LlmError::Cancelled => "Stopped, as asked.".into(),
            LlmError::Rpc(_) | LlmError::Malformed(_) => format!("Sorry, I could not reach my model: {self}"),
        }
    }
}

impl From<Verdict> for LlmError {
    fn from(v: Verdict) -> LlmError {
        match v {
            Verdict::ProviderError(m) => {
                LlmError::Provider(format!("the provider reported an error in its answer: {m}"))
            }
            Verdict::Filtered => LlmError::Filtered,
            Verdict::Refused(said) => LlmError::Refused(said),
        }
    }
}
