//! The core pool (R-LANE-1, -3): named core jobs, each on its own thread with
//! its own conversation, model (the `core` lane) and budget (steps, tokens,
//! wall time), started by the edge lane through `choir.core.start`.
//!
//! **Invariant (1):** a core job's lifetime is inside its edge's: the pool is
//! owned by the edge lane, and dropping it (the edge stopping, or unwinding
//! from a panic) cancels every job and joins its thread. Cancellation is checked
//! before every step and, through the arbiter, before every tool call.
//! **Invariant (6):** what the edge learns of a job is a workflow summary —
//! status, the actions taken (tool, outcome, summary), artifacts, and the job's
//! final report — never the model's intermediate text.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use choir_common::commit::canonical_json;
use choir_common::manifest::EDGE_ONLY_TOOLS;
use choir_common::openai::{ChatMessage, Role};
use choir_common::rpc::CoreBudget;
use choir_common::rpc::{FiringOffer, FiringReport};
use choir_common::trust::{OutputTrust, TRUST_KEY};
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::arbiter::approvals::Approvals;
use crate::arbiter::invocation::{Invocation, Status};
use crate::arbiter::lane_ctx::LaneCtx;
use crate::arbiter::Arbiter;
use crate::board::{LaneMachine, LaneState, StatusBoard};
use crate::cancel::Cancel;
use crate::lanes::conversation::Conversation;
use crate::lanes::inbox::EdgeEvent;
use crate::lanes::llm::Llm;
use crate::lanes::llm::LlmError;
use crate::lanes::prompt::Identity;
use crate::lanes::reasoning::{Mind, Step};
use crate::lanes::skill_run::{SkillOutcome, SkillRun, SkillStep};
use crate::lanes::skills::{Skill, SkillBook};
use crate::origin::{Entry, Origin};
use crate::tools::tool::{JobRequest, LaneHooks, ToolError};
use choir_common::lane::Lane;

/// Characters of a firing's report sent to choird.
const MAX_FIRING_REPORT: usize = 4000;

/// The nice value core job threads run at (edge and link threads keep the
/// agent's own): when the CPU is short, the person waiting goes first.
pub const CORE_NICE: i32 = choir_common::nice::BACKGROUND_NICE;

/// What every core job shares.
pub struct CoreSetup {
    /// The arbiter.
    pub arbiter: Arc<Arbiter>,
    /// The model client.
    pub llm: Arc<Llm>,
    /// The core lane's model.
    pub model: String,
    /// The agent's identity.
    pub identity: Identity,
    /// Where lanes report.
    pub board: Arc<StatusBoard>,
    /// The edge's inbox, for finished jobs.
    pub edge: Sender<EdgeEvent>,
    /// The agent's skills.
    pub skills: Arc<SkillBook>,
    /// Who has the floor (the edge, while it works on a turn).
    pub floor: Arc<crate::lanes::floor::Floor>,
    /// Where decisions on proposals arrive.
    pub approvals: Arc<Approvals>,
    /// Where a scheduled firing's outcome goes (link-push, to choird; not the edge).
    pub firings: Sender<FiringReport>,
}

/// Limits that may change at run time (dynamic config).
#[derive(Debug, Clone, Copy)]
pub struct CoreLimits {
    /// Jobs at once.
    pub max_jobs: usize,
    /// Per-job budget.
    pub budget: CoreBudget,
    /// Corrections in a row tolerated.
    pub retry_budget: u32,
    /// Context size before compaction.
    pub context_tokens: u64,
}

impl CoreLimits {
    /// The limits a dynamic config sets (the one place they are read from it).
    pub fn of(c: &choir_common::rpc::DynamicConfig) -> CoreLimits {
        CoreLimits {
            max_jobs: c.max_core_jobs as usize,
            budget: c.core_budget,
            retry_budget: c.retry_budget,
            context_tokens: c.context_tokens,
        }
    }
}

struct Job {
    cancel: Arc<Cancel>,
    /// Cancelled by the edge itself: it knows, so no report is sent back.
    quiet: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    status: Arc<Mutex<JobStatus>>,
}

#[derive(Debug, Clone)]
struct JobStatus {
    state: LaneState,
    objective: String,
    steps: u64,
    tokens: u64,
    started: Instant,
    report: Option<Value>,
}

/// The pool of core jobs of one edge lane.
pub struct CorePool {
    setup: Arc<CoreSetup>,
    limits: Mutex<CoreLimits>,
    jobs: Mutex<BTreeMap<String, Job>>,
}

impl CorePool {
    /// An empty pool.
    pub fn new(setup: CoreSetup, limits: CoreLimits) -> CorePool {
        CorePool { setup: Arc::new(setup), limits: Mutex::new(limits), jobs: Mutex::new(BTreeMap::new()) }
    }

    /// Applies new limits (running jobs keep their budgets).
    pub fn set_limits(&self, limits: CoreLimits) {
        *self.limits.lock() = limits;
    }

    /// Starts job `name` for the edge conversation `conversation`, running
    /// `skill` with `input` if one is named (the input is checked first).
    pub fn start(&self, job: JobRequest<'_>, conversation: &str) -> Result<Value, ToolError> {
        self.start_job(job, conversation, None)
    }

    /// Starts scheduled firing `offer` (choird accepted its start) as core
    /// job `offer.job` with the firing's own budget. Its outcome goes to
    /// choird (a [`FiringReport`] to link-push); the edge is not told.
    pub fn start_firing(&self, offer: &FiringOffer) -> Result<Value, ToolError> {
        let skill = offer.skill.as_deref().map(|s| (s, &offer.input));
        let job = JobRequest {
            name: &offer.job,
            objective: &offer.prompt,
            skill,
            allowed_tools: offer.allowed_tools.as_deref(),
            inherited: Vec::new(),
        };
        self.start_job(job, &format!("schedule:{}", offer.job), Some((offer.id, offer.budget)))
    }

    fn start_job(
        &self,
        job: JobRequest<'_>,
        conversation: &str,
        firing: Option<(i64, CoreBudget)>,
    ) -> Result<Value, ToolError> {
        let JobRequest { name, objective, skill, allowed_tools, inherited } = job;
        let skill =
            skill.map(|(s, input)| self.setup.skills.prepare(s, input).map(|k| (k, input.clone()))).transpose()?;
        // The task's allowlist names only tools a job could use anyway.
        if let Some(list) = allowed_tools {
            let registry = self.setup.arbiter.registry();
            let known = registry.names();
            let bad: Vec<&str> = list
                .iter()
                .filter(|t| !known.contains(t) || EDGE_ONLY_TOOLS.contains(&t.as_str()))
                .map(String::as_str)
                .collect();
            if !bad.is_empty() {
                return Err(ToolError::new(
                    "invalid_allowed_tools",
                    format!("a job cannot be given {}: unknown, or not for core jobs", bad.join(", ")),
                ));
            }
        }
        let mut limits = *self.limits.lock();
        if let Some((_, budget)) = firing {
            limits.budget = budget;
        }
        let mut jobs = self.jobs.lock();
        let running: Vec<String> = jobs
            .iter()
            .filter(|(_, j)| j.handle.as_ref().is_some_and(|h| !h.is_finished()))
            .map(|(n, _)| n.clone())
            .collect();
        if running.iter().any(|n| n == name) {
            return Err(ToolError::new("job_exists", format!("a core job named {name} is already running")));
        }
        if running.len() >= limits.max_jobs {
            return Err(ToolError::new(
                "too_many_jobs",
                format!(
                    "at most {} core jobs may run at once and {} are running ({}); wait for one to finish or cancel one",
                    limits.max_jobs,
                    running.len(),
                    running.join(", ")
                ),
            ));
        }
        if let Some(mut old) = jobs.remove(name) {
            if let Some(h) = old.handle.take() {
                let _ = h.join();
            }
        }
        let cancel = Arc::new(Cancel::new());
        let quiet = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(JobStatus {
            state: LaneState::Idle,
            objective: objective.to_owned(),
            steps: 0,
            tokens: 0,
            started: Instant::now(),
            report: None,
        }));
        let run = JobRun {
            setup: self.setup.clone(),
            limits,
            name: name.to_owned(),
            objective: objective.to_owned(),
            skill: skill.clone(),
            task: allowed_tools.map(<[String]>::to_vec),
            inherited: Arc::new(inherited),
            conversation: conversation.to_owned(),
            firing: firing.map(|(id, _)| id),
            cancel: cancel.clone(),
            quiet: quiet.clone(),
            status: status.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("core-{name}"))
            .spawn(move || {
                // Background work: below the edge (and the link threads) for
                // the CPU; the tools it runs inherit it.
                choir_common::nice::lower_this_thread();
                run.run()
            })
            .map_err(|e| ToolError::new("start_failed", format!("cannot start a thread for the job: {e}")))?;
        jobs.insert(name.to_owned(), Job { cancel, quiet, handle: Some(handle), status });
        let with = skill.map(|(s, _)| format!(" running skill {}", s.spec.name)).unwrap_or_default();
        Ok(json!({
            "summary": format!("core job {name} started{with}; its report will come back when it finishes"),
            "job": name,
            "budget": {"steps": limits.budget.steps, "tokens": limits.budget.tokens, "wall_s": limits.budget.wall_s},
        }))
    }

    /// The status of one job, or of all.
    pub fn status(&self, name: Option<&str>) -> Result<Value, ToolError> {
        let jobs = self.jobs.lock();
        let one = |n: &str, j: &Job| {
            let s = j.status.lock().clone();
            json!({"job": n, "state": s.state.as_str(), "objective": s.objective, "steps": s.steps, "tokens": s.tokens,
                   "elapsed_s": s.started.elapsed().as_secs(), "report": s.report})
        };
        match name {
            Some(n) => {
                let j = jobs
                    .get(n)
                    .ok_or_else(|| ToolError::new("not_found", format!("there is no core job named {n}")))?;
                let v = one(n, j);
                Ok(json!({"summary": format!("job {n} is {}", v["state"].as_str().unwrap_or("?")), "jobs": [v]}))
            }
            None => {
                let all: Vec<Value> = jobs.iter().map(|(n, j)| one(n, j)).collect();
                Ok(json!({"summary": format!("{} core job(s)", all.len()), "jobs": all}))
            }
        }
    }

    /// Cancels a job for the edge (which knows, so no report comes back): it
    /// stops at its next step or tool boundary.
    pub fn cancel(&self, name: &str) -> Result<Value, ToolError> {
        self.cancel_job(name, true)
    }

    /// Cancels a job for someone else (the operator, a user): its report
    /// still reaches the edge, which tells the user.
    pub fn cancel_reported(&self, name: &str) -> Result<Value, ToolError> {
        self.cancel_job(name, false)
    }

    /// Cancels every job, reporting each.
    pub fn cancel_all(&self) {
        for j in self.jobs.lock().values() {
            j.cancel.set();
        }
    }

    fn cancel_job(&self, name: &str, quiet: bool) -> Result<Value, ToolError> {
        let jobs = self.jobs.lock();
        let j =
            jobs.get(name).ok_or_else(|| ToolError::new("not_found", format!("there is no core job named {name}")))?;
        if quiet {
            j.quiet.store(true, Ordering::SeqCst);
        }
        j.cancel.set();
        Ok(json!({"summary": format!("core job {name} is cancelled; it stops at its next step"), "job": name}))
    }

    /// Cancels every job and joins every thread.
    pub fn shutdown(&self) {
        let mut jobs = std::mem::take(&mut *self.jobs.lock());
        let mut running = 0;
        for j in jobs.values() {
            running += usize::from(j.handle.as_ref().is_some_and(|h| !h.is_finished()));
            j.quiet.store(true, Ordering::SeqCst);
            j.cancel.set();
        }
        for (name, j) in jobs.iter_mut() {
            if let Some(h) = j.handle.take() {
                if h.join().is_err() {
                    log::error!("core job {name} panicked");
                }
            }
        }
        if !jobs.is_empty() {
            log::info!("core pool: {running} running job(s) cancelled; all {} joined", jobs.len());
        }
    }
}

impl Drop for CorePool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One job's run, on its own thread.
struct JobRun {
    setup: Arc<CoreSetup>,
    limits: CoreLimits,
    name: String,
    objective: String,
    skill: Option<(Arc<Skill>, Value)>,
    /// The task's allowlist (`allowed_tools` of `choir.core.start`).
    task: Option<Vec<String>>,
    /// The edge's history when it started the job (provenance evidence).
    inherited: Arc<Vec<Entry>>,
    conversation: String,
    /// The scheduled firing this job runs, if any: its outcome goes to choird.
    firing: Option<i64>,
    cancel: Arc<Cancel>,
    quiet: Arc<AtomicBool>,
    status: Arc<Mutex<JobStatus>>,
}

/// Core lanes compact their own history only (the hook records the wish).
struct CoreHooks {
    compact: AtomicBool,
}

impl LaneHooks for CoreHooks {
    fn core_start(&self, _: JobRequest<'_>) -> Result<Value, ToolError> {
        Err(ToolError::new("not_available", "core jobs cannot start core jobs"))
    }
    fn skill_run(&self, _: &str, _: &Value) -> Result<Value, ToolError> {
        Err(ToolError::new("not_available", "core jobs run a skill only when started with one"))
    }
    fn core_status(&self, _: Option<&str>) -> Result<Value, ToolError> {
        Err(ToolError::new("not_available", "core jobs cannot see other core jobs"))
    }
    fn core_cancel(&self, _: &str) -> Result<Value, ToolError> {
        Err(ToolError::new("not_available", "core jobs cannot cancel core jobs"))
    }
    fn compact(&self) -> Result<Value, ToolError> {
        self.compact.store(true, Ordering::SeqCst);
        Ok(json!({"summary": "your working memory will be compacted before the next step"}))
    }
}

impl JobRun {
    fn run(self) {
        let s = &self.setup;
        let lane_name = format!("core:{}", self.name);
        let budget = self.limits.budget;
        s.board.add_lane(&lane_name, Some(budget.steps), Some(budget.tokens), Some(self.objective.clone()));
        let mut machine = LaneMachine::new(&lane_name, Lane::Core, s.board.clone());
        let registry = s.arbiter.registry();
        let allowlist: Vec<String> = registry
            .names()
            .into_iter()
            .filter(|n| !EDGE_ONLY_TOOLS.contains(&n.as_str()))
            .filter(|n| self.task.as_ref().is_none_or(|t| t.contains(n)))
            .collect();
        let system = crate::lanes::prompt::core(&s.identity, registry, &allowlist, &self.name, &self.objective);
        let hooks = Arc::new(CoreHooks { compact: AtomicBool::new(false) });
        let mut lane = LaneCtx::new(&lane_name, Lane::Core);
        lane.allowlist = Some(allowlist);
        lane.task_allowlist = self.task.clone();
        lane.inherited = Some(self.inherited.clone());
        lane.hooks = Some(hooks.clone());
        lane.cancel = Some(self.cancel.clone());
        lane.conversation = Some(self.conversation.clone());
        lane.waits_for_approval = true;
        let mind = Mind {
            arbiter: s.arbiter.clone(),
            llm: s.llm.clone(),
            llm_lane: "core",
            model: s.model.clone(),
            stream: false,
            job: Some(self.name.clone()),
            floor: s.floor.clone(),
            fallback: Default::default(),
        };
        let mut conv = Conversation::default();
        // The job's task, in the user's place: written by the edge's model
        // (its `choir.core.start` call), not by the user; a scheduled
        // firing's by a person (choirctl, or the approval of its exact text).
        let author = if self.firing.is_some() { Origin::Operator } else { Origin::Model };
        conv.push(Entry::new(ChatMessage::text(Role::User, &self.objective), author));
        let started = Instant::now();
        let mut run = match &self.skill {
            Some((skill, input)) => match SkillRun::start(skill.clone(), input.clone(), &mind, &lane) {
                Ok(r) => Some(r),
                Err(e) => {
                    log::error!("core job {}: cannot commit the skill's start: {e}", self.name);
                    None
                }
            },
            None => None,
        };
        let (mut steps, mut tokens, mut corrections) = (0u64, 0u64, 0u32);
        // Every call's outcome, as it happens: the workflow summary is built from these.
        let mut actions: Vec<Action> = Vec::new();
        let (end, outcome): (LaneState, Result<String, String>) = loop {
            if self.cancel.is_set() {
                break (LaneState::Cancelled, Err("cancelled".into()));
            }
            if steps >= budget.steps {
                break (LaneState::Failed, Err(format!("step budget of {} spent", budget.steps)));
            }
            if tokens >= budget.tokens {
                break (LaneState::Failed, Err(format!("token budget of {} spent", budget.tokens)));
            }
            if started.elapsed().as_secs() >= budget.wall_s {
                break (LaneState::Failed, Err(format!("wall-time budget of {} s spent", budget.wall_s)));
            }
            let force = hooks.compact.swap(false, Ordering::SeqCst);
            let ctx = self.limits.context_tokens;
            if let Err(e) = mind.maybe_compact(&lane, &lane_name, &system, &mut conv, Role::Assistant, ctx, force) {
                break (LaneState::Failed, Err(format!("commit log failure: {e}")));
            }
            steps += 1;
            let mut calls = Vec::new();
            let step = match run.as_mut() {
                Some(r) => {
                    let step = r.step(&mind, &lane, &mut machine, &system, &mut conv.entries, &mut tokens, &mut calls);
                    s.board.skill(&lane_name, Some(r.progress()));
                    step.map(|st| match st {
                        SkillStep::Continue => Step::Continue(Vec::new()),
                        SkillStep::AwaitApproval(ids) if r.skill().spec.wait_for_approval => Step::Continue(ids),
                        SkillStep::AwaitApproval(_) => Step::Continue(Vec::new()),
                        SkillStep::Finished(output) => Step::Answer(canonical_json(&output)),
                        SkillStep::Failed(why) => Step::Failed(format!("skill failed: {why}")),
                        SkillStep::ModelDown(e) => Step::ModelDown(e),
                    })
                }
                None => {
                    mind.step(&lane, &mut machine, &system, &mut conv.entries, &mut tokens, &mut |_| {}, &mut calls)
                }
            };
            actions.extend(calls.iter().map(Action::of));
            {
                let mut st = self.status.lock();
                st.steps = steps;
                st.tokens = tokens;
                st.state = machine.state();
            }
            s.board.usage(&lane_name, steps, tokens);
            match step {
                Ok(Step::Answer(report)) => break (LaneState::Done, Ok(report)),
                Ok(Step::Continue(pending)) => {
                    corrections = 0;
                    if let Err(why) = self.await_decisions(&pending, &mut machine, &mut conv) {
                        break (LaneState::Cancelled, Err(why));
                    }
                }
                // A skill counts its own rejections (and takes its error path).
                Ok(Step::Corrected(why)) => {
                    corrections += 1;
                    if corrections > self.limits.retry_budget {
                        break (LaneState::Failed, Err(format!("too many invalid proposals in a row ({why})")));
                    }
                }
                Ok(Step::ModelDown(LlmError::Cancelled)) => break (LaneState::Cancelled, Err("cancelled".into())),
                Ok(Step::ModelDown(e)) => break (LaneState::Failed, Err(e.to_string())),
                Ok(Step::Failed(why)) => break (LaneState::Failed, Err(why)),
                Err(e) => break (LaneState::Failed, Err(format!("commit log failure: {e}"))),
            }
        };
        let mut skill_report = None;
        if let Some(r) = &run {
            let outcome = match (&end, &outcome) {
                (LaneState::Done, Ok(report)) => {
                    SkillOutcome::Finished(serde_json::from_str(report).unwrap_or(Value::Null))
                }
                (LaneState::Cancelled, _) => SkillOutcome::Cancelled,
                (_, Err(why)) => SkillOutcome::Failed(why.clone()),
                (_, Ok(_)) => SkillOutcome::Failed("ended".into()),
            };
            if let Err(e) = r.end(&mind, &lane, &outcome) {
                log::error!("core job {}: cannot commit the skill's end: {e}", self.name);
            }
            let mut v = outcome.to_json();
            v["name"] = json!(r.skill().spec.name);
            v["state"] = json!(r.state_name());
            skill_report = Some(v);
            s.board.skill(&lane_name, None);
        }
        if machine.state() == LaneState::WaitingApproval && end == LaneState::Done {
            let _ = machine.go(LaneState::Reasoning);
        }
        let _ = machine.go(end);
        let (mut report, origin) = self.summary(end, &outcome, &actions, steps, tokens, started);
        if let Some(v) = skill_report {
            report["skill"] = v;
        }
        {
            let mut st = self.status.lock();
            st.state = end;
            st.report = Some(report.clone());
        }
        log::info!("core job {} ended {}", self.name, end.as_str());
        if let Some(id) = self.firing {
            let (state, detail) = match (&end, &outcome) {
                (LaneState::Done, Ok(text)) => ("done", text.chars().take(MAX_FIRING_REPORT).collect()),
                (_, Err(why)) => ("failed", why.chars().take(MAX_FIRING_REPORT).collect()),
                (_, Ok(_)) => ("failed", end.as_str().to_owned()),
            };
            let _ = s.firings.send(FiringReport { id, state: state.to_owned(), detail });
        } else if !self.quiet.load(Ordering::SeqCst) {
            let _ = s.edge.send(EdgeEvent::CoreDone {
                job: self.name.clone(),
                conversation: self.conversation.clone(),
                report,
                origin,
            });
        }
        s.board.remove_lane(&lane_name);
    }

    /// Waits in WAITING_APPROVAL for the human decisions on `pending`
    /// proposals and appends each to the history; fails if cancelled first.
    fn await_decisions(
        &self,
        pending: &[i64],
        machine: &mut LaneMachine,
        conv: &mut Conversation,
    ) -> Result<(), String> {
        for id in pending {
            let _ = machine.go(LaneState::WaitingApproval);
            log::info!("core job {}: waiting for the decision on proposal {id}", self.name);
            let Some(d) = self.setup.approvals.wait(*id, Some(&self.cancel)) else {
                return Err(format!("cancelled while proposal {id} waited for a decision"));
            };
            let why = d.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            conv.push(Entry::operator(format!(
                "Proposal {id} ({}) was {} by {}{why}.",
                d.subject, d.status, d.decided_by
            )));
            let _ = machine.go(LaneState::Reasoning);
        }
        Ok(())
    }

    /// The workflow summary: status, actions, artifacts and the final report —
    /// built from what came of the job's calls, never from the model's
    /// intermediate text — and its origin. An action whose output was
    /// untrusted is marked so, and so is the whole summary then (its report
    /// was written after reading it): `"output_trust": "untrusted"`.
    fn summary(
        &self,
        end: LaneState,
        outcome: &Result<String, String>,
        actions: &[Action],
        steps: u64,
        tokens: u64,
        started: Instant,
    ) -> (Value, Origin) {
        let mut artifacts: Vec<String> = Vec::new();
        for a in actions.iter().filter(|a| a.status == Status::Success && a.tool != "choir.fs.read") {
            for p in &a.paths {
                if !artifacts.contains(p) {
                    artifacts.push(p.clone());
                }
            }
        }
        let listed: Vec<Value> = actions.iter().map(Action::to_json).collect();
        let origin = Origin::Summary {
            untrusted_tools: actions
                .iter()
                .filter(|a| a.trust == OutputTrust::Untrusted)
                .map(|a| a.tool.clone())
                .collect(),
        };
        let cap = |s: &str| s.chars().take(2000).collect::<String>();
        let mut v = json!({
            "job": self.name,
            "status": match end { LaneState::Done => "done", LaneState::Cancelled => "cancelled", _ => "failed" },
            "objective": self.objective,
            "steps": steps,
            "tokens": tokens,
            "elapsed_s": started.elapsed().as_secs(),
            "actions": listed,
            "artifacts": artifacts,
        });
        match outcome {
            Ok(report) => v["report"] = json!(cap(report)),
            Err(reason) => v["reason"] = json!(reason),
        }
        if origin.trust() == OutputTrust::Untrusted {
            v[TRUST_KEY] = json!(OutputTrust::Untrusted.as_str());
        }
        (v, origin)
    }
}

/// One action of a job, for its workflow summary: what came of one call.
#[derive(Debug, Clone)]
struct Action {
    tool: String,
    status: Status,
    summary: String,
    trust: OutputTrust,
    /// Files it names as its product (`path`, `log_path`, an artifact).
    paths: Vec<String>,
}

impl Action {
    fn of(inv: &Invocation) -> Action {
        let named = ["path", "log_path"].iter().filter_map(|k| inv.payload.get(*k).and_then(Value::as_str));
        let artifact = inv.artifact.as_ref().and_then(|a| a.path.as_deref());
        Action {
            tool: inv.tool.clone(),
            status: inv.status,
            summary: inv.summary.clone(),
            trust: inv.trust,
            paths: named.chain(artifact).map(str::to_owned).collect(),
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({"tool": self.tool, "status": self.status.as_str(), "summary": self.summary});
        if self.trust == OutputTrust::Untrusted {
            v[TRUST_KEY] = json!(OutputTrust::Untrusted.as_str());
        }
        v
    }
}
