//! Lane and session state machines (R-LANE-2) and the status board reported to
//! choird.
//!
//! **Invariant:** a lane changes state only along an edge of [`allowed`]; an
//! illegal transition is refused (and logged), never applied. Core lanes end in
//! DONE, FAILED or CANCELLED for good; the edge lane returns to IDLE after each
//! turn, whatever its outcome.
//!
//! **Invariant:** the board is reported when its session state changed
//! (link-push: choird counts an agent running from its first RUNNING) and
//! when choird asks (link-poll: someone reads the lanes). A lane's change
//! alone wakes no one: lanes change several times a turn and a step, and
//! nobody reads them but someone asking.

use choir_common::lane::Lane;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use choir_common::rpc::{json_len, LaneStatus, ReportStatusRequest, SkillProgress, MAX_STATUS_BYTES};
use parking_lot::Mutex;

/// Characters of a lane's detail a status report carries.
pub const DETAIL_CHARS: usize = 200;

/// The state of a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneState {
    /// Waiting for work.
    Idle,
    /// Waiting for the model.
    Reasoning,
    /// Running tool calls.
    WaitingTool,
    /// Waiting for a human's decision on a proposal.
    WaitingApproval,
    /// Finished its work (core jobs).
    Done,
    /// Gave up (budget, corrections, errors).
    Failed,
    /// Cancelled by the user, the edge, or a stop.
    Cancelled,
}

impl LaneState {
    /// The protocol spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LaneState::Idle => "IDLE",
            LaneState::Reasoning => "REASONING",
            LaneState::WaitingTool => "WAITING_TOOL",
            LaneState::WaitingApproval => "WAITING_APPROVAL",
            LaneState::Done => "DONE",
            LaneState::Failed => "FAILED",
            LaneState::Cancelled => "CANCELLED",
        }
    }
}

/// The transition table.
pub fn allowed(role: Lane, from: LaneState, to: LaneState) -> bool {
    use LaneState::*;
    match (from, to) {
        (Idle, Reasoning) | (Idle, Cancelled) => true,
        (Reasoning, Reasoning) | (Reasoning, WaitingTool) | (Reasoning, WaitingApproval) => true,
        (Reasoning, Failed) | (Reasoning, Cancelled) => true,
        (WaitingTool, Reasoning) | (WaitingTool, Failed) | (WaitingTool, Cancelled) => true,
        // A proposal tool returned "pending": the lane waits for the human.
        (WaitingTool, WaitingApproval) => true,
        (WaitingApproval, Reasoning) | (WaitingApproval, Failed) | (WaitingApproval, Cancelled) => true,
        // The edge answers and goes back to waiting; a core job finishes.
        (Reasoning, Idle) => role == Lane::Edge,
        (Reasoning, Done) => role == Lane::Core,
        // An edge turn that failed or was cut short leaves the lane usable.
        (Failed, Idle) | (Cancelled, Idle) => role == Lane::Edge,
        (Idle, Done) => role == Lane::Edge,
        _ => false,
    }
}

/// A transition that the table does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lane {lane}: illegal transition {from} -> {to}")]
pub struct IllegalTransition {
    /// The lane.
    pub lane: String,
    /// Its state.
    pub from: &'static str,
    /// The refused target.
    pub to: &'static str,
}

/// The session's state (the agent as a whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Handshake and set-up.
    Starting,
    /// Resuming interrupted turns from the log.
    Recovering,
    /// Serving.
    Running,
    /// Finishing the current work before stopping.
    Draining,
    /// Gone.
    Stopped,
}

impl SessionState {
    /// The protocol spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Starting => "STARTING",
            SessionState::Recovering => "RECOVERING",
            SessionState::Running => "RUNNING",
            SessionState::Draining => "DRAINING",
            SessionState::Stopped => "STOPPED",
        }
    }
}

/// Budgets and usage of one lane.
#[derive(Debug, Clone, Default)]
struct Entry {
    state: Option<LaneState>,
    steps: u64,
    tokens: u64,
    max_steps: Option<u64>,
    max_tokens: Option<u64>,
    started: Option<Instant>,
    detail: Option<String>,
    skill: Option<SkillProgress>,
    /// Waiting, inside a tool call, for a human to confirm it (reported as
    /// WAITING_APPROVAL over the machine's WAITING_TOOL).
    confirming: bool,
}

/// Every lane's state and budget, shared by the lanes (who update it) and the
/// link (which reports it when the session state changed, or asked).
#[derive(Default)]
pub struct StatusBoard {
    inner: Mutex<Board>,
    /// Pokes the reporter when the session state changes (bounded(1): one
    /// pending poke is enough).
    poke: Option<crossbeam_channel::Sender<()>>,
}

#[derive(Default)]
struct Board {
    session: Option<SessionState>,
    lanes: BTreeMap<String, Entry>,
    /// Counts changes of the session state.
    session_version: u64,
}

impl StatusBoard {
    /// A new board.
    pub fn new() -> Arc<StatusBoard> {
        Arc::new(StatusBoard::default())
    }

    /// A new board that pokes `poke` when its session state changes.
    pub fn with_poke(poke: crossbeam_channel::Sender<()>) -> Arc<StatusBoard> {
        Arc::new(StatusBoard { inner: Mutex::default(), poke: Some(poke) })
    }

    /// Sets the session state; a change pokes the reporter.
    pub fn set_session(&self, s: SessionState) {
        let mut b = self.inner.lock();
        if b.session == Some(s) {
            return;
        }
        b.session = Some(s);
        b.session_version += 1;
        if let Some(p) = &self.poke {
            let _ = p.try_send(());
        }
    }

    /// Registers a lane with its budgets.
    pub fn add_lane(&self, lane: &str, max_steps: Option<u64>, max_tokens: Option<u64>, detail: Option<String>) {
        let mut b = self.inner.lock();
        b.lanes.insert(
            lane.to_owned(),
            Entry { state: Some(LaneState::Idle), max_steps, max_tokens, started: None, detail, ..Entry::default() },
        );
    }

    /// Removes a lane (a finished core job, once reported).
    pub fn remove_lane(&self, lane: &str) {
        let mut b = self.inner.lock();
        b.lanes.remove(lane);
    }

    /// Updates a lane's usage.
    pub fn usage(&self, lane: &str, steps: u64, tokens: u64) {
        let mut b = self.inner.lock();
        if let Some(e) = b.lanes.get_mut(lane) {
            e.steps = steps;
            e.tokens = tokens;
        }
    }

    /// Sets (or clears) the skill a lane runs and where it is.
    pub fn skill(&self, lane: &str, progress: Option<SkillProgress>) {
        let mut b = self.inner.lock();
        if let Some(e) = b.lanes.get_mut(lane) {
            e.skill = progress;
        }
    }

    /// Marks a lane as waiting (or no longer) for a human to confirm the
    /// call it is making: reported as WAITING_APPROVAL meanwhile.
    pub fn confirming(&self, lane: &str, on: bool) {
        let mut b = self.inner.lock();
        if let Some(e) = b.lanes.get_mut(lane) {
            e.confirming = on;
        }
    }

    /// ELAPSED counts from the moment a lane leaves IDLE (a turn, a job)
    /// and stops when it is IDLE again.
    fn set_state(&self, lane: &str, s: LaneState) {
        let mut b = self.inner.lock();
        if let Some(e) = b.lanes.get_mut(lane) {
            let was_idle = matches!(e.state, None | Some(LaneState::Idle));
            e.state = Some(s);
            if s == LaneState::Idle {
                e.started = None;
            } else if was_idle {
                e.started = Some(Instant::now());
            }
        }
    }

    /// A lane's step limit, as the config in force says (an approved
    /// change shows at the next turn, not at the next start).
    pub fn set_max_steps(&self, lane: &str, max_steps: u64) {
        let mut b = self.inner.lock();
        if let Some(e) = b.lanes.get_mut(lane) {
            e.max_steps = Some(max_steps);
        }
    }

    /// Counts changes of the session state: the reporter reports when it moved.
    pub fn session_version(&self) -> u64 {
        self.inner.lock().session_version
    }

    /// The status report of the board: [`StatusBoard::snapshot`] within
    /// what choird takes ([`MAX_STATUS_BYTES`]). A lane's detail (a core
    /// job's objective, which the model wrote) is cut to [`DETAIL_CHARS`];
    /// lanes that still do not fit are left out, the last ones first, so a
    /// report is never refused (refused on the poll, it would keep the
    /// agent's messages, cancels and stop from it).
    pub fn report(&self) -> ReportStatusRequest {
        let (session_state, mut lanes) = self.snapshot();
        for l in &mut lanes {
            l.detail = l.detail.as_deref().map(|d| choir_common::text::clipped(d, DETAIL_CHARS));
        }
        // Each part's size is counted once: the empty report, then each
        // lane and its comma.
        let mut used = json_len(&ReportStatusRequest { session_state: session_state.clone(), lanes: Vec::new() });
        let fitting = lanes
            .iter()
            .take_while(|l| {
                used = used.saturating_add(json_len(l)).saturating_add(1);
                used <= MAX_STATUS_BYTES + 1
            })
            .count();
        lanes.truncate(fitting);
        ReportStatusRequest { session_state, lanes }
    }

    /// The session state and every lane, as a status report carries them.
    fn snapshot(&self) -> (String, Vec<LaneStatus>) {
        let b = self.inner.lock();
        let lanes = b
            .lanes
            .iter()
            .map(|(name, e)| LaneStatus {
                lane: name.clone(),
                state: if e.confirming {
                    LaneState::WaitingApproval.as_str()
                } else {
                    e.state.map(LaneState::as_str).unwrap_or("IDLE")
                }
                .to_owned(),
                steps: e.steps,
                tokens: e.tokens,
                max_steps: e.max_steps,
                max_tokens: e.max_tokens,
                elapsed_ms: e.started.map(|t| t.elapsed().as_millis() as u64),
                detail: e.detail.clone(),
                skill: e.skill.clone(),
            })
            .collect();
        (b.session.map(SessionState::as_str).unwrap_or("STARTING").to_owned(), lanes)
    }
}

/// One lane's state machine, mirrored on the board.
pub struct LaneMachine {
    lane: String,
    role: Lane,
    state: LaneState,
    board: Arc<StatusBoard>,
}

impl LaneMachine {
    /// A lane in IDLE.
    pub fn new(lane: &str, role: Lane, board: Arc<StatusBoard>) -> LaneMachine {
        LaneMachine { lane: lane.to_owned(), role, state: LaneState::Idle, board }
    }

    /// The current state.
    pub fn state(&self) -> LaneState {
        self.state
    }

    /// Moves to `to` if the table allows it; otherwise logs and refuses.
    pub fn go(&mut self, to: LaneState) -> Result<(), IllegalTransition> {
        if !allowed(self.role, self.state, to) {
            let e = IllegalTransition { lane: self.lane.clone(), from: self.state.as_str(), to: to.as_str() };
            log::error!("{e}");
            return Err(e);
        }
        self.state = to;
        self.board.set_state(&self.lane, to);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LaneState::*;

    const ALL: [LaneState; 7] = [Idle, Reasoning, WaitingTool, WaitingApproval, Done, Failed, Cancelled];

    #[test]
    fn terminal_states_of_core_lanes_are_final() {
        for to in ALL {
            for from in [Done, Failed, Cancelled] {
                assert!(!allowed(Lane::Core, from, to), "core {from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn the_table_is_exactly_as_documented() {
        let edge: Vec<(LaneState, LaneState)> = ALL
            .iter()
            .flat_map(|f| ALL.iter().map(move |t| (*f, *t)))
            .filter(|(f, t)| allowed(Lane::Edge, *f, *t))
            .collect();
        assert_eq!(
            edge,
            vec![
                (Idle, Reasoning),
                (Idle, Done),
                (Idle, Cancelled),
                (Reasoning, Idle),
                (Reasoning, Reasoning),
                (Reasoning, WaitingTool),
                (Reasoning, WaitingApproval),
                (Reasoning, Failed),
                (Reasoning, Cancelled),
                (WaitingTool, Reasoning),
                (WaitingTool, WaitingApproval),
                (WaitingTool, Failed),
                (WaitingTool, Cancelled),
                (WaitingApproval, Reasoning),
                (WaitingApproval, Failed),
                (WaitingApproval, Cancelled),
                (Failed, Idle),
                (Cancelled, Idle),
            ]
        );
        assert!(allowed(Lane::Core, Reasoning, Done) && !allowed(Lane::Core, Reasoning, Idle));
    }

    #[test]
    fn illegal_transitions_are_refused_and_change_nothing() {
        let board = StatusBoard::new();
        board.add_lane("core-x", Some(10), None, None);
        let mut m = LaneMachine::new("core-x", Lane::Core, board.clone());
        assert!(m.go(WaitingTool).is_err());
        assert_eq!(m.state(), Idle);
        m.go(Reasoning).unwrap();
        m.go(Done).unwrap();
        let err = m.go(Reasoning).unwrap_err();
        assert_eq!(err.to_string(), "lane core-x: illegal transition DONE -> REASONING");
        assert_eq!(board.snapshot().1[0].state, "DONE");
    }

    /// Every lane change woke the status reporter (at most every 250 ms),
    /// which sent a report nobody had asked for: with a model that thinks,
    /// two or three round trips to choird a turn, and one a core job's step.
    #[test]
    fn regression_a_lane_change_woke_the_reporter_though_nobody_asked() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let board = StatusBoard::with_poke(tx);
        let pokes = || rx.try_iter().count();
        board.add_lane("edge", None, None, None);
        let mut m = LaneMachine::new("edge", Lane::Edge, board.clone());
        m.go(Reasoning).unwrap();
        board.usage("edge", 1, 10);
        board.skill("edge", None);
        board.confirming("edge", true);
        board.set_max_steps("edge", 7);
        m.go(WaitingTool).unwrap();
        assert_eq!(pokes(), 0, "lane changes wake no one");
        assert_eq!(board.session_version(), 0);
        let (_, lanes) = board.snapshot();
        assert_eq!(
            (lanes[0].state.as_str(), lanes[0].steps, lanes[0].max_steps),
            ("WAITING_APPROVAL", 1, Some(7)),
            "an asked report carries the latest of every change"
        );
        // The session state is what choird needs unasked (RUNNING ends a start).
        board.set_session(SessionState::Running);
        assert_eq!(pokes(), 1, "a session change pokes");
        board.set_session(SessionState::Running);
        assert_eq!(pokes(), 0, "the same state again is no change");
        assert_eq!((board.snapshot().0.as_str(), board.session_version()), ("RUNNING", 1));
    }

    /// A report choird refuses on the long-poll would keep the agent deaf
    /// to its messages and cancels: the model writes core jobs'
    /// objectives (a lane's detail), so the report is fitted.
    #[test]
    fn a_report_fits_what_choird_takes_whatever_the_lanes_hold() {
        let board = StatusBoard::new();
        board.set_session(SessionState::Running);
        for i in 0..64 {
            board.add_lane(&format!("core:{i:02}"), None, None, Some("objective ".repeat(10_000)));
        }
        let raw = serde_json::to_vec(&board.snapshot().1).unwrap().len();
        assert!(raw > 4 * MAX_STATUS_BYTES, "the test builds an oversized board ({raw} bytes)");
        let report = board.report();
        assert!(serde_json::to_vec(&report).unwrap().len() <= MAX_STATUS_BYTES);
        assert_eq!(report.lanes.len(), 64, "cutting the details was enough");
        assert!(report.lanes.iter().all(|l| l.detail.as_ref().is_some_and(|d| d.chars().count() <= DETAIL_CHARS + 1)));
        // Lanes that cannot fit are left out, the last ones first.
        for i in 0..2000 {
            board.add_lane(&format!("core:x{i:04}"), Some(1), Some(1), Some("d".repeat(150)));
        }
        let report = board.report();
        assert!(serde_json::to_vec(&report).unwrap().len() <= MAX_STATUS_BYTES);
        assert!(report.lanes.len() < 2064 && report.lanes[0].lane == "core:00", "{}", report.lanes.len());
        assert_eq!(report.session_state, "RUNNING");
    }
}
