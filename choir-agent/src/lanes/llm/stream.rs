//! Reads a streamed chat completion (server-sent events of
//! `chat.completion.chunk`s) into one answer, as the SSE specification and
//! the providers' documented deviations have it:
//!
//! * lines starting with `:` are comments (OpenRouter's `: OPENROUTER
//!   PROCESSING`, DeepSeek's `: keep-alive`); `event:`/`id:`/`retry:` lines
//!   are ignored; an event's data is its `data:` lines joined, and a `data:`
//!   line that is a whole JSON value on its own is taken at once (servers
//!   that leave out the blank line between events);
//! * `[DONE]` may be missing: a `finish_reason` ends the answer too;
//! * reasoning (`reasoning`, `reasoning_content`, Magistral's `thinking`
//!   parts) is never part of the answer's text;
//! * tool calls are keyed by `index`, else by `id`, else continue the last
//!   call: Gemini's parallel calls carry no `index` (openai/openai-python
//!   #2806) — each arrives whole with its own id; Fireworks repeats `id`,
//!   `type` and the function's name on every chunk (SillyTavern PR #5948,
//!   BerriAI/litellm #8988) and llama.cpp's server did so before its PR
//!   #13800 — so `id` and `name` are taken once and only `arguments` is
//!   appended (an `arguments` object, as Mistral may send, is taken whole);
//!   one index given to two different ids is two calls;
//! * a call's `extra_content` (Gemini's `thought_signature`,
//!   ai.google.dev/gemini-api/docs/thought-signatures) is kept to be sent back;
//! * usage comes from the last chunk that reports it (`usage`, or Groq's
//!   `x_groq.usage`).
//!
//! **Invariant:** nothing of a stream that did not finish cleanly is
//! returned: a stream cut before a `finish_reason` or `[DONE]` is
//! [`Read::Cut`]; one carrying a provider's error is judged by
//! [`super::answer::judge`] as no answer. Each line is bounded by
//! [`MAX_LINE`].

use std::collections::HashMap;
use std::io::BufRead;

use choir_common::openai::{ChatMessage, ChatResponse, Choice, FunctionCall, Role, ToolCall, Usage};
use serde_json::Value;

/// Longest line of an event stream read (a chunk carrying a whole tool
/// call's arguments fits many times over).
pub const MAX_LINE: usize = 8 * 1024 * 1024;

/// How reading a stream ended.
#[derive(Debug)]
pub enum Read {
    /// The model finished; its answer (not yet judged) and any provider
    /// error seen in the stream.
    Finished(ChatResponse, Option<String>),
    /// The stream ended before the model finished: why.
    Cut(String),
    /// A whole event that is not a chunk: the provider's garbage.
    Malformed(String),
    /// Whoever took the text stopped listening.
    Abandoned,
}

/// One tool call being put together.
#[derive(Default)]
struct Slot {
    id: String,
    name: String,
    arguments: String,
    extra: Option<Value>,
}

/// The answer so far.
#[derive(Default)]
struct Assembly {
    id: String,
    model: String,
    content: String,
    refusal: String,
    /// `reasoning_content` (DeepSeek), kept for a tool turn.
    reasoning: String,
    calls: Vec<Slot>,
    by_index: HashMap<u64, usize>,
    finish: Option<String>,
    usage: Option<Usage>,
    error: Option<String>,
}

impl Assembly {
    /// Takes one chunk; `false` when the text taker stopped listening.
    fn chunk(&mut self, chunk: &Value, on_text: &mut dyn FnMut(&str) -> bool) -> bool {
        if self.id.is_empty() {
            if let Some(id) = chunk["id"].as_str() {
                self.id = id.to_owned();
            }
        }
        if self.model.is_empty() {
            if let Some(m) = chunk["model"].as_str() {
                self.model = m.to_owned();
            }
        }
        if let Some(e) = chunk.get("error").filter(|e| !e.is_null()) {
            self.error = Some(super::answer::error_message(e));
        }
        if let Some(u) = choir_common::openai::reported_usage(chunk) {
            self.usage = Some(u);
        }
        let Some(choice) =
            chunk["choices"].as_array().and_then(|c| c.iter().find(|c| c["index"].as_u64().unwrap_or(0) == 0))
        else {
            return true;
        };
        let delta = &choice["delta"];
        let mut listening = true;
        match &delta["content"] {
            Value::String(text) if !text.is_empty() => {
                self.content.push_str(text);
                listening = on_text(text);
            }
            // Magistral streams typed parts: only `text` parts are the answer.
            Value::Array(parts) => {
                for text in parts.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()) {
                    self.content.push_str(text);
                    listening &= on_text(text);
                }
            }
            _ => {}
        }
        if let Some(r) = delta["refusal"].as_str() {
            self.refusal.push_str(r);
        }
        if let Some(r) = delta["reasoning_content"].as_str() {
            if self.reasoning.len() + r.len() <= choir_common::openai::MAX_EXTRA_CONTENT {
                self.reasoning.push_str(r);
            }
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.call(call);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_owned());
        }
        listening
    }

    /// The slot a tool call delta belongs to.
    fn slot_for(&mut self, call: &Value) -> usize {
        let id = call["id"].as_str().filter(|s| !s.is_empty());
        let fresh = |calls: &mut Vec<Slot>| {
            calls.push(Slot::default());
            calls.len() - 1
        };
        if let Some(index) = call["index"].as_u64() {
            if let Some(&at) = self.by_index.get(&index) {
                let known = &self.calls[at].id;
                if id.is_none_or(|id| known.is_empty() || known == id) {
                    return at;
                }
            }
            let at = fresh(&mut self.calls);
            self.by_index.insert(index, at);
            return at;
        }
        match id {
            Some(id) => match self.calls.iter().rposition(|s| s.id == id) {
                Some(at) => at,
                None => fresh(&mut self.calls),
            },
            None if !self.calls.is_empty() => self.calls.len() - 1,
            None => fresh(&mut self.calls),
        }
    }

    fn call(&mut self, call: &Value) {
        let at = self.slot_for(call);
        let slot = &mut self.calls[at];
        if let Some(id) = call["id"].as_str().filter(|_| slot.id.is_empty()) {
            slot.id = id.to_owned();
        }
        if let Some(name) = call["function"]["name"].as_str().filter(|_| slot.name.is_empty()) {
            slot.name = name.to_owned();
        }
        match &call["function"]["arguments"] {
            Value::String(part) => slot.arguments.push_str(part),
            whole @ Value::Object(_) => slot.arguments = whole.to_string(),
            _ => {}
        }
        if let Some(extra) = call.get("extra_content").filter(|e| e.is_object()) {
            if slot.extra.is_none() && extra.to_string().len() <= choir_common::openai::MAX_EXTRA_CONTENT {
                slot.extra = Some(extra.clone());
            }
        }
    }

    fn answer(self) -> (ChatResponse, Option<String>) {
        let mut tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|s| ToolCall {
                id: s.id,
                kind: "function".into(),
                function: FunctionCall { name: s.name, arguments: s.arguments },
                extra_content: s.extra,
            })
            .collect();
        super::answer::keep_reasoning(&mut tool_calls, &self.reasoning);
        let message = ChatMessage {
            role: Role::Assistant,
            content: (!self.content.is_empty()).then_some(self.content),
            tool_calls,
            tool_call_id: None,
            refusal: (!self.refusal.is_empty()).then_some(self.refusal),
        };
        let answer = ChatResponse {
            id: self.id,
            object: "chat.completion".into(),
            created: 0,
            model: self.model,
            choices: vec![Choice { index: 0, message, finish_reason: self.finish }],
            usage: self.usage,
            fallback: None,
        };
        (answer, self.error)
    }
}

/// One line into `line` (without its end), at most [`MAX_LINE`] bytes:
/// `Ok(true)` for a whole line, `Ok(false)` at the end of the stream, an
/// error for a broken stream, a line cut off by the end, or one too long.
fn next_line(reader: &mut dyn BufRead, line: &mut Vec<u8>) -> std::io::Result<bool> {
    line.clear();
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            if line.is_empty() {
                return Ok(false);
            }
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the stream ended inside a chunk"));
        }
        let (take, found) = match memchr::memchr(b'\n', buf) {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE + 1 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line of the stream is longer than {MAX_LINE} bytes"),
            ));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if found {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(true);
        }
    }
}

/// What one event's data did.
enum Event {
    /// Taken; read on.
    Taken,
    /// `[DONE]`.
    Done,
    /// Reading ends here.
    End(Read),
}

/// Takes one event's data: `[DONE]`, or a chunk.
fn take(data: &[u8], assembly: &mut Assembly, on_text: &mut dyn FnMut(&str) -> bool) -> Event {
    if data.trim_ascii() == b"[DONE]" {
        return Event::Done;
    }
    match serde_json::from_slice::<Value>(data) {
        Ok(chunk) if assembly.chunk(&chunk, on_text) => Event::Taken,
        Ok(_) => Event::End(Read::Abandoned),
        Err(e) => Event::End(Read::Malformed(format!("bad stream chunk: {e}"))),
    }
}

/// Reads an event stream to its end; `on_text` gets each text delta as it
/// arrives and answers whether it still listens.
pub fn read(reader: &mut dyn BufRead, on_text: &mut dyn FnMut(&str) -> bool) -> Read {
    let mut assembly = Assembly::default();
    let mut line = Vec::with_capacity(1024);
    // The data lines of an event not yet whole.
    let mut pending: Vec<u8> = Vec::new();
    let mut done = false;
    loop {
        match next_line(reader, &mut line) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Read::Malformed(e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Read::Cut(e.to_string()),
            Err(e) => return Read::Cut(format!("the stream broke: {e}")),
        }
        let event = if line.is_empty() {
            // The end of an event.
            if pending.is_empty() {
                continue;
            }
            let data = std::mem::take(&mut pending);
            take(&data, &mut assembly, on_text)
        } else {
            let Some(data) = line.strip_prefix(b"data:") else { continue };
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if pending.is_empty() {
                // A line that is a whole chunk on its own is taken at once.
                if data.trim_ascii() == b"[DONE]" {
                    Event::Done
                } else {
                    match serde_json::from_slice::<Value>(data) {
                        Ok(chunk) if assembly.chunk(&chunk, on_text) => Event::Taken,
                        Ok(_) => Event::End(Read::Abandoned),
                        Err(e) if e.is_eof() => {
                            pending.extend_from_slice(data);
                            continue;
                        }
                        Err(e) => Event::End(Read::Malformed(format!("bad stream chunk: {e}"))),
                    }
                }
            } else {
                pending.push(b'\n');
                pending.extend_from_slice(data);
                if pending.len() > MAX_LINE {
                    return Read::Malformed(format!("an event of the stream is longer than {MAX_LINE} bytes"));
                }
                continue;
            }
        };
        match event {
            Event::Taken => {}
            Event::Done => {
                done = true;
                break;
            }
            Event::End(read) => return read,
        }
    }
    if !done && !pending.is_empty() {
        match take(&std::mem::take(&mut pending), &mut assembly, on_text) {
            Event::Taken => {}
            Event::Done => done = true,
            Event::End(read) => return read,
        }
    }
    if !done && assembly.finish.is_none() && assembly.error.is_none() {
        // Cut before the model finished: nothing of it may be used. (A
        // stream that ended on a provider's error is judged as that error.)
        return Read::Cut("the stream ended before the model finished".into());
    }
    let (answer, error) = assembly.answer();
    Read::Finished(answer, error)
}
