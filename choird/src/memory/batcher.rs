//! `memory-embed`: the embedding batcher (R-MEM-2). Upserts write their items
//! and an outbox row in one transaction and poke this thread; it gathers
//! outbox rows (up to `batch_size`, waiting `batch_ms` for more to arrive),
//! embeds them in one request, stores the vectors and clears the rows in one
//! transaction, and tells waiting upserts. When the endpoint is down it backs
//! off and tries again: the outbox keeps everything, so nothing is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex};

use super::embeddings::Embedder;
use crate::config::MemoryConfig;
use crate::pace::{backoff, nap};
use crate::store::Store;

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

/// Runs until `stop`.
pub fn run(
    store: &Store,
    embedder: &Embedder,
    cfg: &MemoryConfig,
    progress: &Arc<Progress>,
    poke: &Receiver<()>,
    stop: &AtomicBool,
) {
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let batch = match store.outbox_batch(cfg.batch_size as i64) {
            Ok(b) => b,
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
                match store.store_embeddings(&done) {
                    Ok(()) => {
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
