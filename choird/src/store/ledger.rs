//! The cost ledger's rows on their way to PostgreSQL (`llm_calls`, and
//! the day's sum in `token_usage`). A relayed model call's row waits here
//! and goes with the next answer an agent stores ([`ledger_rows`] in that
//! answer's statement, so in its commit), instead of a statement and a
//! commit of its own: on a plain turn that was a third of PostgreSQL's
//! work. Rows no answer carried are written together by the signal loop's
//! round, within a second.
//!
//! **Invariants:**
//! - every read of the ledger through the store sees every row recorded
//!   before it: each such read writes the waiting rows first
//!   ([`Store::flush_ledger`]);
//! - a row carries its own time, so where it lands (its day, a job's
//!   window) does not depend on when it was written;
//! - at most [`MAX_WAITING`] rows wait: the call that would pass it writes
//!   them at once, as every call did before;
//! - a row that makes its carrier's statement fail is written alone, and
//!   dropped with a log line if that fails too: a bad row never keeps an
//!   answer from being stored.
//!
//! What waits is lost if choird itself dies (not if it stops: it writes
//! them on the way out): at most a second of calls' rows, the tolerance
//! the ledger already had (its rows were committed without waiting for
//! their flush, so a crash of PostgreSQL lost as much). The budgets are
//! counted in memory as calls settle (`budget.rs`); only their load after
//! a start reads the ledger.

use choir_common::ids::AgentId;
use parking_lot::Mutex;
use serde::Serialize;

use super::{Store, Tokens};
use crate::db::DbError;

/// Most rows waiting for a carrier.
pub const MAX_WAITING: usize = 256;

/// The CTEs that write a JSON array of ledger rows (parameter `$p`, a
/// `jsonb`): the calls in their order, and their tokens added to each
/// agent's day. Data-modifying CTEs, so they run whatever the rest of the
/// statement does. Shared by [`FLUSH`] and the answer's statement
/// (`turns.rs`).
macro_rules! ledger_rows {
    ($p:literal) => {
        concat!(
            "ledger AS (SELECT e.ord, e.v, to_timestamp((e.v->>'t')::float8) AS at
                        FROM jsonb_array_elements(",
            $p,
            "::jsonb) WITH ORDINALITY AS e(v, ord)),
             ledger_calls AS (
                 INSERT INTO llm_calls (at, agent_id, session_id, lane, model, status, prompt_tokens,
                                        completion_tokens, duration_ms, estimated, cost_usd, job,
                                        cache_read_tokens, cache_write_tokens)
                 SELECT at, v->>'a', (v->>'s')::bigint, v->>'l', v->>'m', (v->>'st')::integer, (v->>'p')::bigint,
                        (v->>'c')::bigint, (v->>'d')::bigint, (v->>'e')::boolean, (v->>'$')::float8, v->>'j',
                        (v->>'cr')::bigint, (v->>'cw')::bigint
                 FROM ledger ORDER BY ord),
             ledger_usage AS (
                 INSERT INTO token_usage (agent_id, day, tokens)
                 SELECT v->>'a', (at AT TIME ZONE 'UTC')::date, sum((v->>'p')::bigint + (v->>'c')::bigint)
                 FROM ledger GROUP BY 1, 2 HAVING sum((v->>'p')::bigint + (v->>'c')::bigint) > 0
                 ON CONFLICT (agent_id, day) DO UPDATE SET tokens = token_usage.tokens + EXCLUDED.tokens)"
        )
    };
}
pub(crate) use ledger_rows;

/// Waiting rows written by themselves: one statement, committed without
/// waiting for its WAL flush (`set_config(…, true)`: local to this
/// statement's transaction); the next synchronous commit flushes it.
const FLUSH: &str = concat!("WITH ", ledger_rows!("$1"), " SELECT set_config('synchronous_commit', 'off', true)");

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

/// The rows waiting for a carrier.
#[derive(Debug, Default)]
pub struct Ledger {
    waiting: Mutex<Vec<Call>>,
}

impl Ledger {
    /// How many rows wait.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().len()
    }

    /// Takes every waiting row, as the JSON array [`ledger_rows`] reads
    /// (empty: `[]`).
    pub(super) fn take(&self) -> (Vec<Call>, serde_json::Value) {
        let calls = std::mem::take(&mut *self.waiting.lock());
        let json = serde_json::to_value(&calls).unwrap_or_else(|_| serde_json::Value::Array(Vec::new()));
        (calls, json)
    }
}

impl Store {
    /// Records one relayed model call: it waits for the next answer's
    /// statement, or is written at once when [`MAX_WAITING`] rows wait.
    pub fn record_llm_call(&self, call: Call) -> Result<(), DbError> {
        let full = {
            let mut waiting = self.ledger.waiting.lock();
            waiting.push(call);
            waiting.len() >= MAX_WAITING
        };
        if full {
            self.flush_ledger()?;
        }
        Ok(())
    }

    /// Writes every waiting row now (before a read of the ledger; the
    /// signal loop's round; the way out). When the statement fails the
    /// rows wait again; when the database refused it (a row it will not
    /// take), each row is written alone and a refused one is dropped, with
    /// the last such error returned for the log.
    pub fn flush_ledger(&self) -> Result<(), DbError> {
        let (calls, json) = self.ledger.take();
        if calls.is_empty() {
            return Ok(());
        }
        match self.write_rows(&json) {
            Ok(()) => Ok(()),
            Err(e) if refused(&e) => {
                let mut last = Ok(());
                for call in calls {
                    let one = serde_json::to_value([&call]).unwrap_or_default();
                    if let Err(e) = self.write_rows(&one) {
                        last = Err(e);
                    }
                }
                last
            }
            Err(e) => {
                self.wait_again(calls);
                Err(e)
            }
        }
    }

    /// How many ledger rows wait for a carrier.
    pub fn ledger_waiting(&self) -> usize {
        self.ledger.waiting()
    }

    /// [`Store::flush_ledger`] before a read of the ledger: a failure is
    /// logged, and the read goes on with what is written (a database that
    /// cannot take the rows fails the read too, with its own error).
    pub(super) fn flush_ledger_for_read(&self) {
        if let Err(e) = self.flush_ledger() {
            log::error!("the cost ledger's waiting rows were not written before a read of it: {e}");
        }
    }

    /// Rows a carrier's statement failed with: written now, each alone if
    /// need be, so a row the database refuses never fails the next answer
    /// too.
    pub(super) fn write_alone(&self, calls: Vec<Call>) {
        let n = calls.len();
        self.wait_again(calls);
        if let Err(e) = self.flush_ledger() {
            log::error!("model call(s) not recorded in the cost ledger (of {n} and those waiting): {e}");
        }
    }

    /// Puts `calls` back at the head of the waiting rows, the oldest
    /// dropped past [`MAX_WAITING`].
    fn wait_again(&self, calls: Vec<Call>) {
        let mut waiting = self.ledger.waiting.lock();
        let later = std::mem::replace(&mut *waiting, calls);
        waiting.extend(later);
        let over = waiting.len().saturating_sub(MAX_WAITING);
        if over > 0 {
            log::error!("{over} model call(s) not recorded in the cost ledger: the database is not reachable");
            waiting.drain(..over);
        }
    }

    fn write_rows(&self, json: &serde_json::Value) -> Result<(), DbError> {
        self.db.with(|c| {
            let flush = c.prepared(FLUSH)?;
            c.query_one(&flush, &[json]).map(drop)
        })
    }
}

/// The database refused the statement itself (a data or integrity error),
/// as opposed to failing to run it.
fn refused(e: &DbError) -> bool {
    match e {
        DbError::Query(q) => q.code().is_some_and(|c| matches!(&c.code()[..2], "22" | "23" | "42")),
        _ => false,
    }
}
