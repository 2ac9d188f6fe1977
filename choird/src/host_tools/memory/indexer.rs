//! `memory-index`: moves fresh vectors into the vector index. The batcher stores an item's vector in `fresh`, outside the index,
//! where a query finds it by an exact scan; this thread then indexes a few
//! items per agent per round, one short transaction each, so an upsert never
//! waits for a graph search and no lock is held for long. It works only on
//! schemas that have the `fresh` column (per-agent migration 2, applied when
//! the agent starts or when the batcher first stores a vector for it).
//!
//! Every [`CHECK_EVERY`] it also looks at each agent's vector index and
//! builds the one the [`lifecycle`] policy calls for (IVFFlat once a table
//! is large, rebuilt as it grows), one build at a time; fresh vectors wait
//! meanwhile (up to `fresh_max`, then the batcher indexes them as stored).
//!
//! **Invariant:** a round moves at most [`BATCH`] items per agent; agents
//! take turns, and an agent whose move fails waits out its own backoff
//! while the others go on. An agent whose build fails is not built again
//! for [`FAILED_BUILD_WAIT`]: a build reads the whole table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use crossbeam_channel::Receiver;

use super::lifecycle::{self, Policy, Step};
use crate::db::{DbError, FRESH_MIGRATION};
use crate::pace::{backoff, nap};
use crate::store::memory_index::{BuildCancel, Settled};
use crate::store::Store;

/// Items indexed per agent per transaction: at a million items an HNSW
/// insert takes 5-30 ms, so a transaction holds its rows for well under a
/// second.
pub const BATCH: i64 = 16;

/// How long an idle round waits for the batcher's poke before looking again.
const IDLE: Duration = Duration::from_secs(5);

/// How often the agents' vector indexes are looked at.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);

/// How long an agent whose build failed waits before the next.
pub const FAILED_BUILD_WAIT: Duration = Duration::from_secs(15 * 60);

/// Runs until `stop`; `poked` wakes it when fresh vectors were stored; a
/// running build leaves its cancel token in `cancel` for `stop`'s caller.
pub fn run(store: &Store, poked: &Receiver<()>, cancel: &BuildCancel, stop: &AtomicBool) {
    let mut failures = 0u32;
    let mut waits = Waits::default();
    let mut builds = Builds::default();
    let mut next_check = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next_check {
            next_check = Instant::now() + CHECK_EVERY;
            match reshape(store, &Policy::DEFAULT, &mut builds, cancel, stop) {
                Ok(r) => {
                    for b in &r.built {
                        log::info!(
                            "memory: agent {}'s vector index rebuilt as IVFFlat with {} lists for {} rows in {:.1} s",
                            b.agent,
                            b.lists,
                            b.rows,
                            b.took.as_secs_f64()
                        );
                    }
                    for (agent, what) in &r.settled {
                        log::info!(
                            "memory: agent {agent}'s vector index put right after an interrupted build ({what:?})"
                        );
                    }
                    for (agent, e) in r.failed.iter().filter(|_| !stop.load(Ordering::SeqCst)) {
                        log::warn!(
                            "memory: cannot build agent {agent}'s vector index ({e}); queries use the index it \
                             has, and the build is tried again in {} minutes",
                            FAILED_BUILD_WAIT.as_secs() / 60
                        );
                    }
                }
                Err(e) => log::warn!("memory: cannot list agents' memory for their indexes ({e}); retrying"),
            }
        }
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

/// Agents whose last build failed, and when they may be built again.
#[derive(Debug, Default)]
pub struct Builds {
    failed_until: HashMap<AgentId, Instant>,
}

/// A build done.
#[derive(Debug, Clone)]
pub struct Built {
    /// Whose.
    pub agent: AgentId,
    /// Its lists.
    pub lists: u32,
    /// The rows its table had when the build was decided.
    pub rows: u64,
    /// How long it took.
    pub took: Duration,
}

/// What one look at the indexes did.
#[derive(Debug, Default)]
pub struct Reshaped {
    /// Builds done, one after another.
    pub built: Vec<Built>,
    /// Agents whose shape could not be read or whose build failed.
    pub failed: Vec<(AgentId, DbError)>,
    /// Leftovers of interrupted builds put right (a swap finished, a
    /// half-made index dropped).
    pub settled: Vec<(AgentId, Settled)>,
}

/// Looks at each agent's vector index (but those whose last build failed
/// less than [`FAILED_BUILD_WAIT`] ago): puts right what an interrupted
/// build left, then builds what `policy` says, one agent after another,
/// until `stop`.
pub fn reshape(
    store: &Store,
    policy: &Policy,
    builds: &mut Builds,
    cancel: &BuildCancel,
    stop: &AtomicBool,
) -> Result<Reshaped, DbError> {
    let mut out = Reshaped::default();
    for agent in store.memory_agents(Some(FRESH_MIGRATION))? {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if builds.failed_until.get(&agent).is_some_and(|at| Instant::now() < *at) {
            continue;
        }
        let done = store.memory_index_settle(&agent, cancel).and_then(|settled| {
            match settled {
                Settled::Busy => return Ok(None), // built elsewhere (another choird on this database)
                Settled::Nothing => {}
                Settled::Swapped | Settled::DroppedInvalid => out.settled.push((agent.clone(), settled)),
            }
            let shape = store.memory_index_shape(&agent)?;
            match lifecycle::step(policy, &shape) {
                Step::Keep => Ok(None),
                Step::Build(lists) => Ok(store
                    .memory_index_build(&agent, lists, lifecycle::build_memory_mib(lists, shape.dims), cancel)?
                    .map(|took| Built { agent: agent.clone(), lists, rows: shape.rows, took })),
            }
        });
        match done {
            Ok(built) => {
                builds.failed_until.remove(&agent);
                out.built.extend(built);
            }
            Err(e) => {
                builds.failed_until.insert(agent.clone(), Instant::now() + FAILED_BUILD_WAIT);
                out.failed.push((agent, e));
            }
        }
    }
    Ok(out)
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
