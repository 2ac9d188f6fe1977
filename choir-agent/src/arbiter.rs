//! The arbiter (R-ARB-1): the one door every tool call goes through. For each
//! call a model proposes, in this order:
//!
//! 1. resolve the tool name (wire name → canonical → registry);
//! 2. parse the arguments and validate them against the tool's schema;
//! 3. check the lane's allowlist (skill state or task; `None` = every tool);
//! 4. apply path rules to every path that names a lock resource;
//! 5. check the kill switch;
//! 6. execute;
//! 7. append the outcome to the commit log (durably) — rejections included;
//! 8. return a structured result for the model.
//!
//! Steps 1–5 produce a [`Decision`]; only `Allowed` executes anything.
//! **Invariant:** a call that is not `Allowed` has no side effect other than its
//! commit record. **Invariant:** no result reaches a model before its commit
//! record is on disk.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use choir_common::commit::{EventKind, Outcome};
use choir_common::ids::canonical_tool_name;
use choir_common::manifest::{placeholders, LockMode};
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::commitlog::{CommitLog, LogError, NewEvent};
use crate::secrets::SecretStore;
use crate::tools::{ExecContext, Registry};
use crate::workspace::Workspace;

/// Who is calling, and what they may call.
#[derive(Debug, Clone)]
pub struct LaneCtx {
    /// Lane name (`edge`, or a core job).
    pub lane: String,
    /// Tools allowed right now; `None` means all registered tools.
    pub allowlist: Option<Vec<String>>,
}

/// A tool call as the model proposed it.
#[derive(Debug, Clone)]
pub struct ProposedCall {
    /// The model's call id.
    pub id: String,
    /// The wire name the model used.
    pub name: String,
    /// The JSON arguments, as a string, exactly as the model sent them.
    pub arguments: String,
}

/// Why a call was not allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such tool.
    UnknownTool,
    /// Arguments are not JSON or do not match the schema.
    InvalidArguments,
    /// The tool exists but is not allowed in this lane/state.
    NotAllowed,
    /// A path is outside the workspace.
    PathForbidden,
    /// The operator's kill switch is on.
    KillSwitch,
}

impl Refusal {
    fn code(self) -> &'static str {
        match self {
            Refusal::UnknownTool => "unknown_tool",
            Refusal::InvalidArguments => "invalid_arguments",
            Refusal::NotAllowed => "tool_not_allowed",
            Refusal::PathForbidden => "path_forbidden",
            Refusal::KillSwitch => "kill_switch",
        }
    }
}

/// The arbiter's verdict on a proposed call.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Run it, holding these resources.
    Allowed {
        /// Canonical tool name.
        tool: String,
        /// Validated input.
        input: Value,
        /// Lock resources with `{field}`s filled from normalised input.
        resources: Vec<(String, LockMode)>,
    },
    /// A human must approve first (meta-tools; not reachable yet).
    NeedsApproval {
        /// Canonical tool name.
        tool: String,
        /// Validated input.
        input: Value,
        /// What the human is asked.
        reason: String,
    },
    /// Refused.
    Forbidden {
        /// Canonical name, when known.
        tool: Option<String>,
        /// Input, when it parsed.
        input: Value,
        /// Category.
        refusal: Refusal,
        /// Explanation for the model.
        reason: String,
    },
}

/// The arbiter.
pub struct Arbiter {
    registry: Registry,
    workspace: Workspace,
    log: Arc<Mutex<CommitLog>>,
    committed: Sender<()>,
    secrets: SecretStore,
    kill_switch: AtomicBool,
}

impl Arbiter {
    /// Assembles the arbiter. `committed` is poked after every append so the
    /// replicator ships the event without waiting for its timer.
    pub fn new(
        registry: Registry,
        workspace: Workspace,
        log: Arc<Mutex<CommitLog>>,
        committed: Sender<()>,
        secrets: SecretStore,
    ) -> Arbiter {
        Arbiter { registry, workspace, log, committed, secrets, kill_switch: AtomicBool::new(false) }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Turns the kill switch on or off (from choird's dynamic config).
    pub fn set_kill_switch(&self, on: bool) {
        self.kill_switch.store(on, Ordering::SeqCst);
    }

    /// Steps 1–5: decides without side effects.
    pub fn decide(&self, lane: &LaneCtx, call: &ProposedCall) -> Decision {
        let allowed_names = || match &lane.allowlist {
            Some(list) => list.clone(),
            None => self.registry.names(),
        };
        let forbid = |tool: Option<String>, input: Value, refusal: Refusal, reason: String| Decision::Forbidden {
            tool,
            input,
            refusal,
            reason,
        };
        let Some(tool) = canonical_tool_name(&call.name).filter(|n| self.registry.get(n).is_some()) else {
            return forbid(
                None,
                Value::Null,
                Refusal::UnknownTool,
                format!("there is no tool named {:?}; available tools: {}", call.name, allowed_names().join(", ")),
            );
        };
        let Some(reg) = self.registry.get(&tool) else {
            return forbid(None, Value::Null, Refusal::UnknownTool, format!("there is no tool named {tool:?}"));
        };
        let input: Value = match serde_json::from_str(&call.arguments) {
            Ok(v) => v,
            Err(e) => {
                return forbid(
                    Some(tool),
                    Value::String(call.arguments.clone()),
                    Refusal::InvalidArguments,
                    format!(
                        "the arguments are not valid JSON ({e}); send a JSON object matching the tool's parameters"
                    ),
                )
            }
        };
        let problems: Vec<String> = reg
            .validator
            .iter_errors(&input)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("{}: {e}", if at.is_empty() { "(root)".to_owned() } else { at })
            })
            .collect();
        if !problems.is_empty() {
            return forbid(
                Some(tool),
                input,
                Refusal::InvalidArguments,
                format!("invalid arguments: {}", problems.join("; ")),
            );
        }
        if let Some(list) = &lane.allowlist {
            if !list.contains(&tool) {
                return forbid(
                    Some(tool.clone()),
                    input,
                    Refusal::NotAllowed,
                    format!("{tool} is not allowed here; allowed tools: {}", list.join(", ")),
                );
            }
        }
        let mut resources = Vec::new();
        for lock in &reg.manifest.runtime.locks {
            let mut resource = lock.resource.clone();
            for field in placeholders(&lock.resource).unwrap_or_default() {
                let raw = input.get(&field).and_then(Value::as_str).unwrap_or("");
                match self.workspace.normalize(raw) {
                    Ok(rel) => resource = resource.replace(&format!("{{{field}}}"), rel.as_str()),
                    Err(e) => return forbid(Some(tool), input, Refusal::PathForbidden, e.to_string()),
                }
            }
            resources.push((resource, lock.mode));
        }
        if self.kill_switch.load(Ordering::SeqCst) {
            return forbid(
                Some(tool),
                input,
                Refusal::KillSwitch,
                "all tools are disabled by the operator's kill switch; tell the user you cannot act right now".into(),
            );
        }
        Decision::Allowed { tool, input, resources }
    }

    /// The whole pipeline; returns the JSON the model gets as the tool result.
    /// Fails only if the commit log cannot be written (the lane must stop:
    /// nothing may proceed unrecorded).
    pub fn invoke(&self, lane: &LaneCtx, call: &ProposedCall) -> Result<Value, LogError> {
        let decision = self.decide(lane, call);
        let (tool, input, outcome, result, duration_us) = match decision {
            Decision::Allowed { tool, input, resources: _ } => {
                let started = Instant::now();
                let reg = self.registry.get(&tool);
                let ctx = ExecContext { workspace: &self.workspace };
                let ran = match reg {
                    Some(reg) => reg.tool.execute(&ctx, &input),
                    None => Err(crate::tools::ToolError::new("unknown_tool", "tool vanished")),
                };
                let duration_us = started.elapsed().as_micros() as u64;
                match ran {
                    Ok(mut out) => {
                        if let Value::Object(map) = &mut out {
                            map.insert("status".into(), json!("success"));
                        }
                        (tool, input, Outcome::Ok, out, duration_us)
                    }
                    Err(e) => {
                        let out = json!({"status": "error", "error": {"code": e.code, "message": e.message}});
                        (tool, input, Outcome::Error, out, duration_us)
                    }
                }
            }
            Decision::NeedsApproval { tool, input, reason } => {
                let out = json!({"status": "needs_approval", "error": {"code": "needs_approval", "message": reason}});
                (tool, input, Outcome::Rejected, out, 0)
            }
            Decision::Forbidden { tool, input, refusal, reason } => {
                let allowed = match &lane.allowlist {
                    Some(l) => l.clone(),
                    None => self.registry.names(),
                };
                let out = json!({
                    "status": "rejected",
                    "error": {"code": refusal.code(), "message": reason, "allowed_tools": allowed},
                });
                (tool.unwrap_or_else(|| format!("?{}", call.name)), input, Outcome::Rejected, out, 0)
            }
        };
        let event = NewEvent {
            lane: lane.lane.clone(),
            kind: EventKind::ToolCall,
            tool,
            call_id: Some(call.id.clone()),
            skill: None,
            state: None,
            input: self.secrets.redact(&input),
            outcome,
            result: self.secrets.redact(&result),
            duration_us,
        };
        let committed = self.log.lock().append(event)?;
        let _ = self.committed.try_send(());
        log::info!(
            "commit {}: {} {} ({:?}, {} µs)",
            committed.seq,
            committed.lane,
            committed.tool,
            committed.outcome,
            duration_us
        );
        Ok(self.secrets.redact(&result))
    }
}
