//! Threads choird starts for one piece of work — a process agent's waiter
//! (`wait-<id>`), a lapsed lease's reaper (`reap-<id>`), an image build's or
//! a memory export's streaming (`build-<id>`, `export-<id>`) — registered
//! here so shutdown joins them too.
//!
//! **Invariant:** every thread choird starts is joined at shutdown: the
//! long-lived ones by their owners (listeners, gateway, supervisors, the
//! batcher), these by [`Tasks::join_all`], which waits for each up to a
//! deadline and names any that did not end.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The registry of task threads.
#[derive(Default)]
pub struct Tasks {
    running: Mutex<Vec<(String, JoinHandle<()>)>>,
}

impl Tasks {
    /// Starts `f` on a thread named `name`, registered for shutdown.
    pub fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name.clone()).spawn(f)?;
        let mut running = self.running.lock();
        // Finished threads are joined as new ones come, so the list stays short.
        let (done, live): (Vec<_>, Vec<_>) = running.drain(..).partition(|(_, h)| h.is_finished());
        for (_, h) in done {
            let _ = h.join();
        }
        *running = live;
        running.push((name, handle));
        Ok(())
    }

    /// How many task threads are running.
    pub fn len(&self) -> usize {
        self.running.lock().iter().filter(|(_, h)| !h.is_finished()).count()
    }

    /// Whether none is running.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Joins every task thread, waiting up to `within` in all; returns the
    /// names of those still running then (left to end with the process).
    pub fn join_all(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let all: Vec<(String, JoinHandle<()>)> = std::mem::take(&mut *self.running.lock());
        let mut left = Vec::new();
        for (name, h) in all {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                left.push(name);
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_joined_and_stragglers_named() {
        let t = Tasks::default();
        t.spawn("quick".into(), || {}).unwrap();
        t.spawn("slow".into(), || std::thread::sleep(Duration::from_secs(2))).unwrap();
        assert_eq!(t.join_all(Duration::from_millis(200)), ["slow"]);
        assert!(t.is_empty());
    }
}
