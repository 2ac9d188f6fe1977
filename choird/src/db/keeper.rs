//! Supervision of the managed PostgreSQL cluster, like an agent's: the
//! `pg-keeper` thread notices that the server is gone (stopped, killed,
//! died on a full disk), starts it again with backoff, says why in the log
//! and in `choirctl status`, and tells the admins on Telegram when it
//! cannot (directly through the Bot API: the outbox is in the database that
//! is down).
//!
//! It looks once a second at the postmaster's pid file and process (no
//! connection: a connection makes the server fork a backend). A server that
//! is up but busy (crash recovery, a checkpoint) is left alone.
//!
//! **Invariant:** the keeper only ever starts the cluster, never stops it;
//! choird's own shutdown stops it after the keeper has ended.
//! **Invariant:** restarts are at least [`FIRST_BACKOFF`] apart and back
//! off to [`MAX_BACKOFF`]: a cluster that cannot start (a full disk) is
//! tried again every half minute until it can, never in a tight loop.

use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use super::cluster::ManagedCluster;
use super::upkeep::UPKEEP_EVERY;

/// How often the server is looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The wait after the first failed start.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two starts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Failed starts in one outage after which the admins are told.
pub const ALERT_AFTER: u32 = 3;

/// What the keeper knows of the cluster, for `status`.
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<HealthState>,
}

#[derive(Debug, Default, Clone)]
struct HealthState {
    /// Since when the server has been found down (None: up).
    down_since: Option<SystemTime>,
    /// Failed starts in this outage.
    failed_starts: u32,
    /// Why the last start failed (or why the server went down).
    why: Option<String>,
    /// Restarts that worked since choird started.
    restarts: u64,
}

impl Health {
    /// One line for `status`: `up` (with the restarts since choird started),
    /// or down since when, the attempts, and why.
    pub fn describe(&self) -> String {
        let s = self.state.lock().clone();
        match s.down_since {
            None if s.restarts == 0 => "up".to_owned(),
            None => format!("up (restarted {} time(s) by choird)", s.restarts),
            Some(since) => {
                let at = jiff::Timestamp::try_from(since).map(|t| t.to_string()).unwrap_or_default();
                let why = s.why.map(|w| format!(": {w}")).unwrap_or_default();
                format!("DOWN since {at}, {} failed start(s), retrying{why}", s.failed_starts)
            }
        }
    }

    /// Whether the server was last found up.
    pub fn up(&self) -> bool {
        self.state.lock().down_since.is_none()
    }
}

/// What the keeper acts on: the cluster (or a stand-in, in unit tests).
pub trait Server {
    /// Whether the postmaster runs.
    fn running(&self) -> bool;
    /// Starts the server; the error says why it did not start.
    fn start(&self) -> Result<(), String>;
    /// Where [`super::upkeep::tend`] connects (`None`: no upkeep).
    fn upkeep_url(&self) -> Option<String> {
        None
    }
}

impl Server for ManagedCluster {
    fn running(&self) -> bool {
        self.postmaster_alive()
    }
    fn start(&self) -> Result<(), String> {
        self.start_again().map_err(|e| e.to_string())
    }
    fn upkeep_url(&self) -> Option<String> {
        Some(self.url())
    }
}

/// Runs until `stop` says so or its sender is gone: looks every
/// [`LOOK_EVERY`], starts the server when it is down, and calls `alert` once
/// per outage after [`ALERT_AFTER`] failed starts (and once more when it is
/// back after an alert). Between looks it sleeps on the channel, so an idle
/// choird's keeper wakes once a look, not to poll a flag.
///
/// Every [`UPKEEP_EVERY`] of a running server it tends the tables
/// ([`super::upkeep`]) on a thread of its own, so a long vacuum never
/// delays a look; one pass at a time, none before the first
/// [`UPKEEP_EVERY`] (a restart stays quick). A pass still running at the
/// end is left to finish or fail with the server's stop: it holds nothing
/// but its connection.
pub fn run(server: &dyn Server, health: &Health, stop: &Receiver<()>, alert: &dyn Fn(&str)) {
    let mut keeper = Keeper::default();
    let mut pace = UpkeepPace { last: Instant::now() };
    let mut upkeep: Option<std::thread::JoinHandle<()>> = None;
    loop {
        keeper.look(server, health, Instant::now(), alert);
        let idle = upkeep.as_ref().is_none_or(std::thread::JoinHandle::is_finished);
        if pace.due(Instant::now(), health.up(), idle) {
            upkeep = server.upkeep_url().and_then(|url| {
                std::thread::Builder::new().name("pg-upkeep".into()).spawn(move || tend_logged(&url)).ok()
            });
        }
        if !matches!(stop.recv_timeout(LOOK_EVERY), Err(RecvTimeoutError::Timeout)) {
            return;
        }
    }
}

/// When the next upkeep pass runs: [`UPKEEP_EVERY`] after the last one
/// began (or the keeper started), with the server up and no pass running.
#[derive(Debug)]
struct UpkeepPace {
    last: Instant,
}

impl UpkeepPace {
    /// Whether a pass starts now (it is then counted as begun).
    fn due(&mut self, now: Instant, up: bool, idle: bool) -> bool {
        let due = up && idle && now.saturating_duration_since(self.last) >= UPKEEP_EVERY;
        if due {
            self.last = now;
        }
        due
    }
}

/// One upkeep pass, its outcome logged.
fn tend_logged(url: &str) {
    match super::upkeep::tend(url) {
        Ok(t) if t.vacuumed.is_empty() && t.analyzed.is_empty() => log::debug!("upkeep: no table was due"),
        Ok(t) => log::info!("upkeep: vacuumed {:?}, analyzed {:?}", t.vacuumed, t.analyzed),
        Err(e) => log::warn!("upkeep: the tables were not tended (next pass in {UPKEEP_EVERY:?}): {e}"),
    }
}

/// The keeper's own memory between looks.
#[derive(Debug, Default)]
struct Keeper {
    /// The earliest next start.
    next_start: Option<Instant>,
    backoff: Option<Duration>,
    alerted: bool,
}

impl Keeper {
    fn look(&mut self, server: &dyn Server, health: &Health, now: Instant, alert: &dyn Fn(&str)) {
        if server.running() {
            let was_down = health.state.lock().down_since.is_some();
            if was_down {
                let mut s = health.state.lock();
                log::info!("the managed PostgreSQL is up again");
                s.down_since = None;
                s.failed_starts = 0;
                s.why = None;
                drop(s);
                if self.alerted {
                    alert("The managed PostgreSQL is up again; choird works normally.");
                }
            }
            *self = Keeper::default();
            return;
        }
        {
            let mut s = health.state.lock();
            if s.down_since.is_none() {
                log::error!("the managed PostgreSQL is not running; choird starts it again");
                s.down_since = Some(SystemTime::now());
                s.why = Some("the server stopped".into());
            }
        }
        if self.next_start.is_some_and(|t| now < t) {
            return;
        }
        // Every start (one that works and dies at once too) waits out the
        // backoff before the next; seen running, the keeper starts afresh.
        let backoff = self.backoff.map_or(FIRST_BACKOFF, |b| (b * 2).min(MAX_BACKOFF));
        self.backoff = Some(backoff);
        self.next_start = Some(now + backoff);
        match server.start() {
            Ok(()) => {
                let mut s = health.state.lock();
                s.restarts += 1;
                log::warn!("the managed PostgreSQL was started again (restart {} since choird started)", s.restarts);
                // Told as up at the next look, which sees it running.
            }
            Err(why) => {
                let failed = {
                    let mut s = health.state.lock();
                    s.failed_starts += 1;
                    s.why = Some(why.clone());
                    s.failed_starts
                };
                log::error!("the managed PostgreSQL did not start (attempt {failed}; next in {backoff:?}): {why}");
                if failed >= ALERT_AFTER && !self.alerted {
                    self.alerted = true;
                    alert(&format!(
                        "choird's managed PostgreSQL is down and did not start after {failed} tries: {why}. \
                         Messages are not taken or answered until it runs; choird keeps trying. \
                         See `choirctl status` and the cluster's log (<home>/pg/postgres.log)."
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    #[test]
    fn upkeep_runs_every_upkeep_every_with_the_server_up_and_never_two_passes_at_once() {
        let t0 = Instant::now();
        let mut pace = UpkeepPace { last: t0 };
        assert!(!pace.due(t0 + UPKEEP_EVERY / 2, true, true), "not before the first period ends");
        let period = t0 + UPKEEP_EVERY;
        assert!(!pace.due(period, false, true), "not while the server is down");
        assert!(!pace.due(period, true, false), "not while a pass runs");
        assert!(pace.due(period, true, true), "a period on, up and idle: a pass");
        assert!(!pace.due(period + Duration::from_secs(1), true, true), "counted from the pass that began");
        assert!(pace.due(period + UPKEEP_EVERY, true, true));
    }

    /// A server that is down until it has been started `works_after` times.
    struct Fake {
        up: Cell<bool>,
        starts: Cell<u32>,
        works_after: u32,
    }
    impl Server for Fake {
        fn running(&self) -> bool {
            self.up.get()
        }
        fn start(&self) -> Result<(), String> {
            self.starts.set(self.starts.get() + 1);
            if self.starts.get() >= self.works_after {
                self.up.set(true);
                Ok(())
            } else {
                Err("could not write lock file: No space left on device".into())
            }
        }
    }

    #[test]
    fn a_stopped_server_is_started_at_the_next_look_and_told_up_after() {
        let fake = Fake { up: Cell::new(false), starts: Cell::new(0), works_after: 1 };
        let (health, mut k) = (Health::default(), Keeper::default());
        let alerts = RefCell::new(Vec::new());
        let alert = |t: &str| alerts.borrow_mut().push(t.to_owned());
        k.look(&fake, &health, Instant::now(), &alert);
        assert_eq!(fake.starts.get(), 1);
        assert!(!health.up(), "told up only once seen running");
        k.look(&fake, &health, Instant::now(), &alert);
        assert!(health.up());
        assert_eq!(health.describe(), "up (restarted 1 time(s) by choird)");
        assert!(alerts.borrow().is_empty(), "a restart that worked alerts nobody");
    }

    /// A full disk: starts fail until space is back. Starts back off (never
    /// two within the backoff), the reason is in the status, the admins are
    /// told once after ALERT_AFTER failures, and once more when it is back.
    #[test]
    fn a_server_that_cannot_start_is_retried_with_backoff_explained_and_alerted_once() {
        let fake = Fake { up: Cell::new(false), starts: Cell::new(0), works_after: 6 };
        let (health, mut k) = (Health::default(), Keeper::default());
        let alerts = RefCell::new(Vec::new());
        let alert = |t: &str| alerts.borrow_mut().push(t.to_owned());
        let t0 = Instant::now();
        let mut starts_at = Vec::new();
        for second in 0..120 {
            let before = fake.starts.get();
            k.look(&fake, &health, t0 + Duration::from_secs(second), &alert);
            if fake.starts.get() > before {
                starts_at.push(second);
            }
            if second == 3 {
                let d = health.describe();
                assert!(d.starts_with("DOWN since") && d.contains("No space left on device"), "{d}");
            }
        }
        // 1, 2, 4, 8, 16 s apart.
        assert_eq!(starts_at, [0, 1, 3, 7, 15, 31]);
        assert!(health.up());
        let alerts = alerts.borrow();
        assert_eq!(alerts.len(), 2, "{alerts:?}");
        assert!(alerts[0].contains("did not start after 3 tries") && alerts[0].contains("No space left"));
        assert!(alerts[1].contains("up again"));
    }
}
