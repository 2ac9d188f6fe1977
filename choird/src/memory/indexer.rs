//! `memory-index`: moves fresh vectors into the HNSW index (issue 19, item
//! 5). The batcher stores an item's vector in `fresh`, outside the index,
//! where a query finds it by an exact scan; this thread then indexes a few
//! items per agent per round, one short transaction each, so an upsert never
//! waits for a graph search and no lock is held for long.
//!
//! At start it first brings every agent's memory schema up to date (a
//! schema made before the `fresh` column existed gets it), then works only
//! on schemas that have the column.
//!
//! **Invariant:** a round moves at most [`BATCH`] items per agent; agents
//! take turns, so one agent's backlog never holds up another's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use choir_common::ids::AgentId;
use crossbeam_channel::Receiver;

use crate::db::{DbError, FRESH_MIGRATION};
use crate::pace::{backoff, nap};
use crate::store::Store;

/// Items indexed per agent per transaction: at a million items an HNSW
/// insert takes 5-30 ms, so a transaction holds its rows for well under a
/// second.
pub const BATCH: i64 = 16;

/// How long an idle round waits for the batcher's poke before looking again.
const IDLE: Duration = Duration::from_secs(5);

/// Runs until `stop`. `dims` is the configured embedding dimension (for
/// bringing schemas up to date); `poked` wakes it when fresh vectors were
/// stored.
pub fn run(store: &Store, dims: u32, poked: &Receiver<()>, stop: &AtomicBool) {
    let mut failures = 0u32;
    // Schemas first: an agent not started since an upgrade has no `fresh`
    // column yet, and the batcher cannot store its vectors until it has.
    while !stop.load(Ordering::SeqCst) {
        match store.memory_agents(None) {
            Ok(agents) => {
                for agent in agents {
                    match store.db.migrate_agent(&agent, dims) {
                        Ok(applied) => applied.iter().for_each(|name| log::info!("memory: applied {name}")),
                        Err(e) => log::error!("memory: agent {agent}'s memory cannot be brought up to date: {e}"),
                    }
                }
                break;
            }
            Err(e) => {
                failures += 1;
                log::warn!("memory: cannot list agents' memory ({e}); retrying");
                nap(backoff(failures), stop);
            }
        }
    }
    failures = 0;
    while !stop.load(Ordering::SeqCst) {
        match round(store) {
            Ok(Round { moved, failed }) => {
                for (agent, e) in &failed {
                    log::warn!("memory: cannot index agent {agent}'s fresh vectors ({e}); retrying");
                }
                failures = if failed.is_empty() { 0 } else { failures + 1 };
                if failures > 0 {
                    nap(backoff(failures), stop);
                } else if moved == 0 {
                    let _ = poked.recv_timeout(IDLE);
                }
            }
            Err(e) => {
                failures += 1;
                log::warn!("memory: cannot list agents' memory ({e}); retrying");
                nap(backoff(failures), stop);
            }
        }
    }
}

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Items moved into the index.
    pub moved: u64,
    /// Agents whose move failed (the others still moved).
    pub failed: Vec<(AgentId, DbError)>,
}

/// One round: up to [`BATCH`] items per agent, each agent in its own
/// transaction (one failing does not stop the others).
pub fn round(store: &Store) -> Result<Round, DbError> {
    let mut out = Round::default();
    for agent in store.memory_agents(Some(FRESH_MIGRATION))? {
        match store.index_fresh(&agent, BATCH) {
            Ok(n) => out.moved += n,
            Err(e) => out.failed.push((agent, e)),
        }
    }
    Ok(out)
}
