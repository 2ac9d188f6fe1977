//! `link-poll`: long-polls HEARTBEAT for user messages, decisions, cancel
//! requests, scheduled firings and stop requests, and feeds the edge lane's
//! inbox; says which messages it has taken delivery of, so a lost answer to
//! a poll is handed out again.
//!
//! **Invariant:** a message id at or below the highest one delivered is
//! never delivered to the edge again (choird may hand one out twice).

use super::*;

/// How long a poll may be held by choird.
const POLL_WAIT_MS: u64 = 25_000;

impl Link {
    /// `link-poll`: delivers messages to the edge; ends on stop, lease loss or
    /// when the agent closes.
    pub fn poll(&self, edge: Sender<EdgeEvent>) {
        let mut highest = self.processed.load(Ordering::SeqCst);
        let mut failures = 0;
        let mut polled = false;
        // choird asked what the lanes are doing: the next poll says.
        let mut report_status = false;
        while !self.closing.load(Ordering::SeqCst) {
            if std::mem::replace(&mut polled, true) {
                crate::failpoints::hang("poll_hang");
            }
            let mut req = self.bare_heartbeat(POLL_WAIT_MS, true, Vec::new());
            // Had an answer to an earlier poll been lost, choird hands its
            // messages out again.
            req.received_upto = Some(highest);
            // Once: a poll that fails does not carry it again (the reader
            // waiting for it has its deadline; the next ask is told anew).
            if std::mem::take(&mut report_status) {
                req.status = Some(self.board.report());
            }
            let timeout = Duration::from_millis(POLL_WAIT_MS) + Duration::from_secs(15);
            match self.rpc.call::<_, HeartbeatResponse>(Verb::Heartbeat, &req, timeout) {
                Ok(resp) => {
                    failures = 0;
                    report_status = resp.report_status;
                    // Config first: a message that arrives with a kill switch
                    // must already meet it.
                    if resp.config_version != self.config_version.load(Ordering::SeqCst) {
                        self.refresh_config();
                    }
                    for d in resp.decisions {
                        log::info!("decision on proposal {}: {} by {}", d.approval_id, d.status, d.decided_by);
                        if let Some(d) = self.approvals.deliver(d) {
                            if edge.send(EdgeEvent::Decision(d)).is_err() {
                                return;
                            }
                        }
                    }
                    for lane in &resp.cancel {
                        self.cancel(lane);
                    }
                    // An offer repeated (a lost reply) is harmless: choird
                    // accepts a firing's start once.
                    if !resp.firings.is_empty() {
                        self.start_firings(resp.firings);
                    }
                    if !resp.messages.is_empty() {
                        choir_common::hop::mark("agent.message");
                    }
                    for m in resp.messages {
                        // choird may hand a message out twice (a lost reply): ids only grow.
                        if m.id > highest {
                            highest = m.id;
                            if edge.send(EdgeEvent::Message(m)).is_err() {
                                return;
                            }
                        }
                    }
                    if resp.stop {
                        log::info!("choird asked us to stop");
                        let _ = edge.send(EdgeEvent::Stop);
                        return;
                    }
                }
                Err(RpcError::Unauthorized(msg)) => {
                    self.lose_lease(&msg);
                    let _ = edge.send(EdgeEvent::Stop);
                    return;
                }
                Err(e) => {
                    failures += 1;
                    log::warn!("poll failed ({e}); retrying");
                    std::thread::sleep(backoff(failures));
                }
            }
        }
    }

    /// Starts scheduled firings: first asks choird to accept each start (a
    /// firing whose start choird recorded is never offered again, so it runs
    /// at most once even if this agent dies now), then starts those accepted
    /// in the core pool; one that cannot start is reported refused.
    fn start_firings(&self, offers: Vec<FiringOffer>) {
        let Some(pool) = self.pool.upgrade() else { return };
        let starting: Vec<FiringReport> =
            offers.iter().map(|f| FiringReport { id: f.id, state: "starting".into(), detail: String::new() }).collect();
        // Asked again after an error: choird answers a start it already
        // granted this session the same, so none is lost, none doubled.
        let mut asked = self.report_firings(starting.clone());
        for _ in 0..2 {
            if asked.is_ok() || self.closing.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            asked = self.report_firings(starting.clone());
        }
        let accepted = match asked {
            Ok(resp) => resp.accepted,
            Err(e) => {
                // Not started: choird offers it again to this or the next session.
                log::warn!("cannot ask choird to start {} firing(s): {e}", offers.len());
                return;
            }
        };
        let mut refused = Vec::new();
        for f in offers.iter().filter(|f| accepted.contains(&f.id)) {
            log::info!("scheduled firing {} starts core job {}", f.id, f.job);
            if let Err(e) = pool.start_firing(f) {
                log::warn!("scheduled firing {} could not start: {e}", f.id);
                refused.push(FiringReport { id: f.id, state: "refused".into(), detail: e.to_string() });
            }
        }
        if !refused.is_empty() {
            // Unsent, choird records the firing as interrupted instead.
            if let Err(e) = self.report_firings(refused) {
                log::warn!("cannot report refused firings: {e}");
            }
        }
    }

    /// A HEARTBEAT that only reports on firings.
    fn report_firings(&self, firings: Vec<FiringReport>) -> Result<HeartbeatResponse, RpcError> {
        let req = self.bare_heartbeat(0, false, firings);
        self.rpc.call::<_, HeartbeatResponse>(Verb::Heartbeat, &req, Duration::from_secs(10))
    }

    /// A cancel request from choird: `edge` (its current turn or skill),
    /// `core:<job>`, or `all`.
    fn cancel(&self, lane: &str) {
        log::info!("cancel requested for {lane}");
        let pool = self.pool.upgrade();
        if lane == "edge" || lane == "all" {
            self.edge_cancel.set();
        }
        if let Some(pool) = &pool {
            if lane == "all" {
                pool.cancel_all();
            } else if let Some(job) = lane.strip_prefix("core:") {
                if let Err(e) = pool.cancel_reported(job) {
                    log::warn!("cancel {lane}: {e}");
                }
            }
        }
    }
}
