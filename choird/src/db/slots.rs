//! How many database connections choird holds at once, and how many of
//! them one agent's requests may hold.
//!
//! Every connection choird uses, pooled or dedicated, is taken under a
//! [`Slot`]. The thread serving an agent's request runs inside
//! [`acting_for`] that agent, so its slots count against the agent too.
//!
//! **Invariant:** at most `max_open` slots are held at once (so choird
//! never asks PostgreSQL for more connections than the managed cluster's
//! `max_connections` leaves it), and at most `per_agent` of them by threads
//! acting for one agent. A hostile agent filling its socket with requests
//! (64 connections a socket) waits for its own slots and leaves the rest
//! to choird and the other agents. Before, each of its requests opened a
//! connection of its own (48 requests at once held 50 connections in
//! `hostile::t2_a_flood_of_one_agents_requests_holds_only_its_share_of_database_connections`),
//! so two such agents could use up PostgreSQL's default 100, after which
//! every connection choird opened for anyone was refused.
//! **Invariant:** a thread that holds a slot takes another without waiting,
//! so work that takes a connection inside another's never deadlocks on the
//! bound (it may exceed it by that nesting, which code bounds).
//! **Invariant:** a take that finds no slot within `patience` is refused
//! ([`Busy`]) before any connection is touched: the request changes
//! nothing, and the agent is told to try again.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use parking_lot::{Condvar, Mutex};

/// The most connections choird holds at once (the managed cluster allows
/// [`MAX_OPEN`] plus room for its keeper, backups and the operator).
pub const MAX_OPEN: usize = 20;
/// The most of them one agent's requests hold at once. An agent's own
/// concurrent work needs about three (its answers, its replication, a
/// core job's tool call); more only queue on its chain head's lock.
pub const PER_AGENT: usize = 4;
/// How long a take waits for a slot before it is refused.
pub const PATIENCE: Duration = Duration::from_secs(5);

thread_local! {
    /// The agent whose request this thread serves, if any.
    static ACTING_FOR: RefCell<Option<AgentId>> = const { RefCell::new(None) };
    /// Slots this thread holds.
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// Marks the current thread as serving `agent`'s request until dropped.
#[must_use = "the thread acts for the agent only while this lives"]
pub struct ActingFor {
    before: Option<AgentId>,
    /// Bound to the thread whose mark it restores.
    _thread: PhantomData<*const ()>,
}

/// The current thread serves `agent`'s request until the result is dropped:
/// the database connections it takes meanwhile count against the agent.
pub fn acting_for(agent: &AgentId) -> ActingFor {
    let before = ACTING_FOR.with(|a| a.replace(Some(agent.clone())));
    ActingFor { before, _thread: PhantomData }
}

impl Drop for ActingFor {
    fn drop(&mut self) {
        let before = self.before.take();
        ACTING_FOR.with(|a| *a.borrow_mut() = before);
    }
}

/// Every slot was taken for longer than the patience allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The agent whose own slots were all taken (none: all of choird's).
    pub agent: Option<AgentId>,
}

/// The slots of one pool.
pub struct Slots {
    max_open: usize,
    per_agent: usize,
    patience: Duration,
    held: Mutex<Held>,
    freed: Condvar,
}

#[derive(Default)]
struct Held {
    all: usize,
    by_agent: HashMap<AgentId, usize>,
}

impl Held {
    fn of(&self, agent: &AgentId) -> usize {
        self.by_agent.get(agent).copied().unwrap_or(0)
    }
}

/// One held slot; given back when dropped, on the thread that took it.
pub struct Slot<'a> {
    slots: &'a Slots,
    agent: Option<AgentId>,
    _thread: PhantomData<*const ()>,
}

impl Default for Slots {
    fn default() -> Slots {
        Slots::new(MAX_OPEN, PER_AGENT, PATIENCE)
    }
}

impl Slots {
    /// Slots with these bounds.
    pub fn new(max_open: usize, per_agent: usize, patience: Duration) -> Slots {
        Slots { max_open, per_agent, patience, held: Mutex::new(Held::default()), freed: Condvar::new() }
    }

    /// Takes a slot for the current thread: at once when it holds one
    /// already, else when one is free for it (of all, and of its agent's),
    /// waiting at most the patience.
    pub fn take(&self) -> Result<Slot<'_>, Busy> {
        let agent = ACTING_FOR.with(|a| a.borrow().clone());
        let nested = HELD.get() > 0;
        let mut held = self.held.lock();
        if !nested {
            let deadline = Instant::now() + self.patience;
            let full = |h: &Held| h.all >= self.max_open || agent.as_ref().is_some_and(|a| h.of(a) >= self.per_agent);
            while full(&held) {
                if self.freed.wait_until(&mut held, deadline).timed_out() && full(&held) {
                    let agent = agent.filter(|a| held.of(a) >= self.per_agent);
                    return Err(Busy { agent });
                }
            }
        }
        held.all += 1;
        if let Some(a) = &agent {
            *held.by_agent.entry(a.clone()).or_default() += 1;
        }
        HELD.set(HELD.get() + 1);
        Ok(Slot { slots: self, agent, _thread: PhantomData })
    }

    /// Slots held now: of all, and of `agent`.
    pub fn held(&self, agent: &AgentId) -> (usize, usize) {
        let held = self.held.lock();
        (held.all, held.of(agent))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        HELD.set(HELD.get().saturating_sub(1));
        let mut held = self.slots.held.lock();
        held.all -= 1;
        if let Some(a) = &self.agent {
            if let Some(n) = held.by_agent.get_mut(a) {
                *n -= 1;
                if *n == 0 {
                    held.by_agent.remove(a);
                }
            }
        }
        // Waiters wait for different things (any slot, or one of their
        // agent's): each looks again.
        self.slots.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{bounded, Receiver, Sender};

    fn agent(name: &str) -> AgentId {
        AgentId::parse(name).unwrap()
    }

    /// Holds a slot on a thread of its own (acting for `who`) until told;
    /// says whether it got one.
    fn holder<'s>(
        scope: &'s std::thread::Scope<'s, '_>,
        slots: &'s Slots,
        who: Option<AgentId>,
    ) -> (Receiver<bool>, Sender<()>) {
        let (got_tx, got_rx) = bounded(1);
        let (release_tx, release_rx) = bounded::<()>(1);
        scope.spawn(move || {
            let _acting = who.as_ref().map(acting_for);
            let slot = slots.take();
            got_tx.send(slot.is_ok()).unwrap();
            let _ = release_rx.recv();
            drop(slot);
        });
        (got_rx, release_tx)
    }

    /// Hostile: one agent's requests fill its share, and its next request
    /// waits and is refused as busy (naming the agent), while another
    /// agent's, and choird's own, still get a slot at once. The control: a
    /// slot given back lets the waiting request through.
    #[test]
    fn one_agents_requests_hold_at_most_its_share_and_leave_the_rest_to_others() {
        let slots = Slots::new(6, 2, Duration::from_millis(200));
        let (a, b) = (agent("alpha"), agent("beta"));
        std::thread::scope(|scope| {
            let first = holder(scope, &slots, Some(a.clone()));
            let second = holder(scope, &slots, Some(a.clone()));
            assert!(first.0.recv().unwrap() && second.0.recv().unwrap());
            assert_eq!(slots.held(&a), (2, 2));

            let _acting = acting_for(&a);
            let started = Instant::now();
            assert_eq!(slots.take().err(), Some(Busy { agent: Some(a.clone()) }));
            assert!(started.elapsed() >= Duration::from_millis(200), "refused before its patience ran out");
            drop(_acting);
            assert_eq!(slots.held(&a), (2, 2), "a refused take holds nothing");

            let other = holder(scope, &slots, Some(b.clone()));
            assert!(other.0.recv().unwrap(), "another agent's request waited for the first one's");
            let own = holder(scope, &slots, None);
            assert!(own.0.recv().unwrap(), "choird's own work waited for an agent's");

            // A third request of the agent waits; one of its slots given
            // back, it goes through.
            let third = holder(scope, &slots, Some(a.clone()));
            std::thread::sleep(Duration::from_millis(50));
            assert!(third.0.try_recv().is_err(), "the agent's third request did not wait");
            first.1.send(()).unwrap();
            assert!(third.0.recv().unwrap(), "a slot given back did not let the waiting request through");
            for release in [second.1, other.1, own.1, third.1] {
                release.send(()).unwrap();
            }
        });
        assert_eq!(slots.held(&a), (0, 0));
    }

    /// All slots taken (by several agents and choird's own work), the next
    /// take of anyone is refused as busy without an agent named; the
    /// control: one fewer taken, it goes through at once.
    #[test]
    fn no_more_than_the_bound_are_held_whoever_asks() {
        let slots = Slots::new(3, 2, Duration::from_millis(100));
        std::thread::scope(|scope| {
            let held: Vec<_> = [Some(agent("a1")), Some(agent("a2")), None]
                .into_iter()
                .map(|who| holder(scope, &slots, who))
                .collect();
            assert!(held.iter().all(|(got, _)| got.recv().unwrap()));
            let _acting = acting_for(&agent("a3"));
            assert_eq!(slots.take().err(), Some(Busy { agent: None }));
            drop(_acting);
            assert_eq!(slots.take().err(), Some(Busy { agent: None }));
            held[0].1.send(()).unwrap();
            let started = Instant::now();
            let slot = loop {
                // The holder gives its slot back on its own thread.
                if let Ok(s) = slots.take() {
                    break s;
                }
            };
            assert!(started.elapsed() < Duration::from_secs(5));
            drop(slot);
            for (_, release) in &held[1..] {
                release.send(()).unwrap();
            }
        });
    }

    /// A thread that holds a slot takes another at once even when its
    /// agent's share is full (a connection taken inside another's work
    /// cannot deadlock on the bound), and gives both back.
    #[test]
    fn a_thread_holding_a_slot_takes_another_without_waiting() {
        let slots = Slots::new(2, 1, Duration::from_secs(30));
        let a = agent("alpha");
        let _acting = acting_for(&a);
        let outer = slots.take().unwrap();
        let started = Instant::now();
        let inner = slots.take().unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(slots.held(&a), (2, 2));
        drop(inner);
        drop(outer);
        assert_eq!(slots.held(&a), (0, 0));
        // Not nested any more: the share is there again, taken at once.
        let again = slots.take().unwrap();
        assert_eq!(slots.held(&a), (1, 1));
        drop(again);
    }

    /// The mark is the thread's, and is restored when its guard goes: a
    /// request served after another's on the same connection thread is
    /// not counted against the first agent.
    #[test]
    fn acting_for_ends_with_its_guard() {
        let slots = Slots::default();
        let (a, b) = (agent("alpha"), agent("beta"));
        {
            let _outer = acting_for(&a);
            {
                let _inner = acting_for(&b);
                let s = slots.take().unwrap();
                assert_eq!(slots.held(&b), (1, 1));
                drop(s);
            }
            let s = slots.take().unwrap();
            assert_eq!((slots.held(&a), slots.held(&b)), ((1, 1), (1, 0)));
            drop(s);
        }
        let s = slots.take().unwrap();
        assert_eq!((slots.held(&a), slots.held(&b)), ((1, 0), (1, 0)));
        drop(s);
    }
}
