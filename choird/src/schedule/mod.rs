//! Scheduled work (R-SCHED-1): the parts that know nothing of the
//! daemon. `clock` (the scheduler's notion of now, injectable), `spec`
//! (a job's spec checked; its firing times with croner in a jiff time zone),
//! `precondition` (the cheap look that lets an idle job cost nothing). The
//! scheduler thread, the claim of each firing and its hand-over to the agent
//! are the daemon's (`daemon/schedule.rs`); the rows are `store/schedule.rs`.

pub mod clock;
pub mod precondition;
pub mod spec;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

/// What the daemon keeps of the scheduler: its clock, and a way to wake or
/// stop its thread (a job added or resumed wakes it at once).
pub struct Scheduling {
    /// The clock every schedule comparison uses.
    pub clock: Arc<dyn clock::Clock>,
    tx: Sender<()>,
    rx: Receiver<()>,
    looks_tx: Sender<()>,
    looks_rx: Receiver<()>,
    stop: AtomicBool,
}

impl Scheduling {
    /// With `clock`.
    pub fn new(clock: Arc<dyn clock::Clock>) -> Scheduling {
        // One pending wake is enough: the thread looks at everything when it wakes.
        let (tx, rx) = bounded(1);
        let (looks_tx, looks_rx) = bounded(1);
        Scheduling { clock, tx, rx, looks_tx, looks_rx, stop: AtomicBool::new(false) }
    }

    /// Wakes the precondition thread (never blocks).
    pub fn poke_looks(&self) {
        let _ = self.looks_tx.try_send(());
    }

    /// The precondition thread sleeps up to `d`, or until poked; whether
    /// it was poked.
    pub fn nap_looks(&self, d: Duration) -> bool {
        self.looks_rx.recv_timeout(self.clock.nap(d)).is_ok()
    }

    /// Wakes the scheduler thread (never blocks).
    pub fn poke(&self) {
        let _ = self.tx.try_send(());
    }

    /// Sleeps up to `d`, or until poked; whether it was poked.
    pub fn nap(&self, d: Duration) -> bool {
        self.rx.recv_timeout(d).is_ok()
    }

    /// Asks the thread to end, and wakes it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.poke();
        self.poke_looks();
    }

    /// Whether the thread should end.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}
