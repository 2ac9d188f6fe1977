//! The arbiter (R-ARB-1): the one door every tool call goes through. For each
//! call a model proposes, in this order:
//!
//! 1. resolve the tool name (wire name → canonical → an offered tool) and
//!    refuse one the operator's tool policy does not permit
//!    (`agents.<id>.tools`, from the dynamic config);
//! 2. parse the arguments and validate them against the tool's schema;
//! 3. check the lane's allowlist (skill state or task; `None` = every tool);
//! 4. apply the path rules to every input field that names a lock resource;
//! 5. check the lease, the commit log's replication and the operator's kill
//!    switch, then ask the call policies ([`crate::arbiter::policy`]);
//! 6. for a call a human must confirm, ask one and wait (WAITING_APPROVAL);
//!    the calls of one model turn that each need a human are asked about
//!    together, once ([`Arbiter::confirm_together`]);
//! 7. acquire the tool's whole lockset atomically (bounded wait);
//! 8. for a call that must not run twice (a host tool that is not
//!    idempotent), commit its intent; then execute, within the manifest's
//!    `timeout_ms`;
//! 9. append the outcome to the commit log and wait until it is durable;
//! 10. release the locks;
//! 11. return an [`Invocation`]: status, summary, the sanitised payload, the
//!     artifact, refusal or pending proposal, and the output's trust; the
//!     commit event's `result` (step 9) is what the model is shown of it,
//!     rendered by `results::render` (R-ARB-5: untrusted output is marked).
//!
//! Steps 1–5 produce a [`Decision`] without side effects. Checks combine so
//! that **the strictest wins**: forbidden over a human's approval over
//! allowed; a proposal (which runs nothing) over a confirmation. Rejections
//! are committed too, so the log is the complete audit trail of what models
//! proposed.
//!
//! **Invariant:** a call that is neither `Allowed` nor confirmed by a human
//! executes nothing.
//! **Invariant:** no result reaches a model before its commit record is
//! durable: stored by choird in production ([`Durability::Replicated`]); a
//! record choird does not store in time withholds the result.
//! **Invariant:** a host tool that is not idempotent runs at most once per
//! call: its intent is stored by choird before it runs, choird runs a call
//! id once and keeps its outcome, and a restart completes an interrupted
//! call from that outcome ([`Arbiter::complete_intents`]), never by running
//! it again. An external tool run here that is not idempotent has its
//! intent committed before it runs too, and a restart that finds it
//! without an outcome commits "may have run" (`may_have_run`) instead of
//! running it again: a crash loop cannot repeat an outside effect.
//! **Invariant:** a tool whose `side_effect` is `external` always holds an
//! exclusive lock (its own, `external:<tool>`, when its manifest names
//! none), and its executed calls are flagged for choird's audit.
//!
//! [`Durability::Replicated`]: crate::commitlog::Durability::Replicated

pub mod approvals;
pub mod arg_check;
pub mod intent;
pub mod invocation;
pub mod lane_ctx;
pub mod locks;
pub mod policy;
pub mod provenance;
pub mod results;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::commit::{canonical_json, CommitEvent, EventKind, Outcome};
use choir_common::ids::canonical_tool_name;
use choir_common::manifest::{placeholders, LockMode, PROPOSAL_TOOLS};
use choir_common::rpc::{ApprovalRequest, ProposalKind, ProposalScope};
use crossbeam_channel::Sender;
use serde_json::{json, Value};
use sha2::Digest;

use crate::arbiter::invocation::{Failure, Invocation, Pending, Refusal, Refused, Status};
use crate::arbiter::lane_ctx::LaneCtx;
use crate::arbiter::locks::{LockManager, Resource};
use crate::arbiter::policy::{CallPolicy, Verdict, MAX_CONFIRM_WAIT};
use crate::arbiter::provenance::{Evidence, Fields};
use crate::arbiter::results::{render, shape, Artifacts};
use crate::board::StatusBoard;
use crate::commitlog::{DurableLog, LogError, NewEvent};
use crate::origin::Entry;
use crate::secrets::SecretStore;
use crate::tools::propose::{self, Awaited, ProposalError, ProposalSink};
use crate::tools::{ExecContext, Registry};
use crate::workspace::Workspace;
use choir_common::lane::Lane;

/// The lock `choir.exec` holds exclusively and every tool with secrets
/// shares, so no shell command runs while a secret is in a tool's process.
pub const PROCESSES: &str = "processes";

/// Longest wait for a lockset before the call is refused as busy.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// How much longer a lane waits for a confirmation than choird keeps it
/// open, so a human's last-second approval still reaches the lane.
const CONFIRM_GRACE: Duration = Duration::from_secs(5);

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

/// What a human decided on the calls of one turn asked about together
/// ([`Arbiter::confirm_together`]), by call id: the exact tool and input
/// confirmed, or why not.
pub type Together = std::collections::HashMap<String, Result<(String, Value), (Refusal, String)>>;

/// What a human must do before a call may go on.
#[derive(Debug, Clone)]
pub enum Approval {
    /// The proposal meta-tools: the input goes to choird as a proposal, and
    /// nothing runs (a human's approval applies it in choird).
    Proposal {
        /// What the human is asked.
        reason: String,
    },
    /// Run this exact call once a human confirms it: the lane waits up to
    /// `wait` (WAITING_APPROVAL), and the call is refused if no one does.
    Confirm {
        /// What the human is told.
        reason: String,
        /// Lock resources, as for an allowed call.
        resources: Vec<(Resource, LockMode)>,
        /// The manifest's timeout.
        timeout: Duration,
        /// How long the lane waits for the decision.
        wait: Duration,
    },
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
    /// A human must decide first.
    NeedsApproval {
        /// Canonical tool name.
        tool: String,
        /// Validated input.
        input: Value,
        /// Which kind of approval.
        approval: Approval,
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

/// What came of a call, before it is committed.
struct Settled {
    tool: String,
    input: Value,
    inv: Invocation,
    duration_us: u64,
    /// An executed call of a `side_effect: external` tool.
    external: bool,
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
    proposals: Option<Arc<dyn ProposalSink>>,
    policies: Vec<Arc<dyn CallPolicy>>,
    board: Option<Arc<StatusBoard>>,
    /// The operator's words (identity, rules): evidence of provenance.
    operator_words: String,
    /// The trusted and private fields tools declare: evidence of provenance.
    fields: Fields,
}

/// What an arbiter is built from, all at once: nothing about how it decides
/// changes after it is built (the kill switch and the lease are states, not
/// parts).
pub struct Parts {
    /// The tools there are.
    pub registry: Registry,
    /// The workspace path rules confine calls to.
    pub workspace: Workspace,
    /// The agent's state directory.
    pub state_dir: PathBuf,
    /// The commit log every decision is appended to.
    pub log: Arc<DurableLog>,
    /// Poked after every append so the replicator ships the event without
    /// waiting for its timer.
    pub committed: Sender<()>,
    /// The secrets tools may be given.
    pub secrets: SecretStore,
    /// Where proposals and confirmations go; without one they are refused.
    pub proposals: Option<Arc<dyn ProposalSink>>,
    /// The call policies, strictest verdict wins; none means none.
    pub policies: Vec<Arc<dyn CallPolicy>>,
    /// Where a lane waiting for a confirmation is shown.
    pub board: Option<Arc<StatusBoard>>,
    /// The operator's words values may be traced to (the identity's
    /// persona and rules).
    pub operator_words: String,
}

impl Arbiter {
    /// Assembles the arbiter from its parts.
    pub fn new(parts: Parts) -> Arbiter {
        let Parts {
            registry,
            workspace,
            state_dir,
            log,
            committed,
            secrets,
            proposals,
            policies,
            board,
            operator_words,
        } = parts;
        let artifacts = Artifacts::new(workspace.root());
        log.set_poke(committed.clone());
        // Every registered tool's (what is offered changes with the tool policy).
        let names: Vec<String> = registry.statuses().into_iter().map(|(n, _)| n).collect();
        let fields = Fields::of(names.iter().filter_map(|n| registry.get(n)).map(|r| &r.manifest));
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
            proposals,
            policies,
            board,
            operator_words,
            fields,
        }
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

    /// Whether anything may run for `lane` right now: not when it was
    /// cancelled, the lease is lost, choird stopped storing the log or the
    /// kill switch is on.
    fn gate(&self, lane: &LaneCtx) -> Option<(Refusal, String)> {
        if lane.cancelled() {
            return Some((Refusal::Cancelled, "this job was cancelled; nothing more runs".into()));
        }
        if self.lease_lost.load(Ordering::SeqCst) {
            return Some((Refusal::LeaseLost, "choird no longer accepts this agent's lease; nothing can run".into()));
        }
        if let Some(why) = self.log.failed_closed() {
            return Some((
                Refusal::ReplicationDown,
                format!("{why}; no tool runs until it does again: tell the user you cannot act right now and why"),
            ));
        }
        if self.kill_switch.load(Ordering::SeqCst) {
            return Some((
                Refusal::KillSwitch,
                "all tools are disabled by the operator's kill switch; tell the user you cannot act right now".into(),
            ));
        }
        None
    }

    /// Steps 1–5: decides without side effects. `history` is the lane's
    /// (what values are traced through, with what it inherited).
    pub fn decide(&self, lane: &LaneCtx, call: &ProposedCall, history: &[Entry]) -> Decision {
        self.decide_named(lane, call, canonical_tool_name(&call.name), history)
    }

    /// [`Arbiter::decide`] for a call whose canonical name (`None` when the
    /// wire name has no canonical form) was worked out once by the caller.
    fn decide_named(
        &self,
        lane: &LaneCtx,
        call: &ProposedCall,
        canonical: Option<String>,
        history: &[Entry],
    ) -> Decision {
        let forbid = |tool: Option<String>, input: Value, refusal: Refusal, reason: String| Decision::Forbidden {
            tool,
            input,
            refusal,
            reason,
        };
        // A tool switched off while the agent runs says why.
        if let Some((name, why)) =
            canonical.as_ref().and_then(|n| self.registry.get(n)).and_then(|t| Some((t, t.tool.unavailable()?)))
        {
            return forbid(Some(name.manifest.llm.name.clone()), Value::Null, Refusal::NotAllowed, why);
        }
        let offered = canonical.and_then(|n| self.registry.get(&n).filter(|t| t.offered()).map(|t| (n, t)));
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
        if let Some(reason) = self.registry.policy_refusal(&tool) {
            return forbid(Some(tool), Value::Null, Refusal::NotAllowed, reason);
        }
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
        let runtime = &reg.manifest.runtime;
        let mut resources = Vec::new();
        for lock in &runtime.locks {
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
        // A tool holding secrets never runs beside anything that runs the
        // model's code (a shell command, or any external tool: git runs
        // hooks, npm runs scripts, make runs the Makefile): those could read
        // its environment or memory. `choir.exec` and tools with secrets hold
        // `processes` exclusively, every other external tool shares it.
        if tool == "choir.exec" || !runtime.secret_resources.is_empty() {
            resources.push((Resource::new(PROCESSES), LockMode::X));
        } else if runtime.exec_path.is_some() || choir_common::mcp::is_mcp_tool(&tool) {
            resources.push((Resource::new(PROCESSES), LockMode::S));
        }
        // An action on the outside world is never concurrent with another
        // of the same resource: its own, unless the manifest names one.
        if runtime.reaches_outside() && !resources.iter().any(|(_, m)| *m == LockMode::X) {
            resources.push((Resource::new(&format!("external:{tool}")), LockMode::X));
        }
        if let Some((refusal, reason)) = self.gate(lane) {
            return forbid(Some(tool), input, refusal, reason);
        }
        let ev = Evidence {
            operator: &self.operator_words,
            inherited: lane.inherited.as_deref().map(Vec::as_slice).unwrap_or_default(),
            history,
            fields: Some(&self.fields),
        };
        // A plan fixes the turn's intent only from trusted input.
        if tool == intent::PLAN_TOOL {
            let offered = |t: &str| self.registry.get(t).is_some_and(|r| r.offered());
            if let Some(reason) = intent::plan_refusal(&intent::lane_facts(lane, &ev), &input, &offered) {
                return forbid(Some(tool), input, Refusal::Policy, reason);
            }
        }
        let verdict = if self.policies.is_empty() {
            Verdict::Allow
        } else {
            crate::arbiter::policy::combine(&self.policies, lane, &tool, &reg.manifest, &input, &ev)
        };
        let timeout = Duration::from_millis(runtime.timeout_ms);
        let proposal = PROPOSAL_TOOLS.contains(&tool.as_str());
        // The strictest wins: a policy's refusal over everything; a proposal
        // (a human decides, nothing runs) over a confirmation.
        match (verdict, proposal) {
            (Verdict::Forbid { reason }, _) => forbid(Some(tool), input, Refusal::Policy, reason),
            (Verdict::Allow | Verdict::Confirm { .. }, true) => {
                let reason =
                    format!("{tool} is a proposal: it goes to a human, and nothing runs before one approves it");
                Decision::NeedsApproval { tool, input, approval: Approval::Proposal { reason } }
            }
            (Verdict::Confirm { reason, wait }, false) => Decision::NeedsApproval {
                tool,
                input,
                approval: Approval::Confirm { reason, resources, timeout, wait },
            },
            (Verdict::Allow, false) => Decision::Allowed { tool, input, resources, timeout },
        }
    }

    /// The whole pipeline; returns what came of the call (what the model is
    /// shown of it is `results::render` of that). Fails only if the commit
    /// log cannot be written (the lane must stop: nothing may proceed
    /// unrecorded).
    pub fn invoke(&self, lane: &LaneCtx, call: &ProposedCall, history: &[Entry]) -> Result<Invocation, LogError> {
        self.invoke_with(lane, call, history, &Together::new())
    }

    /// [`Arbiter::invoke`], for a call of a turn whose confirmations a
    /// human decided `together`: a call to confirm that is exactly one they
    /// confirmed runs without asking again; one they refused is refused.
    pub fn invoke_with(
        &self,
        lane: &LaneCtx,
        call: &ProposedCall,
        history: &[Entry],
        together: &Together,
    ) -> Result<Invocation, LogError> {
        // The tool as the model named it, canonical where the name has a canonical form.
        let canonical = canonical_tool_name(&call.name);
        let named = canonical.clone().unwrap_or_else(|| call.name.clone());
        // The guard lives until after the commit: locks are released last.
        let mut guard = None;
        let settled = match self.decide_named(lane, call, canonical, history) {
            Decision::Allowed { tool, input, resources, timeout } => {
                self.run(lane, call, &named, (tool, input), resources, timeout, history, &mut guard)?
            }
            Decision::NeedsApproval { tool, input, approval: Approval::Proposal { reason } } => {
                self.propose(lane, &named, tool, input, &reason)
            }
            Decision::NeedsApproval {
                tool,
                input,
                approval: Approval::Confirm { reason, resources, timeout, wait },
            } => match self.confirmed_together(lane, call, &tool, &input, together) {
                Some(Ok(())) => self.run(lane, call, &named, (tool, input), resources, timeout, history, &mut guard)?,
                Some(Err((refusal, why))) => self.refuse(lane, &named, Some(tool), input, refusal, why),
                None => match self.confirm(lane, call, &tool, &input, &reason, wait) {
                    Ok(()) => self.run(lane, call, &named, (tool, input), resources, timeout, history, &mut guard)?,
                    Err((refusal, why)) => self.refuse(lane, &named, Some(tool), input, refusal, why),
                },
            },
            Decision::Forbidden { tool, input, refusal, reason } => {
                self.refuse(lane, &named, tool, input, refusal, reason)
            }
        };
        let tool = if settled.tool.is_empty() { format!("?{}", call.name) } else { settled.tool };
        crate::failpoints::hit("before_append");
        let event = NewEvent {
            lane: lane.lane.clone(),
            kind: EventKind::ToolCall,
            tool,
            call_id: Some(call.id.clone()),
            turn: lane.turn,
            skill: lane.skill.as_ref().map(|s| s.name.clone()),
            state: lane.skill.as_ref().map(|s| s.state.clone()),
            input: self.secrets.redact(&settled.input),
            outcome: settled.inv.status.outcome(),
            result: render(&settled.inv),
            duration_us: settled.duration_us,
            external: settled.external,
        };
        let committed = match self.log.append(event) {
            Ok(c) => c,
            Err(LogError::NotReplicated { seq, why }) => {
                // The tool's result is withheld: no model sees what choird's
                // copy of the log does not hold.
                drop(guard);
                log::error!("commit {seq}: not stored by choird ({why}); its result is withheld from the model");
                return Ok(Invocation::withheld(&named, &why));
            }
            Err(e) => return Err(e),
        };
        drop(guard);
        let _ = self.committed.try_send(());
        log::info!(
            "commit {}: {} {} {:?} ({} µs)",
            committed.seq,
            committed.lane,
            committed.tool,
            committed.outcome,
            settled.duration_us
        );
        Ok(settled.inv)
    }

    /// A refusal: nothing ran. `tool` is `None` when the name resolved to no tool.
    fn refuse(
        &self,
        lane: &LaneCtx,
        named: &str,
        tool: Option<String>,
        input: Value,
        refusal: Refusal,
        reason: String,
    ) -> Settled {
        let inv = Invocation::refused(
            named,
            format!("the call was not executed: {reason}"),
            Refused { refusal, reason, allowed_tools: self.allowed_names(lane), skill: None },
        );
        Settled { tool: tool.unwrap_or_default(), input, inv, duration_us: 0, external: false }
    }

    /// A proposal meta-tool: its input goes to choird for a human.
    fn propose(&self, lane: &LaneCtx, named: &str, tool: String, input: Value, reason: &str) -> Settled {
        let started = Instant::now();
        let sink = self.proposals.as_ref();
        let submitted = match (sink, propose::request(&tool, &input, lane)) {
            (Some(sink), Some(req)) => sink.submit(&req, lane.waits_for_approval),
            _ => Err(ProposalError::Unavailable("proposals cannot be submitted from here".into())),
        };
        let duration_us = started.elapsed().as_micros() as u64;
        match submitted {
            Ok(r) => {
                let summary =
                    format!("{}: proposal {} is waiting for a human's decision ({reason})", r.summary, r.approval_id);
                let inv = Invocation {
                    approval: Some(Pending { approval_id: r.approval_id, sha256: r.sha256 }),
                    ..Invocation::new(named, Status::PendingApproval, summary)
                };
                Settled { tool, input, inv, duration_us, external: false }
            }
            Err(ProposalError::Invalid(why)) => self.refuse(
                lane,
                named,
                Some(tool),
                input,
                Refusal::InvalidProposal,
                format!("choird refused the proposal: {why}"),
            ),
            Err(ProposalError::Unavailable(why)) => self.refuse(
                lane,
                named,
                Some(tool),
                input,
                Refusal::ProposalUnavailable,
                format!("the proposal could not be submitted now: {why}"),
            ),
        }
    }

    /// Step 6: asks a human to confirm this exact call and waits, shown as
    /// WAITING_APPROVAL, for at most `wait`. `Ok` once confirmed and nothing
    /// since stops it from running; otherwise why not.
    fn confirm(
        &self,
        lane: &LaneCtx,
        call: &ProposedCall,
        tool: &str,
        input: &Value,
        reason: &str,
        wait: Duration,
    ) -> Result<(), (Refusal, String)> {
        let wait = wait.clamp(Duration::from_secs(1), MAX_CONFIRM_WAIT);
        let mut content = self.confirmed_call(lane, call, tool, input);
        content["timeout_s"] = json!(wait.as_secs().max(1));
        self.ask_human(lane, content, reason, wait, &format!("{tool} {}", call.id))
    }

    /// A call as a confirmation names it: the tool, its input (secrets
    /// redacted), and an id unique among the lanes running now.
    fn confirmed_call(&self, lane: &LaneCtx, call: &ProposedCall, tool: &str, input: &Value) -> Value {
        let call_id: String = format!("{}/{}", lane.lane, call.id).chars().take(200).collect();
        json!({"tool": tool, "input": self.secrets.redact(input), "call_id": call_id})
    }

    /// When two or more of a turn's `calls` each need a human to confirm
    /// them, asks once for all of them (at most
    /// [`choir_common::rpc::MAX_CALLS_CONFIRMED`]; more are asked about one
    /// by one), each with its own reason, and waits as long as the longest
    /// of their waits; what was decided, by call id. Empty when fewer than
    /// two need a human (each is asked on its own, as ever). Nothing runs
    /// here: each call still goes through [`Arbiter::invoke_with`], which
    /// decides it again and runs it only if it is exactly what was
    /// confirmed.
    pub fn confirm_together(&self, lane: &LaneCtx, calls: &[ProposedCall], history: &[Entry]) -> Together {
        let mut asked = Vec::new();
        for call in calls {
            if asked.len() == choir_common::rpc::MAX_CALLS_CONFIRMED {
                break;
            }
            let canonical = canonical_tool_name(&call.name);
            if let Decision::NeedsApproval { tool, input, approval: Approval::Confirm { reason, wait, .. } } =
                self.decide_named(lane, call, canonical, history)
            {
                asked.push((call, tool, input, reason, wait));
            }
        }
        if asked.len() < 2 || self.proposals.is_none() {
            return Together::new();
        }
        let wait = asked.iter().map(|a| a.4).max().unwrap_or_default().clamp(Duration::from_secs(1), MAX_CONFIRM_WAIT);
        let listed: Vec<Value> =
            asked.iter().map(|(call, tool, input, ..)| self.confirmed_call(lane, call, tool, input)).collect();
        let content = json!({"calls": listed, "timeout_s": wait.as_secs().max(1)});
        let mut reason = format!("{} calls of one turn each need a human; one decision covers them all.", asked.len());
        for (i, (_, _, _, why, _)) in asked.iter().enumerate() {
            reason.push_str(&format!("\n{}. {why}", i + 1));
        }
        let ids: Vec<&str> = asked.iter().map(|a| a.0.id.as_str()).collect();
        let decided =
            self.ask_human(lane, content, &reason, wait, &format!("{} calls ({})", ids.len(), ids.join(", ")));
        asked
            .into_iter()
            .map(|(call, tool, input, ..)| (call.id.clone(), decided.clone().map(|()| (tool, input))))
            .collect()
    }

    /// What `together` says of `call` (`tool` with `input`): `None` when it
    /// was not asked about with others (or not exactly as it is now).
    fn confirmed_together(
        &self,
        lane: &LaneCtx,
        call: &ProposedCall,
        tool: &str,
        input: &Value,
        together: &Together,
    ) -> Option<Result<(), (Refusal, String)>> {
        match together.get(&call.id)? {
            Ok((t, i)) if t == tool && i == input => {
                // What stops any call also stops a confirmed one.
                Some(match self.gate(lane) {
                    Some((refusal, why)) => Err((refusal, format!("confirmed, but {why}"))),
                    None => Ok(()),
                })
            }
            Ok(_) => None,
            Err(e) => Some(Err(e.clone())),
        }
    }

    /// Submits the confirmation `content` (with `reason`) and waits for a
    /// human's decision, at most `wait`; `what` names it in the log. `Ok`
    /// once exactly this was confirmed and nothing since stops it.
    fn ask_human(
        &self,
        lane: &LaneCtx,
        content: Value,
        reason: &str,
        wait: Duration,
        what: &str,
    ) -> Result<(), (Refusal, String)> {
        let Some(sink) = self.proposals.as_ref() else {
            return Err((Refusal::ProposalUnavailable, "no human can be asked to confirm it from here".into()));
        };
        let req = ApprovalRequest {
            kind: ProposalKind::Call,
            scope: ProposalScope::Agent,
            content,
            reason: reason.to_owned(),
            lane: lane.lane.clone(),
            skill: lane.skill.as_ref().map(|s| s.name.clone()),
            state: lane.skill.as_ref().map(|s| s.state.clone()),
            conversation: lane.conversation.clone(),
        };
        // What exactly a human is asked about: a decision on anything else
        // (another digest) runs nothing.
        let digest = hex::encode(sha2::Sha256::digest(canonical_json(&req.content).as_bytes()));
        let id = match sink.submit(&req, true) {
            Ok(r) if r.sha256 == digest => r.approval_id,
            Ok(r) => {
                return Err((
                    Refusal::NotConfirmed,
                    format!(
                        "choird recorded approval {} for another call (sha256 {}, not {digest})",
                        r.approval_id, r.sha256
                    ),
                ))
            }
            Err(ProposalError::Invalid(why)) => {
                return Err((Refusal::InvalidProposal, format!("choird refused to ask for a confirmation: {why}")))
            }
            Err(ProposalError::Unavailable(why)) => {
                return Err((Refusal::ProposalUnavailable, format!("no human could be asked to confirm it now: {why}")))
            }
        };
        log::info!("{}: {what} waits for a human to confirm it (approval {id})", lane.lane);
        let board = self.board.as_ref();
        if let Some(b) = board {
            b.confirming(&lane.lane, true);
        }
        let awaited = sink.await_decision(id, lane.cancel.as_deref(), Instant::now() + wait + CONFIRM_GRACE);
        if let Some(b) = board {
            b.confirming(&lane.lane, false);
        }
        match awaited {
            Awaited::Decided(d) if d.status == "approved" && d.sha256.as_deref() != Some(digest.as_str()) => Err((
                Refusal::NotConfirmed,
                format!(
                    "approval {id} was given for another call (sha256 {}), not this one ({digest}); it was not run",
                    d.sha256.as_deref().unwrap_or("unknown")
                ),
            )),
            Awaited::Decided(d) if d.status == "approved" => {
                log::info!("{}: {what} confirmed by {}", lane.lane, d.decided_by);
                // What stops any call also stops a confirmed one.
                match self.gate(lane) {
                    Some((refusal, why)) => Err((refusal, format!("confirmed (approval {id}), but {why}"))),
                    None => Ok(()),
                }
            }
            // choird's own rejection: its time ran out there first.
            Awaited::Decided(d) if d.decided_by == "choird" => Err((
                Refusal::ConfirmTimeout,
                format!("no human confirmed it within {} s (approval {id}); it was not run", wait.as_secs()),
            )),
            Awaited::Decided(d) => Err((
                Refusal::NotConfirmed,
                format!(
                    "{} did not confirm it (approval {id}): {}",
                    d.decided_by,
                    d.reason.as_deref().unwrap_or("no reason given")
                ),
            )),
            Awaited::Cancelled => {
                Err((Refusal::Cancelled, format!("this job was cancelled while it waited for approval {id}")))
            }
            Awaited::TimedOut => Err((
                Refusal::ConfirmTimeout,
                format!("no human confirmed it within {} s (approval {id}); it was not run", wait.as_secs()),
            )),
        }
    }

    /// Steps 7–8 for a call that may run: locks, the intent of a call that
    /// must not run twice, execution.
    #[allow(clippy::too_many_arguments)]
    fn run<'a>(
        &'a self,
        lane: &LaneCtx,
        call: &ProposedCall,
        named: &str,
        (tool, input): (String, Value),
        resources: Vec<(Resource, LockMode)>,
        timeout: Duration,
        history: &[Entry],
        guard: &mut Option<crate::arbiter::locks::LockGuard<'a, crate::arbiter::locks::ParkingMonitor>>,
    ) -> Result<Settled, LogError> {
        let owner = format!("{}/{}", lane.lane, call.id);
        match self.locks.acquire(&owner, resources, LOCK_WAIT.min(timeout)) {
            Err(busy) => {
                return Ok(self.refuse(
                    lane,
                    named,
                    Some(tool),
                    input,
                    Refusal::Busy,
                    format!("{busy}; try again later"),
                ))
            }
            // Cancelled while it waited for its locks: the boundary holds.
            Ok(_) if lane.cancelled() => {
                let why = "this job was cancelled while the call waited for its locks; nothing ran".to_owned();
                return Ok(self.refuse(lane, named, Some(tool), input, Refusal::Cancelled, why));
            }
            Ok(g) => *guard = Some(g),
        }
        let Some(reg) = self.registry.get(&tool) else {
            let inv = Invocation::new(&tool, Status::Error, "tool vanished");
            return Ok(Settled { tool, input, inv, duration_us: 0, external: false });
        };
        let key = if reg.at_most_once() {
            match self.announce(lane, call, &tool, &input) {
                // choird keys a host tool's run with it; a tool run here
                // needs only the committed intent.
                Ok(intent) => reg.runs_on_host().then(|| once_key(&intent)),
                Err(LogError::NotReplicated { why, .. }) => {
                    let why = format!("its intent was not stored by choird ({why}); nothing ran");
                    return Ok(self.refuse(lane, named, Some(tool), input, Refusal::ReplicationDown, why));
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let (inv, duration_us) =
            self.execute(lane, key.as_deref().unwrap_or(&call.id), &tool, &input, timeout, history);
        crate::failpoints::hit("after_execute");
        let external = reg.manifest.runtime.reaches_outside();
        Ok(Settled { tool, input, inv, duration_us, external })
    }

    /// Commits the intent to run a call that must not run twice, before it runs.
    fn announce(
        &self,
        lane: &LaneCtx,
        call: &ProposedCall,
        tool: &str,
        input: &Value,
    ) -> Result<CommitEvent, LogError> {
        let event = NewEvent {
            lane: lane.lane.clone(),
            kind: EventKind::Intent,
            tool: tool.to_owned(),
            call_id: Some(call.id.clone()),
            turn: lane.turn,
            skill: lane.skill.as_ref().map(|s| s.name.clone()),
            state: lane.skill.as_ref().map(|s| s.state.clone()),
            input: self.secrets.redact(input),
            outcome: Outcome::Ok,
            result: json!({"summary": format!("about to run {tool}; it runs at most once")}),
            duration_us: 0,
            external: false,
        };
        let intent = self.log.append(event)?;
        let _ = self.committed.try_send(());
        Ok(intent)
    }

    /// Completes the calls a crash interrupted between their intent and
    /// their outcome ([`crate::commitlog::CommitLog::dangling_intents`]):
    /// choird is asked for each again under the same key, and answers with
    /// the outcome it stored when the call ran (or runs it now if it never
    /// reached choird, or refuses if it started and never finished: it runs
    /// at most once). A tool run here is not run again: its call is told
    /// as one that may have run. A tool no longer served is not asked at all. Each
    /// outcome is committed as the call's `tool_call` event, returned so an
    /// interrupted turn can be replayed with it.
    pub fn complete_intents(&self, intents: &[CommitEvent]) -> Result<Vec<CommitEvent>, LogError> {
        let mut done = Vec::new();
        for intent in intents {
            let mut lane = LaneCtx::new(&intent.lane, if intent.lane == "edge" { Lane::Edge } else { Lane::Core });
            lane.turn = intent.turn;
            lane.skill = intent
                .skill
                .clone()
                .zip(intent.state.clone())
                .map(|(name, state)| crate::arbiter::lane_ctx::SkillAt { name, state });
            let named = intent.tool.clone();
            let (inv, duration_us, external) = match self.registry.get(&intent.tool) {
                Some(reg) if reg.runs_on_host() => {
                    let timeout = Duration::from_millis(reg.manifest.runtime.timeout_ms);
                    let (inv, us) = self.execute(&lane, &once_key(intent), &intent.tool, &intent.input, timeout, &[]);
                    (inv, us, reg.manifest.runtime.reaches_outside())
                }
                // Run here, and the process that ran it is gone: whether it
                // reached the outside world is unknown. Never run blindly
                // again; the model is told, and tells the user.
                Some(_) => {
                    let message = format!(
                        "{} was started before a restart and its outcome is unknown: it may have run. It was not \
                         run again. Tell the user it may have run; do not call it again unless they ask",
                        intent.tool
                    );
                    let inv = Invocation {
                        error: Some(Failure { code: "may_have_run".into(), message: message.clone() }),
                        ..Invocation::new(&named, Status::Error, message)
                    };
                    (inv, 0, true)
                }
                None => {
                    let message = format!(
                        "{} was interrupted by a restart and is no longer served here; it was not run again",
                        intent.tool
                    );
                    let inv = Invocation {
                        error: Some(Failure { code: "interrupted".into(), message: message.clone() }),
                        ..Invocation::new(&named, Status::Error, message)
                    };
                    (inv, 0, false)
                }
            };
            log::warn!(
                "commit {}: {} {} was interrupted; completed from choird's record: {:?}",
                intent.seq,
                intent.lane,
                intent.tool,
                inv.status
            );
            let event = NewEvent {
                lane: intent.lane.clone(),
                kind: EventKind::ToolCall,
                tool: intent.tool.clone(),
                call_id: intent.call_id.clone(),
                turn: intent.turn,
                skill: intent.skill.clone(),
                state: intent.state.clone(),
                input: intent.input.clone(),
                outcome: inv.status.outcome(),
                result: render(&inv),
                duration_us,
                external,
            };
            done.push(self.log.append(event)?);
            let _ = self.committed.try_send(());
        }
        Ok(done)
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
    ) -> Result<CommitEvent, LogError> {
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
            external: false,
        };
        let committed = self.log.append(event)?;
        let _ = self.committed.try_send(());
        Ok(committed)
    }

    /// Step 8's execution plus result shaping: runs the tool and returns
    /// what came of it and the microseconds it took. `call_id` is what the
    /// tool is told (for a call that must not run twice, its key with choird).
    fn execute(
        &self,
        lane: &LaneCtx,
        call_id: &str,
        tool: &str,
        input: &Value,
        timeout: Duration,
        history: &[Entry],
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
            history,
        };
        crate::failpoints::hit("during_tool");
        let ran = reg.tool.execute(&ctx, input);
        let us = started.elapsed().as_micros() as u64;
        let inv = shape(tool, ran, &reg.manifest.runtime, lane.kind, &self.secrets, &self.artifacts);
        (inv, us)
    }
}

/// The key under which choird runs a call that must not run twice: its
/// intent's position and hash, the same before and after a restart and
/// never the same for two calls (a reset log starts a different chain).
fn once_key(intent: &CommitEvent) -> String {
    format!("intent:{}:{}", intent.seq, &intent.hash[..16.min(intent.hash.len())])
}

/// Test support (also the link's tests): an arbiter over the built-ins and
/// the external tools `manifests`, its log in `dir/state`.
#[cfg(test)]
pub(crate) fn arbiter_with(dir: &std::path::Path, manifests: &[(&str, Value)]) -> Arbiter {
    tests::arbiter_with(dir, manifests)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::host::NoHost;
    use serde_json::json;

    /// An arbiter over the built-ins and the external tools `manifests`
    /// (name stem → manifest), each a script that prints `{}`.
    pub(super) fn arbiter_with(dir: &std::path::Path, manifests: &[(&str, Value)]) -> Arbiter {
        Arbiter::new(parts_with(dir, manifests))
    }

    fn parts_with(dir: &std::path::Path, manifests: &[(&str, Value)]) -> Parts {
        let tools = dir.join("choir/tools/agent");
        std::fs::create_dir_all(&tools).unwrap();
        for (stem, manifest) in manifests {
            std::fs::write(tools.join(format!("{stem}.json")), manifest.to_string()).unwrap();
            std::fs::write(tools.join(stem), "#!/bin/sh\necho '{}'\n").unwrap();
            std::fs::set_permissions(tools.join(stem), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        let registry =
            Registry::load(&dir.join("choir"), &["deploy_key".to_owned()], Arc::new(NoHost), &[], &[], None).unwrap();
        let ws = dir.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let (log, _) = crate::commitlog::CommitLog::open(&dir.join("state")).unwrap();
        let (tx, _rx) = crossbeam_channel::bounded(1);
        Parts {
            registry,
            workspace: Workspace::open(&ws).unwrap(),
            state_dir: dir.join("state"),
            log: Arc::new(DurableLog::new(log).unwrap()),
            committed: tx,
            secrets: SecretStore::default(),
            proposals: None,
            policies: Vec::new(),
            board: None,
            operator_words: String::new(),
        }
    }

    fn external(name: &str, extra: Value) -> Value {
        let mut runtime = json!({"exec_path": name.rsplit('.').nth(1).unwrap(), "timeout_ms": 1000,
                                 "side_effect": "external", "version": "1"});
        runtime.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!({"llm": {"name": name, "description": "Acts.", "parameters": {"type": "object"}}, "runtime": runtime})
    }

    fn call(name: &str, args: &str) -> ProposedCall {
        ProposedCall { id: "c".into(), name: name.into(), arguments: args.into() }
    }

    #[test]
    fn regression_a_tool_with_secrets_ran_beside_an_external_tool_that_runs_the_models_code() {
        let dir = tempfile::tempdir().unwrap();
        let deploy = external("x.deploy.run", json!({"secret_resources": ["deploy_key"]}));
        let status = external("x.repo.status", json!({"side_effect": "read"}));
        let arbiter = arbiter_with(dir.path(), &[("deploy", deploy), ("repo", status)]);
        let lane = LaneCtx::new("edge", Lane::Edge);
        let resources = |name: &str, args: &str| match arbiter.decide(&lane, &call(name, args), &[]) {
            Decision::Allowed { resources, .. } => resources,
            other => panic!("{other:?}"),
        };
        let exec = resources("choir__exec", r#"{"command": "true"}"#);
        let deploy = resources("x__deploy__run", "{}");
        let status = resources("x__repo__status", "{}");
        assert!(exec.contains(&(Resource::new(PROCESSES), LockMode::X)), "{exec:?}");
        assert!(deploy.contains(&(Resource::new(PROCESSES), LockMode::X)), "{deploy:?}");
        assert!(status.contains(&(Resource::new(PROCESSES), LockMode::S)), "{status:?}");
        // So the secret tool never holds its locks beside either.
        for other in [exec, status.clone()] {
            let held = arbiter.locks().acquire("edge/1", other, Duration::from_secs(1)).unwrap();
            assert!(arbiter.locks().acquire("core/1", deploy.clone(), Duration::from_millis(100)).is_err());
            drop(held);
        }
        // Tools without secrets still run side by side (the control).
        let held = arbiter.locks().acquire("edge/1", status.clone(), Duration::from_secs(1)).unwrap();
        assert!(arbiter.locks().acquire("core/1", status, Duration::from_millis(100)).is_ok());
        drop(held);
    }

    #[test]
    fn the_fields_tools_declare_are_evidence() {
        let dir = tempfile::tempdir().unwrap();
        let lister = external(
            "x.drive.list",
            json!({"side_effect": "read", "trusted_fields": ["/result/*/id"],
                                                     "private_fields": ["/result/*/secret"]}),
        );
        let arbiter = arbiter_with(dir.path(), &[("drive", lister)]);
        assert_eq!(
            arbiter.fields.trusted["x.drive.list"],
            vec![vec!["result".to_owned(), "*".to_owned(), "id".to_owned()]]
        );
        assert_eq!(
            arbiter.fields.private["x.drive.list"],
            vec![vec!["result".to_owned(), "*".to_owned(), "secret".to_owned()]]
        );
        // The built-ins that read the user's files are private wholly.
        for tool in ["choir.fs.read", "choir.fs.search", "choir.exec"] {
            assert_eq!(arbiter.fields.private[tool], vec![Vec::<String>::new()], "{tool}");
        }
    }

    #[test]
    fn a_destination_a_trusted_field_produced_needs_no_human_under_the_shipped_default() {
        use crate::origin::{Entry, Origin};
        use choir_common::arg_policy::{PolicyFile, PolicySet, BUILT_IN, DEFAULT_POLICY};
        use choir_common::trust::OutputTrust;
        let dir = tempfile::tempdir().unwrap();
        let lister = external("x.chat.channels", json!({"side_effect": "read", "trusted_fields": ["/result/*"]}));
        let mut poster = external("x.chat.post", json!({"roles": {"/channel": "destination"}}));
        poster["llm"]["parameters"] = json!({"type": "object", "properties": {"channel": {"type": "string"}}});
        let policy = Arc::new(crate::arbiter::arg_check::ArgumentPolicy::default());
        let known = [("x.chat.post".to_owned(), None), ("choir.web.browse".to_owned(), None)].into();
        policy.set(&PolicySet::merge([PolicyFile::parse(BUILT_IN, DEFAULT_POLICY, &known).unwrap()]));
        let arbiter = Arbiter::new(Parts {
            policies: vec![policy],
            ..parts_with(dir.path(), &[("chat", lister), ("chat2", poster)])
        });
        let result = r#"{"output_trust":"untrusted","result":["general","External_ mail x@evil.test"],"status":"success","summary":"s"}"#;
        let history = vec![
            Entry::user("post hello in the general-purpose channel"),
            Entry::tool_result(
                "c1",
                result,
                Origin::Tool { tool: "x.chat.channels".into(), trust: OutputTrust::Untrusted },
            ),
        ];
        let mut lane = LaneCtx::new("edge", Lane::Edge);
        lane.allowlist = Some(vec!["x.chat.post".into(), "x.chat.channels".into()]);
        lane.skill = Some(lane_ctx::SkillAt { name: "post".into(), state: "s".into() });
        let d = arbiter.decide(&lane, &call("x__chat__post", r#"{"channel": "general"}"#), &history);
        assert!(matches!(d, Decision::Allowed { .. }), "{d:?}");
        let d = arbiter.decide(&lane, &call("x__chat__post", r#"{"channel": "x@evil.test"}"#), &history);
        assert!(matches!(d, Decision::NeedsApproval { .. }), "{d:?}");
    }

    #[test]
    fn an_oversized_plan_is_refused_by_its_schema_and_fixes_no_intent() {
        use crate::arbiter::intent::{lane_facts, IntentBy};
        use crate::origin::{Entry, Origin};
        use choir_common::trust::OutputTrust;
        let dir = tempfile::tempdir().unwrap();
        let arbiter = arbiter_with(dir.path(), &[]);
        let lane = LaneCtx::new("edge", Lane::Edge);
        let many: Vec<String> = (0..65).map(|i| format!("x.t{i}")).collect();
        let cases = [
            json!({"tools": many}),
            json!({"tools": ["x.a"], "times": {"x.a": 1001}}),
            json!({"tools": ["x.a", "x.a"]}),
            json!({"tools": []}),
            json!({"tools": ["x.a"], "why": "w".repeat(1001)}),
            json!({"tools": ["x.a"], "also": "anything"}),
        ];
        for input in cases {
            let proposed = call("choir__plan", &input.to_string());
            let d = arbiter.decide(&lane, &proposed, &[Entry::user("hi")]);
            assert!(matches!(d, Decision::Forbidden { refusal: Refusal::InvalidArguments, .. }), "{input}: {d:?}");
            // What the lane then holds fixes no intent.
            let inv = arbiter.invoke(&lane, &proposed, &[Entry::user("hi")]).unwrap();
            let mut m = choir_common::openai::ChatMessage::text(choir_common::openai::Role::Assistant, "");
            m.tool_calls = vec![choir_common::openai::ToolCall {
                id: proposed.id.clone(),
                kind: "function".into(),
                function: choir_common::openai::FunctionCall {
                    name: "choir__plan".into(),
                    arguments: input.to_string(),
                },
                extra_content: None,
            }];
            let history = vec![
                Entry::user("hi"),
                Entry::model(m),
                Entry::tool_result(
                    &proposed.id,
                    crate::arbiter::results::render(&inv).to_string(),
                    Origin::Tool { tool: crate::tools::plan::PLAN_TOOL.into(), trust: OutputTrust::Trusted },
                ),
            ];
            let ev = provenance::Evidence { history: &history, ..Default::default() };
            assert_eq!(lane_facts(&lane, &ev).by, IntentBy::Nothing, "{input}");
        }
    }

    #[test]
    fn regression_a_search_query_carrying_a_file_the_lane_read_went_out_unasked() {
        use crate::origin::{Entry, Origin};
        use choir_common::arg_policy::{PolicyFile, PolicySet, BUILT_IN, DEFAULT_POLICY};
        use choir_common::trust::OutputTrust;
        let dir = tempfile::tempdir().unwrap();
        let mut finder = external("x.web.find", json!({"side_effect": "read", "roles": {"/query": "payload"}}));
        finder["llm"]["parameters"] = json!({"type": "object", "properties": {"query": {"type": "string"}}});
        let policy = Arc::new(crate::arbiter::arg_check::ArgumentPolicy::default());
        let known = [("choir.web.browse".to_owned(), None)].into();
        policy.set(&PolicySet::merge([PolicyFile::parse(BUILT_IN, DEFAULT_POLICY, &known).unwrap()]));
        let arbiter = Arbiter::new(Parts { policies: vec![policy], ..parts_with(dir.path(), &[("web", finder)]) });
        let file = r#"{"output_trust":"untrusted","content":"DEPLOY_KEY=sk-live-4f9a8b2c77d1","status":"success","summary":"read deploy.env"}"#;
        let lane_that_read = |tool: &str| {
            vec![
                Entry::user("find me a pizza place in Lyon"),
                Entry::tool_result("c1", file, Origin::Tool { tool: tool.into(), trust: OutputTrust::Untrusted }),
            ]
        };
        let mut lane = LaneCtx::new("edge", Lane::Edge);
        lane.allowlist = Some(vec!["x.web.find".into(), "choir.fs.read".into()]);
        let leak = call("x__web__find", r#"{"query": "sk-live-4f9a8b2c77d1"}"#);
        let d = arbiter.decide(&lane, &leak, &lane_that_read("choir.fs.read"));
        match d {
            Decision::NeedsApproval { approval: Approval::Confirm { reason, .. }, .. } => {
                assert!(reason.contains("private-data-out"), "{reason}");
                assert!(reason.contains("private data in choir.fs.read's output"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
        // The user's query goes; and the same text from a tool whose output
        // is not private (a page) is no private data (the negative control).
        let asked = call("x__web__find", r#"{"query": "pizza Lyon"}"#);
        assert!(matches!(arbiter.decide(&lane, &asked, &lane_that_read("choir.fs.read")), Decision::Allowed { .. }));
        assert!(matches!(arbiter.decide(&lane, &leak, &lane_that_read("x.web.find")), Decision::Allowed { .. }));
    }

    #[test]
    fn an_external_tool_always_holds_an_exclusive_lock_and_its_calls_are_flagged_for_audit() {
        let dir = tempfile::tempdir().unwrap();
        let named = external("x.mail.send", json!({"locks": [{"resource": "mailbox", "mode": "X"}]}));
        let shared = external("x.ping.send", json!({"locks": [{"resource": "net", "mode": "S"}]}));
        let arbiter = arbiter_with(dir.path(), &[("mail", named), ("ping", shared)]);
        let lane = LaneCtx::new("edge", Lane::Edge);
        let resources = |name: &str| match arbiter.decide(&lane, &call(name, "{}"), &[]) {
            Decision::Allowed { resources, .. } => resources,
            other => panic!("{other:?}"),
        };
        // The one it names, or its own beside a shared one.
        let runs = (Resource::new(PROCESSES), LockMode::S);
        assert_eq!(resources("x__mail__send"), [(Resource::new("mailbox"), LockMode::X), runs.clone()]);
        assert_eq!(
            resources("x__ping__send"),
            [(Resource::new("net"), LockMode::S), runs, (Resource::new("external:x.ping.send"), LockMode::X)]
        );
        // Two calls of it never overlap.
        let held = arbiter.locks().acquire("edge/1", resources("x__ping__send"), Duration::from_secs(1)).unwrap();
        assert!(arbiter.locks().acquire("core/1", resources("x__ping__send"), Duration::from_millis(50)).is_err());
        drop(held);
        // Its executed calls carry the flag; a refused one and a workspace write do not.
        arbiter.invoke(&lane, &call("x__ping__send", "{}"), &[]).unwrap();
        arbiter.invoke(&lane, &call("x__ping__send", "[]"), &[]).unwrap();
        arbiter.invoke(&lane, &call("choir__fs__write", r#"{"path": "a", "content": "b"}"#), &[]).unwrap();
        let text = std::fs::read_to_string(dir.path().join("state/commit.log")).unwrap();
        let events: Vec<CommitEvent> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        // The call that ran was announced first (external, not idempotent:
        // at most once); the intent is no call of its own.
        assert_eq!((events[0].kind, events[0].tool.as_str()), (EventKind::Intent, "x.ping.send"));
        let flags: Vec<(&str, Outcome, bool)> = events
            .iter()
            .filter(|e| e.kind != EventKind::Intent)
            .map(|e| (e.tool.as_str(), e.outcome, e.external))
            .collect();
        assert_eq!(
            flags,
            [
                ("x.ping.send", Outcome::Ok, true),
                ("x.ping.send", Outcome::Rejected, false),
                ("choir.fs.write", Outcome::Ok, false)
            ]
        );
    }

    struct Says(Verdict);
    impl CallPolicy for Says {
        fn name(&self) -> &str {
            "test"
        }
        fn check(
            &self,
            _: &LaneCtx,
            _: &str,
            _: &choir_common::manifest::ToolManifest,
            _: &Value,
            _: &Evidence<'_>,
        ) -> Verdict {
            self.0.clone()
        }
    }

    #[test]
    fn the_strictest_check_wins() {
        let dir = tempfile::tempdir().unwrap();
        let lane = LaneCtx::new("edge", Lane::Edge);
        let read = call("choir__fs__read", r#"{"path": "a"}"#);
        let propose = call("choir__propose__config_change", r#"{"changes": {"max_steps_per_turn": 3}, "reason": "r"}"#);
        let unknown = call("nope", "{}");

        // A confirmation turns an allowed call into one a human must confirm,
        // with the same locks, but leaves a proposal a proposal (nothing runs).
        let wait = Duration::from_secs(7);
        let confirming = Arbiter::new(Parts {
            policies: vec![Arc::new(Says(Verdict::Confirm { reason: "sure?".into(), wait }))],
            ..parts_with(dir.path(), &[])
        });
        match confirming.decide(&lane, &read, &[]) {
            Decision::NeedsApproval { approval: Approval::Confirm { reason, resources, wait: w, .. }, .. } => {
                assert_eq!((reason.as_str(), w), ("sure?", wait));
                assert_eq!(resources, [(Resource::new("file:a"), LockMode::S)]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            confirming.decide(&lane, &propose, &[]),
            Decision::NeedsApproval { approval: Approval::Proposal { .. }, .. }
        ));
        // The arbiter's own refusals come first.
        assert!(matches!(
            confirming.decide(&lane, &unknown, &[]),
            Decision::Forbidden { refusal: Refusal::UnknownTool, .. }
        ));
        confirming.set_kill_switch(true);
        assert!(matches!(
            confirming.decide(&lane, &read, &[]),
            Decision::Forbidden { refusal: Refusal::KillSwitch, .. }
        ));
        drop(confirming);

        // A policy's refusal beats everything, proposals included; and a
        // refused call runs nothing.
        let dir = tempfile::tempdir().unwrap();
        let forbidding = Arbiter::new(Parts {
            policies: vec![
                Arc::new(Says(Verdict::Confirm { reason: "sure?".into(), wait })),
                Arc::new(Says(Verdict::Forbid { reason: "never".into() })),
            ],
            ..parts_with(dir.path(), &[])
        });
        for c in [&read, &propose] {
            match forbidding.decide(&lane, c, &[]) {
                Decision::Forbidden { refusal: Refusal::Policy, reason, .. } => {
                    assert_eq!(reason, "test policy: never")
                }
                other => panic!("{other:?}"),
            }
        }
        let write = call("choir__fs__write", r#"{"path": "w", "content": "x"}"#);
        let inv = forbidding.invoke(&lane, &write, &[]).unwrap();
        assert_eq!(inv.refusal.map(|r| r.refusal), Some(Refusal::Policy));
        assert!(!dir.path().join("ws/w").exists());
    }

    #[test]
    fn a_call_to_confirm_is_refused_when_no_human_can_be_asked() {
        let dir = tempfile::tempdir().unwrap();
        let arbiter = Arbiter::new(Parts {
            policies: vec![Arc::new(Says(Verdict::Confirm { reason: "sure?".into(), wait: Duration::from_secs(1) }))],
            ..parts_with(dir.path(), &[])
        });
        let lane = LaneCtx::new("edge", Lane::Edge);
        let inv = arbiter.invoke(&lane, &call("choir__fs__write", r#"{"path": "w", "content": "x"}"#), &[]).unwrap();
        assert_eq!(inv.refusal.map(|r| r.refusal), Some(Refusal::ProposalUnavailable));
        assert!(!dir.path().join("ws/w").exists());
    }
}
