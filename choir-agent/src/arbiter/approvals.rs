//! The agent's side of the approval pipeline (R-TOOL-8, R-CTL-1): proposals go
//! to choird with REQUEST_APPROVAL; human decisions come back on HEARTBEAT
//! replies and are handed to the lane that waits for them (in
//! WAITING_APPROVAL), or, when no lane waits, to the edge lane, which tells
//! the user.
//!
//! **Invariant:** a decision is handed over once: to its waiting lane if one
//! registered when the proposal was stored, else to the edge.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::rpc::{ApprovalDecision, ApprovalRequest, ApprovalResponse, Verb};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::cancel::Cancel;
use crate::rpc::{Rpc, RpcError};
use crate::tools::propose::{Awaited, ProposalError, ProposalSink};

/// Where the decision on a proposal a lane waits for arrives (bounded(1):
/// choird decides a proposal once); it holds a decision that came before
/// the lane began to wait.
type Slot = (Sender<ApprovalDecision>, Receiver<ApprovalDecision>);

/// Submits proposals and routes decisions.
///
/// **Invariant:** a decision on a proposal a lane waits for goes to that
/// lane, never to the edge too; once the lane's wait has ended without it
/// (cancelled, timed out), a later one goes to the edge. The waiting lane
/// sleeps until the decision, its cancel or its deadline wakes it.
pub struct Approvals {
    rpc: Option<Arc<Rpc>>,
    /// The proposals a lane waits for, by id.
    desk: Mutex<HashMap<i64, Slot>>,
}

impl Approvals {
    /// A desk that submits through `rpc` (`None`: proposals are refused, for
    /// tests without choird).
    pub fn new(rpc: Option<Arc<Rpc>>) -> Approvals {
        Approvals { rpc, desk: Mutex::new(HashMap::new()) }
    }

    /// A decision from choird: kept for the lane that waits for it (then
    /// `None`), or returned for the edge to tell the user.
    pub fn deliver(&self, d: ApprovalDecision) -> Option<ApprovalDecision> {
        match self.desk.lock().get(&d.approval_id) {
            Some((tx, _)) => {
                // Full: it was decided already (choird decides once).
                let _ = tx.try_send(d);
                None
            }
            None => Some(d),
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
        let decided = self.desk.lock().entry(id).or_insert_with(|| crossbeam_channel::bounded(1)).1.clone();
        let listening = cancel.map(Cancel::listen);
        let (never, deadline) =
            (crossbeam_channel::never(), until.map_or_else(crossbeam_channel::never, crossbeam_channel::at));
        let woken = listening.as_ref().map_or(&never, |l| l.woken());
        let out = loop {
            if let Ok(d) = decided.try_recv() {
                break Awaited::Decided(d);
            }
            if cancel.is_some_and(Cancel::is_set) {
                break Awaited::Cancelled;
            }
            crossbeam_channel::select! {
                recv(decided) -> d => if let Ok(d) = d { break Awaited::Decided(d) },
                recv(woken) -> _ => {}
                recv(deadline) -> _ => break Awaited::TimedOut,
            }
        };
        // No lane waits for it any more: a later decision goes to the edge,
        // and one that came meanwhile is still this lane's.
        self.desk.lock().remove(&id);
        match (out, decided.try_recv()) {
            (Awaited::Cancelled | Awaited::TimedOut, Ok(d)) => Awaited::Decided(d),
            (out, _) => out,
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
                    desk.entry(r.approval_id).or_insert_with(|| crossbeam_channel::bounded(1));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::fewest_wake_ups;

    fn decision(id: i64) -> ApprovalDecision {
        ApprovalDecision {
            approval_id: id,
            status: "approved".into(),
            subject: "tool x".into(),
            decided_by: "admin".into(),
            reason: None,
            conversation: None,
            sha256: None,
        }
    }

    /// A lane waiting for a human's decision used to wake every 200 ms to
    /// look at its cancel flag, however long the human took.
    #[test]
    fn regression_a_lane_waiting_for_a_decision_woke_every_200_ms() {
        let woke = fewest_wake_ups(|| {
            let desk = Arc::new(Approvals::new(None));
            let cancel = Cancel::new();
            let giver = desk.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1_200));
                assert_eq!(giver.deliver(decision(7)), None, "the waiting lane takes it");
            });
            let got = desk.wait(7, Some(&cancel));
            t.join().unwrap();
            assert_eq!(got, Some(decision(7)));
        });
        assert!(woke <= 2, "the waiting lane woke {woke} times in 1.2 s");
    }

    #[test]
    fn a_decision_goes_to_its_waiting_lane_else_to_the_edge_and_a_cancel_ends_the_wait() {
        let desk = Arc::new(Approvals::new(None));
        // Nobody waits: the edge gets it.
        assert_eq!(desk.deliver(decision(1)), Some(decision(1)));
        // Decided before the lane began to wait (registered at submit): kept for it.
        desk.desk.lock().entry(2).or_insert_with(|| crossbeam_channel::bounded(1));
        assert_eq!(desk.deliver(decision(2)), None);
        assert_eq!(desk.wait(2, None), Some(decision(2)));
        // A cancel wakes the wait at once; afterwards a decision goes to the edge.
        let woke = fewest_wake_ups(|| {
            let cancel = Arc::new(Cancel::new());
            let setter = cancel.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1_000));
                setter.set();
            });
            assert_eq!(desk.wait(3, Some(&cancel)), None);
            t.join().unwrap();
            assert_eq!(desk.deliver(decision(3)), Some(decision(3)), "no lane waits for it any more");
        });
        assert!(woke <= 2, "woken by the cancel, not by a clock: {woke} wake-ups");
        // A deadline ends it too, and a decision that came first still counts.
        let until = Instant::now() + Duration::from_millis(100);
        assert_eq!(desk.await_decision(4, None, until), Awaited::TimedOut);
        assert_eq!(desk.deliver(decision(4)), Some(decision(4)));
        desk.desk.lock().entry(5).or_insert_with(|| crossbeam_channel::bounded(1));
        desk.deliver(decision(5));
        let set = Cancel::new();
        set.set();
        assert_eq!(desk.await_decision(5, Some(&set), Instant::now()), Awaited::Decided(decision(5)));
        assert!(desk.desk.lock().is_empty(), "no wait is left registered");
    }
}
