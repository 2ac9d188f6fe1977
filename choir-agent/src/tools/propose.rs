//! Proposal meta-tools (R-TOOL-8): `choir.propose.tool`, `choir.propose.skill`,
//! `choir.propose.config_change` and `choir.propose.schedule` (R-SCHED-1). They are registered like any tool (so
//! the arbiter validates their input and a skill state can allow them), but
//! they are **never executed**: the arbiter decides
//! [`crate::arbiter::Decision::NeedsApproval`] and hands the input to a
//! [`ProposalSink`], which submits it to choird with REQUEST_APPROVAL. choird
//! validates it fully and stores it for a human; nothing is installed or
//! changed until a human approves that exact content (its sha256).

use choir_common::manifest::ToolManifest;

use std::time::Instant;

use choir_common::rpc::{ApprovalDecision, ApprovalRequest, ApprovalResponse, ProposalKind, ProposalScope};
use serde_json::{json, Value};

use super::tool::{ExecContext, Tool, ToolError};

/// Why a proposal was not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposalError {
    /// choird refused its content (the model should fix it); not retried.
    #[error("{0}")]
    Invalid(String),
    /// choird could not be asked; the model may try again later.
    #[error("{0}")]
    Unavailable(String),
}

/// What came of waiting for a human's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Awaited {
    /// A human (or choird, for an expired confirmation) decided.
    Decided(ApprovalDecision),
    /// The waiting lane was cancelled first.
    Cancelled,
    /// No decision came in time.
    TimedOut,
}

/// Where proposals go (choird, in production).
pub trait ProposalSink: Send + Sync {
    /// Submits a proposal; `wait` says whether the proposing lane will wait
    /// for the decision (so it is handed to that lane rather than the edge).
    fn submit(&self, req: &ApprovalRequest, wait: bool) -> Result<ApprovalResponse, ProposalError>;

    /// Waits for the decision on proposal `id` (submitted with `wait`)
    /// until `cancel` is set or `until` passes, whichever comes first.
    fn await_decision(&self, id: i64, cancel: Option<&crate::cancel::Cancel>, until: Instant) -> Awaited;
}

/// The kind of proposal a meta-tool makes.
pub fn kind_of(tool: &str) -> Option<ProposalKind> {
    match tool {
        "choir.propose.tool" => Some(ProposalKind::Tool),
        "choir.propose.skill" => Some(ProposalKind::Skill),
        "choir.propose.config_change" => Some(ProposalKind::ConfigChange),
        "choir.propose.schedule" => Some(ProposalKind::Schedule),
        _ => None,
    }
}

/// What choird is sent for a validated meta-tool input: (kind, scope,
/// content, reason). The content is exactly what a human approves.
pub fn proposal_of(tool: &str, input: &Value) -> Option<(ProposalKind, ProposalScope, Value, String)> {
    let kind = kind_of(tool)?;
    let scope = match input.get("scope").and_then(Value::as_str) {
        Some("global") => ProposalScope::Global,
        _ => ProposalScope::Agent,
    };
    let reason = input.get("reason").and_then(Value::as_str).unwrap_or_default().to_owned();
    let content = match kind {
        ProposalKind::Tool => json!({"manifest": input["manifest"], "executable": input["executable"]}),
        ProposalKind::Skill => json!({"skill": input["skill"]}),
        ProposalKind::ConfigChange => json!({"changes": input["changes"]}),
        ProposalKind::Schedule => json!({"job": input["job"]}),
        // Confirmations are made by the arbiter, MCP catalogs by the agent's
        // MCP client; neither by a meta-tool.
        ProposalKind::Call | ProposalKind::Mcp => return None,
    };
    Some((kind, scope, content, reason))
}

fn manifest(name: &str, description: &str, parameters: Value) -> ToolManifest {
    super::fs::builtin_manifest(json!({
        "llm": {"name": name, "description": description, "parameters": parameters},
        // Never run: the answer is choird's, about the proposal it stored: trusted.
        "runtime": {"timeout_ms": 30000, "side_effect": "external", "version": "1", "output_trust": "trusted"}
    }))
}

/// The meta-tools' manifests, with their (never executed) implementation.
pub fn tools() -> Vec<(ToolManifest, std::sync::Arc<dyn Tool>)> {
    let reason =
        json!({"type": "string", "minLength": 1, "description": "Why this is needed, for the human who decides"});
    let scope = json!({"type": "string", "enum": ["agent", "global"], "description": "agent (default): only this agent; global: every agent"});
    vec![
        (
            manifest(
                "choir.propose.tool",
                "Propose a new or changed tool for a human to approve: its manifest (llm and runtime views) and its executable. Nothing is installed until a human approves it.",
                json!({
                    "type": "object",
                    "properties": {
                        "manifest": {"type": "object", "description": "The tool manifest: {\"llm\": {name, description, parameters}, \"runtime\": {exec_path, timeout_ms, locks, side_effect, version, ...}}"},
                        "executable": {"type": "string", "minLength": 3, "maxLength": 65536, "description": "The executable's full text (a script starting with #!), stored at runtime.exec_path"},
                        "reason": reason,
                        "scope": scope
                    },
                    "required": ["manifest", "executable", "reason"],
                    "additionalProperties": false
                }),
            ),
            std::sync::Arc::new(ProposalTool),
        ),
        (
            manifest(
                "choir.propose.skill",
                "Propose a new or changed skill (a SkillSpec state machine) for a human to approve. Nothing is installed until a human approves it.",
                json!({
                    "type": "object",
                    "properties": {
                        "skill": {"type": "object", "description": "The SkillSpec: name, description, initial_state, input_schema, output_schema, states, max_steps, interruptible"},
                        "reason": reason,
                        "scope": scope
                    },
                    "required": ["skill", "reason"],
                    "additionalProperties": false
                }),
            ),
            std::sync::Arc::new(ProposalTool),
        ),
        (
            manifest(
                "choir.propose.config_change",
                "Propose a change to your own settings (such as max_steps_per_turn, context_tokens or core_budget) for a human to approve.",
                json!({
                    "type": "object",
                    "properties": {
                        "changes": {"type": "object", "minProperties": 1, "description": "Setting name → new value"},
                        "reason": reason
                    },
                    "required": ["changes", "reason"],
                    "additionalProperties": false
                }),
            ),
            std::sync::Arc::new(ProposalTool),
        ),
        (
            manifest(
                "choir.propose.schedule",
                "Propose a scheduled job for yourself (a cron expression with a time zone, or an interval; a prompt or a skill; a budget; where the result goes) for a human to approve. Nothing is scheduled until a human approves it.",
                json!({
                    "type": "object",
                    "properties": {
                        "job": {
                            "type": "object",
                            "description": "The job: {name, cron (5 or 6 fields) and tz (IANA, default UTC) | every_s (>= 60), prompt, skill + input?, allowed_tools?, budget {steps, tokens, wall_s}?, deliver_to (tg:<bot>:<user>)?, missed: skip|run_once, precondition {kind: new_mail|file_changed (path)|url_changed (url)|memory_due}?, breaker?}",
                            "required": ["name", "prompt"]
                        },
                        "reason": reason
                    },
                    "required": ["job", "reason"],
                    "additionalProperties": false
                }),
            ),
            std::sync::Arc::new(ProposalTool),
        ),
    ]
}

/// The meta-tools' implementation: reached only if the arbiter's proposal
/// path were bypassed, which it never is.
pub struct ProposalTool;

impl Tool for ProposalTool {
    fn execute(&self, _: &ExecContext<'_>, _: &Value) -> Result<Value, ToolError> {
        Err(ToolError::new("not_executable", "proposal tools are never executed; they go to a human"))
    }
}

/// A request for choird, from a meta-tool call.
pub fn request(tool: &str, input: &Value, lane: &crate::arbiter::lane_ctx::LaneCtx) -> Option<ApprovalRequest> {
    let (kind, scope, content, reason) = proposal_of(tool, input)?;
    Some(ApprovalRequest {
        kind,
        scope,
        content,
        reason,
        lane: lane.lane.clone(),
        skill: lane.skill.as_ref().map(|s| s.name.clone()),
        state: lane.skill.as_ref().map(|s| s.state.clone()),
        conversation: lane.conversation.clone(),
    })
}
