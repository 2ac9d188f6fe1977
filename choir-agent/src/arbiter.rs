//! The arbiter (R-ARB-1): the one door every tool call goes through. For each
//! call a model proposes, in this order:
//!
//! 1. resolve the tool name (wire name → canonical → an offered tool);
//! 2. parse the arguments and validate them against the tool's schema;
//! 3. check the lane's allowlist (skill state or task; `None` = every tool);
//! 4. apply the path rules to every input field that names a lock resource;
//! 5. check the lease and the operator's kill switch;
//! 6. acquire the tool's whole lockset atomically (bounded wait);
//! 7. execute, within the manifest's `timeout_ms`;
//! 8. append the outcome to the commit log and wait until it is durable;
//! 9. release the locks;
//! 10. return an [`Invocation`]: status, summary, the sanitised payload, the
//!     artifact, refusal or pending proposal, and the output's trust; the
//!     commit event's `result` (step 8) is what the model is shown of it,
//!     rendered by `results::render` (R-ARB-5: untrusted output is marked).
//!
//! Steps 1–5 produce a [`Decision`] without side effects; only
//! [`Decision::Allowed`] proceeds. Rejections are committed too, so the log is
//! the complete audit trail of what models proposed.
//!
//! **Invariant:** a call that is not `Allowed` executes nothing.
//! **Invariant:** no result reaches a model before its commit record is
//! durable: stored by choird in production ([`Durability::Replicated`]); a
//! record choird does not store in time withholds the result.
//!
//! [`Durability::Replicated`]: crate::commitlog::Durability::Replicated

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::commit::{EventKind, Outcome};
use choir_common::ids::canonical_tool_name;
use choir_common::manifest::{placeholders, LockMode, PROPOSAL_TOOLS};
use crossbeam_channel::Sender;
use serde_json::Value;

use crate::commitlog::{DurableLog, LogError, NewEvent};
use crate::invocation::{Invocation, Pending, Refusal, Refused, Status};
use crate::lane_ctx::LaneCtx;
use crate::locks::{LockManager, Resource};
use crate::results::{render, shape, Artifacts};
use crate::secrets::SecretStore;
use crate::tools::propose::{self, ProposalError, ProposalSink};
use crate::tools::{ExecContext, Registry};
use crate::workspace::Workspace;

/// The lock `choir.exec` holds exclusively and every tool with secrets
/// shares, so no shell command runs while a secret is in a tool's process.
pub const PROCESSES: &str = "processes";

/// Longest wait for a lockset before the call is refused as busy.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

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

/// The arbiter's verdict on a proposed call.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Run it, holding these resources, within this time.
    Allowed {
        /// Canonical tool name.
        tool: String,
        /// Validated input.
        input: Value,
        /// Lock resources with `{field}`s filled from normalised input.
        resources: Vec<(Resource, LockMode)>,
        /// The manifest's timeout.
        timeout: Duration,
    },
    /// A human must approve first (the proposal meta-tools): the input goes
    /// to choird as a proposal; nothing runs.
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
    state_dir: PathBuf,
    log: Arc<DurableLog>,
    committed: Sender<()>,
    secrets: SecretStore,
    locks: LockManager,
    artifacts: Artifacts,
    kill_switch: AtomicBool,
    lease_lost: AtomicBool,
    proposals: std::sync::OnceLock<Arc<dyn ProposalSink>>,
}

impl Arbiter {
    /// Assembles the arbiter. `committed` is poked after every append so the
    /// replicator ships the event without waiting for its timer.
    pub fn new(
        registry: Registry,
        workspace: Workspace,
        state_dir: PathBuf,
        log: Arc<DurableLog>,
        committed: Sender<()>,
        secrets: SecretStore,
    ) -> Arbiter {
        let artifacts = Artifacts::new(workspace.root());
        log.set_poke(committed.clone());
        Arbiter {
            registry,
            workspace,
            state_dir,
            log,
            committed,
            secrets,
            locks: LockManager::default(),
            artifacts,
            kill_switch: AtomicBool::new(false),
            lease_lost: AtomicBool::new(false),
            proposals: std::sync::OnceLock::new(),
        }
    }

    /// Where proposals go (set once, at start; without one they are refused).
    pub fn set_proposals(&self, sink: Arc<dyn ProposalSink>) {
        let _ = self.proposals.set(sink);
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The lock manager (for status and tests).
    pub fn locks(&self) -> &LockManager {
        &self.locks
    }

    /// Turns the kill switch on or off (from choird's dynamic config).
    pub fn set_kill_switch(&self, on: bool) {
        if self.kill_switch.swap(on, Ordering::SeqCst) != on {
            log::warn!("kill switch {}", if on { "ON: no tool will run" } else { "off" });
        }
    }

    /// Records that choird refused our lease: nothing may run any more.
    pub fn set_lease_lost(&self) {
        self.lease_lost.store(true, Ordering::SeqCst);
    }

    fn allowed_names(&self, lane: &LaneCtx) -> Vec<String> {
        match &lane.allowlist {
            Some(list) => list.clone(),
            None => self.registry.names(),
        }
    }

    /// Steps 1–5: decides without side effects.
    pub fn decide(&self, lane: &LaneCtx, call: &ProposedCall) -> Decision {
        let forbid = |tool: Option<String>, input: Value, refusal: Refusal, reason: String| Decision::Forbidden {
            tool,
            input,
            refusal,
            reason,
        };
        let offered = canonical_tool_name(&call.name)
            .and_then(|n| self.registry.get(&n).filter(|t| t.status.offered()).map(|t| (n, t)));
        let Some((tool, reg)) = offered else {
            return forbid(
                None,
                Value::Null,
                Refusal::UnknownTool,
                format!(
                    "there is no tool named {:?}; available tools: {}",
                    call.name,
                    self.allowed_names(lane).join(", ")
                ),
            );
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
                let reason = format!("{tool} is not allowed here; allowed tools: {}", list.join(", "));
                return forbid(Some(tool), input, Refusal::NotAllowed, reason);
            }
        }
        let mut resources = Vec::new();
        for lock in &reg.manifest.runtime.locks {
            let mut resource = lock.resource.clone();
            for field in placeholders(&lock.resource).unwrap_or_default() {
                // An optional path left out means the workspace root.
                let raw = input.get(&field).and_then(Value::as_str).unwrap_or(".");
                match self.workspace.normalize(raw) {
                    Ok(rel) => resource = resource.replace(&format!("{{{field}}}"), rel.as_str()),
                    Err(e) => return forbid(Some(tool), input, Refusal::PathForbidden, e.to_string()),
                }
            }
            resources.push((Resource::new(&resource), lock.mode));
        }
        // A tool holding secrets never runs beside a shell command (whose
        // processes could read its environment or memory): `choir.exec`
        // holds `processes` exclusively, tools with secrets share it.
        if tool == "choir.exec" {
            resources.push((Resource::new(PROCESSES), LockMode::X));
        } else if !reg.manifest.runtime.secret_resources.is_empty() {
            resources.push((Resource::new(PROCESSES), LockMode::S));
        }
        if lane.cancelled() {
            return forbid(Some(tool), input, Refusal::Cancelled, "this job was cancelled; nothing more runs".into());
        }
        if self.lease_lost.load(Ordering::SeqCst) {
            let reason = "choird no longer accepts this agent's lease; nothing can run".to_owned();
            return forbid(Some(tool), input, Refusal::LeaseLost, reason);
        }
        if let Some(why) = self.log.failed_closed() {
            return forbid(
                Some(tool),
                input,
                Refusal::ReplicationDown,
                format!("{why}; no tool runs until it does again: tell the user you cannot act right now and why"),
            );
        }
        if self.kill_switch.load(Ordering::SeqCst) {
            return forbid(
                Some(tool),
                input,
                Refusal::KillSwitch,
                "all tools are disabled by the operator's kill switch; tell the user you cannot act right now".into(),
            );
        }
        if PROPOSAL_TOOLS.contains(&tool.as_str()) {
            let reason = format!("{tool} is a proposal: it goes to a human, and nothing runs before one approves it");
            return Decision::NeedsApproval { tool, input, reason };
        }
        let timeout = Duration::from_millis(reg.manifest.runtime.timeout_ms);
        Decision::Allowed { tool, input, resources, timeout }
    }

    /// The whole pipeline; returns what came of the call (what the model is
    /// shown of it is `results::render` of that). Fails only if the commit
    /// log cannot be written (the lane must stop: nothing may proceed
    /// unrecorded).
    pub fn invoke(&self, lane: &LaneCtx, call: &ProposedCall) -> Result<Invocation, LogError> {
        let owner = format!("{}/{}", lane.lane, call.id);
        // The tool as the model named it, canonical where the name has a canonical form.
        let named = canonical_tool_name(&call.name).unwrap_or_else(|| call.name.clone());
        let decision = self.decide(lane, call);
        let refused = |tool: Option<String>, input: Value, refusal: Refusal, reason: String| {
            let inv = Invocation::refused(
                &named,
                format!("the call was not executed: {reason}"),
                Refused { refusal, reason, allowed_tools: self.allowed_names(lane), skill: None },
            );
            (tool.unwrap_or_else(|| format!("?{}", call.name)), input, inv, 0)
        };
        // The guard lives until after the commit: locks are released last.
        let mut _guard = None;
        let (tool, input, inv, duration_us) = match decision {
            Decision::Allowed { tool, input, resources, timeout } => {
                match self.locks.acquire(&owner, resources, LOCK_WAIT.min(timeout)) {
                    Err(busy) => refused(Some(tool), input, Refusal::Busy, format!("{busy}; try again later")),
                    // Cancelled while it waited for its locks: the boundary holds.
                    Ok(_) if lane.cancelled() => refused(
                        Some(tool),
                        input,
                        Refusal::Cancelled,
                        "this job was cancelled while the call waited for its locks; nothing ran".into(),
                    ),
                    Ok(guard) => {
                        _guard = Some(guard);
                        let (inv, us) = self.execute(lane, &call.id, &tool, &input, timeout);
                        (tool, input, inv, us)
                    }
                }
            }
            Decision::NeedsApproval { tool, input, reason } => {
                let started = Instant::now();
                let sink = self.proposals.get();
                let submitted = match (sink, propose::request(&tool, &input, lane)) {
                    (Some(sink), Some(req)) => sink.submit(&req, lane.waits_for_approval),
                    _ => Err(ProposalError::Unavailable("proposals cannot be submitted from here".into())),
                };
                let us = started.elapsed().as_micros() as u64;
                match submitted {
                    Ok(r) => {
                        let summary = format!(
                            "{}: proposal {} is waiting for a human's decision ({reason})",
                            r.summary, r.approval_id
                        );
                        let inv = Invocation {
                            approval: Some(Pending { approval_id: r.approval_id, sha256: r.sha256 }),
                            ..Invocation::new(&named, Status::PendingApproval, summary)
                        };
                        (tool, input, inv, us)
                    }
                    Err(ProposalError::Invalid(why)) => refused(
                        Some(tool),
                        input,
                        Refusal::InvalidProposal,
                        format!("choird refused the proposal: {why}"),
                    ),
                    Err(ProposalError::Unavailable(why)) => refused(
                        Some(tool),
                        input,
                        Refusal::ProposalUnavailable,
                        format!("the proposal could not be submitted now: {why}"),
                    ),
                }
            }
            Decision::Forbidden { tool, input, refusal, reason } => refused(tool, input, refusal, reason),
        };
        crate::failpoints::hit("before_append");
        let event = NewEvent {
            lane: lane.lane.clone(),
            kind: EventKind::ToolCall,
            tool,
            call_id: Some(call.id.clone()),
            turn: lane.turn,
            skill: lane.skill.as_ref().map(|s| s.name.clone()),
            state: lane.skill.as_ref().map(|s| s.state.clone()),
            input: self.secrets.redact(&input),
            outcome: inv.status.outcome(),
            result: render(&inv),
            duration_us,
        };
        let committed = match self.log.append(event) {
            Ok(c) => c,
            Err(LogError::NotReplicated { seq, why }) => {
                // The tool's result is withheld: no model sees what choird's
                // copy of the log does not hold.
                drop(_guard);
                log::error!("commit {seq}: not stored by choird ({why}); its result is withheld from the model");
                return Ok(Invocation::withheld(&named, &why));
            }
            Err(e) => return Err(e),
        };
        drop(_guard);
        let _ = self.committed.try_send(());
        log::info!(
            "commit {}: {} {} {:?} ({} µs)",
            committed.seq,
            committed.lane,
            committed.tool,
            committed.outcome,
            duration_us
        );
        Ok(inv)
    }

    /// Commits an event that is not a tool call (a compaction, a correction),
    /// durably, and pokes the replicator.
    pub fn record(
        &self,
        lane: &LaneCtx,
        kind: EventKind,
        tool: &str,
        input: Value,
        outcome: Outcome,
        result: Value,
    ) -> Result<choir_common::commit::CommitEvent, LogError> {
        let event = NewEvent {
            lane: lane.lane.clone(),
            kind,
            tool: tool.to_owned(),
            call_id: None,
            turn: lane.turn,
            skill: lane.skill.as_ref().map(|s| s.name.clone()),
            state: lane.skill.as_ref().map(|s| s.state.clone()),
            input: self.secrets.redact(&input),
            outcome,
            result: self.secrets.redact(&result),
            duration_us: 0,
        };
        let committed = self.log.append(event)?;
        let _ = self.committed.try_send(());
        Ok(committed)
    }

    /// Step 7 plus result shaping: runs the tool and returns what came of
    /// it and the microseconds it took.
    fn execute(
        &self,
        lane: &LaneCtx,
        call_id: &str,
        tool: &str,
        input: &Value,
        timeout: Duration,
    ) -> (Invocation, u64) {
        let Some(reg) = self.registry.get(tool) else {
            return (Invocation::new(tool, Status::Error, "tool vanished"), 0);
        };
        let started = Instant::now();
        let ctx = ExecContext {
            workspace: &self.workspace,
            lane: &lane.lane,
            call_id,
            state_dir: &self.state_dir,
            deadline: started + timeout,
            secrets: self.secrets.subset(&reg.manifest.runtime.secret_resources),
            hooks: lane.hooks.as_deref(),
        };
        crate::failpoints::hit("during_tool");
        let ran = reg.tool.execute(&ctx, input);
        let us = started.elapsed().as_micros() as u64;
        let inv = shape(tool, ran, &reg.manifest.runtime, lane.kind, &self.secrets, &self.artifacts);
        (inv, us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane_ctx::LaneKind;
    use crate::tools::host::NoHost;
    use serde_json::json;

    #[test]
    fn a_tool_with_secrets_never_runs_beside_a_shell_command() {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("choir/tools/agent");
        std::fs::create_dir_all(&tools).unwrap();
        let manifest = json!({
            "llm": {"name": "x.deploy.run", "description": "Deploy.", "parameters": {"type": "object"}},
            "runtime": {"exec_path": "deploy", "timeout_ms": 1000, "side_effect": "external", "version": "1",
                        "secret_resources": ["deploy_key"]}
        });
        std::fs::write(tools.join("deploy.json"), manifest.to_string()).unwrap();
        std::fs::write(tools.join("deploy"), "#!/bin/sh\necho '{}'\n").unwrap();
        std::fs::set_permissions(tools.join("deploy"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let registry =
            Registry::load(&dir.path().join("choir"), &["deploy_key".to_owned()], Arc::new(NoHost), &[]).unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let (log, _) = crate::commitlog::CommitLog::open(&dir.path().join("state")).unwrap();
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let arbiter = Arbiter::new(
            registry,
            Workspace::open(&ws).unwrap(),
            dir.path().join("state"),
            Arc::new(DurableLog::new(log).unwrap()),
            tx,
            SecretStore::default(),
        );
        let lane = LaneCtx::new("edge", LaneKind::Edge);
        let resources = |name: &str, args: &str| match arbiter
            .decide(&lane, &ProposedCall { id: "c".into(), name: name.into(), arguments: args.into() })
        {
            Decision::Allowed { resources, .. } => resources,
            other => panic!("{other:?}"),
        };
        let exec = resources("choir__exec", r#"{"command": "true"}"#);
        let deploy = resources("x__deploy__run", "{}");
        assert!(exec.contains(&(Resource::new(PROCESSES), LockMode::X)), "{exec:?}");
        assert!(deploy.contains(&(Resource::new(PROCESSES), LockMode::S)), "{deploy:?}");
        // So they can never hold their locks at once.
        let held = arbiter.locks().acquire("edge/1", exec, Duration::from_secs(1)).unwrap();
        assert!(arbiter.locks().acquire("core/1", deploy, Duration::from_millis(100)).is_err());
        drop(held);
    }
}
