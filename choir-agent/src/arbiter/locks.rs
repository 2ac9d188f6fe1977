//! The lock manager (R-ARB-2): named resources locked shared (S) or exclusive
//! (X), a tool's whole lockset granted at once or not at all.
//!
//! Resources form a tree: `workspace` is the parent of `choirtmp` and of every
//! `file:<path>`, and `file:a` is the parent of `file:a/b`. Two locks conflict
//! when one resource is the other or an ancestor of it and at least one of them
//! is X. So an X on `workspace` excludes every file lock and the reverse, a
//! search holding S on `file:src` excludes a write to `file:src/main.rs`, and
//! readers share anything.
//!
//! **Invariant (no deadlock):** a lockset is granted atomically and nothing is
//! held while waiting, so no cycle of waiters can form.
//! **Invariant (no starvation):** a waiting request is granted only when it
//! conflicts neither with a holder nor with any request that has waited longer,
//! so a stream of readers cannot overtake a waiting writer; unrelated requests
//! still pass.
//!
//! The algorithm is the pure [`LockTable`]; [`LockManager`] adds blocking with a
//! mutex and condition variable behind the small [`Monitor`] trait, so the same
//! code runs on parking_lot in production and on shuttle's model checker in tests.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use choir_common::manifest::LockMode;

/// A lockable resource name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource(String);

impl Resource {
    /// A resource by name. `file:.` (the workspace root as a path) is `workspace`.
    pub fn new(name: &str) -> Resource {
        if name == "file:." {
            Resource("workspace".to_owned())
        } else {
            Resource(name.to_owned())
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is `other` or one of its ancestors.
    fn covers(&self, other: &Resource) -> bool {
        if self.0 == other.0 {
            return true;
        }
        if self.0 == "workspace" {
            return other.0 == "choirtmp" || other.0.starts_with("file:");
        }
        match (self.0.strip_prefix("file:"), other.0.strip_prefix("file:")) {
            (Some(a), Some(b)) => b.len() > a.len() && b.starts_with(a) && b.as_bytes()[a.len()] == b'/',
            _ => false,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether two (resource, mode) pairs cannot be held at the same time.
pub fn conflicts(a: (&Resource, LockMode), b: (&Resource, LockMode)) -> bool {
    let related = a.0.covers(b.0) || b.0.covers(a.0);
    related && !(a.1 == LockMode::S && b.1 == LockMode::S)
}

/// A request's identity in the table.
pub type Ticket = u64;

#[derive(Debug, Clone)]
struct Request {
    ticket: Ticket,
    owner: String,
    items: Vec<(Resource, LockMode)>,
}

impl Request {
    fn conflicts_with(&self, other: &Request) -> bool {
        self.items.iter().any(|a| other.items.iter().any(|b| conflicts((&a.0, a.1), (&b.0, b.1))))
    }
}

/// The state of one resource, for status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// Nobody holds it.
    Free,
    /// Held shared by this many requests.
    Shared(usize),
    /// Held exclusively by this owner.
    Exclusive(String),
}

/// The pure lock algorithm: holders and a FIFO of waiters. Not thread-safe by
/// itself; [`LockManager`] guards it.
#[derive(Debug, Default)]
pub struct LockTable {
    next: Ticket,
    held: Vec<Request>,
    waiting: VecDeque<Request>,
}

impl LockTable {
    /// Queues a request for the whole lockset `items`.
    pub fn enqueue(&mut self, owner: &str, items: Vec<(Resource, LockMode)>) -> Ticket {
        self.next += 1;
        self.waiting.push_back(Request { ticket: self.next, owner: owner.to_owned(), items });
        self.next
    }

    /// Grants `ticket` if it conflicts with no holder and no earlier waiter.
    pub fn try_grant(&mut self, ticket: Ticket) -> bool {
        let Some(pos) = self.waiting.iter().position(|r| r.ticket == ticket) else {
            return self.held.iter().any(|r| r.ticket == ticket);
        };
        let req = &self.waiting[pos];
        let blocked = self.held.iter().any(|h| req.conflicts_with(h))
            || self.waiting.iter().take(pos).any(|w| req.conflicts_with(w));
        if blocked {
            return false;
        }
        if let Some(req) = self.waiting.remove(pos) {
            self.held.push(req);
        }
        true
    }

    /// Withdraws a waiting request (timeout).
    pub fn cancel(&mut self, ticket: Ticket) {
        self.waiting.retain(|r| r.ticket != ticket);
    }

    /// Releases a granted request.
    pub fn release(&mut self, ticket: Ticket) {
        self.held.retain(|r| r.ticket != ticket);
    }

    /// Owners currently holding something that conflicts with `ticket`.
    pub fn blockers(&self, ticket: Ticket) -> Vec<String> {
        let Some(req) = self.waiting.iter().find(|r| r.ticket == ticket) else { return Vec::new() };
        let mut out: Vec<String> =
            self.held.iter().filter(|h| req.conflicts_with(h)).map(|h| h.owner.clone()).collect();
        out.dedup();
        out
    }

    /// FREE / S_LOCKED(n) / X_LOCKED(owner) of one resource (exact name).
    pub fn state(&self, resource: &Resource) -> LockState {
        let mut shared = 0;
        for h in &self.held {
            for (r, m) in &h.items {
                if r == resource {
                    match m {
                        LockMode::X => return LockState::Exclusive(h.owner.clone()),
                        LockMode::S => shared += 1,
                    }
                }
            }
        }
        if shared > 0 {
            LockState::Shared(shared)
        } else {
            LockState::Free
        }
    }

    /// Number of waiting requests.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// A mutex + condition variable around a [`LockTable`].
pub trait Monitor: Send + Sync {
    /// The guard of the mutex.
    type Guard<'a>: std::ops::DerefMut<Target = LockTable>
    where
        Self: 'a;
    /// Locks the table.
    fn lock(&self) -> Self::Guard<'_>;
    /// Waits for a notification or until `deadline`; true if the deadline passed.
    fn wait_until(&self, guard: &mut Self::Guard<'_>, deadline: Instant) -> bool;
    /// Wakes every waiter.
    fn notify_all(&self);
}

/// The production monitor: parking_lot.
#[derive(Default)]
pub struct ParkingMonitor {
    table: parking_lot::Mutex<LockTable>,
    cv: parking_lot::Condvar,
}

impl Monitor for ParkingMonitor {
    type Guard<'a> = parking_lot::MutexGuard<'a, LockTable>;

    fn lock(&self) -> Self::Guard<'_> {
        self.table.lock()
    }

    fn wait_until(&self, guard: &mut Self::Guard<'_>, deadline: Instant) -> bool {
        self.cv.wait_until(guard, deadline).timed_out()
    }

    fn notify_all(&self) {
        self.cv.notify_all();
    }
}

/// A lockset could not be acquired in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not lock {resources} within {waited_ms} ms (held by {held_by})")]
pub struct LockTimeout {
    /// The requested lockset, e.g. `file:a.txt:X, workspace:S`.
    pub resources: String,
    /// How long we waited.
    pub waited_ms: u64,
    /// Who held conflicting locks when we gave up.
    pub held_by: String,
}

/// The blocking lock manager.
#[derive(Default)]
pub struct LockManager<M: Monitor = ParkingMonitor> {
    monitor: M,
}

/// Holds a granted lockset; releases it on drop.
pub struct LockGuard<'a, M: Monitor> {
    manager: &'a LockManager<M>,
    ticket: Ticket,
}

impl<M: Monitor> Drop for LockGuard<'_, M> {
    fn drop(&mut self) {
        self.manager.monitor.lock().release(self.ticket);
        self.manager.monitor.notify_all();
    }
}

impl<M: Monitor> LockManager<M> {
    /// A manager over `monitor`.
    pub fn with_monitor(monitor: M) -> LockManager<M> {
        LockManager { monitor }
    }

    /// Acquires every item of the lockset atomically, waiting at most `timeout`.
    /// An empty lockset is granted at once.
    pub fn acquire(
        &self,
        owner: &str,
        items: Vec<(Resource, LockMode)>,
        timeout: Duration,
    ) -> Result<LockGuard<'_, M>, LockTimeout> {
        let started = Instant::now();
        let deadline = started + timeout;
        let describe = items.iter().map(|(r, m)| format!("{r}:{m:?}")).collect::<Vec<_>>().join(", ");
        let mut table = self.monitor.lock();
        let ticket = table.enqueue(owner, items);
        loop {
            if table.try_grant(ticket) {
                return Ok(LockGuard { manager: self, ticket });
            }
            let timed_out = Instant::now() >= deadline || self.monitor.wait_until(&mut table, deadline);
            if timed_out {
                if table.try_grant(ticket) {
                    return Ok(LockGuard { manager: self, ticket });
                }
                let held_by = table.blockers(ticket).join(", ");
                table.cancel(ticket);
                drop(table);
                // Our withdrawal may unblock requests queued behind us.
                self.monitor.notify_all();
                return Err(LockTimeout {
                    resources: describe,
                    waited_ms: started.elapsed().as_millis() as u64,
                    held_by: if held_by.is_empty() { "earlier waiters".into() } else { held_by },
                });
            }
        }
    }

    /// The state of a resource.
    pub fn state(&self, resource: &Resource) -> LockState {
        self.monitor.lock().state(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use LockMode::{S, X};

    fn r(name: &str) -> Resource {
        Resource::new(name)
    }

    #[test]
    fn compatibility_of_every_pair() {
        // (a, b, related?) — conflicts iff related and not both S.
        let pairs = [
            ("workspace", "workspace", true),
            ("workspace", "file:a.txt", true),
            ("workspace", "file:dir/a.txt", true),
            ("workspace", "choirtmp", true),
            ("workspace", "browser_tab", false),
            ("file:a.txt", "file:a.txt", true),
            ("file:a.txt", "file:b.txt", false),
            ("file:dir", "file:dir/a.txt", true),
            ("file:dir", "file:dirx/a.txt", false),
            ("file:dir/a", "file:dir", true),
            ("file:.", "file:a", true),
            ("choirtmp", "file:a", false),
            ("browser_tab", "browser_tab", true),
            ("browser_tab", "file:a", false),
        ];
        for (a, b, related) in pairs {
            for (ma, mb) in [(S, S), (S, X), (X, S), (X, X)] {
                let want = related && !(ma == S && mb == S);
                assert_eq!(conflicts((&r(a), ma), (&r(b), mb)), want, "{a}:{ma:?} vs {b}:{mb:?}");
                assert_eq!(conflicts((&r(b), mb), (&r(a), ma)), want, "symmetric: {b}:{mb:?} vs {a}:{ma:?}");
            }
        }
    }

    #[test]
    fn states_are_free_shared_and_exclusive() {
        let m: LockManager = LockManager::default();
        let f = r("file:a");
        assert_eq!(m.state(&f), LockState::Free);
        let g1 = m.acquire("one", vec![(f.clone(), S)], Duration::from_secs(1)).unwrap();
        let g2 = m.acquire("two", vec![(f.clone(), S)], Duration::from_secs(1)).unwrap();
        assert_eq!(m.state(&f), LockState::Shared(2));
        drop((g1, g2));
        let _g = m.acquire("three", vec![(f.clone(), X)], Duration::from_secs(1)).unwrap();
        assert_eq!(m.state(&f), LockState::Exclusive("three".into()));
    }

    #[test]
    fn a_lockset_is_all_or_nothing_and_times_out_clearly() {
        let m: LockManager = LockManager::default();
        let _held = m.acquire("exec", vec![(r("file:b"), X)], Duration::from_secs(1)).unwrap();
        let err =
            m.acquire("write", vec![(r("file:a"), X), (r("file:b"), X)], Duration::from_millis(100)).err().unwrap();
        assert_eq!(err.held_by, "exec");
        assert!(err.to_string().starts_with("could not lock file:a:X, file:b:X within"), "{err}");
        // Nothing of the failed set stayed held: file:a is free.
        assert_eq!(m.state(&r("file:a")), LockState::Free);
        assert!(m.acquire("other", vec![(r("file:a"), X)], Duration::from_millis(10)).is_ok());
    }

    #[test]
    fn a_waiting_writer_is_not_overtaken_by_later_readers() {
        let mut t = LockTable::default();
        let reader1 = t.enqueue("r1", vec![(r("file:a"), S)]);
        assert!(t.try_grant(reader1));
        let writer = t.enqueue("w", vec![(r("file:a"), X)]);
        assert!(!t.try_grant(writer));
        let reader2 = t.enqueue("r2", vec![(r("file:a"), S)]);
        assert!(!t.try_grant(reader2), "a later reader must queue behind the writer");
        let unrelated = t.enqueue("u", vec![(r("file:b"), X)]);
        assert!(t.try_grant(unrelated), "unrelated requests pass");
        t.release(reader1);
        assert!(t.try_grant(writer));
        assert!(!t.try_grant(reader2));
        t.release(writer);
        assert!(t.try_grant(reader2));
    }

    #[test]
    fn workspace_x_waits_for_file_locks_and_blocks_them() {
        let mut t = LockTable::default();
        let file = t.enqueue("read", vec![(r("file:src/a.rs"), S)]);
        assert!(t.try_grant(file));
        let exec = t.enqueue("exec", vec![(r("workspace"), X)]);
        assert!(!t.try_grant(exec));
        t.release(file);
        assert!(t.try_grant(exec));
        let file2 = t.enqueue("read", vec![(r("file:other"), S)]);
        assert!(!t.try_grant(file2));
        assert_eq!(t.blockers(file2), vec!["exec".to_owned()]);
    }

    /// Many threads, random locksets over a small set of resources: conflicting
    /// locks are never held together, and every request is eventually granted.
    #[test]
    fn randomized_stress_keeps_mutual_exclusion_and_grants_everyone() {
        let names = ["workspace", "file:a", "file:a/x", "file:b", "choirtmp", "browser_tab"];
        let manager: Arc<LockManager> = Arc::new(LockManager::default());
        let held: Arc<parking_lot::Mutex<Vec<(u64, Resource, LockMode)>>> = Arc::default();
        let granted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let (manager, held, granted) = (manager.clone(), held.clone(), granted.clone());
                std::thread::spawn(move || {
                    let mut seed = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut next = || {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed
                    };
                    for i in 0..300u64 {
                        let n = 1 + (next() % 3) as usize;
                        let mut items: Vec<(Resource, LockMode)> = (0..n)
                            .map(|_| {
                                let name = names[(next() % names.len() as u64) as usize];
                                (r(name), if next() % 3 == 0 { X } else { S })
                            })
                            .collect();
                        items.sort_by(|a, b| a.0.cmp(&b.0));
                        items.dedup_by(|a, b| a.0 == b.0);
                        let id = t * 1000 + i;
                        let guard = manager.acquire(&format!("t{t}"), items.clone(), Duration::from_secs(60)).unwrap();
                        {
                            let mut h = held.lock();
                            for (res, mode) in &items {
                                for (other, ores, omode) in h.iter() {
                                    assert!(
                                        !conflicts((res, *mode), (ores, *omode)),
                                        "{res}:{mode:?} granted while {other} holds {ores}:{omode:?}"
                                    );
                                }
                            }
                            h.extend(items.iter().map(|(res, m)| (id, res.clone(), *m)));
                        }
                        std::thread::yield_now();
                        held.lock().retain(|(owner, _, _)| *owner != id);
                        drop(guard);
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(granted.load(Ordering::SeqCst), 16 * 300);
    }

    /// The monitor over shuttle's primitives, for model checking.
    #[derive(Default)]
    struct ShuttleMonitor {
        table: shuttle::sync::Mutex<LockTable>,
        cv: shuttle::sync::Condvar,
    }

    struct ShuttleGuard<'a>(Option<shuttle::sync::MutexGuard<'a, LockTable>>);

    impl std::ops::Deref for ShuttleGuard<'_> {
        type Target = LockTable;
        fn deref(&self) -> &LockTable {
            self.0.as_deref().unwrap()
        }
    }

    impl std::ops::DerefMut for ShuttleGuard<'_> {
        fn deref_mut(&mut self) -> &mut LockTable {
            self.0.as_deref_mut().unwrap()
        }
    }

    impl Monitor for ShuttleMonitor {
        type Guard<'a> = ShuttleGuard<'a>;

        fn lock(&self) -> ShuttleGuard<'_> {
            ShuttleGuard(Some(self.table.lock().unwrap()))
        }

        fn wait_until(&self, guard: &mut ShuttleGuard<'_>, _deadline: Instant) -> bool {
            // Deadlines are far away in the model: only notifications matter.
            let g = guard.0.take().unwrap();
            guard.0 = Some(self.cv.wait(g).unwrap());
            false
        }

        fn notify_all(&self) {
            self.cv.notify_all();
        }
    }

    /// Model check over thread interleavings: a workspace writer and file
    /// readers and writers never hold conflicting locks together, and all finish
    /// (a lost wake-up would show up as a deadlock, which shuttle reports).
    #[test]
    fn model_checked_exclusion_and_progress() {
        shuttle::check_random(
            || {
                let manager = Arc::new(LockManager::with_monitor(ShuttleMonitor::default()));
                let inside = Arc::new(shuttle::sync::Mutex::new((0usize, 0usize)));
                let specs: Vec<(&str, Vec<(Resource, LockMode)>)> = vec![
                    ("exec", vec![(r("workspace"), X)]),
                    ("read", vec![(r("file:a"), S)]),
                    ("read2", vec![(r("file:a"), S), (r("file:b"), S)]),
                    ("write", vec![(r("file:a"), X)]),
                ];
                let handles: Vec<_> = specs
                    .into_iter()
                    .map(|(owner, items)| {
                        let (manager, inside) = (manager.clone(), inside.clone());
                        shuttle::thread::spawn(move || {
                            let exclusive = items.iter().any(|(_, m)| *m == X);
                            let _g = manager.acquire(owner, items, Duration::from_secs(3600)).unwrap();
                            {
                                let mut c = inside.lock().unwrap();
                                if exclusive {
                                    assert_eq!(*c, (0, 0), "{owner} entered while others were inside");
                                    c.1 += 1;
                                } else {
                                    assert_eq!(c.1, 0, "{owner} entered while a writer was inside");
                                    c.0 += 1;
                                }
                            }
                            shuttle::thread::yield_now();
                            let mut c = inside.lock().unwrap();
                            if exclusive {
                                c.1 -= 1;
                            } else {
                                c.0 -= 1;
                            }
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().unwrap();
                }
            },
            2000,
        );
    }
}
