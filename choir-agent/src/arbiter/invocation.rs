//! What came of one tool call: an [`Invocation`]. The arbiter returns one for
//! every call a model proposes (ran, failed, timed out, refused, waiting for
//! a human, withheld), skills make them for their controls
//! (`choir.skill.transition`, `choir.skill.finish`), and lanes decide on
//! them by their types — a refusal to correct, a proposal to wait for —
//! never by reading JSON back. What the model sees of one (and what is
//! committed as the call's `result`) is rendered from it in one place,
//! `results::render`.
//!
//! **Invariant:** an invocation holds only what the calling lane may see:
//! secrets masked, text sanitised, output hidden by `exposure` or
//! `prompt_mask` left out, a large output replaced by its artifact.

use choir_common::commit::Outcome;
use choir_common::trust::OutputTrust;
use serde_json::{Map, Value};

use crate::origin::Origin;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The tool ran and reported success.
    Success,
    /// The tool ran and failed (or could not be run).
    Error,
    /// The tool ran past its deadline and was stopped; partial output.
    Timeout,
    /// The arbiter (or a skill) refused the call; nothing ran.
    Rejected,
    /// A proposal now waits for a human; nothing ran.
    PendingApproval,
    /// The call's record was not stored by choird in time, so its result
    /// is withheld from the model.
    Withheld,
}

impl Status {
    /// The status the model sees (a withheld result is an `error` to it).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Error | Status::Withheld => "error",
            Status::Timeout => "timeout",
            Status::Rejected => "rejected",
            Status::PendingApproval => "pending_approval",
        }
    }

    /// The commit event's outcome for a call that ended so.
    pub fn outcome(self) -> Outcome {
        match self {
            Status::Success | Status::PendingApproval => Outcome::Ok,
            Status::Error | Status::Withheld => Outcome::Error,
            Status::Timeout => Outcome::Timeout,
            Status::Rejected => Outcome::Rejected,
        }
    }
}

/// Why a proposed call (or a skill control) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such (offered) tool.
    UnknownTool,
    /// Arguments are not JSON or do not match the schema.
    InvalidArguments,
    /// The tool exists but is not allowed in this lane/state.
    NotAllowed,
    /// A path is outside the workspace.
    PathForbidden,
    /// The operator's kill switch is on.
    KillSwitch,
    /// choird no longer accepts this agent's lease.
    LeaseLost,
    /// The lockset stayed busy past the arbiter's longest wait.
    Busy,
    /// The calling lane was cancelled.
    Cancelled,
    /// choird refused a proposal's content.
    InvalidProposal,
    /// choird could not take a proposal now.
    ProposalUnavailable,
    /// choird has not stored this agent's log for longer than the
    /// fail-closed time: nothing runs until it does again.
    ReplicationDown,
    /// A call policy forbids the call.
    Policy,
    /// A human refused to confirm the call (or choird, once its time passed).
    NotConfirmed,
    /// No human confirmed the call within its time.
    ConfirmTimeout,
    /// In a skill: a step that proposed nothing.
    NoProposal,
    /// In a skill: more than one transition or finish in one step.
    OneControl,
    /// In a skill: a control not applied because other proposals of its step were refused.
    StepRefused,
    /// In a skill: an event that is not one of the state's transitions.
    InvalidTransition,
    /// In a skill: finish outside a terminal state.
    NotTerminal,
    /// In a skill: a finish output that does not match the output schema.
    InvalidOutput,
}

impl Refusal {
    /// The stable code the model sees.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::UnknownTool => "unknown_tool",
            Refusal::InvalidArguments => "invalid_arguments",
            Refusal::NotAllowed => "tool_not_allowed",
            Refusal::PathForbidden => "path_forbidden",
            Refusal::KillSwitch => "kill_switch",
            Refusal::LeaseLost => "lease_lost",
            Refusal::Busy => "busy",
            Refusal::Cancelled => "cancelled",
            Refusal::InvalidProposal => "invalid_proposal",
            Refusal::ProposalUnavailable => "proposal_unavailable",
            Refusal::ReplicationDown => "replication_down",
            Refusal::Policy => "policy_forbidden",
            Refusal::NotConfirmed => "not_confirmed",
            Refusal::ConfirmTimeout => "confirmation_timeout",
            Refusal::NoProposal => "no_proposal",
            Refusal::OneControl => "one_control",
            Refusal::StepRefused => "step_refused",
            Refusal::InvalidTransition => "invalid_transition",
            Refusal::NotTerminal => "not_terminal",
            Refusal::InvalidOutput => "invalid_output",
        }
    }

    /// Whether the model must correct itself (a *correction*, counted
    /// against its retry budget): an unknown tool, invalid arguments, a tool
    /// outside the allowlist, a proposal choird refused. Other refusals (a
    /// busy lock, the kill switch) are results the model may act on.
    pub fn needs_correction(self) -> bool {
        matches!(
            self,
            Refusal::UnknownTool | Refusal::InvalidArguments | Refusal::NotAllowed | Refusal::InvalidProposal
        )
    }
}

/// A refusal, as the model is told it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Why.
    pub refusal: Refusal,
    /// The explanation for the model.
    pub reason: String,
    /// The tools the lane may call instead.
    pub allowed_tools: Vec<String>,
    /// In a skill: where the run stands.
    pub skill: Option<SkillPlace>,
}

/// Where a skill run stands, told with a refusal.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillPlace {
    /// The current state.
    pub state: String,
    /// Its transitions' events.
    pub allowed_transitions: Vec<String>,
    /// Whether finishing is possible here (told with the skill's own refusals).
    pub can_finish: Option<bool>,
}

/// A proposal waiting for a human.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// choird's id for it.
    pub approval_id: i64,
    /// The sha256 of its canonical content (what an approval is bound to).
    pub sha256: String,
}

/// What went wrong, when the model is shown it beside the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Stable code, e.g. `not_found`.
    pub code: String,
    /// For the model.
    pub message: String,
}

/// A result too large for context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// `sha256:<hex>` of the whole result, stored at `path`; `None` when it
    /// could not be stored (then only the preview exists).
    pub reference: Option<String>,
    /// Where it is, relative to the workspace (readable with `choir.fs.read`).
    pub path: Option<String>,
    /// The whole result's size.
    pub bytes: usize,
    /// Its beginning.
    pub preview: String,
}

/// What came of one tool call (see the module).
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// The tool as the model named it (canonical form where it has one).
    pub tool: String,
    /// How it ended.
    pub status: Status,
    /// One line on what happened.
    pub summary: String,
    /// The tool's structured result as this lane may see it, without
    /// `status` and `summary`: empty when nothing ran, when the output is
    /// hidden from this lane, or when it became an artifact.
    pub payload: Map<String, Value>,
    /// The tool's error, or why the result was withheld.
    pub error: Option<Failure>,
    /// Why the call was refused.
    pub refusal: Option<Refused>,
    /// The proposal the call made, waiting for a human.
    pub approval: Option<Pending>,
    /// The artifact a large result became.
    pub artifact: Option<Artifact>,
    /// Why the output is not (all) shown, for the model.
    pub note: Option<String>,
    /// Whether the content came from outside: the tool's declared output
    /// trust when it ran, `trusted` when the arbiter answered for it.
    pub trust: OutputTrust,
}

impl Invocation {
    /// An invocation with only a status and a summary, answered by Choir.
    pub fn new(tool: &str, status: Status, summary: impl Into<String>) -> Invocation {
        Invocation {
            tool: tool.to_owned(),
            status,
            summary: summary.into(),
            payload: Map::new(),
            error: None,
            refusal: None,
            approval: None,
            artifact: None,
            note: None,
            trust: OutputTrust::Trusted,
        }
    }

    /// A refused call: nothing ran.
    pub fn refused(tool: &str, summary: impl Into<String>, refused: Refused) -> Invocation {
        Invocation { refusal: Some(refused), ..Invocation::new(tool, Status::Rejected, summary) }
    }

    /// A successful answer of Choir's own (a skill control), with a payload.
    pub fn answered(tool: &str, summary: impl Into<String>, payload: Value) -> Invocation {
        let payload = match payload {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Invocation { payload, ..Invocation::new(tool, Status::Success, summary) }
    }

    /// A result withheld because choird did not store its record.
    pub fn withheld(tool: &str, why: &str) -> Invocation {
        Invocation {
            error: Some(Failure { code: Refusal::ReplicationDown.code().to_owned(), message: why.to_owned() }),
            ..Invocation::new(
                tool,
                Status::Withheld,
                format!(
                    "the call's record was not stored by choird ({why}); its result is withheld, and tools stay off \
                     until choird stores this agent's log again"
                ),
            )
        }
    }

    /// Where its content came from.
    pub fn origin(&self) -> Origin {
        Origin::Tool { tool: self.tool.clone(), trust: self.trust }
    }

    /// Why the model must correct itself, if this refusal calls for it.
    pub fn correction(&self) -> Option<&str> {
        self.refusal.as_ref().filter(|r| r.refusal.needs_correction()).map(|r| r.reason.as_str())
    }

    /// The proposal now waiting for a human, if any.
    pub fn pending_approval(&self) -> Option<i64> {
        self.approval.as_ref().map(|p| p.approval_id)
    }
}
