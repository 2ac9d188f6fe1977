//! The scheduler's clock. Production reads the system clock; the tests give
//! choird a clock they move (`CHOIR_TEST_CLOCK_FILE`, read in `main.rs`), so
//! a job "every minute" is tested across a restart without sleeping minutes.
//!
//! **Invariant:** every time the scheduler compares with a job's schedule
//! comes from one [`Clock`]; nothing in `schedule/` reads the system time
//! (database timestamps of starts and ends are the database's own, for the
//! cost ledger, and are never compared with a schedule).

use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;
use parking_lot::Mutex;

/// A source of "now" for the scheduler.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
    /// How long (real time) the scheduler may sleep when the next firing is
    /// `until` away on this clock.
    fn nap(&self, until: Duration) -> Duration;
}

/// The system clock.
pub struct SystemClock;

/// Longest sleep between two looks at the schedule (a wall-clock jump, such
/// as a resumed laptop, is noticed within this).
const MAX_NAP: Duration = Duration::from_secs(30);

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
    fn nap(&self, until: Duration) -> Duration {
        until.min(MAX_NAP)
    }
}

/// A clock read from a file holding an RFC 3339 time, for tests: the file
/// is read at every look; an unreadable file keeps the last time read.
pub struct FileClock {
    path: PathBuf,
    last: Mutex<Timestamp>,
}

impl FileClock {
    /// A clock reading `path`.
    pub fn new(path: PathBuf) -> FileClock {
        FileClock { path, last: Mutex::new(Timestamp::UNIX_EPOCH) }
    }
}

impl Clock for FileClock {
    fn now(&self) -> Timestamp {
        let mut last = self.last.lock();
        if let Some(t) = std::fs::read_to_string(&self.path).ok().and_then(|s| s.trim().parse::<Timestamp>().ok()) {
            *last = t;
        }
        *last
    }
    fn nap(&self, until: Duration) -> Duration {
        until.min(Duration::from_millis(50))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_clock_reads_its_file_and_keeps_the_last_good_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("now");
        std::fs::write(&path, "2026-01-05T08:00:00Z\n").unwrap();
        let c = FileClock::new(path.clone());
        assert_eq!(c.now().to_string(), "2026-01-05T08:00:00Z");
        std::fs::write(&path, "not a time").unwrap();
        assert_eq!(c.now().to_string(), "2026-01-05T08:00:00Z");
        std::fs::write(&path, "2026-01-05T08:01:00Z").unwrap();
        assert_eq!(c.now().to_string(), "2026-01-05T08:01:00Z");
    }
}
