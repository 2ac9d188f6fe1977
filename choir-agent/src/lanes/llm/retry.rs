//! When a failed model call is tried again, and when it is not: a few
//! attempts with exponential backoff and jitter, the wait the provider asked
//! for honoured (choird passes it on as `retry-after-ms` / `Retry-After`,
//! read from the provider's `retry-after-ms`, `Retry-After` in seconds or as
//! an HTTP date, or `x-ratelimit-reset-*`), and never longer than a person
//! waits for an answer: a provider asking for more than [`PATIENCE`] is told
//! to the user at once, not after minutes of retries.
//!
//! **Invariant:** every wait ends early once the call is abandoned, and the
//! time spent waiting in one call is at most [`PATIENCE`].

use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::rpc::RpcError;

use super::error::LlmError;

/// Attempts per model call.
pub const ATTEMPTS: u32 = 4;
/// The longest a call spends waiting between its attempts, in all.
pub const PATIENCE: Duration = Duration::from_secs(45);

/// One attempt's failure.
pub enum Attempt {
    /// May succeed if tried again, after the wait asked for (if any).
    Failed(LlmError, Option<Duration>),
    /// The answer's stream began and was cut before the model finished: at
    /// a chunk's boundary, inside a chunk, or by a broken connection, all
    /// alike. Retried as a failure is; reported as the model's.
    Cut(String),
    /// Will not.
    Fatal(LlmError),
}

impl From<RpcError> for Attempt {
    fn from(e: RpcError) -> Attempt {
        let wait = match &e {
            RpcError::Refused { retry_after, .. } => *retry_after,
            _ => None,
        };
        if e.retryable() {
            Attempt::Failed(LlmError::from_rpc(e), wait)
        } else {
            Attempt::Fatal(LlmError::from_rpc(e))
        }
    }
}

/// Runs `f` until it succeeds, fails for good, or the attempts or the
/// patience run out; gives up at once when `abandoned` is set.
pub fn retrying<T>(abandoned: &Cancel, mut f: impl FnMut() -> Result<T, Attempt>) -> Result<T, LlmError> {
    let mut attempt = 0;
    let started = Instant::now();
    let mut waited = Duration::ZERO;
    loop {
        attempt += 1;
        let (failed, asked) = match f() {
            Ok(v) => return Ok(v),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Failed(e, _)) if attempt >= ATTEMPTS => return Err(e),
            Err(Attempt::Cut(why)) if attempt >= ATTEMPTS => return Err(LlmError::Cut { attempts: attempt, why }),
            Err(Attempt::Failed(e, asked)) => (e, asked),
            Err(Attempt::Cut(why)) => (LlmError::Cut { attempts: attempt, why }, None),
        };
        if abandoned.is_set() {
            return Err(LlmError::Cancelled);
        }
        let left = PATIENCE.saturating_sub(waited);
        if let Some(asked) = asked.filter(|a| *a > left) {
            // Longer than anyone waits for an answer: said now.
            return Err(LlmError::WaitTooLong { wait: asked, why: Box::new(failed) });
        }
        let wait = asked.unwrap_or_else(|| backoff(attempt)).min(left);
        log::warn!("model call attempt {attempt} failed ({failed}); retrying in {wait:?}");
        if !sleep(wait, abandoned) {
            return Err(LlmError::Cancelled);
        }
        waited += wait;
        log::debug!("model call: attempt {} after {:?}", attempt + 1, started.elapsed());
    }
}

/// Sleeps `wait` unless abandoned first (`false` then): woken by the
/// abandonment or the deadline, never by a clock in between.
fn sleep(wait: Duration, abandoned: &Cancel) -> bool {
    let listening = abandoned.listen();
    if abandoned.is_set() {
        return false;
    }
    crossbeam_channel::select! {
        recv(listening.woken()) -> _ => false,
        recv(crossbeam_channel::at(Instant::now() + wait)) -> _ => true,
    }
}

/// 500 ms · 2^(attempt-1), plus up to 50% jitter.
fn backoff(attempt: u32) -> Duration {
    let base = 500u64.saturating_mul(1 << (attempt - 1).min(10));
    let mut b = [0u8; 2];
    let jitter = if getrandom::fill(&mut b).is_ok() { u64::from(u16::from_le_bytes(b)) % (base / 2 + 1) } else { 0 };
    Duration::from_millis(base + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(retry_after: Option<Duration>) -> Attempt {
        Attempt::from(RpcError::Refused {
            verb: "LLM".into(),
            status: 502,
            code: super::super::error::PROVIDER_CODE.into(),
            message: "the edge model's provider answered 429: slow down".into(),
            retryable: true,
            retry_after,
        })
    }

    /// Every attempt cut: the error says so (the model's failure, with the
    /// attempts), not that choird could not be reached.
    #[test]
    fn a_call_whose_every_attempt_is_cut_fails_as_cut_after_the_attempts() {
        let mut tries = 0;
        let r: Result<(), LlmError> = retrying(&Cancel::new(), || {
            tries += 1;
            Err(Attempt::Cut("the stream ended inside a chunk".into()))
        });
        assert_eq!(tries, ATTEMPTS);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("cut off before it finished") && !e.contains("choird"), "{e}");
    }

    /// Regression: a provider asking to wait an hour still cost the user
    /// 90 s of retries before they heard anything.
    #[test]
    fn regression_a_wait_longer_than_anyone_waits_is_said_at_once() {
        let mut tries = 0;
        let started = Instant::now();
        let r: Result<(), LlmError> = retrying(&Cancel::new(), || {
            tries += 1;
            Err(provider(Some(Duration::from_secs(3600))))
        });
        assert_eq!(tries, 1, "not tried again");
        assert!(started.elapsed() < Duration::from_secs(5));
        let words = r.unwrap_err().user_words();
        assert!(words.contains("1 h") && words.contains("slow down"), "{words}");
        // Negative control: a short wait asked for is waited, and tried again.
        let mut tries = 0;
        let r: Result<(), LlmError> = retrying(&Cancel::new(), || {
            tries += 1;
            if tries < 2 {
                Err(provider(Some(Duration::from_millis(20))))
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok() && tries == 2);
    }

    #[test]
    fn an_abandoned_call_stops_waiting() {
        let abandoned = Cancel::new();
        let started = Instant::now();
        let r: Result<(), LlmError> = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                abandoned.set();
            });
            retrying(&abandoned, || Err(provider(Some(Duration::from_secs(30)))))
        });
        assert!(matches!(r, Err(LlmError::Cancelled)), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    /// The wait between attempts slept in 50 ms slices to look at the
    /// abandonment: twenty wake-ups a second of a provider's asked wait.
    /// Now the deadline or the abandonment wakes it, nothing between.
    #[test]
    fn regression_the_wait_between_attempts_woke_every_50_ms() {
        let woke = crate::cancel::fewest_wake_ups(|| {
            let mut tries = 0;
            let r: Result<(), LlmError> = retrying(&Cancel::new(), || {
                tries += 1;
                if tries == 1 {
                    Err(provider(Some(Duration::from_secs(1))))
                } else {
                    Ok(())
                }
            });
            assert!(r.is_ok() && tries == 2);
        });
        assert!(woke <= 4, "the wait of 1 s woke its thread {woke} times");
    }
}
