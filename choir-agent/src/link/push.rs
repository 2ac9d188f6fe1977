//! `link-push`: replicates committed events (at once, and again until
//! acknowledged), reports firings and changes of the session state, and
//! heartbeats to keep the lease.
//!
//! **Invariant:** an event leaves the replication queue only once choird
//! has acknowledged a sequence number at or above it.
//!
//! Lanes are not reported here when they change: choird asks when someone
//! reads them, and link-poll answers (see `board.rs`).

use super::*;

/// How often a report of the session state choird did not take is tried again.
const STATUS_RETRY: Duration = Duration::from_secs(1);

/// Firing reports per HEARTBEAT (choird refuses more).
const MAX_FIRING_REPORTS: usize = 64;

/// How often an idle agent's link-push heartbeats. The lease lapses after
/// a minute without a request (choird's `LEASE_TTL`), and link-poll's long
/// poll renews it every 25 s anyway: three beats a minute keep the lease
/// with room for a missed one, and wake an idle agent and choird three
/// times a minute instead of twelve (at 100 agents that is most of the
/// system's idle CPU). Events, firings and status go at once, not at a beat.
const BEAT_EVERY: Duration = Duration::from_secs(20);

/// While events or firing reports wait for choird and the last try failed,
/// it is tried again at least this often (after each failure's backoff):
/// a withheld result waits on it, so not at the idle beat's pace.
const RETRY_EVERY: Duration = Duration::from_secs(5);

/// Events per replication HEARTBEAT.
const MAX_BATCH_EVENTS: usize = 512;

/// Bytes of events per replication HEARTBEAT (choird takes bodies up to 8 MiB).
const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;

impl Link {
    /// `link-push`: replicates committed events (at once, and again until
    /// acknowledged), reports firings and changes of the session state, and
    /// heartbeats to keep the lease; runs until `firings` closes and everything is
    /// shipped (or the lease is lost). What the edge says goes through
    /// [`Link::speak`] instead.
    pub fn push(&self, firings: Receiver<FiringReport>, committed: Receiver<()>) {
        let mut reports: Vec<FiringReport> = Vec::new();
        let mut reported = 0u64;
        // A session state choird did not take is tried again at most this
        // often, whatever else wakes the loop (every commit pokes it).
        let mut status_failed: Option<Instant> = None;
        let mut last_beat = Instant::now();
        let mut open = true;
        let mut closed_at: Option<Instant> = None;
        let mut failures = 0;
        loop {
            if !open && closed_at.is_none() {
                closed_at = Some(Instant::now());
            }
            let status_due = self.board.session_version() != reported;
            if open {
                let wait = if !self.log.all_acked() && failures == 0 {
                    // More to replicate (a batch was split): at once.
                    Duration::ZERO
                } else if status_due {
                    // A session state not reported yet: at once, or again
                    // STATUS_RETRY after a failure.
                    status_failed.map_or(Duration::ZERO, |t| STATUS_RETRY.saturating_sub(t.elapsed()))
                } else {
                    let every = if self.log.all_acked() && reports.is_empty() { BEAT_EVERY } else { RETRY_EVERY };
                    every.saturating_sub(last_beat.elapsed())
                };
                select! {
                    recv(firings) -> m => match m {
                        Ok(f) => reports.push(f),
                        Err(_) => open = false,
                    },
                    recv(committed) -> _ => {},
                    default(wait) => {},
                }
                reports.extend(firings.try_iter());
            }
            if self.lease_lost.is_set() {
                return;
            }
            let events = self.log.unacked_batch(MAX_BATCH_EVENTS, MAX_BATCH_BYTES);
            if !events.is_empty() || !reports.is_empty() || last_beat.elapsed() >= BEAT_EVERY {
                let mut req = self.bare_heartbeat(0, false, reports.iter().take(MAX_FIRING_REPORTS).cloned().collect());
                req.events = events;
                log::debug!("push: HEARTBEAT with {} event(s)", req.events.len());
                match self.rpc.call::<_, HeartbeatResponse>(Verb::Heartbeat, &req, Duration::from_secs(30)) {
                    Ok(resp) => {
                        failures = 0;
                        last_beat = Instant::now();
                        self.log.ack(resp.acked_seq);
                        reports.drain(..reports.len().min(MAX_FIRING_REPORTS));
                    }
                    Err(RpcError::Unauthorized(msg)) => {
                        self.lose_lease(&msg);
                        return;
                    }
                    Err(RpcError::EventRefused { seq, message }) => {
                        // Not retried as is: a placeholder keeps the chain,
                        // and the batch goes again at once.
                        if !self.log.quarantine(seq, &message) {
                            let first = req.events.first().map(|e| e.seq);
                            log::error!(
                                "choird refused event {seq}, which is not waiting ({message}); quarantining {first:?}"
                            );
                            if let Some(first) = first {
                                self.log.quarantine(first, &message);
                            }
                        }
                        continue;
                    }
                    Err(e) => {
                        failures += 1;
                        self.log.replication_failed(&e.to_string(), e.retryable());
                        // Stopping and choird unreachable: what is committed stays
                        // in the local log and is replicated at the next start.
                        if closed_at.is_some_and(|t| t.elapsed() >= GIVE_UP_WHEN_STOPPING) {
                            log::warn!(
                                "choird unreachable while stopping ({e}); {} event(s) stay in the local log for the next start",
                                self.log.unacked().len()
                            );
                            self.log.close_replication("the agent is stopping and choird is unreachable");
                            return;
                        }
                        log::warn!("replication failed ({e}); retrying");
                        std::thread::sleep(backoff(failures));
                        continue;
                    }
                }
            }
            let version = self.board.session_version();
            if version != reported && status_failed.is_none_or(|t| t.elapsed() >= STATUS_RETRY || !open) {
                let report = self.board.report();
                match self.rpc.call::<_, Ack>(Verb::ReportStatus, &report, Duration::from_secs(10)) {
                    Ok(_) => (reported, status_failed) = (version, None),
                    Err(e) => {
                        log::warn!("status report failed: {e}");
                        status_failed = Some(Instant::now());
                    }
                }
            }
            if !open && reports.is_empty() && self.log.all_acked() {
                return;
            }
        }
    }
}
