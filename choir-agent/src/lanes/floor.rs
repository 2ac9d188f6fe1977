//! The edge has the floor: while the edge lane works on a
//! turn — between a user's message arriving and its reply leaving, except
//! while it waits for the model — core jobs take their steps one at a time
//! instead of all at once, so the shared points of a turn (the CPU, the
//! relay, replication, PostgreSQL, the locks) serve the person waiting
//! first. (Core job threads also run at a lower CPU priority: see
//! `core.rs`.)
//!
//! While a core step is under way, the next starts no sooner than
//! [`STAGGER`] after the last one started, whether or not the edge was
//! involved: so the steps that waited for the edge do not all start at once
//! when it lets go. A burst of core steps released together is what made the
//! slowest turns (the next message arriving into it).
//!
//! **Invariant:** a core step waits only while another core step is under
//! way — for the edge to let go of the floor, or for the next start, which
//! comes [`STAGGER`] after the last (waiters take it in no particular
//! order) — never for the edge alone and never when none is under way, so
//! an edge that is never idle slows core jobs to one step at a time but
//! never stops them, and no timer releases a burst of waiting steps at
//! once (each start lets one step go). Holds and steps are guards: a
//! panicking or erroring lane cannot leave the floor held or a step
//! counted.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// While a core step is under way, another starts at most this often (the
/// edge not holding the floor): core steps that waited for the edge go one
/// by one when it lets go, not all at once. Against a core step's own length
/// (a model call: hundreds of milliseconds and more) it costs nothing; it
/// only spreads steps that would have started together.
pub const STAGGER: Duration = Duration::from_millis(1);

#[derive(Default)]
struct State {
    /// Holds of the edge (its turn, the push of its reply).
    held: u32,
    /// Core steps under way.
    core: u32,
    /// When the next core step may start while one is under way:
    /// [`STAGGER`] after the last one started.
    next_start: Option<Instant>,
    /// Whether a waiting step is timing that start (the others sleep).
    watched: bool,
}

/// Who has the floor.
#[derive(Default)]
pub struct Floor {
    state: Mutex<State>,
    changed: Condvar,
}

/// A hold on the floor; released when dropped.
#[must_use = "the floor is released when the hold is dropped"]
pub struct Hold<'a> {
    floor: &'a Floor,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.floor.release();
    }
}

/// The edge stepping aside while its model thinks; takes the floor back when dropped.
#[must_use = "the floor is taken back when this is dropped"]
pub struct Aside<'a> {
    floor: &'a Floor,
}

impl Drop for Aside<'_> {
    fn drop(&mut self) {
        self.floor.state.lock().held += 1;
    }
}

/// A core step under way; ends when dropped.
#[must_use = "the step ends when this is dropped"]
pub struct CoreStep<'a> {
    floor: &'a Floor,
}

impl Drop for CoreStep<'_> {
    fn drop(&mut self) {
        let mut s = self.floor.state.lock();
        s.core = s.core.saturating_sub(1);
        self.floor.changed.notify_all();
    }
}

impl Floor {
    /// Takes the floor (the edge starting a turn, or pushing its reply).
    pub fn hold(&self) -> Hold<'_> {
        self.state.lock().held += 1;
        Hold { floor: self }
    }

    /// Gives the floor up while waiting on something slow (the model) when
    /// it is held; taken back when the result is dropped.
    pub fn step_aside(&self) -> Option<Aside<'_>> {
        let mut s = self.state.lock();
        if s.held == 0 {
            return None;
        }
        s.held -= 1;
        self.changed.notify_all();
        Some(Aside { floor: self })
    }

    fn release(&self) {
        let mut s = self.state.lock();
        s.held = s.held.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Whether the edge has the floor now.
    pub fn is_held(&self) -> bool {
        self.state.lock().held > 0
    }

    /// A core job taking a step (a model call, a round of tool calls):
    /// waits while another core step is under way and either the edge has
    /// the floor or the step's slot ([`STAGGER`] after the last) has not
    /// come.
    /// Not re-entrant: a thread holding a step must not ask for another (it
    /// would wait for itself while the edge works); `Mind::ask` and
    /// `Mind::run_calls` take theirs one after the other, never nested.
    pub fn core_step(&self) -> CoreStep<'_> {
        let mut s = self.state.lock();
        // Whether this step is the one waiting out the slot (the others
        // sleep until it has taken it: one timer, not one per waiter).
        let mut watching = false;
        while s.core > 0 {
            if s.held > 0 {
                if watching {
                    watching = false;
                    s.watched = false;
                }
                self.changed.wait(&mut s);
                continue;
            }
            let left = s.next_start.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                break;
            }
            if s.watched && !watching {
                self.changed.wait(&mut s);
                continue;
            }
            watching = true;
            s.watched = true;
            self.changed.wait_for(&mut s, left);
        }
        if watching {
            s.watched = false;
        }
        s.core += 1;
        s.next_start = Some(Instant::now() + STAGGER);
        // A step waiting for its slot takes over the watch.
        self.changed.notify_one();
        CoreStep { floor: self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A core job's step on its own thread: the receiver hears when it went.
    fn core_step_on_a_thread(f: &Arc<Floor>) -> (std::thread::JoinHandle<()>, crossbeam_channel::Receiver<()>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let f = f.clone();
        let thread = std::thread::spawn(move || {
            let _step = f.core_step();
            tx.send(()).unwrap();
        });
        (thread, rx)
    }

    #[test]
    fn a_free_floor_lets_core_steps_run_together() {
        let f = Floor::default();
        let a = f.core_step();
        let b = f.core_step();
        let c = f.core_step();
        assert_eq!(f.state.lock().core, 3);
        drop((a, b, c));
        assert_eq!(f.state.lock().core, 0);
        assert!(f.step_aside().is_none(), "nothing to step aside from");
        assert!(!f.is_held(), "stepping aside from a free floor takes nothing");
    }

    #[test]
    fn while_the_edge_works_core_steps_go_one_at_a_time() {
        let f = Arc::new(Floor::default());
        let first = f.core_step();
        let hold = f.hold();
        let (second, rx) = core_step_on_a_thread(&f);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "a second core step went while the edge held");
        drop(first);
        rx.recv_timeout(Duration::from_secs(60)).expect("the next core step goes when the one under way ends");
        second.join().unwrap();
        assert!(f.is_held(), "the edge never waited for core");
        // Never for the edge alone: a step goes at once when none is under way.
        let _alone = f.core_step();
        drop(hold);
    }

    #[test]
    fn a_waiting_core_step_goes_when_the_edge_lets_go_or_steps_aside() {
        let f = Arc::new(Floor::default());
        let running = f.core_step();
        let hold = f.hold();
        let (waiter, rx) = core_step_on_a_thread(&f);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        {
            let _aside = f.step_aside().expect("held");
            rx.recv_timeout(Duration::from_secs(60)).expect("goes while the edge waits on its model");
        }
        assert!(f.is_held(), "the edge has the floor back after its model answered");
        waiter.join().unwrap();
        drop((running, hold));
        assert!(!f.is_held());
    }

    #[test]
    fn core_steps_that_waited_for_the_edge_go_one_by_one_when_it_lets_go() {
        const WAITERS: u32 = 6;
        let f = Arc::new(Floor::default());
        // Under way throughout: the waiters' steps are not the only ones.
        let running = f.core_step();
        let hold = f.hold();
        let (tx, rx) = crossbeam_channel::unbounded();
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (f, tx) = (f.clone(), tx.clone());
                std::thread::spawn(move || {
                    let _step = f.core_step();
                    tx.send(Instant::now()).unwrap();
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "none went while the edge held the floor");
        let released = Instant::now();
        drop(hold);
        let last = (0..WAITERS).map(|_| rx.recv_timeout(Duration::from_secs(60)).unwrap()).max().unwrap();
        // A lower bound on a monotonic clock: a slow machine only widens it.
        assert!(
            last.duration_since(released) >= STAGGER * (WAITERS - 1),
            "the waiting steps started a STAGGER apart, not together: the last after {:?}",
            last.duration_since(released)
        );
        for w in waiters {
            w.join().unwrap();
        }
        drop(running);
    }

    #[test]
    fn holds_nest_and_an_extra_release_never_underflows() {
        let f = Floor::default();
        let a = f.hold();
        let b = f.hold();
        drop(a);
        assert!(f.is_held(), "the push's hold outlives the turn's");
        drop(b);
        assert!(!f.is_held());
        f.release();
        assert!(!f.is_held());
        let _c = f.hold();
        assert!(f.is_held(), "an extra release did not leave the count negative");
    }
}
