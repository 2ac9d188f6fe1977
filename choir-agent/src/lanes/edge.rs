//! The edge lane (R-LANE-1): one thread, the user's conversations (one per
//! conversation key, at most [`HELD_CONVERSATIONS`] held in memory: see
//! [`crate::lanes::held`]), fast model, streamed answers. It answers directly or
//! starts core jobs, and relays their results to the user in one voice.
//!
//! The lane reads one closed enum of events ([`EdgeEvent`]) from its inbox.
//! Between model steps it looks at the inbox again: a new message of the same
//! conversation is *appended* to the history and seen at the next step (and the
//! turn's answer answers it too); anything else waits its turn.
//! **Invariant (3):** injection only appends; nothing before it changes, and
//! no budget is reset by it.
//! **Invariant (1):** the lane owns its core pool; when the lane ends (stop,
//! lost lease, panic) the pool is dropped, which cancels and joins every job.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use choir_common::commit::{canonical_json, CommitEvent, Outcome};
use choir_common::ids::wire_tool_name;
use choir_common::openai::{ChatMessage, FunctionCall, Role, ToolCall};
use choir_common::rpc::{ConversationTail, DynamicConfig, InboundMessage, OutboundReply, PartialReply, MAX_COVERS};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};

use crate::arbiter::lane_ctx::LaneCtx;
use crate::board::{LaneMachine, LaneState, StatusBoard};
use crate::cancel::Cancel;
use crate::commitlog::LogError;
use crate::lanes::conversation::Conversation;
use crate::lanes::core::{CoreLimits, CorePool};
use crate::lanes::held::{Held, Recall, HELD_CONVERSATIONS, HELD_TOKENS};
use crate::lanes::inbox::EdgeEvent;
use crate::lanes::llm::LlmError;
use crate::lanes::prompt::Identity;
use crate::lanes::reasoning::{Mind, Step};
use crate::lanes::skill_run::{SkillOutcome, SkillRun, SkillStep};
use crate::lanes::skills::{Skill, SkillBook};
use crate::origin::{Entry, Origin};
use crate::tools::tool::{JobRequest, LaneHooks, ToolError};
use crate::tools::Registry;
use choir_common::lane::Lane;

use crate::lanes::outbound::Outbound;

/// Least time between two partial answers sent for one message.
const PARTIAL_EVERY: std::time::Duration = std::time::Duration::from_millis(150);

/// The line that ends an answer a fallback model gave (the lane's first
/// was down, rate limited or overloaded).
pub fn fallback_note(model: &str) -> String {
    let model: String = model.chars().filter(|c| !c.is_control()).take(100).collect();
    format!("(Answered by the fallback model {model}: the usual one was unavailable.)")
}

/// How a turn begins.
enum Start {
    /// A user message.
    User(InboundMessage),
    /// A note for the model (a core job's report to relay, a decision to tell).
    Note(Entry),
}

/// The edge lane.
pub struct EdgeLane {
    /// Takes model steps.
    pub mind: Mind,
    /// The agent's identity (for the system prompt).
    pub identity: Identity,
    /// Hot-reloadable limits.
    pub config: Arc<RwLock<DynamicConfig>>,
    /// Where answers go.
    pub out: Sender<Outbound>,
    /// Committed calls of turns interrupted before their answer: message id → events.
    pub resume: HashMap<u64, Vec<CommitEvent>>,
    /// Intents of calls a crash interrupted before their outcome was
    /// committed, completed (from choird's record) before the first turn.
    pub interrupted: Vec<CommitEvent>,
    /// Conversations recovered from the snapshot.
    pub recovered: Vec<ConversationTail>,
    /// Lane states and budgets.
    pub board: Arc<StatusBoard>,
    /// The lane's core jobs (owned: dropped with the lane).
    pub pool: Arc<CorePool>,
    /// The agent's skills.
    pub skills: Arc<SkillBook>,
    /// Set (by the link) when the operator or user asks the edge to stop its
    /// current turn or skill; cleared when a turn begins.
    pub cancel: Arc<Cancel>,
    /// Tools `choir.tools.find` found, per conversation (offered with
    /// `tool_exposure: find`); dropped with the conversation's history.
    pub discovered: Arc<Mutex<HashMap<String, std::collections::BTreeSet<String>>>>,
    /// Where the tail of a conversation no longer held comes from (choird).
    pub recall: Arc<dyn Recall>,
}

/// What lane tools act on during one edge turn.
struct EdgeHooks {
    pool: Arc<CorePool>,
    skills: Arc<SkillBook>,
    conversation: String,
    compact: AtomicBool,
    /// A skill `choir.skill.run` asked for, run after the current step.
    skill: Mutex<Option<(Arc<Skill>, Value)>>,
    discovered: Arc<Mutex<HashMap<String, std::collections::BTreeSet<String>>>>,
}

impl LaneHooks for EdgeHooks {
    fn core_start(&self, job: JobRequest<'_>) -> Result<Value, ToolError> {
        self.pool.start(job, &self.conversation)
    }
    fn skill_run(&self, name: &str, input: &Value) -> Result<Value, ToolError> {
        let skill = self.skills.prepare(name, input)?;
        let mut slot = self.skill.lock();
        if let Some((other, _)) = slot.as_ref() {
            return Err(ToolError::new(
                "skill_active",
                format!("skill {} is already about to run in this lane; one skill at a time", other.spec.name),
            ));
        }
        *slot = Some((skill, input.clone()));
        Ok(json!({"summary": format!("skill {name} starts now; its outcome follows when it ends")}))
    }
    fn core_status(&self, name: Option<&str>) -> Result<Value, ToolError> {
        self.pool.status(name)
    }
    fn core_cancel(&self, name: &str) -> Result<Value, ToolError> {
        self.pool.cancel(name)
    }
    fn compact(&self) -> Result<Value, ToolError> {
        self.compact.store(true, Ordering::SeqCst);
        Ok(json!({"summary": "the conversation will be compacted before the next step"}))
    }
    fn discovered(&self, names: &[String]) {
        self.discovered.lock().entry(self.conversation.clone()).or_default().extend(names.iter().cloned());
    }
}

struct State {
    /// The conversations held in memory (at most [`HELD_CONVERSATIONS`]).
    held: Held,
    deferred: VecDeque<EdgeEvent>,
    stopping: bool,
    tokens: u64,
}

impl EdgeLane {
    /// Runs until [`EdgeEvent::Stop`] or the inbox closes. Fails only if the
    /// commit log cannot be written. The core pool is shut down on the way out.
    pub fn run(mut self, inbox: Receiver<EdgeEvent>) -> Result<(), LogError> {
        let mut machine = LaneMachine::new("edge", choir_common::lane::Lane::Edge, self.board.clone());
        let mut st = State {
            held: Held::new(HELD_CONVERSATIONS, HELD_TOKENS),
            deferred: VecDeque::new(),
            stopping: false,
            tokens: 0,
        };
        // Completed before any turn, so an interrupted turn is replayed with
        // the outcome, and nothing runs twice.
        for ev in self.mind.arbiter.complete_intents(&std::mem::take(&mut self.interrupted))? {
            if let Some(events) = ev.turn.and_then(|t| self.resume.get_mut(&t)) {
                events.push(ev);
            }
        }
        // Least recently answered first, so the most recent are held last.
        for tail in std::mem::take(&mut self.recovered) {
            st.held.insert(&tail.conversation, crate::lanes::held::from_tail(&tail));
        }
        let result = loop {
            let event = match st.deferred.pop_front() {
                Some(e) => e,
                None => match inbox.recv() {
                    Ok(e) => e,
                    Err(_) => break Ok(()),
                },
            };
            let outcome = match event {
                EdgeEvent::Stop => break Ok(()),
                EdgeEvent::Message(m) => {
                    log::debug!("edge: message {} for {}", m.id, m.conversation);
                    let conv = m.conversation.clone();
                    self.turn(&mut st, &mut machine, &inbox, &conv, Start::User(m))
                }
                EdgeEvent::Decision(d) => {
                    let why = d.reason.as_deref().map(|r| format!(" (reason: {r})")).unwrap_or_default();
                    let note = format!(
                        "A human decided on your proposal {} ({}): {} by {}{why}. Tell the user briefly.",
                        d.approval_id, d.subject, d.status, d.decided_by
                    );
                    let conversation = d.conversation.clone().unwrap_or_else(|| "cli".to_owned());
                    self.turn(&mut st, &mut machine, &inbox, &conversation, Start::Note(Entry::operator(note)))
                }
                EdgeEvent::CoreDone { job, conversation, report, origin } => {
                    let note = format!(
                        "Core job '{job}' finished. Its workflow summary follows; tell the user the outcome in your own \
                         words, as the one agent they talk to: {}",
                        canonical_json(&report)
                    );
                    self.turn(&mut st, &mut machine, &inbox, &conversation, Start::Note(Entry::note(note, origin)))
                }
            };
            if let Err(e) = outcome {
                break Err(e);
            }
            if st.stopping {
                break Ok(());
            }
        };
        // Lifetimes: no core job outlives its edge.
        self.pool.shutdown();
        let _ = machine.go(LaneState::Reasoning).and_then(|()| machine.go(LaneState::Cancelled));
        result
    }

    fn limits(&self) -> CoreLimits {
        CoreLimits::of(&self.config.read())
    }

    /// One turn: model steps until an answer, with injection between steps.
    fn turn(
        &mut self,
        st: &mut State,
        machine: &mut LaneMachine,
        inbox: &Receiver<EdgeEvent>,
        conv_name: &str,
        start: Start,
    ) -> Result<(), LogError> {
        // Core jobs hold back while this turn is worked on (not while its
        // model thinks: `Mind::ask` steps aside).
        let floor = self.mind.floor.clone();
        let _hold = floor.hold();
        self.pool.set_limits(self.limits());
        let (max_steps, retry_budget, context_tokens) = {
            let c = self.config.read();
            (c.max_steps_per_turn, c.retry_budget, c.context_tokens)
        };
        self.board.set_max_steps("edge", u64::from(max_steps));
        let mut covers: Vec<u64> = Vec::new();
        let mut turn_id = None;
        {
            // Notes come for conversations that spoke before.
            let earlier = match &start {
                Start::User(m) => m.earlier,
                Start::Note(_) => true,
            };
            let dropped = st.held.open(conv_name, earlier, self.recall.as_ref());
            if !dropped.is_empty() {
                let mut found = self.discovered.lock();
                for name in &dropped {
                    found.remove(name);
                }
            }
            let conv = st.held.get(conv_name);
            match start {
                Start::User(m) => {
                    conv.push_user(m.id, &m.text);
                    covers.push(m.id);
                    turn_id = Some(m.id);
                    if let Some(done) = self.resume.remove(&m.id) {
                        log::info!("resuming message {} with {} committed event(s) from the log", m.id, done.len());
                        replay_committed(conv, &done, self.mind.arbiter.registry());
                    }
                }
                Start::Note(note) => conv.push(note),
            }
        }
        let hooks = Arc::new(EdgeHooks {
            pool: self.pool.clone(),
            skills: self.skills.clone(),
            conversation: conv_name.to_owned(),
            compact: AtomicBool::new(false),
            skill: Mutex::new(None),
            discovered: self.discovered.clone(),
        });
        // A cancel asked for while the lane was idle has nothing to stop.
        self.cancel.clear();
        self.mind.fallback.lock().take();
        let mut lane = LaneCtx::new("edge", Lane::Edge);
        lane.turn = turn_id;
        lane.hooks = Some(hooks.clone());
        lane.cancel = Some(self.cancel.clone());
        lane.conversation = Some(conv_name.to_owned());
        let finding = self.config.read().tool_exposure == "find";
        // Choir's own tools, listed only when the others are found on demand.
        let own: Vec<String> = if finding {
            choir_common::manifest::BUILTIN_TOOLS
                .iter()
                .chain(choir_common::host_tools::HOST_TOOLS)
                .map(|s| (*s).to_owned())
                .collect()
        } else {
            Vec::new()
        };
        let system = crate::lanes::prompt::edge(
            &self.identity,
            self.mind.arbiter.registry(),
            &self.skills,
            finding.then_some(own.as_slice()),
        );
        let mut corrections = 0u32;
        let mut text: Option<String> = None;
        for step in 1..=u64::from(max_steps) {
            if step > 1 {
                inject(st, inbox, conv_name, &mut covers);
            }
            if self.cancel.is_set() {
                let _ = machine.go(LaneState::Cancelled);
                text = Some("Stopped, as asked.".to_owned());
                break;
            }
            if finding {
                // Choir's own tools, then whatever choir.tools.find has found here.
                let mut offer = own.clone();
                offer.extend(self.discovered.lock().get(conv_name).into_iter().flatten().cloned());
                lane.offer = Some(offer);
            }
            let conv = st.held.get(conv_name);
            let force = hooks.compact.swap(false, Ordering::SeqCst);
            self.mind.maybe_compact(&lane, conv_name, &system, conv, Role::User, context_tokens, force)?;
            // Stream what the model writes to whoever waits for this message.
            let mut so_far = String::new();
            // The first partial only once the model has streamed for
            // PARTIAL_EVERY: an answer done sooner goes out whole, without a
            // HEARTBEAT of its own ahead of it (a round trip and a database
            // write on every quick turn).
            let mut last_sent = std::time::Instant::now();
            let (out, first) = (&self.out, covers.first().copied());
            let mut on_text = |delta: &str| {
                so_far.push_str(delta);
                let due = last_sent.elapsed() >= PARTIAL_EVERY;
                if let (Some(id), true) = (first, due) {
                    last_sent = std::time::Instant::now();
                    let _ = out.send(Outbound::Partial(PartialReply { in_reply_to: id, text: so_far.clone() }));
                }
            };
            // What came of the calls lives on in the history; the edge keeps no other record.
            let mut calls = Vec::new();
            let outcome =
                self.mind.step(&lane, machine, &system, &mut conv.entries, &mut st.tokens, &mut on_text, &mut calls)?;
            self.board.usage("edge", step, st.tokens);
            match outcome {
                Step::Answer(t) => {
                    text = Some(t);
                    break;
                }
                Step::Continue(_) => {
                    corrections = 0;
                    let pending = hooks.skill.lock().take();
                    if let Some((skill, input)) = pending {
                        let name = skill.spec.name.clone();
                        let outcome =
                            self.run_skill(st, machine, inbox, conv_name, &mut covers, &lane, &system, skill, input)?;
                        let note = format!(
                            "The skill {name} ended: {}. Tell the user the outcome in your own words.",
                            canonical_json(&outcome.to_json())
                        );
                        st.held.get(conv_name).push(Entry::operator(note));
                        if outcome == SkillOutcome::Cancelled {
                            text = Some(format!("Stopped: the skill {name} was cancelled."));
                            break;
                        }
                    }
                }
                Step::Corrected(why) => {
                    corrections += 1;
                    if corrections > retry_budget {
                        let _ = machine.go(LaneState::Failed);
                        text = Some(format!(
                            "Sorry, I could not complete this: my model kept making invalid proposals ({why})."
                        ));
                        break;
                    }
                }
                Step::ModelDown(e) => {
                    log::error!("edge: {e}");
                    let cancelled = matches!(e, LlmError::Cancelled) || self.cancel.is_set();
                    let _ = machine.go(if cancelled { LaneState::Cancelled } else { LaneState::Failed });
                    text = Some(if cancelled { "Stopped, as asked.".to_owned() } else { e.user_words() });
                    break;
                }
                Step::Failed(why) => {
                    let _ = machine.go(LaneState::Failed);
                    text = Some(format!("Sorry, I could not complete this: {why}."));
                    break;
                }
            }
        }
        let text = text.unwrap_or_else(|| {
            let _ = machine.go(LaneState::Failed);
            format!("I stopped after {max_steps} model steps without finishing; please narrow the request.")
        });
        let failed = machine.state() == LaneState::Failed;
        // Said when a model other than the lane's first answered this turn.
        let text = match self.mind.fallback.lock().take() {
            Some(model) => format!("{text}\n\n{}", fallback_note(&model)),
            None => text,
        };
        let reply = match covers.last() {
            Some(last) => OutboundReply {
                in_reply_to: *last,
                covers: covers.clone(),
                conversation: conv_name.to_owned(),
                text,
                key: String::new(),
                failed,
            },
            None => OutboundReply {
                in_reply_to: 0,
                covers: Vec::new(),
                conversation: conv_name.to_owned(),
                text,
                key: notice_key(),
                failed,
            },
        };
        log::debug!("edge: answer ready for {conv_name}");
        choir_common::hop::mark("agent.reply");
        // The reply first, then the state change (which pokes link-push to
        // report it): the reply is on link-reply's queue before anything
        // else of this turn is sent.
        if self.out.send(Outbound::Reply(reply)).is_err() {
            st.stopping = true;
        }
        let _ = machine.go(LaneState::Idle);
        Ok(())
    }

    /// Runs a skill inside the current turn, step by step, with injection and
    /// cancellation between steps. The edge never blocks on a human: a
    /// proposal's decision comes back later as an event.
    #[allow(clippy::too_many_arguments)]
    fn run_skill(
        &mut self,
        st: &mut State,
        machine: &mut LaneMachine,
        inbox: &Receiver<EdgeEvent>,
        conv_name: &str,
        covers: &mut Vec<u64>,
        lane: &LaneCtx,
        system: &str,
        skill: Arc<Skill>,
        input: Value,
    ) -> Result<SkillOutcome, LogError> {
        let context_tokens = self.config.read().context_tokens;
        let mut run = SkillRun::start(skill, input, &self.mind, lane)?;
        self.board.skill("edge", Some(run.progress()));
        let outcome = loop {
            inject(st, inbox, conv_name, covers);
            if st.stopping || self.cancel.is_set() {
                break SkillOutcome::Cancelled;
            }
            let conv = st.held.get(conv_name);
            self.mind.maybe_compact(lane, conv_name, system, conv, Role::User, context_tokens, false)?;
            let mut calls = Vec::new();
            let step = run.step(&self.mind, lane, machine, system, &mut conv.entries, &mut st.tokens, &mut calls)?;
            self.board.skill("edge", Some(run.progress()));
            match step {
                SkillStep::Continue | SkillStep::AwaitApproval(_) => {}
                SkillStep::Finished(output) => break SkillOutcome::Finished(output),
                SkillStep::Failed(why) => break SkillOutcome::Failed(why),
                SkillStep::ModelDown(LlmError::Cancelled) => break SkillOutcome::Cancelled,
                SkillStep::ModelDown(e) => break SkillOutcome::Failed(format!("no answer from the model: {e}")),
            }
        };
        run.end(&self.mind, lane, &outcome)?;
        self.board.skill("edge", None);
        Ok(outcome)
    }
}

/// Takes what arrived during the turn: messages of this conversation join
/// it (appended) while the turn's answer covers fewer than [`MAX_COVERS`]
/// messages (choird refuses a reply covering more); everything else waits,
/// in arrival order, for a turn of its own; a stop is noted.
fn inject(st: &mut State, inbox: &Receiver<EdgeEvent>, conv_name: &str, covers: &mut Vec<u64>) {
    while let Ok(ev) = inbox.try_recv() {
        match ev {
            EdgeEvent::Message(m) if m.conversation == conv_name && covers.len() < MAX_COVERS => {
                log::info!("message {} injected into the running turn", m.id);
                st.held.get(conv_name).push_user(m.id, &m.text);
                covers.push(m.id);
            }
            EdgeEvent::Stop => st.stopping = true,
            other => st.deferred.push_back(other),
        }
    }
}

/// A key for a message of the agent's own.
fn notice_key() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    format!("notice-{}", hex::encode(b))
}

/// Re-creates, from committed events, the assistant tool calls and their results
/// of an interrupted turn, so the model continues from there and nothing that
/// was committed runs twice. Each result is shown as it was committed, with
/// its trust: marked untrusted as it was, or because its tool (as registered
/// now) declares untrusted output and it ran.
fn replay_committed(conv: &mut Conversation, events: &[CommitEvent], registry: &Registry) {
    for ev in events.iter().filter(|e| e.kind == choir_common::commit::EventKind::ToolCall) {
        let id = ev.call_id.clone().unwrap_or_else(|| format!("replayed_{}", ev.seq));
        let name = ev.tool.strip_prefix('?').map(str::to_owned).unwrap_or_else(|| wire_tool_name(&ev.tool));
        let arguments = match &ev.input {
            Value::String(raw) => raw.clone(),
            other => canonical_json(other),
        };
        conv.push(Entry::model(ChatMessage {
            role: Role::Assistant,
            content: None,
            tool_calls: vec![ToolCall {
                id: id.clone(),
                kind: "function".into(),
                function: FunctionCall { name, arguments },
                extra_content: None,
            }],
            tool_call_id: None,
            refusal: None,
        }));
        let declared = registry.get(&ev.tool).map(|t| t.manifest.runtime.output_trust);
        let (content, trust) = crate::arbiter::results::replayed(&ev.result, declared, ev.outcome != Outcome::Rejected);
        let tool = ev.tool.strip_prefix('?').unwrap_or(&ev.tool).to_owned();
        conv.push(Entry::tool_result(&id, content, Origin::Tool { tool, trust }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: u64, conversation: &str) -> EdgeEvent {
        EdgeEvent::Message(InboundMessage {
            id,
            conversation: conversation.into(),
            sender: "user".into(),
            text: format!("message {id}"),
            earlier: true,
        })
    }

    /// A flood of messages into a running turn (a hostile chat, or a busy
    /// one): the turn's answer covers at most MAX_COVERS of them, so choird
    /// accepts it; the others, and other conversations' messages, wait in
    /// the order they came, and a stop among them is noted.
    #[test]
    fn a_running_turn_takes_in_at_most_max_covers_messages_and_the_rest_wait_in_order() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let max = MAX_COVERS as u64;
        for id in 2..=max + 10 {
            tx.send(message(id, "chat")).unwrap();
            if id == 5 {
                tx.send(message(1_000, "other")).unwrap();
                tx.send(EdgeEvent::Stop).unwrap();
            }
        }
        let mut st = State { held: Held::new(4, HELD_TOKENS), deferred: VecDeque::new(), stopping: false, tokens: 0 };
        let mut covers = vec![1]; // the message that began the turn
        inject(&mut st, &rx, "chat", &mut covers);

        assert_eq!(covers, (1..=max).collect::<Vec<_>>(), "the first MAX_COVERS messages, in order");
        assert_eq!(st.held.get("chat").user_ids.len(), MAX_COVERS - 1, "each injected one joined the turn");
        assert!(st.stopping);
        let waiting: Vec<(u64, String)> = st
            .deferred
            .iter()
            .map(|e| match e {
                EdgeEvent::Message(m) => (m.id, m.conversation.clone()),
                _ => panic!("only messages wait"),
            })
            .collect();
        let mut expected = vec![(1_000, "other".to_owned())];
        expected.extend((max + 1..=max + 10).map(|id| (id, "chat".to_owned())));
        assert_eq!(waiting, expected);

        // Once the turn covers MAX_COVERS, a later message of its own
        // conversation waits too.
        tx.send(message(max + 11, "chat")).unwrap();
        inject(&mut st, &rx, "chat", &mut covers);
        assert_eq!(covers.len(), MAX_COVERS);
        assert!(matches!(st.deferred.back(), Some(EdgeEvent::Message(m)) if m.id == max + 11));
    }
}
