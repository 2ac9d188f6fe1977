//! The agent's side of the approval pipeline (R-TOOL-8, R-CTL-1): proposals go
//! to choird with REQUEST_APPROVAL; human decisions come back on HEARTBEAT
//! replies and are handed to the lane that waits for them (in
//! WAITING_APPROVAL), or, when no lane waits, to the edge lane, which tells
//! the user.
//!
//! **Invariant:** a decision is handed over once: to its waiting lane if one
//! registered when the proposal was stored, else to the edge.

use std::collections::{HashMap, HashSet};

use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::rpc::{ApprovalDecision, ApprovalRequest, ApprovalResponse, Verb};
use parking_lot::{Condvar, Mutex};

use crate::cancel::Cancel;
use crate::rpc::{Rpc, RpcError};
use crate::tools::propose::{Awaited, ProposalError, ProposalSink};

/// How often a waiting lane looks at its cancel flag.
const CANCEL_CHECK: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Desk {
    /// Proposals a lane waits for.
    waiting: HashSet<i64>,
    /// Decisions for those, not yet taken.
    decided: HashMap<i64, ApprovalDecision>,
}

/// Submits proposals and routes decisions.
pub struct Approvals {
    rpc: Option<Arc<Rpc>>,
    desk: Mutex<Desk>,
    changed: Condvar,
}

impl Approvals {
    /// A desk that submits through `rpc` (`None`: proposals are refused, for
    /// tests without choird).
    pub fn new(rpc: Option<Arc<Rpc>>) -> Approvals {
        Approvals { rpc, desk: Mutex::new(Desk::default()), changed: Condvar::new() }
    }

    /// A decision from choird: kept for the lane that waits for it (then
    /// `None`), or returned for the edge to tell the user.
    pub fn deliver(&self, d: ApprovalDecision) -> Option<ApprovalDecision> {
        let mut desk = self.desk.lock();
        if desk.waiting.contains(&d.approval_id) {
            desk.decided.insert(d.approval_id, d);
            self.changed.notify_all();
            None
        } else {
            Some(d)
        }
    }

    /// Waits for the decision on proposal `id` (submitted with `wait`);
    /// `None` if `cancel` was set first (the decision then goes to the edge).
    pub fn wait(&self, id: i64, cancel: Option<&Cancel>) -> Option<ApprovalDecision> {
        match self.wait_until(id, cancel, None) {
            Awaited::Decided(d) => Some(d),
            Awaited::Cancelled | Awaited::TimedOut => None,
        }
    }

    /// Waits for the decision on proposal `id` until `cancel` is set or
    /// `until` (if any) passes. Afterwards no lane waits for it: a later
    /// decision goes to the edge.
    fn wait_until(&self, id: i64, cancel: Option<&Cancel>, until: Option<Instant>) -> Awaited {
        let mut desk = self.desk.lock();
        desk.waiting.insert(id);
        loop {
            if let Some(d) = desk.decided.remove(&id) {
                desk.waiting.remove(&id);
                return Awaited::Decided(d);
            }
            if cancel.is_some_and(Cancel::is_set) {
                desk.waiting.remove(&id);
                return Awaited::Cancelled;
            }
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                desk.waiting.remove(&id);
                return Awaited::TimedOut;
            }
            let slice = until.map_or(CANCEL_CHECK, |u| (u - now).min(CANCEL_CHECK));
            self.changed.wait_for(&mut desk, slice);
        }
    }
}

impl ProposalSink for Approvals {
    fn submit(&self, req: &ApprovalRequest, wait: bool) -> Result<ApprovalResponse, ProposalError> {
        let rpc = self.rpc.as_ref().ok_or_else(|| ProposalError::Unavailable("no choird to send it to".into()))?;
        // Registered before the call returns, so a decision can never overtake it.
        let mut desk = self.desk.lock();
        match rpc.call::<_, ApprovalResponse>(Verb::RequestApproval, req, Duration::from_secs(30)) {
            Ok(r) => {
                if wait && r.status == "pending" {
                    desk.waiting.insert(r.approval_id);
                }
                Ok(r)
            }
            Err(RpcError::Refused { status: 400 | 409 | 413 | 422, message, .. }) => {
                Err(ProposalError::Invalid(message))
            }
            Err(e) => Err(ProposalError::Unavailable(e.to_string())),
        }
    }

    fn await_decision(&self, id: i64, cancel: Option<&Cancel>, until: Instant) -> Awaited {
        self.wait_until(id, cancel, Some(until))
    }
}
