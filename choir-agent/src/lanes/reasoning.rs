//! One model step, shared by the edge lane and core jobs: build the request
//! (system prompt + history + the LLM views of the tools this lane may use),
//! call the model through the relay, and act on what it proposed —
//!
//! * tool calls: all go through the arbiter, in parallel when there are
//!   several (the lock manager serialises what conflicts); results are
//!   appended in the order the model gave;
//! * a text answer: returned, unless it *looks* like a tool call written as
//!   text, which is refused with a correction (never parsed, never executed);
//! * nothing at all: refused with a correction.
//!
//! A step whose proposal was refused (an unknown tool, arguments that do not
//! validate, text posing as a tool call, an empty answer) is a *correction*;
//! lanes count corrections in a row against their retry budget.

use std::sync::Arc;

use choir_common::commit::{EventKind, Outcome};
use choir_common::compaction::{CompactionInput, CompactionResult};
use choir_common::openai::{ChatMessage, ChatRequest, ChatResponse, Role, ToolCall, ToolSpec};
use serde_json::{json, Value};

use crate::arbiter::invocation::{Invocation, Status};
use crate::arbiter::lane_ctx::LaneCtx;
use crate::arbiter::results;
use crate::arbiter::{Arbiter, ProposedCall};
use crate::board::{LaneMachine, LaneState};
use crate::commitlog::LogError;
use crate::lanes::conversation::{self, Conversation};
use crate::lanes::floor::Floor;
use crate::lanes::llm::{Llm, LlmError};
use crate::origin::Entry;

/// What a lane needs to take steps.
pub struct Mind {
    /// The arbiter.
    pub arbiter: Arc<Arbiter>,
    /// The model client.
    pub llm: Arc<Llm>,
    /// `edge` or `core`: which relay lane (and model) to use.
    pub llm_lane: &'static str,
    /// Model name sent (the relay enforces the configured one).
    pub model: String,
    /// Stream the model's answer (the edge lane does, so a reply can start early).
    pub stream: bool,
    /// The core job this mind works for (named to the relay for the ledger).
    pub job: Option<String>,
    /// Who has the floor: the edge steps aside while its model thinks; a
    /// core job's model calls and rounds of tool calls are steps, taken one
    /// at a time while the edge works (see `floor.rs`).
    pub floor: Arc<Floor>,
    /// The fallback model that answered a call of this mind's since it was
    /// last taken (choird tried it because the lane's first was down,
    /// rate limited or overloaded); the edge tells its user.
    pub fallback: parking_lot::Mutex<Option<String>>,
}

/// Appended to an answer the model ended at its output length limit
/// (`finish_reason: length`), so the user knows it is not whole.
pub const CUT_OFF_MARK: &str = "(My answer was cut off: the model reached its length limit.)";

/// What one step led to.
#[derive(Debug)]
pub enum Step {
    /// The model answered in text.
    Answer(String),
    /// Tool calls ran and were all acceptable; the model should look at the
    /// results. Carries the ids of proposals now waiting for a human.
    Continue(Vec<i64>),
    /// The proposal was refused; a correction was appended to the history.
    Corrected(String),
    /// No answer came from the model (after retries where they made sense):
    /// why, with words for the user ([`LlmError::user_words`]).
    ModelDown(LlmError),
    /// A skill run by a core job ended in failure: why.
    Failed(String),
}

/// Markers of tool calls written as text instead of through `tool_calls`.
const POSING_MARKERS: &[&str] = &[
    "<tool_call>",
    "<function_call>",
    "<|tool_call|>",
    "[TOOL_CALLS]",
    "\"tool_calls\"",
    "\"function_call\"",
    "<|python_tag|>",
];

/// Whether a text answer looks like a tool call the model tried to write out.
pub fn poses_as_tool_call(text: &str, tool_names: &[String]) -> bool {
    if POSING_MARKERS.iter().any(|m| text.contains(m)) {
        return true;
    }
    let trimmed = text.trim().trim_start_matches("```json").trim_start_matches("```").trim_end_matches("```").trim();
    if let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(trimmed) {
        let named = obj.contains_key("name") || obj.contains_key("function") || obj.contains_key("tool");
        let args = obj.contains_key("arguments") || obj.contains_key("parameters") || obj.contains_key("function");
        if named && args {
            return true;
        }
    }
    tool_names.iter().any(|name| {
        let wire = choir_common::ids::wire_tool_name(name);
        [name.as_str(), wire.as_str()]
            .iter()
            .any(|n| trimmed.starts_with(&format!("{n}(")) || trimmed.starts_with(&format!("{n} {{")))
    })
}

impl Mind {
    /// Asks the model: the system prompt, the history, and `tools`. Streams
    /// when the lane does and `on_text` is given.
    pub fn ask(
        &self,
        system: &str,
        history: &[Entry],
        tools: Vec<ToolSpec>,
        on_text: Option<&mut dyn FnMut(&str)>,
        cancel: Option<&crate::cancel::Cancel>,
    ) -> Result<ChatResponse, crate::lanes::llm::LlmError> {
        let mut messages = vec![ChatMessage::text(Role::System, system)];
        messages.extend(conversation::messages(history));
        // Made streamed here when it will be, so the client sends it as is.
        let streamed = self.stream && on_text.is_some();
        let req = ChatRequest {
            model: self.model.clone(),
            messages,
            tool_choice: if tools.is_empty() { None } else { Some("auto".into()) },
            tools,
            stream: streamed.then_some(true),
            stream_options: streamed.then(crate::lanes::llm::stream_options),
        };
        // The edge gives the floor up while its model thinks; a core job's
        // call is one step (one at a time while the edge works).
        let (_aside, _step) =
            if self.job.is_none() { (self.floor.step_aside(), None) } else { (None, Some(self.floor.core_step())) };
        let answer = match on_text {
            Some(on_text) if self.stream => self.llm.stream(self.llm_lane, self.job.as_deref(), &req, on_text, cancel),
            _ => self.llm.complete(self.llm_lane, self.job.as_deref(), &req, cancel),
        };
        if let Some(model) = answer.as_ref().ok().and_then(|a| a.fallback.clone()) {
            *self.fallback.lock() = Some(model);
        }
        answer
    }

    /// Commits that a fallback model answered `resp`, if one did.
    pub fn note_fallback(&self, lane: &LaneCtx, resp: &ChatResponse) -> Result<(), LogError> {
        if let Some(model) = &resp.fallback {
            self.arbiter.record(
                lane,
                EventKind::ModelFallback,
                "-",
                json!({"lane": self.llm_lane}),
                Outcome::Ok,
                json!({"model": model}),
            )?;
        }
        Ok(())
    }

    /// Runs tool calls through the arbiter — in parallel when there are
    /// several (the lock manager serialises what conflicts) — and returns
    /// what came of each, in the model's order.
    pub fn run_calls(
        &self,
        lane: &LaneCtx,
        calls: &[ToolCall],
        history: &[Entry],
    ) -> Result<Vec<Invocation>, LogError> {
        let _step = self.job.is_some().then(|| self.floor.core_step());
        let proposed: Vec<ProposedCall> = calls
            .iter()
            .map(|c| ProposedCall {
                id: c.id.clone(),
                name: c.function.name.clone(),
                arguments: c.function.arguments.clone(),
            })
            .collect();
        let results: Vec<Result<Invocation, LogError>> = if proposed.len() == 1 {
            vec![self.arbiter.invoke(lane, &proposed[0], history)]
        } else {
            // The calls of this turn that each need a human are asked about once.
            let together = self.arbiter.confirm_together(lane, &proposed, history);
            std::thread::scope(|s| {
                let handles: Vec<_> = proposed
                    .iter()
                    .map(|p| s.spawn(|| self.arbiter.invoke_with(lane, p, history, &together)))
                    .collect();
                handles
                    .into_iter()
                    .zip(&proposed)
                    .map(|(h, p)| {
                        h.join().unwrap_or_else(|_| {
                            let tool = choir_common::ids::canonical_tool_name(&p.name).unwrap_or(p.name.clone());
                            Ok(Invocation::new(&tool, Status::Error, "the tool call panicked"))
                        })
                    })
                    .collect()
            })
        };
        results.into_iter().collect()
    }

    /// Takes one step. `on_text` receives streamed answer text as it arrives;
    /// what came of the step's tool calls is appended to `calls`, in the
    /// model's order, as each result enters the history. Fails only when the
    /// commit log cannot be written.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        lane: &LaneCtx,
        machine: &mut LaneMachine,
        system: &str,
        history: &mut Vec<Entry>,
        tokens: &mut u64,
        on_text: &mut dyn FnMut(&str),
        calls: &mut Vec<Invocation>,
    ) -> Result<Step, LogError> {
        if machine.state() != LaneState::Reasoning {
            let _ = machine.go(LaneState::Reasoning);
        }
        let registry = self.arbiter.registry();
        let mut tools = registry.llm_tools(lane.allowlist.as_deref());
        if let Some(offer) = &lane.offer {
            tools.retain(|t| {
                choir_common::ids::canonical_tool_name(&t.function.name).is_some_and(|n| offer.contains(&n))
            });
        }
        let allowed: Vec<String> = match &lane.allowlist {
            Some(l) => l.clone(),
            None => registry.names(),
        };
        let resp = match self.ask(system, history, tools, Some(on_text), lane.cancel.as_deref()) {
            Ok(r) => r,
            Err(e) => return Ok(Step::ModelDown(e)),
        };
        self.note_fallback(lane, &resp)?;
        *tokens += resp.usage.map(|u| u.total_tokens).unwrap_or(0);
        let Some(choice) = resp.choices.into_iter().next() else {
            return self.correct(lane, history, None, "your reply had no choices at all", &allowed);
        };
        let answer = choice.message;
        // The model stopped at its output limit: a call's arguments may be
        // cut short, so none runs; a text answer is shown, marked.
        let at_limit = choice.finish_reason.as_deref() == Some("length");
        if at_limit && !answer.tool_calls.is_empty() {
            return self.correct(
                lane,
                history,
                None,
                "your reply was cut off at the output length limit, so its tool calls were not run; make a shorter \
                 reply",
                &allowed,
            );
        }
        if answer.tool_calls.is_empty() {
            let text = answer.content.clone().unwrap_or_default();
            if text.trim().is_empty() {
                return self.correct(
                    lane,
                    history,
                    None,
                    "your reply was empty: answer the user or call a tool",
                    &allowed,
                );
            }
            if poses_as_tool_call(&text, &allowed) {
                let reply = Entry::model(ChatMessage::text(Role::Assistant, text));
                return self.correct(
                    lane,
                    history,
                    Some(reply),
                    "your reply looks like a tool call written as text; it was not executed. Call tools only through \
                     the structured tool_calls field; plain text is shown to the user as your answer",
                    &allowed,
                );
            }
            history.push(Entry::model(ChatMessage::text(Role::Assistant, text.clone())));
            if at_limit {
                return Ok(Step::Answer(format!("{text}\n\n{CUT_OFF_MARK}")));
            }
            return Ok(Step::Answer(text));
        }

        let proposed = answer.tool_calls.clone();
        let _ = machine.go(LaneState::WaitingTool);
        history.push(Entry::model(ChatMessage {
            role: Role::Assistant,
            content: answer.content,
            tool_calls: proposed.clone(),
            tool_call_id: None,
            refusal: None,
        }));
        let results = self.run_calls(lane, &proposed, history)?;
        let mut refused = Vec::new();
        let mut pending = Vec::new();
        for (call, inv) in proposed.iter().zip(results) {
            if let Some(why) = inv.correction() {
                refused.push(format!("{}: {why}", call.function.name));
            }
            pending.extend(inv.pending_approval());
            history.push(Entry::tool_result(&call.id, results::content(&inv), inv.origin()));
            calls.push(inv);
        }
        if refused.is_empty() {
            Ok(Step::Continue(pending))
        } else {
            Ok(Step::Corrected(refused.join("; ")))
        }
    }

    /// Compacts `conv` (conversation `name`) if it is over 80 % of `budget`
    /// estimated tokens, holds more than [`conversation::MAX_ENTRIES`] entries (and
    /// folding would free at least `MAX_ENTRIES / 2` of them), or `force` is set: older turns are folded into a summary made by
    /// the model, committed as a compaction event. Returns whether it folded.
    /// A failed summary call leaves the history as it was.
    #[allow(clippy::too_many_arguments)]
    pub fn maybe_compact(
        &self,
        lane: &LaneCtx,
        name: &str,
        system: &str,
        conv: &mut Conversation,
        turn_starts_at: Role,
        budget: u64,
        force: bool,
    ) -> Result<bool, LogError> {
        let size = conversation::estimate(system, &conv.entries);
        let over_tokens = size * 5 >= budget * 4;
        let over_entries = conv.entries.len() > conversation::MAX_ENTRIES;
        if !force && !over_tokens && !over_entries {
            return Ok(false);
        }
        let Some(cut) = conversation::fold_point(conv, turn_starts_at) else { return Ok(false) };
        // Many entries but few to fold (one long turn): a summary call would
        // free almost nothing, and be asked for again at every step.
        if !force && !over_tokens && cut < conversation::MAX_ENTRIES / 2 {
            return Ok(false);
        }
        let req = conversation::summary_request(&self.model, &conv.entries[..cut]);
        let summary = match self.llm.complete(self.llm_lane, self.job.as_deref(), &req, lane.cancel.as_deref()) {
            Ok(r) => r.choices.into_iter().next().and_then(|c| c.message.content).unwrap_or_default(),
            Err(e) => {
                log::warn!("{}: compaction skipped, the summary call failed: {e}", lane.lane);
                return Ok(false);
            }
        };
        if summary.trim().is_empty() {
            return Ok(false);
        }
        let folded = conversation::fold(conv, cut, summary.trim());
        let input = CompactionInput {
            conversation: name.to_owned(),
            folded_messages: cut as u64,
            upto_message: folded.upto,
            estimated_tokens_before: size,
        };
        let result = CompactionResult {
            summary: folded.summary,
            estimated_tokens_after: conversation::estimate(system, &conv.entries),
            untrusted_tools: folded.untrusted_tools.into_iter().collect(),
        };
        self.arbiter.record(
            lane,
            EventKind::Compaction,
            choir_common::compaction::TOOL,
            serde_json::to_value(&input).unwrap_or(Value::Null),
            Outcome::Ok,
            serde_json::to_value(&result).unwrap_or(Value::Null),
        )?;
        log::info!("{}: compacted {cut} messages of {name} (about {size} tokens before)", lane.lane);
        Ok(true)
    }

    /// Appends (and commits) a correction for a refused proposal.
    pub fn correct(
        &self,
        lane: &LaneCtx,
        history: &mut Vec<Entry>,
        said: Option<Entry>,
        reason: &str,
        allowed: &[String],
    ) -> Result<Step, LogError> {
        let text = format!("Correction: {reason}. Tools you may call: {}.", allowed.join(", "));
        self.arbiter.record(
            lane,
            EventKind::Correction,
            "-",
            json!({"said": said.as_ref().and_then(|m| m.message.content.clone())}),
            Outcome::Rejected,
            json!({"correction": text}),
        )?;
        if let Some(m) = said {
            history.push(m);
        }
        history.push(Entry::operator(text));
        Ok(Step::Corrected(reason.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_posing_as_a_tool_call_is_recognised() {
        let tools = vec!["choir.fs.write".to_owned()];
        for posing in [
            r#"{"name": "choir.fs.write", "arguments": {"path": "a"}}"#,
            "```json\n{\"function\": {\"name\": \"x\"}}\n```",
            "<tool_call>{\"name\": \"choir__fs__write\"}</tool_call>",
            r#"choir.fs.write({"path": "a"})"#,
            r#"choir__fs__write {"path": "a"}"#,
            r#"Sure! {"tool_calls": [{"id": "1"}]}"#,
        ] {
            assert!(poses_as_tool_call(posing, &tools), "{posing}");
        }
        for honest in ["I wrote the file.", r#"The config is {"name": "demo"}."#, "Use choir.fs.write to change files."]
        {
            assert!(!poses_as_tool_call(honest, &tools), "{honest}");
        }
    }
}
