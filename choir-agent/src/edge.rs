//! The edge lane (R-LANE-1): one thread holding the user's conversations. For
//! each inbound message it runs model steps through the relay, sends every
//! proposed tool call through the arbiter, and answers once the model stops
//! calling tools (or the step budget runs out).
//!
//! The lane reads one closed enum of events ([`EdgeEvent`]) from its inbox.
//! **Invariant:** history only grows — tool results and new messages are
//! appended, never rewritten (invariant 3).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use choir_common::commit::{canonical_json, CommitEvent};
use choir_common::ids::wire_tool_name;
use choir_common::openai::{ChatMessage, ChatRequest, FunctionCall, Role, ToolCall};
use choir_common::rpc::{ConversationTail, InboundMessage, LaneStatus, OutboundReply};
use crossbeam_channel::{Receiver, Sender};

use crate::arbiter::{Arbiter, LaneCtx, ProposedCall};
use crate::commitlog::LogError;
use crate::llm::Llm;
use crate::results::LaneKind;

/// What reaches the edge lane.
#[derive(Debug)]
pub enum EdgeEvent {
    /// A user message.
    Message(InboundMessage),
    /// Finish the current message, then stop.
    Stop,
}

/// What the edge lane hands to the link for choird.
#[derive(Debug)]
pub enum Outbound {
    /// An answer; every message up to and including its id is processed.
    Reply(OutboundReply),
    /// The lane's state changed.
    Status(LaneStatus),
}

/// Lane states reported to choird.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneState {
    /// Waiting for a message.
    Idle,
    /// Waiting for the model.
    Reasoning,
    /// Running tool calls.
    WaitingTool,
}

impl LaneState {
    fn as_str(self) -> &'static str {
        match self {
            LaneState::Idle => "IDLE",
            LaneState::Reasoning => "REASONING",
            LaneState::WaitingTool => "WAITING_TOOL",
        }
    }
}

/// The edge lane's fixed setup.
pub struct EdgeLane {
    /// The arbiter.
    pub arbiter: Arc<Arbiter>,
    /// The model client.
    pub llm: Llm,
    /// Model name for requests (the relay enforces the configured one anyway).
    pub model: String,
    /// System prompt.
    pub system_prompt: String,
    /// Step budget per message (hot-reloadable through the dynamic config).
    pub max_steps: Arc<AtomicU32>,
    /// Where answers and status go.
    pub out: Sender<Outbound>,
    /// Tool calls already committed for turns that were interrupted (by a
    /// crash or a stop) before their answer: message id → events, in order.
    pub resume: HashMap<u64, Vec<CommitEvent>>,
    /// The latest exchanges of each conversation from the recovery snapshot.
    pub recovered: Vec<ConversationTail>,
}

impl EdgeLane {
    /// Runs until [`EdgeEvent::Stop`] or the inbox closes. Fails only if the
    /// commit log cannot be written.
    pub fn run(mut self, inbox: Receiver<EdgeEvent>) -> Result<(), LogError> {
        let mut conversations: HashMap<String, Vec<ChatMessage>> = HashMap::new();
        for tail in std::mem::take(&mut self.recovered) {
            let history = conversations.entry(tail.conversation).or_default();
            for ex in tail.turns {
                history.push(ChatMessage::text(Role::User, ex.user));
                history.push(ChatMessage::text(Role::Assistant, ex.assistant));
            }
        }
        let mut tokens = 0u64;
        for event in inbox {
            match event {
                EdgeEvent::Stop => break,
                EdgeEvent::Message(msg) => {
                    let history = conversations.entry(msg.conversation.clone()).or_default();
                    let text = self.turn(history, &msg, &mut tokens)?;
                    self.status(LaneState::Idle, 0, tokens);
                    let reply = OutboundReply { in_reply_to: msg.id, conversation: msg.conversation.clone(), text };
                    if self.out.send(Outbound::Reply(reply)).is_err() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn status(&self, state: LaneState, steps: u64, tokens: u64) {
        let _ = self.out.send(Outbound::Status(LaneStatus {
            lane: "edge".into(),
            state: state.as_str().into(),
            steps,
            tokens,
        }));
    }

    /// One user message: model steps until a text answer.
    fn turn(
        &mut self,
        history: &mut Vec<ChatMessage>,
        msg: &InboundMessage,
        tokens: &mut u64,
    ) -> Result<String, LogError> {
        history.push(ChatMessage::text(Role::User, msg.text.clone()));
        if let Some(done) = self.resume.remove(&msg.id) {
            log::info!("resuming message {} with {} committed tool call(s) from the log", msg.id, done.len());
            replay_committed(history, &done);
        }
        let lane = LaneCtx { lane: "edge".into(), kind: LaneKind::Edge, allowlist: None, turn: Some(msg.id) };
        let tools = self.arbiter.registry().llm_tools(None);
        let max_steps = self.max_steps.load(Ordering::SeqCst);
        for step in 1..=u64::from(max_steps) {
            self.status(LaneState::Reasoning, step, *tokens);
            let mut messages = vec![ChatMessage::text(Role::System, self.system_prompt.clone())];
            messages.extend(history.iter().cloned());
            let req = ChatRequest {
                model: self.model.clone(),
                messages,
                tools: tools.clone(),
                tool_choice: if tools.is_empty() { None } else { Some("auto".into()) },
            };
            let resp = match self.llm.complete("edge", &req) {
                Ok(r) => r,
                Err(e) => {
                    log::error!("edge: {e}");
                    return Ok(format!("Sorry, I could not reach my model: {e}"));
                }
            };
            *tokens += resp.usage.map(|u| u.total_tokens).unwrap_or(0);
            let Some(choice) = resp.choices.into_iter().next() else {
                return Ok("Sorry, my model returned no answer.".into());
            };
            let answer = choice.message;
            let calls = answer.tool_calls.clone();
            history.push(ChatMessage {
                role: Role::Assistant,
                content: answer.content.clone(),
                tool_calls: calls.clone(),
                tool_call_id: None,
            });
            if calls.is_empty() {
                let text = answer.content.unwrap_or_default();
                return Ok(if text.trim().is_empty() { "(my model returned an empty answer)".into() } else { text });
            }
            self.status(LaneState::WaitingTool, step, *tokens);
            for call in calls {
                let proposed =
                    ProposedCall { id: call.id.clone(), name: call.function.name, arguments: call.function.arguments };
                let result = self.arbiter.invoke(&lane, &proposed)?;
                history.push(ChatMessage::tool_result(&call.id, result.to_string()));
            }
        }
        Ok(format!("I stopped after {max_steps} model steps without finishing; please narrow the request."))
    }
}

/// Re-creates, from committed events, the assistant tool calls and their results
/// of an interrupted turn, so the model continues from there and nothing that
/// was committed runs twice.
fn replay_committed(history: &mut Vec<ChatMessage>, events: &[CommitEvent]) {
    for ev in events {
        let id = ev.call_id.clone().unwrap_or_else(|| format!("replayed_{}", ev.seq));
        let name = ev.tool.strip_prefix('?').map(str::to_owned).unwrap_or_else(|| wire_tool_name(&ev.tool));
        let arguments = match &ev.input {
            serde_json::Value::String(raw) => raw.clone(),
            other => canonical_json(other),
        };
        history.push(ChatMessage {
            role: Role::Assistant,
            content: None,
            tool_calls: vec![ToolCall {
                id: id.clone(),
                kind: "function".into(),
                function: FunctionCall { name, arguments },
            }],
            tool_call_id: None,
        });
        history.push(ChatMessage::tool_result(&id, ev.result.to_string()));
    }
}
