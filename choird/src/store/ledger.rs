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
//!   before it: it writes the waiting rows first, and waits (bounded) for
//!   the rows other threads took to write ([`Store::flush_ledger_for_read`]);
//! - a row carries its own time (choird's clock, as the job windows and
//!   days it lands in are PostgreSQL's: one clock on one host), so where
//!   it lands does not depend on when it was written;
//! - at most [`MAX_WAITING`] rows wait: the call that would pass it writes
//!   them at once, as every call did before;
//! - a row is counted at most once: rows go again only when the database
//!   said they were not written; when the connection failed mid-statement
//!   (perhaps after the commit) they are dropped and logged;
//! - a row that makes its carrier's statement fail is written alone, and
//!   dropped with a log line if refused again: a bad row never keeps an
//!   answer from being stored.
//!
//! What waits is lost if choird itself dies (not if it stops: it writes
//! them on the way out, once its connections are closed): at most a
//! second of calls' rows. The round's own writes commit without waiting
//! for their WAL flush, as every row did before, so a crash of PostgreSQL
//! loses as much. The budgets are counted in memory as calls settle
//! (`budget.rs`); only their load after a start reads the ledger.

use super::calls::Taken;
pub use super::calls::{Call, MAX_WAITING};
use super::Store;
use crate::db::DbError;

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
                 ORDER BY 1, 2
                 ON CONFLICT (agent_id, day) DO UPDATE SET tokens = token_usage.tokens + EXCLUDED.tokens)"
        )
    };
}
pub(crate) use ledger_rows;

/// Waiting rows written by themselves: one statement, committed without
/// waiting for its WAL flush (`set_config(…, true)`: local to this
/// statement's transaction); the next synchronous commit flushes it.
const FLUSH: &str = concat!("WITH ", ledger_rows!("$1"), " SELECT set_config('synchronous_commit', 'off', true)");

/// What became of a statement that carried rows.
enum Outcome {
    /// Written.
    Written,
    /// Not written, and the database said so: the rows can go again.
    NotWritten,
    /// The database refused them (a data or integrity error): written
    /// one by one, a refused one dropped.
    Refused,
    /// Unknown (the connection failed mid-statement, perhaps after the
    /// commit): dropped, so no row is ever counted twice.
    Unknown,
}

impl Outcome {
    /// What came of a statement that failed with `error` (none: it did not).
    fn of(error: Option<&DbError>) -> Outcome {
        match error {
            None => Outcome::Written,
            Some(DbError::Query(q)) => match q.code().map(|c| &c.code()[..2]) {
                Some("22" | "23") => Outcome::Refused,
                Some(_) => Outcome::NotWritten,
                None => Outcome::Unknown,
            },
            Some(_) => Outcome::NotWritten,
        }
    }
}

impl Store {
    /// Records one relayed model call: it waits for the next answer's
    /// statement, or is written at once when [`MAX_WAITING`] rows wait (a
    /// failure to then is logged, the rows waiting on).
    pub fn record_llm_call(&self, call: Call) {
        if self.ledger.push(call) {
            if let Err(e) = self.flush_ledger() {
                log::error!("the cost ledger's waiting rows were not written: {e}");
            }
        }
    }

    /// Writes every waiting row now (before a read of the ledger; the
    /// signal loop's round; the way out). See [`Store::carried`] for what
    /// a failure does to them.
    pub fn flush_ledger(&self) -> Result<(), DbError> {
        let Some(taken) = self.ledger.take() else { return Ok(()) };
        let out = self.write_rows(&taken.json);
        self.carried(taken, out.as_ref().err());
        out
    }

    /// Ends a take whose rows a statement carried, by what came of it:
    /// written; not written (they wait again); refused (each written
    /// alone, a refused one dropped and logged); unknown (dropped and
    /// logged: counted once at most, never twice).
    pub(super) fn carried(&self, taken: Taken, error: Option<&DbError>) {
        let Taken { calls, ticket, .. } = taken;
        match Outcome::of(error) {
            Outcome::Written => self.ledger.end(ticket, Vec::new()),
            Outcome::NotWritten => self.ledger.end(ticket, calls),
            Outcome::Unknown => {
                log::error!(
                    "{} model call(s) may not be recorded in the cost ledger: the connection failed while they were \
                     written",
                    calls.len()
                );
                self.ledger.end(ticket, Vec::new());
            }
            Outcome::Refused => {
                let mut rest = calls.into_iter();
                while let Some(call) = rest.next() {
                    let one = serde_json::to_value([&call]).unwrap_or_default();
                    let out = self.write_rows(&one);
                    match (Outcome::of(out.as_ref().err()), out) {
                        (Outcome::Written, _) | (_, Ok(())) => {}
                        (Outcome::Refused | Outcome::Unknown, Err(e)) => {
                            log::error!("a model call was not recorded in the cost ledger: {e}")
                        }
                        (Outcome::NotWritten, Err(_)) => {
                            // The database went away meanwhile: the rest waits.
                            self.ledger.end(ticket, std::iter::once(call).chain(rest).collect());
                            return;
                        }
                    }
                }
                self.ledger.end(ticket, Vec::new());
            }
        }
    }

    /// How many ledger rows wait for a carrier.
    pub fn ledger_waiting(&self) -> usize {
        self.ledger.waiting()
    }

    /// Before a read of the ledger: the waiting rows written, and the rows
    /// other threads are writing waited for (bounded). A failure is
    /// logged, and the read goes on with what is written (a database that
    /// cannot take the rows fails the read too, with its own error).
    pub fn flush_ledger_for_read(&self) {
        if let Err(e) = self.flush_ledger() {
            log::error!("the cost ledger's waiting rows were not written before a read of it: {e}");
        }
        self.ledger.settled();
    }

    fn write_rows(&self, json: &serde_json::Value) -> Result<(), DbError> {
        self.db.with(|c| {
            let flush = c.prepared(FLUSH)?;
            c.query_one(&flush, &[json]).map(drop)
        })
    }
}
