//! Running a skill inside a lane (R-SKILL-2): the skill's state machine
//! decides what the model may propose at each step.
//!
//! Each step the model sees the lane's context and history, plus only the
//! current state's objective, the notes earlier states left, and a `tools`
//! list that is exactly the state's allowlist (as offered) plus one control:
//! `choir.skill.transition` (with the state's events) or, in a terminal state,
//! `choir.skill.finish` (with the skill's output schema). The model proposes
//! tool calls (the arbiter refuses any tool outside the allowlist), a
//! transition (must be one of the state's events), or finish (terminal states
//! only, output validated). A step with any refused part is a *rejection*: it
//! is committed, the model gets a structured error listing the allowed tools
//! and transitions, and it counts against the skill's retry budget; past it,
//! the state's `fail` transition is taken if it has one, else the run fails.
//!
//! **Invariant (5):** a run moves only along its spec's transitions; every
//! transition, rejection, start and end is a committed event; no state can
//! call a tool outside its allowlist (the arbiter enforces the list this
//! module passes it) and no skill can start a skill.
//!
//! The caller (edge lane or core job) drives the run step by step and owns
//! what happens between steps: injection, cancellation, budgets, compaction.

use std::sync::Arc;

use choir_common::commit::{EventKind, Outcome};
use choir_common::ids::wire_tool_name;
use choir_common::openai::{ChatMessage, FunctionSpec, Role, ToolSpec};
use choir_common::rpc::SkillProgress;
use choir_common::skill::{StateSpec, FINISH_TOOL, TRANSITION_TOOL};
use serde_json::{json, Value};

use crate::arbiter::invocation::{Invocation, Refusal, Refused, SkillPlace, Status};
use crate::arbiter::lane_ctx::{LaneCtx, SkillAt};
use crate::arbiter::results;
use crate::board::{LaneMachine, LaneState};
use crate::commitlog::LogError;
use crate::lanes::reasoning::Mind;
use crate::lanes::skills::{problems, Skill};
use crate::origin::Entry;

/// What one step of a run led to.
#[derive(Debug)]
pub enum SkillStep {
    /// Keep stepping.
    Continue,
    /// Proposals now wait for a human (ids); the caller waits if the skill says so.
    AwaitApproval(Vec<i64>),
    /// Finished in a terminal state with a valid output.
    Finished(Value),
    /// The run cannot go on (budget, max_steps).
    Failed(String),
    /// No answer came from the model (after retries where they made sense).
    ModelDown(crate::lanes::llm::LlmError),
}

/// How a run ended, for its end event and its report.
#[derive(Debug, Clone, PartialEq)]
pub enum SkillOutcome {
    /// Finished with this output.
    Finished(Value),
    /// Failed, with why.
    Failed(String),
    /// Cancelled by the user, the edge, or a stop.
    Cancelled,
}

impl SkillOutcome {
    /// `finished`, `failed` or `cancelled`.
    pub fn status(&self) -> &'static str {
        match self {
            SkillOutcome::Finished(_) => "finished",
            SkillOutcome::Failed(_) => "failed",
            SkillOutcome::Cancelled => "cancelled",
        }
    }

    /// The outcome as JSON (status, and output or reason).
    pub fn to_json(&self) -> Value {
        match self {
            SkillOutcome::Finished(output) => json!({"status": "finished", "output": output}),
            SkillOutcome::Failed(reason) => json!({"status": "failed", "reason": reason}),
            SkillOutcome::Cancelled => json!({"status": "cancelled"}),
        }
    }
}

/// One run of a skill.
pub struct SkillRun {
    skill: Arc<Skill>,
    input: Value,
    state: String,
    steps: u64,
    /// Rejected steps in a row.
    rejections: u32,
    /// (state, note) left by transitions, oldest first.
    notes: Vec<(String, String)>,
}

/// A value, or why a proposal is refused (reason, refusal).
type Refusable<T> = Result<T, (String, Refusal)>;

/// A control call the model made.
enum Control {
    Transition { event: String, note: Option<String> },
    Finish(Value),
}

impl SkillRun {
    /// Starts a run of `skill` with an input already checked against its
    /// input schema; commits the start.
    pub fn start(skill: Arc<Skill>, input: Value, mind: &Mind, lane: &LaneCtx) -> Result<SkillRun, LogError> {
        let run = SkillRun {
            state: skill.spec.initial_state.clone(),
            skill,
            input,
            steps: 0,
            rejections: 0,
            notes: Vec::new(),
        };
        let ctx = run.ctx(lane);
        mind.arbiter.record(
            &ctx,
            EventKind::SkillStart,
            &run.skill.spec.name,
            json!({"input": run.input}),
            Outcome::Ok,
            json!({"state": run.state, "max_steps": run.skill.spec.max_steps}),
        )?;
        log::info!("{}: skill {} started in state {}", lane.lane, run.skill.spec.name, run.state);
        Ok(run)
    }

    /// The skill.
    pub fn skill(&self) -> &Arc<Skill> {
        &self.skill
    }

    /// Whether a cancel may cut the current step short.
    pub fn interruptible(&self) -> bool {
        self.skill.spec.interruptible
    }

    /// The current state's name.
    pub fn state_name(&self) -> &str {
        &self.state
    }

    /// Progress, for REPORT_STATUS.
    pub fn progress(&self) -> SkillProgress {
        SkillProgress {
            name: self.skill.spec.name.clone(),
            state: self.state.clone(),
            steps: self.steps,
            max_steps: u64::from(self.skill.spec.max_steps),
        }
    }

    fn current(&self) -> &StateSpec {
        // `state` only ever takes values validated against `states`; the
        // fallback (a terminal state allowing nothing) is never reached.
        self.skill.spec.states.get(&self.state).unwrap_or(&NOWHERE)
    }

    fn events(&self) -> Vec<String> {
        self.current().transitions.iter().map(|t| t.on.clone()).collect()
    }

    /// The lane context for this step: the state's allowlist, the skill and
    /// state recorded in every event; cancellation reaches tool calls only
    /// when the skill is interruptible.
    fn ctx(&self, lane: &LaneCtx) -> LaneCtx {
        let mut ctx = lane.clone();
        // The state's list, within the task's allowlist when the lane has one.
        let state_list = self.current().allowed_tools.iter();
        ctx.allowlist = Some(match &lane.task_allowlist {
            Some(task) => state_list.filter(|t| task.contains(t)).cloned().collect(),
            None => state_list.cloned().collect(),
        });
        ctx.skill = Some(SkillAt { name: self.skill.spec.name.clone(), state: self.state.clone() });
        if !self.skill.spec.interruptible {
            ctx.cancel = None;
        }
        ctx.waits_for_approval = lane.waits_for_approval && self.skill.spec.wait_for_approval;
        ctx
    }

    /// The skill section of the system prompt: this state only.
    fn prompt(&self) -> String {
        let spec = &self.skill.spec;
        let state = self.current();
        let mut p = format!(
            "You are running the skill '{}': {}\nSkill input: {}\nCurrent state: {}.",
            spec.name, spec.description, self.input, self.state
        );
        if !state.objective.is_empty() {
            p.push_str(&format!(" Objective: {}", state.objective));
        }
        if !self.notes.is_empty() {
            p.push_str("\nNotes from earlier states:");
            for (s, n) in &self.notes {
                p.push_str(&format!("\n- {s}: {n}"));
            }
        }
        let tools = if state.allowed_tools.is_empty() { "none".to_owned() } else { state.allowed_tools.join(", ") };
        if state.terminal {
            p.push_str(&format!(
                "\nThis is a terminal state. Tools allowed here: {tools}. Finish with {FINISH_TOOL} and an output matching: {}",
                spec.output_schema
            ));
        } else {
            p.push_str(&format!(
                "\nEach step, do exactly one of: call tools allowed in this state ({tools}); or move on with {TRANSITION_TOOL} \
                 naming one of the events [{}] and a note of what this state produced (later states see only the notes). \
                 Plain text is not an answer here.",
                self.events().join(", ")
            ));
        }
        p
    }

    /// The control tools offered in the current state.
    fn controls(&self) -> Vec<ToolSpec> {
        let state = self.current();
        let spec = |name: &str, description: &str, parameters: Value| ToolSpec {
            kind: "function".into(),
            function: FunctionSpec {
                name: wire_tool_name(name),
                description: description.into(),
                parameters: choir_common::openai::Schema::new(&parameters),
            },
        };
        if state.terminal {
            vec![spec(
                FINISH_TOOL,
                "Finish the skill with its output.",
                json!({"type": "object", "properties": {"output": self.skill.spec.output_schema}, "required": ["output"], "additionalProperties": false}),
            )]
        } else {
            vec![spec(
                TRANSITION_TOOL,
                "Leave the current state by one of its events, with a note of what it produced.",
                json!({"type": "object", "properties": {
                    "event": {"type": "string", "enum": self.events()},
                    "note": {"type": "string", "description": "What this state produced, for the next states"}
                }, "required": ["event"], "additionalProperties": false}),
            )]
        }
    }

    /// A rejection of a proposal of `tool` in this state, with where the run
    /// stands (what the model may do instead).
    fn rejection(&self, tool: &str, reason: &str, refusal: Refusal) -> Invocation {
        let state = self.current();
        Invocation::refused(
            tool,
            format!("refused: {reason}"),
            Refused {
                refusal,
                reason: reason.to_owned(),
                allowed_tools: state.allowed_tools.clone(),
                skill: Some(SkillPlace {
                    state: self.state.clone(),
                    allowed_transitions: self.events(),
                    can_finish: Some(state.terminal),
                }),
            },
        )
    }

    /// One step; what came of its tool calls and controls is appended to
    /// `calls` in the model's order. Fails only when the commit log cannot be
    /// written.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        mind: &Mind,
        lane: &LaneCtx,
        machine: &mut LaneMachine,
        system: &str,
        history: &mut Vec<Entry>,
        tokens: &mut u64,
        calls: &mut Vec<Invocation>,
    ) -> Result<SkillStep, LogError> {
        let max = u64::from(self.skill.spec.max_steps);
        if self.steps >= max {
            return Ok(SkillStep::Failed(format!("max_steps ({max}) reached in state {}", self.state)));
        }
        self.steps += 1;
        if machine.state() != LaneState::Reasoning {
            let _ = machine.go(LaneState::Reasoning);
        }
        let ctx = self.ctx(lane);
        // Offered: the state's tools within the task's allowlist (ctx's list).
        let offered = ctx.allowlist.clone().unwrap_or_default();
        let mut tools = mind.arbiter.registry().llm_tools(Some(&offered));
        tools.extend(self.controls());
        let system = format!("{system}\n\n{}", self.prompt());
        let resp = match mind.ask(&system, history, tools, None, lane.cancel.as_deref()) {
            Ok(r) => r,
            Err(e) => return Ok(SkillStep::ModelDown(e)),
        };
        mind.note_fallback(lane, &resp)?;
        *tokens += resp.usage.map(|u| u.total_tokens).unwrap_or(0);
        let answer = resp.choices.into_iter().next().map(|c| c.message);
        let Some(answer) = answer.clone().filter(|a| !a.tool_calls.is_empty()) else {
            let said = answer.and_then(|a| a.content).filter(|t| !t.trim().is_empty());
            if let Some(text) = &said {
                history.push(Entry::model(ChatMessage::text(Role::Assistant, text.clone())));
            }
            let reason = "in a skill every step must call an allowed tool, take a transition, or finish; plain text is not an answer here";
            let result = results::render(&self.rejection("-", reason, Refusal::NoProposal));
            mind.arbiter.record(
                &ctx,
                EventKind::Correction,
                "-",
                json!({"said": said}),
                Outcome::Rejected,
                result.clone(),
            )?;
            history.push(Entry::operator(format!("Correction: {result}")));
            return self.rejected(mind, lane, history);
        };

        let _ = machine.go(LaneState::WaitingTool);
        history.push(Entry::model(ChatMessage {
            role: Role::Assistant,
            content: answer.content.clone(),
            tool_calls: answer.tool_calls.clone(),
            tool_call_id: None,
            refusal: None,
        }));
        let control_names = [wire_tool_name(TRANSITION_TOOL), wire_tool_name(FINISH_TOOL)];
        let (controls, tool_calls): (Vec<_>, Vec<_>) =
            answer.tool_calls.iter().cloned().partition(|c| control_names.contains(&c.function.name));
        let mut done: std::collections::HashMap<String, Invocation> = std::collections::HashMap::new();
        let mut refused = false;
        let mut pending = Vec::new();
        for (call, mut inv) in tool_calls.iter().zip(mind.run_calls(&ctx, &tool_calls, history)?) {
            if inv.correction().is_some() {
                refused = true;
                if let Some(r) = inv.refusal.as_mut() {
                    // Where the run stands; finishing is told only with the skill's own refusals.
                    r.skill = Some(SkillPlace {
                        state: self.state.clone(),
                        allowed_transitions: self.events(),
                        can_finish: None,
                    });
                }
            }
            pending.extend(inv.pending_approval());
            done.insert(call.id.clone(), inv);
        }
        let mut finished = None;
        for call in &controls {
            let tool = choir_common::ids::canonical_tool_name(&call.function.name).unwrap_or_default();
            let parsed = self.parse_control(&call.function.name, &call.function.arguments);
            let outcome = if controls.len() > 1 {
                Err(("propose one transition or finish per step, not several".to_owned(), Refusal::OneControl))
            } else if refused {
                Err(("not applied: other proposals of this step were refused".to_owned(), Refusal::StepRefused))
            } else {
                match parsed {
                    Ok(c) => self.apply(mind, &ctx, c)?,
                    Err(e) => Err(e),
                }
            };
            let inv = match outcome {
                Ok(Some(output)) => {
                    finished = Some(output.clone());
                    Invocation::answered(&tool, "the skill is finished", json!({"output": output}))
                }
                Ok(None) => {
                    let s = self.current();
                    Invocation::answered(
                        &tool,
                        format!("now in state {}", self.state),
                        json!({"state": self.state, "objective": s.objective, "allowed_tools": s.allowed_tools,
                               "allowed_transitions": self.events(), "can_finish": s.terminal}),
                    )
                }
                Err((reason, refusal)) => {
                    refused = true;
                    let inv = self.rejection(&tool, &reason, refusal);
                    let input = serde_json::from_str(&call.function.arguments)
                        .unwrap_or_else(|_| Value::String(call.function.arguments.clone()));
                    mind.arbiter.record(
                        &ctx,
                        EventKind::Correction,
                        &tool,
                        input,
                        Outcome::Rejected,
                        results::render(&inv),
                    )?;
                    inv
                }
            };
            done.insert(call.id.clone(), inv);
        }
        for call in &answer.tool_calls {
            let inv = done.remove(&call.id).unwrap_or_else(|| Invocation::new(&call.function.name, Status::Error, ""));
            history.push(Entry::tool_result(&call.id, results::content(&inv), inv.origin()));
            calls.push(inv);
        }
        if refused {
            return self.rejected(mind, lane, history);
        }
        self.rejections = 0;
        if let Some(output) = finished {
            return Ok(SkillStep::Finished(output));
        }
        if !pending.is_empty() {
            return Ok(SkillStep::AwaitApproval(pending));
        }
        Ok(SkillStep::Continue)
    }

    fn parse_control(&self, wire: &str, arguments: &str) -> Refusable<Control> {
        let args: Value = serde_json::from_str(arguments)
            .map_err(|e| (format!("the arguments are not valid JSON ({e})"), Refusal::InvalidArguments))?;
        if wire == wire_tool_name(FINISH_TOOL) {
            let output = args
                .get("output")
                .cloned()
                .ok_or_else(|| ("finish needs {\"output\": ...}".to_owned(), Refusal::InvalidArguments))?;
            return Ok(Control::Finish(output));
        }
        let event = args
            .get("event")
            .and_then(Value::as_str)
            .ok_or_else(|| ("a transition needs {\"event\": \"...\"}".to_owned(), Refusal::InvalidArguments))?;
        let note = args.get("note").and_then(Value::as_str).map(str::to_owned);
        Ok(Control::Transition { event: event.to_owned(), note })
    }

    /// Applies a control: a transition (`Ok(Ok(None))`) or finish
    /// (`Ok(Ok(Some(output)))`), or says why it is refused (`Ok(Err(..))`).
    /// Fails only when the commit log cannot be written.
    fn apply(&mut self, mind: &Mind, ctx: &LaneCtx, control: Control) -> Result<Refusable<Option<Value>>, LogError> {
        let state = self.current();
        Ok(match control {
            Control::Finish(output) => {
                if !state.terminal {
                    return Ok(Err((
                        format!(
                            "finish is possible only in a terminal state, and {} is not; its transitions: {}",
                            self.state,
                            self.events().join(", ")
                        ),
                        Refusal::NotTerminal,
                    )));
                }
                let bad = problems(&self.skill.output, &output);
                if !bad.is_empty() {
                    return Ok(Err((
                        format!("the output does not match the skill's output_schema: {}", bad.join("; ")),
                        Refusal::InvalidOutput,
                    )));
                }
                Ok(Some(output))
            }
            Control::Transition { event, note } => {
                let Some(t) = state.transitions.iter().find(|t| t.on == event).cloned() else {
                    let why = if state.terminal {
                        format!("{} is a terminal state: there are no transitions, only finish", self.state)
                    } else {
                        format!(
                            "{event:?} is not a transition of state {}; its transitions: {}",
                            self.state,
                            self.events().join(", ")
                        )
                    };
                    return Ok(Err((why, Refusal::InvalidTransition)));
                };
                self.transition(mind, ctx, &t.on, &t.to, note, "proposed by the model")?;
                Ok(None)
            }
        })
    }

    fn transition(
        &mut self,
        mind: &Mind,
        ctx: &LaneCtx,
        event: &str,
        to: &str,
        note: Option<String>,
        why: &str,
    ) -> Result<(), LogError> {
        let from = std::mem::replace(&mut self.state, to.to_owned());
        mind.arbiter.record(
            ctx,
            EventKind::SkillTransition,
            TRANSITION_TOOL,
            json!({"event": event, "note": note}),
            Outcome::Ok,
            json!({"from": from, "to": to, "why": why}),
        )?;
        if let Some(n) = note.filter(|n| !n.trim().is_empty()) {
            self.notes.push((from.clone(), n));
        }
        self.rejections = 0;
        log::info!("{}: skill {} {from} --{event}--> {to}", ctx.lane, self.skill.spec.name);
        Ok(())
    }

    /// Counts a rejected step; past the budget, takes the error path.
    fn rejected(&mut self, mind: &Mind, lane: &LaneCtx, history: &mut Vec<Entry>) -> Result<SkillStep, LogError> {
        self.rejections += 1;
        let budget = self.skill.spec.retry_budget();
        if self.rejections <= budget {
            return Ok(SkillStep::Continue);
        }
        let from = self.state.clone();
        let fail = self.current().transitions.iter().find(|t| t.on == "fail").cloned();
        match fail {
            Some(t) => {
                let ctx = self.ctx(lane);
                self.transition(mind, &ctx, "fail", &t.to, None, "retry budget exhausted")?;
                history.push(Entry::operator(format!(
                    "Your proposals in state {from} were refused more than {budget} times in a row; the skill took its \
                     fail transition to state {}.",
                    t.to
                )));
                Ok(SkillStep::Continue)
            }
            None => Ok(SkillStep::Failed(format!(
                "retry budget exhausted in state {from}: more than {budget} refused proposals in a row"
            ))),
        }
    }

    /// Commits the end of the run.
    pub fn end(&self, mind: &Mind, lane: &LaneCtx, outcome: &SkillOutcome) -> Result<(), LogError> {
        let ctx = self.ctx(lane);
        mind.arbiter.record(
            &ctx,
            EventKind::SkillEnd,
            &self.skill.spec.name,
            json!({"steps": self.steps}),
            if matches!(outcome, SkillOutcome::Finished(_)) { Outcome::Ok } else { Outcome::Error },
            outcome.to_json(),
        )?;
        log::info!("{}: skill {} {} in state {}", lane.lane, self.skill.spec.name, outcome.status(), self.state);
        Ok(())
    }
}

/// A terminal state that allows nothing.
static NOWHERE: StateSpec =
    StateSpec { objective: String::new(), allowed_tools: Vec::new(), transitions: Vec::new(), terminal: true };
