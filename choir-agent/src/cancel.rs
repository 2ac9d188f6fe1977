//! A lane's cancel: a flag the lane's work reads between steps, and a wake
//! for a thread that waits on something else meanwhile (a model's answer,
//! a human's decision), so it sleeps until either comes instead of waking
//! every few milliseconds to look at the flag.
//!
//! **Invariant:** a waiter that registered with [`Cancel::listen`] and then
//! found the flag clear is woken by the next [`Cancel::set`]: `set` raises
//! the flag before it looks at the waiters, and `listen` registers before
//! the caller looks at the flag, so one of the two always sees the other.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender};

/// A cancel flag with wake-ups for the threads waiting on it.
#[derive(Debug, Default)]
pub struct Cancel {
    set: AtomicBool,
    /// One sender per thread waiting now (taken out when its [`Listening`]
    /// drops): a handful at most, one per model call or decision in flight.
    waiting: parking_lot::Mutex<Vec<Sender<()>>>,
}

impl Cancel {
    /// A clear flag.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Whether the lane was asked to stop.
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Asks the lane to stop, and wakes every thread waiting on it.
    pub fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        for w in self.waiting.lock().iter() {
            // Full: a wake-up is already pending, which is all it needs.
            let _ = w.try_send(());
        }
    }

    /// Clears the flag (a new turn; a cancel asked for while the lane was
    /// idle has nothing to stop).
    pub fn clear(&self) {
        self.set.store(false, Ordering::SeqCst);
    }

    /// Registers the calling thread for a wake-up at the next [`Cancel::set`]:
    /// its receiver gets a message then. Look at [`Cancel::is_set`] after
    /// this, before waiting (a `set` before the registration wakes nobody).
    pub fn listen(&self) -> Listening<'_> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.waiting.lock().push(tx.clone());
        Listening { cancel: self, tx, rx }
    }
}

/// A thread's registration for a cancel's wake-up; ended when dropped.
pub struct Listening<'a> {
    cancel: &'a Cancel,
    tx: Sender<()>,
    rx: Receiver<()>,
}

impl Listening<'_> {
    /// Where the wake-up arrives (for a `select!`).
    pub fn woken(&self) -> &Receiver<()> {
        &self.rx
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.cancel.waiting.lock().retain(|w| !w.same_channel(&self.tx));
    }
}

/// How often this thread has slept and been woken
/// (`voluntary_ctxt_switches`): what the tests of a wait count.
#[cfg(test)]
pub(crate) fn wake_ups() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The fewest wake-ups of this thread over three runs of `run`. Another
/// test's `fork` holds the process's memory map for a moment, and a thread
/// touching a page meanwhile sleeps until it is free: wake-ups that are
/// not the code's, now and then. A clock in the code wakes it every run.
#[cfg(test)]
pub(crate) fn fewest_wake_ups(mut run: impl FnMut()) -> u64 {
    (0..3)
        .map(|_| {
            let before = wake_ups();
            run();
            wake_ups() - before
        })
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_set_wakes_every_listener_and_a_dropped_listener_is_forgotten() {
        let cancel = std::sync::Arc::new(Cancel::new());
        let first = cancel.listen();
        let second = cancel.listen();
        assert!(first.woken().try_recv().is_err(), "nothing before a set");
        drop(second);
        assert_eq!(cancel.waiting.lock().len(), 1, "the dropped registration is gone");
        let setter = cancel.clone();
        let t = std::thread::spawn(move || setter.set());
        first.woken().recv_timeout(Duration::from_secs(10)).expect("the set wakes the listener");
        t.join().unwrap();
        assert!(cancel.is_set());
        // Set again with the wake-up not taken: no block, the flag holds.
        cancel.set();
        cancel.set();
        drop(first);
        assert!(cancel.waiting.lock().is_empty());
        cancel.clear();
        assert!(!cancel.is_set());
    }

    #[test]
    fn a_set_before_the_listen_is_seen_in_the_flag() {
        let cancel = Cancel::new();
        cancel.set();
        let l = cancel.listen();
        assert!(l.woken().try_recv().is_err(), "no wake-up for a set before the registration");
        assert!(cancel.is_set(), "but the flag, looked at after listen, says it");
    }
}
