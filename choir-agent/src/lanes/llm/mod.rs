//! The LLM client: OpenAI-compatible chat completions through choird's relay
//! (`/llm/<lane>/v1/chat/completions`), plain or streamed (server-sent
//! events), with retries on rate limits, server errors, transport failures and
//! streams cut short ([`retry`]). The API key is added by choird; the agent
//! never has it. Streams are read by [`stream`]; what an answer is (a
//! provider's error, a refusal, a filter, or one to act on) is judged by
//! [`answer`] for both shapes.
//!
//! A call runs on a thread of its own while the lane waits for it, so a lane
//! cancelled while its model thinks stops waiting at once (the call's thread
//! stops at the stream's next byte and closes the connection, which ends the
//! relay's upstream request); a call's thread waits a while for the lane's
//! next call ([`callers`]).
//!
//! **Invariant:** a streamed answer is used only once it is complete (a
//! `finish_reason` or `[DONE]` arrived) and clean (no provider error in it);
//! a stream cut in the middle is an error and is retried whole, so no partial
//! tool call is ever executed. Tool calls come only from the structured
//! `tool_calls` field, never from text.

mod answer;
mod callers;
mod error;
mod retry;
mod stream;

pub use error::{LlmError, CUT_PREFIX, PROVIDER_CODE};

use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::openai::{ChatRequest, ChatResponse};
use serde_json::json;

use crate::cancel::Cancel;
use crate::rpc::{refusal, Patience, RawAnswer, Rpc, RpcError};

use answer::Verdict;
use retry::{retrying, Attempt};

/// How long one attempt may take: choird ends an upstream answer at its
/// configured silence and ceiling (at most 30 and 60 minutes); these only
/// guard against choird itself hanging.
const CALL_PATIENCE: Patience =
    Patience { whole: Duration::from_secs(62 * 60), silence: Some(Duration::from_secs(31 * 60)) };
/// Bytes after a streamed answer's end read to reach the end of its body;
/// a longer tail is left unread and its connection dropped.
const STREAM_TAIL: u64 = 64 * 1024;
/// Streamed text reaches the lane at most this often; what streams in
/// meanwhile waits on the call's thread. A provider sends a token or a few
/// per event, and each hand-over wakes the lane: coalesced, a 500-character
/// answer wakes it a few times instead of a hundred. The lane sends a
/// partial answer every 150 ms at most anyway (`edge::PARTIAL_EVERY`).
const TEXT_EVERY: Duration = Duration::from_millis(50);

/// The relay's path for `lane`, naming the core job (for choird's ledger)
/// when its name is safe in a query as it is.
fn path(lane: &str, job: Option<&str>) -> String {
    let safe = |j: &&str| j.len() <= 64 && j.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    match job.filter(safe) {
        Some(job) => format!("/llm/{lane}/v1/chat/completions?job={job}"),
        None => format!("/llm/{lane}/v1/chat/completions"),
    }
}

/// What a streamed request asks for: a final chunk with the usage (which
/// choird's ledger counts). A request built with these is sent as it is;
/// any other is copied and given them.
pub fn stream_options() -> serde_json::Value {
    json!({"include_usage": true})
}

/// What the call's thread sends the waiting lane.
enum Msg {
    Text(String),
    Done(Result<ChatResponse, LlmError>),
}

/// The client.
pub struct Llm {
    rpc: Arc<Rpc>,
    /// The threads its calls run on.
    callers: callers::Callers,
    /// The size of the last request body: the next one starts in a buffer
    /// an eighth larger (a request is mostly the same tools and history
    /// again, and a conversation grows), not grown and copied from empty.
    /// One client may serve several lanes (the core jobs share theirs), so
    /// a large request sizes the next one's buffer, at most
    /// [`BODY_START_MAX`] for as long as that call lasts.
    last_body: std::sync::atomic::AtomicUsize,
}

/// The largest buffer a request body starts with (a long history may be
/// larger; it grows from there).
const BODY_START_MAX: usize = 1 << 20;

impl Llm {
    /// A client over the agent's RPC connection.
    pub fn new(rpc: Arc<Rpc>) -> Llm {
        Llm { rpc, callers: callers::Callers::default(), last_body: Default::default() }
    }

    /// `req` as a request body.
    fn body(&self, req: &ChatRequest) -> Result<Vec<u8>, LlmError> {
        use std::sync::atomic::Ordering::Relaxed;
        let last = self.last_body.load(Relaxed);
        let mut body = Vec::with_capacity((last + last / 8).min(BODY_START_MAX));
        serde_json::to_writer(&mut body, req).map_err(|e| LlmError::Malformed(e.to_string()))?;
        self.last_body.store(body.len(), Relaxed);
        Ok(body)
    }

    /// One completion for `lane` (`edge` or `core`), for core job `job`;
    /// given up when `cancel` is set.
    pub fn complete(
        &self,
        lane: &str,
        job: Option<&str>,
        req: &ChatRequest,
        cancel: Option<&Cancel>,
    ) -> Result<ChatResponse, LlmError> {
        let body = self.body(req)?;
        self.call(lane, job, body, false, &mut |_| {}, cancel)
    }

    /// One streamed completion: `on_text` gets each content delta as it
    /// arrives (so an answer can be shown before the model is done); the
    /// assembled response is returned once the stream completed. Given up
    /// when `cancel` is set.
    pub fn stream(
        &self,
        lane: &str,
        job: Option<&str>,
        req: &ChatRequest,
        on_text: &mut dyn FnMut(&str),
        cancel: Option<&Cancel>,
    ) -> Result<ChatResponse, LlmError> {
        let body = if req.stream == Some(true) && req.stream_options == Some(stream_options()) {
            self.body(req)
        } else {
            let mut req = req.clone();
            req.stream = Some(true);
            req.stream_options = Some(stream_options());
            self.body(&req)
        }?;
        self.call(lane, job, body, true, on_text, cancel)
    }

    /// Runs the call on a thread of its own and waits for it, handing its
    /// text to `on_text`, until it ends or `cancel` is set.
    fn call(
        &self,
        lane: &str,
        job: Option<&str>,
        body: Vec<u8>,
        streamed: bool,
        on_text: &mut dyn FnMut(&str),
        cancel: Option<&Cancel>,
    ) -> Result<ChatResponse, LlmError> {
        let edge = lane == "edge";
        if edge {
            choir_common::hop::mark("agent.request");
        }
        let (tx, rx) = crossbeam_channel::bounded::<Msg>(256);
        let abandoned = Arc::new(Cancel::new());
        let (rpc, path, gone) = (self.rpc.clone(), path(lane, job), abandoned.clone());
        let spawned = self.callers.run(
            lane,
            Box::new(move || {
                let (mut held, mut handed) = (String::new(), Instant::now());
                let answer = {
                    let mut on_text = |t: &str| {
                        if gone.is_set() {
                            return false;
                        }
                        held.push_str(t);
                        if handed.elapsed() < TEXT_EVERY {
                            return true;
                        }
                        handed = Instant::now();
                        tx.send(Msg::Text(std::mem::take(&mut held))).is_ok()
                    };
                    retrying(&gone, || attempt(&rpc, &path, &body, streamed, &mut on_text))
                };
                if !held.is_empty() {
                    let _ = tx.send(Msg::Text(held));
                }
                let _ = tx.send(Msg::Done(answer));
            }),
        );
        if let Err(e) = spawned {
            return Err(LlmError::Rpc(RpcError::Transport(format!("cannot start the model call: {e}"))));
        }
        // Woken by the call's thread or by a cancel, never by a clock: a
        // model thinking for seconds costs this thread no wake-ups.
        let listening = cancel.map(|c| (c, c.listen()));
        let answer = loop {
            let msg = match &listening {
                Some((cancel, _)) if cancel.is_set() => {
                    abandoned.set();
                    break Err(LlmError::Cancelled);
                }
                Some((_, woken)) => crossbeam_channel::select! {
                    recv(rx) -> m => m,
                    recv(woken.woken()) -> _ => continue,
                },
                None => rx.recv(),
            };
            match msg {
                Ok(Msg::Text(t)) => on_text(&t),
                Ok(Msg::Done(answer)) => break answer,
                Err(_) => break Err(LlmError::Malformed("the model call ended without an answer".into())),
            }
        };
        if edge {
            choir_common::hop::mark("agent.answer");
        }
        answer
    }
}

/// One attempt: the request, and its answer read and judged.
fn attempt(
    rpc: &Rpc,
    path: &str,
    body: &[u8],
    streamed: bool,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<ChatResponse, Attempt> {
    if !streamed {
        let answer = rpc.post_raw(path, body, CALL_PATIENCE)?;
        if answer.status != 200 {
            return Err(refusal("LLM", &answer).into());
        }
        return whole(&answer.body).map(|mut a| {
            a.fallback = answer.fallback;
            a
        });
    }
    let (status, retry_after, fallback, mut reader) = rpc.post_reader(path, body, CALL_PATIENCE)?;
    if status != 200 {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(reader.as_mut(), 1 << 20), &mut text);
        return Err(refusal("LLM", &RawAnswer { status, retry_after, fallback, body: text }).into());
    }
    let read = stream::read(reader.as_mut(), on_text);
    if let stream::Read::Finished(..) = read {
        // The stream's end (its last chunk) is read too, so the connection
        // returns to the pool for the next call instead of being closed
        // (choird would start a new connection thread for each call).
        // Bounded: choird passes nothing after `[DONE]`.
        let _ = std::io::copy(&mut std::io::Read::take(reader.as_mut(), STREAM_TAIL), &mut std::io::sink());
    }
    settle(read).map(|mut a| {
        a.fallback = fallback;
        a
    })
}

/// A streamed answer as read, judged.
fn settle(read: stream::Read) -> Result<ChatResponse, Attempt> {
    match read {
        stream::Read::Finished(answer, error) => match answer::judge(answer, error) {
            Ok(answer) => Ok(answer),
            // A provider's error in the middle of an answer is worth another try.
            Err(v @ Verdict::ProviderError(_)) => Err(Attempt::Failed(v.into(), None)),
            Err(v) => Err(Attempt::Fatal(v.into())),
        },
        stream::Read::Cut(why) => Err(Attempt::Cut(why)),
        stream::Read::Malformed(why) => Err(Attempt::Fatal(LlmError::Malformed(why))),
        stream::Read::Abandoned => Err(Attempt::Fatal(LlmError::Cancelled)),
    }
}

/// A whole (not streamed) answer, judged: a provider's `error` object in
/// place of the answer is a failed attempt; the body is read as the
/// providers send it (see `choir_common::openai`).
fn whole(body: &[u8]) -> Result<ChatResponse, Attempt> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| Attempt::Fatal(LlmError::Malformed(e.to_string())))?;
    let error = value.get("error").filter(|e| !e.is_null()).map(answer::error_message);
    if let (Some(m), None) = (&error, value.get("choices")) {
        return Err(Attempt::Failed(Verdict::ProviderError(m.clone()).into(), None));
    }
    let usage = choir_common::openai::reported_usage(&value);
    let reasoning = value["choices"][0]["message"]["reasoning_content"].as_str().unwrap_or_default().to_owned();
    let mut answer: ChatResponse =
        serde_json::from_value(value).map_err(|e| Attempt::Fatal(LlmError::Malformed(e.to_string())))?;
    answer.usage = usage;
    if let Some(choice) = answer.choices.first_mut() {
        answer::keep_reasoning(&mut choice.message.tool_calls, &reasoning);
    }
    match answer::judge(answer, error) {
        Ok(answer) => Ok(answer),
        Err(v @ Verdict::ProviderError(_)) => Err(Attempt::Failed(v.into(), None)),
        Err(v) => Err(Attempt::Fatal(v.into())),
    }
}

/// Reads a whole event stream into a chat completion (for the stream
/// benchmark): the answer, or why the stream was not one.
pub fn read_stream(reader: &mut dyn BufRead) -> Result<ChatResponse, String> {
    match settle(stream::read(reader, &mut |_| true)) {
        Ok(answer) => Ok(answer),
        Err(Attempt::Failed(e, _) | Attempt::Fatal(e)) => Err(e.to_string()),
        Err(Attempt::Cut(why)) => Err(why),
    }
}

#[cfg(test)]
mod tests;
