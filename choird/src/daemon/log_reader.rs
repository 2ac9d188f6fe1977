//! `choirctl logs`: choird's and agents' logs read back through the admin API
//! (R-CTL-3), archives included, and followed live.

use std::io::Write;
use std::time::Duration;

use choir_common::admin::LogPage;

use super::Daemon;
use crate::error::Error;
use crate::logs::query::{self, LogQuery};

/// How often a follower hears a keep-alive (a blank line) when nothing is
/// logged, so a client that went away is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);

impl Daemon {
    /// The newest matching records.
    pub fn log_page(&self, q: &LogQuery) -> LogPage {
        let logs = self.logs();
        let snapshot = logs.snapshot();
        query::read(logs.dir(), &snapshot, &q.filter, q.limit)
    }

    /// The newest matching records, then every new one as it is written, as
    /// JSON lines on `out` until the client goes away.
    pub fn follow_logs(&self, q: &LogQuery, out: &mut impl Write) -> Result<(), Error> {
        let logs = self.logs();
        let follower = logs.follow().ok_or_else(|| {
            Error::Unavailable(format!(
                "{} clients follow the logs already; stop one first",
                crate::logs::MAX_FOLLOWERS
            ))
        })?;
        let page = query::read(logs.dir(), &follower.snapshot, &q.filter, q.limit);
        let line = |r: &choir_common::admin::LogRecord| serde_json::to_string(r).unwrap_or_default();
        for r in &page.records {
            if writeln!(out, "{}", line(r)).is_err() {
                return Ok(());
            }
        }
        let mut quiet_since = std::time::Instant::now();
        loop {
            if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            let written = match follower.rx.recv_timeout(Duration::from_secs(1)) {
                Ok(entry) => {
                    let (stream, r) = &*entry;
                    if !q.filter.matches(stream, r) {
                        continue;
                    }
                    quiet_since = std::time::Instant::now();
                    writeln!(out, "{}", line(r))
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if quiet_since.elapsed() < KEEPALIVE => continue,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    quiet_since = std::time::Instant::now();
                    writeln!(out)
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    let _ = writeln!(
                        out,
                        "{}",
                        serde_json::json!({"error": "this follower fell too far behind the log and was cut off; run it again"})
                    );
                    return Ok(());
                }
            };
            if written.and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
        }
    }
}
