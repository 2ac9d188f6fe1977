//! `memory-embed`: the embedding batcher (R-MEM-2). Upserts write their items
//! and an outbox row in one transaction and poke this thread; it gathers
//! outbox rows (up to `batch_size`, waiting `batch_ms` for more to arrive),
//! embeds them in one request, stores the vectors and clears the rows in one
//! transaction, and tells waiting upserts. Vectors are stored fresh (outside
//! the vector index, up to `fresh_max` per agent) and the `memory-index` thread
//! is poked to index them. When the endpoint is down it backs
//! off and tries again: the outbox keeps everything, so nothing is lost.
//! When the endpoint *refuses* a batch (4xx), its items are embedded one by
//! one; an item refused alone [`GIVE_UP_AFTER`] times is set aside
//! (`failed_at`, shown by `choirctl memory stats`), so one poisoned item
//! never stops embeddings for every agent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use choir_common::ids::AgentId;

use super::embeddings::Embedder;
use crate::config::MemoryConfig;
use crate::pace::{backoff, nap};
use crate::store::Store;

/// Refusals of one item (embedded alone) before it is set aside.
pub const GIVE_UP_AFTER: i32 = 3;

/// Tells waiting upserts that a batch was stored.
#[derive(Default)]
pub struct Progress {
    batches: Mutex<u64>,
    changed: Condvar,
}

impl Progress {
    /// The number of batches stored so far.
    pub fn count(&self) -> u64 {
        *self.batches.lock()
    }

    /// Waits until a batch after `seen` is stored, or `timeout`.
    pub fn wait_after(&self, seen: u64, timeout: Duration) {
        let mut g = self.batches.lock();
        if *g == seen {
            self.changed.wait_for(&mut g, timeout);
        }
    }

    fn bump(&self) {
        *self.batches.lock() += 1;
        self.changed.notify_all();
    }
}

/// The threads the batcher wakes and is woken by.
pub struct Pokes {
    /// Upserts (and stop) poke this: look at the outbox.
    pub outbox: Receiver<()>,
    /// The batcher pokes this when it stored fresh vectors.
    pub index: Sender<()>,
}

/// An outbox row as the batcher reads it: (outbox id, agent, item id, content).
pub type Queued = (i64, AgentId, i64, String);

/// The rows of `batch` whose agent's memory schema is up to date: each agent
/// not in `migrated` (shared with `Memory::ensure`) is brought up to date
/// once, on first sight (a schema made
/// before a per-agent migration, with embeddings still queued, gets it
/// here). The rows of an agent whose schema cannot be (a dimension it was
/// not made for, the database refusing) stay in the outbox with one more
/// failed attempt, so they sort behind everyone else's: one agent never
/// holds up embeddings for the others.
pub fn schema_ready(store: &Store, dims: u32, migrated: &Mutex<HashSet<AgentId>>, batch: Vec<Queued>) -> Vec<Queued> {
    let mut refused: HashSet<AgentId> = HashSet::new();
    for (_, agent, _, _) in &batch {
        if refused.contains(agent) || migrated.lock().contains(agent) {
            continue;
        }
        match store.db.migrate_agent(agent, dims) {
            Ok(applied) => {
                applied.iter().for_each(|name| log::info!("memory: applied {name}"));
                migrated.lock().insert(agent.clone());
            }
            Err(e) => {
                log::warn!("memory: agent {agent}'s memory cannot be brought up to date ({e}); its embeddings wait");
                refused.insert(agent.clone());
            }
        }
    }
    if refused.is_empty() {
        return batch;
    }
    let (ready, held): (Vec<Queued>, Vec<Queued>) = batch.into_iter().partition(|(_, a, _, _)| !refused.contains(a));
    let ids: Vec<i64> = held.iter().map(|(o, _, _, _)| *o).collect();
    if let Err(e) = store.outbox_failed(&ids, "the agent's memory schema is not up to date (see choird's log)") {
        log::warn!("memory: cannot record that {} embedding(s) wait ({e})", ids.len());
    }
    ready
}

/// Runs until `stop`.
pub fn run(
    store: &Store,
    embedder: &Embedder,
    cfg: &MemoryConfig,
    progress: &Arc<Progress>,
    pokes: &Pokes,
    ready: &Mutex<HashSet<AgentId>>,
    stop: &AtomicBool,
) {
    let poke = &pokes.outbox;
    let fresh_max = i64::from(cfg.fresh_max);
    let stored = |fresh: u64| {
        if fresh > 0 {
            let _ = pokes.index.try_send(());
        }
    };
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let batch = match store.outbox_batch(cfg.batch_size as i64) {
            Ok(b) if b.is_empty() => b,
            Ok(b) => {
                let kept = schema_ready(store, cfg.embeddings.dimensions, ready, b);
                if kept.is_empty() {
                    // Only agents whose schema cannot be brought up to date.
                    failures += 1;
                    nap(backoff(failures), stop);
                    continue;
                }
                kept
            }
            Err(e) => {
                failures += 1;
                log::warn!("memory: cannot read the embedding outbox ({e}); retrying");
                nap(backoff(failures), stop);
                continue;
            }
        };
        if batch.is_empty() {
            let _ = poke.recv_timeout(Duration::from_secs(2));
            // Let more arrive, so one request carries them all.
            std::thread::sleep(Duration::from_millis(cfg.batch_ms));
            continue;
        }
        let texts: Vec<String> = batch.iter().map(|(_, _, _, t)| t.clone()).collect();
        match embedder.embed(&texts) {
            Ok(vectors) => {
                let done: Vec<_> =
                    batch.into_iter().zip(vectors).map(|((o, agent, item, _), v)| (o, agent, item, v)).collect();
                match store.store_embeddings(&done, fresh_max) {
                    Ok(fresh) => {
                        stored(fresh);
                        failures = 0;
                        progress.bump();
                    }
                    Err(e) => {
                        failures += 1;
                        log::warn!("memory: cannot store {} embedding(s) ({e}); retrying", done.len());
                        nap(backoff(failures), stop);
                    }
                }
            }
            Err(super::embeddings::EmbedError::Refused(why)) => {
                // One bad item must not stop embeddings for every agent: each
                // item alone, so only those refused alone count against
                // themselves (and are set aside after a few refusals).
                failures = 0;
                log::warn!(
                    "memory: the endpoint refused a batch of {} ({why}); embedding them one by one",
                    batch.len()
                );
                for (o, agent, item, text) in batch {
                    match embedder.embed(std::slice::from_ref(&text)) {
                        Ok(mut v) if v.len() == 1 => {
                            if let Some(v) = v.pop() {
                                match store.store_embeddings(&[(o, agent, item, v)], fresh_max) {
                                    Ok(fresh) => stored(fresh),
                                    Err(e) => log::warn!("memory: cannot store an embedding ({e})"),
                                }
                            }
                        }
                        Ok(_) => log::warn!("memory: the endpoint answered no vector for item {item} of {agent}"),
                        Err(e @ super::embeddings::EmbedError::Refused(_)) => {
                            match store.outbox_refused(o, &e.to_string(), GIVE_UP_AFTER) {
                                Ok(true) => log::error!(
                                    "memory: item {item} of agent {agent} refused {GIVE_UP_AFTER} times ({e}); set aside \
                                     (see `choirctl memory stats {agent}`)"
                                ),
                                Ok(false) => {}
                                Err(db) => log::warn!("memory: cannot record a refusal ({db})"),
                            }
                        }
                        Err(e) => {
                            let _ = store.outbox_failed(&[o], &e.to_string());
                            break;
                        }
                    }
                }
                progress.bump();
            }
            Err(e) => {
                failures += 1;
                let ids: Vec<i64> = batch.iter().map(|(o, _, _, _)| *o).collect();
                let _ = store.outbox_failed(&ids, &e.to_string());
                // Waiting upserts answer "pending" rather than wait out the outage.
                progress.bump();
                let wait = backoff(failures);
                log::warn!("memory: {e}; {} item(s) stay queued, next try in {wait:?}", ids.len());
                nap(wait, stop);
            }
        }
    }
}
