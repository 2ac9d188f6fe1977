//! A relayed model call as the cost ledger keeps it ([`Call`], its
//! [`Tokens`]), and the queue of calls waiting to be written ([`Ledger`]):
//! what `ledger.rs` writes, with the next answer's statement or by
//! themselves.
//!
//! **Invariant:** every take of waiting rows ends ([`Ledger::end`]): the
//! rows written, put back at the head of the queue, or dropped; a read
//! waits for the takes begun before it ([`Ledger::settled`]).

use std::collections::BTreeSet;

use choir_common::ids::AgentId;
use parking_lot::{Condvar, Mutex};
use serde::Serialize;

/// The tokens of one model call: prompt (cache reads and writes included)
/// and completion, and of the prompt, what the provider read from and wrote
/// to its prompt cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens, all of them.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Of the prompt, read from the provider's cache.
    pub cache_read: u64,
    /// Of the prompt, written to the provider's cache.
    pub cache_write: u64,
}

impl Tokens {
    /// Prompt and completion tokens, no cache.
    pub fn plain(prompt: u64, completion: u64) -> Tokens {
        Tokens { prompt, completion, ..Tokens::default() }
    }

    /// What `answer` (a chat completion or chunk) reports, if it does.
    pub fn reported(answer: &serde_json::Value) -> Option<Tokens> {
        let u = choir_common::openai::reported_usage(answer)?;
        let (cache_read, cache_write) = choir_common::openai::reported_cache(answer);
        Some(Tokens { prompt: u.prompt_tokens, completion: u.completion_tokens, cache_read, cache_write })
    }
}

/// Most rows waiting for a carrier.
pub const MAX_WAITING: usize = 256;

/// One relayed model call, as the ledger keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// The agent.
    #[serde(rename = "a")]
    pub agent: String,
    /// Its session.
    #[serde(rename = "s")]
    pub session: i64,
    /// The lane.
    #[serde(rename = "l")]
    pub lane: String,
    /// The core job it ran for, if any.
    #[serde(rename = "j")]
    pub job: Option<String>,
    /// The model that answered (or refused).
    #[serde(rename = "m")]
    pub model: String,
    /// The endpoint's HTTP status (0: no answer).
    #[serde(rename = "st")]
    pub status: u16,
    /// Prompt tokens.
    #[serde(rename = "p")]
    pub prompt: u64,
    /// Completion tokens.
    #[serde(rename = "c")]
    pub completion: u64,
    /// Of the prompt, read from the provider's cache.
    #[serde(rename = "cr")]
    pub cache_read: u64,
    /// Of the prompt, written to it.
    #[serde(rename = "cw")]
    pub cache_write: u64,
    /// How long the call took.
    #[serde(rename = "d")]
    pub duration_ms: u64,
    /// The tokens were estimated (the endpoint reported none).
    #[serde(rename = "e")]
    pub estimated: bool,
    /// Its price, when the model has one.
    #[serde(rename = "$")]
    pub cost_usd: Option<f64>,
    /// When it was recorded, in seconds since the epoch (microseconds kept).
    #[serde(rename = "t")]
    pub at: f64,
}

impl Call {
    /// A call of `agent` with `used` tokens (added to its day), recorded now.
    #[allow(clippy::too_many_arguments)]
    pub fn now(
        agent: &AgentId,
        session: i64,
        lane: &str,
        job: Option<&str>,
        model: &str,
        status: u16,
        used: Tokens,
        duration_ms: u64,
        estimated: bool,
        cost_usd: Option<f64>,
    ) -> Call {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as f64 / 1e6)
            .unwrap_or(0.0);
        Call {
            agent: agent.as_str().to_owned(),
            session,
            lane: lane.to_owned(),
            job: job.map(str::to_owned),
            model: model.to_owned(),
            status,
            prompt: used.prompt,
            completion: used.completion,
            cache_read: used.cache_read,
            cache_write: used.cache_write,
            duration_ms,
            estimated,
            // A price that is not a number is no price (JSON has no NaN).
            cost_usd: cost_usd.filter(|c| c.is_finite()),
            at,
        }
    }
}

/// How long a read of the ledger waits for rows another thread is
/// writing (a carrier's statement, the round) before it reads anyway.
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The rows waiting for a carrier, and the takes still writing theirs.
#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<Queue>,
    /// Signalled when a take ends.
    ended: Condvar,
}

#[derive(Debug, Default)]
struct Queue {
    waiting: Vec<Call>,
    /// The tickets of the takes not yet ended (written, put back or dropped).
    in_flight: BTreeSet<u64>,
    next: u64,
}

/// Rows taken to be written: [`Ledger::end`] must follow, whatever came of it.
pub(super) struct Taken {
    /// The rows, in their order.
    pub calls: Vec<Call>,
    /// The same, as the JSON array `ledger_rows!` reads (empty: `[]`).
    pub json: serde_json::Value,
    pub(super) ticket: u64,
}

impl Ledger {
    /// Queues `call`; whether [`MAX_WAITING`] rows now wait.
    pub(super) fn push(&self, call: Call) -> bool {
        let mut q = self.state.lock();
        q.waiting.push(call);
        q.waiting.len() >= MAX_WAITING
    }

    /// How many rows wait.
    pub fn waiting(&self) -> usize {
        self.state.lock().waiting.len()
    }

    /// Takes every waiting row, to be written; none is taken (and no
    /// ticket) when none waits.
    pub(super) fn take(&self) -> Option<Taken> {
        let mut q = self.state.lock();
        if q.waiting.is_empty() {
            return None;
        }
        let calls = std::mem::take(&mut q.waiting);
        let ticket = q.next;
        q.next += 1;
        q.in_flight.insert(ticket);
        drop(q);
        let json = serde_json::to_value(&calls).unwrap_or_else(|_| serde_json::Value::Array(Vec::new()));
        Some(Taken { calls, json, ticket })
    }

    /// Ends a take; `back` rows go back at the head of the waiting ones
    /// (the oldest dropped past [`MAX_WAITING`]).
    pub(super) fn end(&self, ticket: u64, back: Vec<Call>) {
        let mut q = self.state.lock();
        if !back.is_empty() {
            let later = std::mem::replace(&mut q.waiting, back);
            q.waiting.extend(later);
            let over = q.waiting.len().saturating_sub(MAX_WAITING);
            if over > 0 {
                log::error!("{over} model call(s) not recorded in the cost ledger: the database is not reachable");
                q.waiting.drain(..over);
            }
        }
        q.in_flight.remove(&ticket);
        drop(q);
        self.ended.notify_all();
    }

    /// Waits (at most [`IN_FLIGHT_WAIT`]) until every take begun before
    /// now has ended, so a read sees the rows they were writing.
    pub(super) fn settled(&self) {
        let mut q = self.state.lock();
        let mark = q.next;
        let deadline = std::time::Instant::now() + IN_FLIGHT_WAIT;
        while q.in_flight.first().is_some_and(|t| *t < mark) {
            if self.ended.wait_until(&mut q, deadline).timed_out() {
                log::warn!("a read of the cost ledger did not wait longer for rows being written");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn call() -> Call {
        let agent = AgentId::parse("a").unwrap();
        Call::now(&agent, 1, "edge", None, "m", 200, Tokens::plain(1, 1), 1, false, None)
    }

    /// A read found the queue empty while a carrier's statement was still
    /// writing the rows it took, and read without them (a job's cost
    /// stored short for good). Now it waits for every take begun before
    /// it, and for none begun after.
    #[test]
    fn regression_a_read_did_not_see_the_rows_another_thread_was_writing() {
        let ledger = Arc::new(Ledger::default());
        ledger.state.lock().waiting.push(call());
        let taken = ledger.take().expect("a row waits");
        assert!(ledger.take().is_none(), "nothing is left to take");
        let (tx, rx) = crossbeam_channel::bounded(1);
        let reader = {
            let ledger = ledger.clone();
            std::thread::spawn(move || {
                ledger.settled();
                let _ = tx.send(Instant::now());
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(rx.try_recv().is_err(), "the read went on while the rows were being written");
        // A take begun after the read started is not waited for.
        ledger.state.lock().waiting.push(call());
        let later = ledger.take().expect("a second row");
        let ended = Instant::now();
        ledger.end(taken.ticket, Vec::new());
        let read = rx.recv_timeout(Duration::from_secs(5)).expect("the read goes on once the first take ended");
        assert!(read >= ended);
        reader.join().unwrap();
        // Rows put back wait again, at the head, for the next carrier.
        ledger.state.lock().waiting.push(call());
        ledger.end(later.ticket, later.calls);
        assert_eq!(ledger.waiting(), 2);
        assert!(ledger.state.lock().in_flight.is_empty());
    }
}
