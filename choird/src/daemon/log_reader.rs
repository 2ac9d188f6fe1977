//! `choirctl logs`: choird's and agents' logs read back through the admin API
//! (R-CTL-3), archives included, and followed live.

use std::io::Write;
use std::time::Duration;

use choir_common::admin::LogPage;
use choir_common::ids::AgentId;

use super::Daemon;
use crate::error::Error;
use crate::logs::query::{self, Filter};

/// Most records one page returns.
pub const MAX_LIMIT: usize = 100_000;
/// How often a follower hears a keep-alive (a blank line) when nothing is
/// logged, so a client that went away is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A reader's query, checked.
#[derive(Debug)]
pub struct LogQuery {
    /// What to read.
    pub filter: Filter,
    /// The newest this many.
    pub limit: usize,
}

impl LogQuery {
    /// Checks a query's parameters (each error names the fix).
    pub fn parse(
        agent: Option<&str>,
        since: Option<&str>,
        level: Option<&str>,
        grep: Option<&str>,
        limit: Option<&str>,
    ) -> Result<LogQuery, Error> {
        let agent = match agent {
            Some(a) => Some(AgentId::parse(a).map_err(|e| Error::Malformed(e.to_string()))?.as_str().to_owned()),
            None => None,
        };
        let since = since.map(query::parse_since).transpose().map_err(Error::Malformed)?;
        let max_rank = level.map_or(Ok(5), query::parse_level).map_err(Error::Malformed)?;
        let limit = match limit {
            None => 1000,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| Error::Malformed(format!("limit {l:?} must be a number from 1 to {MAX_LIMIT}")))?,
        };
        let grep = grep.filter(|g| !g.is_empty()).map(str::to_owned);
        Ok(LogQuery { filter: Filter { agent, since, max_rank, grep }, limit })
    }
}

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
