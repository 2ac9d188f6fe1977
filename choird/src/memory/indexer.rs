//! `memory-index`: moves fresh vectors into the HNSW index (issue 19, item
//! 5). The batcher stores an item's vector in `fresh`, outside the index,
//! where a query finds it by an exact scan; this thread then indexes a few
//! items per agent per round, one short transaction each, so an upsert never
//! waits for a graph search and no lock is held for long. It works only on
//! schemas that have the `fresh` column (per-agent migration 2, applied when
//! the agent starts or when the batcher first stores a vector for it).
//!
//! **Invariant:** a round moves at most [`BATCH`] items per agent; agents
//! take turns, and an agent whose move fails waits out its own backoff
//! while the others go on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

/// Runs until `stop`; `poked` wakes it when fresh vectors were stored.
pub fn run(store: &Store, poked: &Receiver<()>, stop: &AtomicBool) {
    let mut failures = 0u32;
    let mut waits = Waits::default();
    while !stop.load(Ordering::SeqCst) {
        match round(store, &mut waits) {
            Ok(Round { moved, failed }) => {
                failures = 0;
                for (agent, e) in &failed {
                    log::warn!("memory: cannot index agent {agent}'s fresh vectors ({e}); it is retried after a pause");
                }
                if moved == 0 {
                    // Idle, or every agent with work is waiting out a backoff.
                    let _ = poked.recv_timeout(waits.next_due().unwrap_or(IDLE).min(IDLE));
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

/// Per-agent backoff after failed moves.
#[derive(Debug, Default)]
pub struct Waits {
    agents: HashMap<AgentId, (u32, Instant)>,
}

impl Waits {
    fn due(&self, agent: &AgentId) -> bool {
        self.agents.get(agent).is_none_or(|(_, at)| Instant::now() >= *at)
    }

    fn failed(&mut self, agent: &AgentId) {
        let n = self.agents.get(agent).map_or(0, |(n, _)| *n) + 1;
        self.agents.insert(agent.clone(), (n, Instant::now() + backoff(n)));
    }

    fn succeeded(&mut self, agent: &AgentId) {
        self.agents.remove(agent);
    }

    /// How long until the first waiting agent is due again.
    fn next_due(&self) -> Option<Duration> {
        self.agents.values().map(|(_, at)| at.saturating_duration_since(Instant::now())).min()
    }
}

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Items moved into the index.
    pub moved: u64,
    /// Agents whose move failed this round (the others still moved).
    pub failed: Vec<(AgentId, DbError)>,
}

/// One round: up to [`BATCH`] items of each agent not waiting out a
/// backoff, each agent in its own transaction.
pub fn round(store: &Store, waits: &mut Waits) -> Result<Round, DbError> {
    let mut out = Round::default();
    for agent in store.memory_agents(Some(FRESH_MIGRATION))? {
        if !waits.due(&agent) {
            continue;
        }
        match store.index_fresh(&agent, BATCH) {
            Ok(n) => {
                waits.succeeded(&agent);
                out.moved += n;
            }
            Err(e) => {
                waits.failed(&agent);
                out.failed.push((agent, e));
            }
        }
    }
    Ok(out)
}
