//! The threads model calls run on: a call's thread, once done, waits a
//! while for the next call instead of ending, so a lane's turn does not pay
//! a thread's start and end (its stack mapped and unmapped, its wake-ups)
//! for every call. Idle threads past [`MAX_IDLE`] end at once; an idle one
//! ends after its idle time, or at once when its client is dropped.
//!
//! **Invariant:** a call handed to a thread runs. A thread takes itself off
//! the idle list (under its lock) before it ends, so a call is only ever
//! sent to a thread that is on the list or has just been taken off it by
//! the sender, and such a thread waits for that call; a send to a thread
//! that is gone fails and hands the call back, which then goes to another
//! thread or a new one.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};
use parking_lot::Mutex;

/// A model call's work.
pub type Call = Box<dyn FnOnce() + Send>;

/// Idle threads kept per client (the edge makes one call at a time, core
/// jobs a few).
pub const MAX_IDLE: usize = 4;
/// How long an idle thread waits for a call before it ends.
pub const IDLE_FOR: Duration = Duration::from_secs(30);

/// One idle thread: its id and where its next call goes.
struct Idle {
    id: u64,
    lane: String,
    calls: Sender<Call>,
}

#[derive(Default)]
struct List {
    idle: Vec<Idle>,
    next_id: u64,
}

/// The threads of one client.
pub struct Callers {
    list: Arc<Mutex<List>>,
    idle_for: Duration,
}

impl Default for Callers {
    fn default() -> Self {
        Callers::with_idle_time(IDLE_FOR)
    }
}

impl Callers {
    /// Threads that wait `idle_for` for their next call.
    pub fn with_idle_time(idle_for: Duration) -> Callers {
        Callers { list: Arc::default(), idle_for }
    }

    /// Runs `call` on an idle thread of `lane`'s, or on a new one named
    /// `model-<lane>`.
    pub fn run(&self, lane: &str, mut call: Call) -> std::io::Result<()> {
        loop {
            let taken = {
                let mut list = self.list.lock();
                let at = list.idle.iter().rposition(|i| i.lane == lane);
                at.map(|at| list.idle.remove(at))
            };
            let Some(idle) = taken else { break };
            match idle.calls.send(call) {
                Ok(()) => return Ok(()),
                // It ended meanwhile: the call comes back.
                Err(back) => call = back.0,
            }
        }
        let id = {
            let mut list = self.list.lock();
            list.next_id += 1;
            list.next_id
        };
        let (list, lane_name, idle_for) = (Arc::downgrade(&self.list), lane.to_owned(), self.idle_for);
        std::thread::Builder::new()
            .name(format!("model-{lane}"))
            .spawn(move || serve(id, lane_name, call, list, idle_for))
            .map(drop)
    }

    /// Threads idle now (for tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.list.lock().idle.len()
    }
}

/// A thread's life: its first call, then each call handed to it while it
/// waits on the idle list. Only the list holds the sender of its next
/// call, so a client dropped (its list with it) ends its idle threads at
/// once.
fn serve(id: u64, lane: String, first: Call, list: Weak<Mutex<List>>, idle_for: Duration) {
    first();
    loop {
        let inbox = {
            let Some(list) = list.upgrade() else { return };
            let mut list = list.lock();
            if list.idle.len() >= MAX_IDLE {
                return;
            }
            let (calls, inbox) = crossbeam_channel::bounded::<Call>(1);
            list.idle.push(Idle { id, lane: lane.clone(), calls });
            inbox
        };
        loop {
            match inbox.recv_timeout(idle_for) {
                Ok(call) => {
                    call();
                    break;
                }
                // The client is gone, and its list with the sender.
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let Some(list) = list.upgrade() else { return };
                    let mut list = list.lock();
                    if let Some(at) = list.idle.iter().position(|i| i.id == id) {
                        list.idle.remove(at);
                        return;
                    }
                    // Taken off the list by a sender: its call is on the way.
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::ThreadId;

    /// Runs a call that reports its thread, and waits for that.
    fn on_thread(callers: &Callers, lane: &str) -> ThreadId {
        let (tx, rx) = crossbeam_channel::bounded(1);
        callers.run(lane, Box::new(move || tx.send(std::thread::current().id()).unwrap())).unwrap();
        rx.recv().unwrap()
    }

    /// Waits until `n` threads are idle.
    fn until_idle(callers: &Callers, n: usize) {
        while callers.idle() != n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_calls_thread_runs_the_next_call_of_its_lane_and_leaves_when_idle_too_long() {
        let callers = Callers::with_idle_time(Duration::from_millis(200));
        let first = on_thread(&callers, "edge");
        until_idle(&callers, 1);
        assert_eq!(on_thread(&callers, "edge"), first, "the same thread took the next call");
        until_idle(&callers, 1);
        // Another lane's call gets a thread of its own.
        assert_ne!(on_thread(&callers, "core"), first);
        until_idle(&callers, 2);
        // Idle past its time, a thread leaves; the next call still runs.
        until_idle(&callers, 0);
        assert_ne!(on_thread(&callers, "edge"), first, "a new thread after the idle one left");
    }

    #[test]
    fn calls_at_once_get_threads_of_their_own_and_at_most_max_idle_stay() {
        let callers = Callers::default();
        let (release, wait) = crossbeam_channel::bounded::<()>(0);
        let (ids, got) = crossbeam_channel::unbounded();
        for _ in 0..MAX_IDLE + 2 {
            let (wait, ids) = (wait.clone(), ids.clone());
            callers
                .run(
                    "core",
                    Box::new(move || {
                        ids.send(std::thread::current().id()).unwrap();
                        wait.recv().unwrap();
                    }),
                )
                .unwrap();
        }
        let threads: std::collections::HashSet<ThreadId> = (0..MAX_IDLE + 2).map(|_| got.recv().unwrap()).collect();
        assert_eq!(threads.len(), MAX_IDLE + 2, "each running call on a thread of its own");
        for _ in 0..MAX_IDLE + 2 {
            release.send(()).unwrap();
        }
        until_idle(&callers, MAX_IDLE);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(callers.idle(), MAX_IDLE, "the others ended");
    }

    /// The threads of this process named `name` now.
    fn named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    #[test]
    fn a_dropped_clients_idle_threads_end_at_once() {
        // A client made per call (as one for a single completion) leaves no
        // thread behind for its idle time.
        let callers = Callers::with_idle_time(Duration::from_secs(3600));
        on_thread(&callers, "dropped");
        until_idle(&callers, 1);
        assert_eq!(named("model-dropped"), 1, "the idle thread waits");
        drop(callers);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while named("model-dropped") > 0 {
            assert!(std::time::Instant::now() < deadline, "the idle thread outlived its client");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_call_sent_as_its_thread_times_out_still_runs() {
        // No idle time: every thread leaves as soon as it is idle, racing
        // the calls of four senders (a call lost hangs or panics here).
        let callers = Arc::new(Callers::with_idle_time(Duration::ZERO));
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let callers = callers.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        on_thread(&callers, "edge");
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
    }
}
