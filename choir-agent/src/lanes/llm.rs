//! The LLM client: OpenAI-compatible chat completions through choird's relay
//! (`/llm/<lane>/v1/chat/completions`), plain or streamed (server-sent
//! events), with retries on rate limits, server errors, transport failures and
//! streams cut short (exponential backoff with jitter, honouring
//! `Retry-After`). The API key is added by choird; the agent never has it.
//!
//! **Invariant:** a streamed answer is used only once it is complete (a
//! `finish_reason` or `[DONE]` arrived); a stream cut in the middle is an error
//! and is retried whole, so no partial tool call is ever executed. Tool calls
//! come only from the structured `tool_calls` field, never from text.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use choir_common::openai::{ChatMessage, ChatRequest, ChatResponse, Choice, FunctionCall, Role, ToolCall, Usage};
use serde_json::{json, Value};

use crate::rpc::{refusal, RawAnswer, Rpc, RpcError};

/// Attempts per model call.
const ATTEMPTS: u32 = 4;
/// Longest single wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time allowed for one model call.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes after a streamed answer's end read to reach the end of its body;
/// a longer tail is left unread and its connection dropped.
const STREAM_TAIL: u64 = 64 * 1024;

/// How a [`LlmError::Cut`] begins, for the edge's words to the user.
pub const CUT_PREFIX: &str = "the model's answer was cut off";

/// A model call failed for good.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The relay or the provider refused, after retries where retrying made sense.
    #[error("the model call failed: {0}")]
    Rpc(#[from] RpcError),
    /// The provider's answer is not a chat completion.
    #[error("the model's answer is not a valid chat completion: {0}")]
    Malformed(String),
    /// Every attempt's stream ended before the model finished its answer
    /// (nothing of it was used).
    #[error("the model's answer was cut off before it finished, {attempts} time(s): {why}")]
    // (The edge tells the user so: see [`CUT_PREFIX`].)
    Cut {
        /// How many attempts were cut.
        attempts: u32,
        /// The last cut, as seen.
        why: String,
    },
}

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

/// The client.
pub struct Llm {
    rpc: Arc<Rpc>,
}

impl Llm {
    /// A client over the agent's RPC connection.
    pub fn new(rpc: Arc<Rpc>) -> Llm {
        Llm { rpc }
    }

    /// One completion for `lane` (`edge` or `core`), for core job `job`.
    pub fn complete(&self, lane: &str, job: Option<&str>, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        if lane == "edge" {
            choir_common::hop::mark("agent.request");
        }
        let path = path(lane, job);
        let body = serde_json::to_vec(req).map_err(|e| LlmError::Malformed(e.to_string()))?;
        let answer = retrying(|| match self.rpc.post_raw(&path, &body, CALL_TIMEOUT) {
            Ok(answer) if answer.status == 200 => {
                serde_json::from_slice(&answer.body).map_err(|e| Attempt::Fatal(LlmError::Malformed(e.to_string())))
            }
            Ok(answer) => Err(Attempt::Failed(refusal("LLM", &answer))),
            Err(e) => Err(Attempt::Failed(e)),
        });
        if lane == "edge" {
            choir_common::hop::mark("agent.answer");
        }
        answer
    }

    /// One streamed completion: `on_text` gets each content delta as it
    /// arrives (so an answer can be shown before the model is done); the
    /// assembled response is returned once the stream completed.
    pub fn stream(
        &self,
        lane: &str,
        job: Option<&str>,
        req: &ChatRequest,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<ChatResponse, LlmError> {
        if lane == "edge" {
            choir_common::hop::mark("agent.request");
        }
        let path = path(lane, job);
        let body = if req.stream == Some(true) && req.stream_options == Some(stream_options()) {
            serde_json::to_vec(req)
        } else {
            let mut req = req.clone();
            req.stream = Some(true);
            req.stream_options = Some(stream_options());
            serde_json::to_vec(&req)
        }
        .map_err(|e| LlmError::Malformed(e.to_string()))?;
        let answer = retrying(|| {
            let (status, retry_after_s, mut reader) =
                self.rpc.post_reader(&path, &body, CALL_TIMEOUT).map_err(Attempt::Failed)?;
            if status != 200 {
                let mut text = Vec::new();
                let _ = std::io::Read::read_to_end(&mut reader, &mut text);
                return Err(Attempt::Failed(refusal("LLM", &RawAnswer { status, retry_after_s, body: text })));
            }
            let answer = read_sse(reader.as_mut(), on_text)?;
            // The stream's end (its last chunk) is read too, so the connection
            // returns to the pool for the next call instead of being closed
            // (choird would start a new connection thread for each call).
            // Bounded: choird passes nothing after `[DONE]`.
            let _ = std::io::copy(&mut std::io::Read::take(reader.as_mut(), STREAM_TAIL), &mut std::io::sink());
            Ok(answer)
        });
        if lane == "edge" {
            choir_common::hop::mark("agent.answer");
        }
        answer
    }
}

enum Attempt {
    /// May succeed if tried again.
    Failed(RpcError),
    /// The answer's stream began and was cut before the model finished: at
    /// a chunk's boundary, inside a chunk, or by a broken connection, all
    /// alike. Retried as a failure is; reported as the model's.
    Cut(String),
    /// Will not.
    Fatal(LlmError),
}

fn retrying<T>(mut f: impl FnMut() -> Result<T, Attempt>) -> Result<T, LlmError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        // What failed, and how long the provider asked us to wait.
        let (failed, retry_after_s) = match f() {
            Ok(v) => return Ok(v),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Failed(e)) if !e.retryable() || attempt >= ATTEMPTS => return Err(e.into()),
            Err(Attempt::Cut(why)) if attempt >= ATTEMPTS => return Err(LlmError::Cut { attempts: attempt, why }),
            Err(Attempt::Failed(e)) => {
                let asked = match &e {
                    RpcError::Refused { retry_after_s, .. } => *retry_after_s,
                    _ => None,
                };
                (e.to_string(), asked)
            }
            Err(Attempt::Cut(why)) => (format!("its answer was cut off: {why}"), None),
        };
        let wait = retry_after_s.map_or_else(|| backoff(attempt), Duration::from_secs).min(MAX_BACKOFF);
        log::warn!("model call attempt {attempt} failed ({failed}); retrying in {wait:?}");
        std::thread::sleep(wait);
    }
}

/// Assembles a chat completion from server-sent `chat.completion.chunk`s.
fn read_sse(reader: &mut dyn BufRead, on_text: &mut dyn FnMut(&str)) -> Result<ChatResponse, Attempt> {
    let mut content = String::new();
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut finish: Option<String> = None;
    let mut usage: Option<Usage> = None;
    let (mut id, mut model) = (String::new(), String::new());
    let mut done = false;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            // A last line without its end: the stream was cut inside a chunk.
            Ok(_) if !line.ends_with('\n') => return Err(Attempt::Cut("the stream ended inside a chunk".into())),
            Ok(_) => {}
            Err(e) => return Err(Attempt::Cut(format!("the stream broke: {e}"))),
        }
        let Some(data) = line.trim_end().strip_prefix("data:") else { continue };
        let data = data.trim_start();
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| Attempt::Fatal(LlmError::Malformed(format!("bad stream chunk: {e}"))))?;
        if id.is_empty() {
            id = chunk["id"].as_str().unwrap_or_default().to_owned();
            model = chunk["model"].as_str().unwrap_or_default().to_owned();
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = serde_json::from_value(u.clone()).ok();
        }
        let Some(choice) = chunk["choices"].get(0) else { continue };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str() {
            content.push_str(text);
            on_text(text);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0);
            let entry = calls.entry(index).or_default();
            if let Some(v) = call["id"].as_str() {
                entry.0.push_str(v);
            }
            if let Some(v) = call["function"]["name"].as_str() {
                entry.1.push_str(v);
            }
            if let Some(v) = call["function"]["arguments"].as_str() {
                entry.2.push_str(v);
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    if !done && finish.is_none() {
        // Cut before the model finished: nothing of it may be used.
        return Err(Attempt::Cut("the stream ended before the model finished".into()));
    }
    let tool_calls = calls
        .into_values()
        .map(|(id, name, arguments)| ToolCall {
            id,
            kind: "function".into(),
            function: FunctionCall { name, arguments },
        })
        .collect();
    let message = ChatMessage {
        role: Role::Assistant,
        content: if content.is_empty() { None } else { Some(content) },
        tool_calls,
        tool_call_id: None,
    };
    Ok(ChatResponse {
        id,
        object: "chat.completion".into(),
        created: 0,
        model,
        choices: vec![Choice { index: 0, message, finish_reason: finish }],
        usage,
    })
}

/// 500 ms · 2^(attempt-1), plus up to 50% jitter.
fn backoff(attempt: u32) -> Duration {
    let base = 500u64.saturating_mul(1 << (attempt - 1).min(10));
    let mut b = [0u8; 2];
    let jitter = if getrandom::fill(&mut b).is_ok() { u64::from(u16::from_le_bytes(b)) % (base / 2 + 1) } else { 0 };
    Duration::from_millis(base + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(lines: &[&str]) -> Result<ChatResponse, Attempt> {
        let text = lines.iter().map(|l| format!("data: {l}\n\n")).collect::<String>();
        read_sse(&mut std::io::Cursor::new(text), &mut |_| {})
    }

    #[test]
    fn chunks_assemble_into_content_and_tool_calls() {
        let r = sse(&[
            r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"choir__fs__read","arguments":"{\"pa"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"a\"}"}}]}}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
            "[DONE]",
        ])
        .ok()
        .unwrap();
        let m = &r.choices[0].message;
        assert_eq!(m.content.as_deref(), Some("Hello"));
        assert_eq!(m.tool_calls[0].function.arguments, r#"{"path": "a"}"#);
        assert_eq!(r.usage.unwrap().total_tokens, 5);
    }

    #[test]
    fn a_cut_stream_is_a_retryable_error_not_a_partial_answer() {
        let r = sse(&[
            r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"choir__fs__write","arguments":"{\"path\": \"a"}}]}}]}"#,
        ]);
        assert!(matches!(r, Err(Attempt::Cut(_))));
    }

    /// Regression: a stream cut inside a chunk (its last line half there)
    /// was a malformed answer, not retried; one cut at a chunk's boundary
    /// was retried but told as "cannot reach choird". Both are cuts now.
    #[test]
    fn regression_a_stream_cut_inside_a_chunk_is_a_cut_like_one_cut_between_chunks() {
        let whole = r#"data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}]}"#;
        for text in [format!("{whole}\n\n{}", &whole[..40]), format!("{whole}\n\n")] {
            let r = read_sse(&mut std::io::Cursor::new(text.clone()), &mut |_| {});
            assert!(matches!(r, Err(Attempt::Cut(_))), "{text}");
        }
        // A whole line that is not JSON is the provider's garbage, not a cut.
        let r = read_sse(&mut std::io::Cursor::new("data: {nope\n\n".to_owned()), &mut |_| {});
        assert!(matches!(r, Err(Attempt::Fatal(LlmError::Malformed(_)))));
    }

    /// Every attempt cut: the error says so (the model's failure, with the
    /// attempts), not that choird could not be reached.
    #[test]
    fn a_call_whose_every_attempt_is_cut_fails_as_cut_after_the_attempts() {
        let mut tries = 0;
        let r: Result<(), LlmError> = retrying(|| {
            tries += 1;
            Err(Attempt::Cut("the stream ended inside a chunk".into()))
        });
        assert_eq!(tries, ATTEMPTS);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("cut off before it finished") && !e.contains("choird"), "{e}");
    }

    /// A stand-in for choird's agent socket: answers every request on a
    /// connection with the same chunked event stream, keeping the connection
    /// alive, and counts the connections it accepted.
    fn streaming_socket(dir: &std::path::Path) -> (std::path::PathBuf, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufReader, Write};
        let path = dir.join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut conn = conn;
                    while crate::rpc::read_request(&mut reader).is_some() {
                        // A model takes a while: calls made at once overlap.
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        let events = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
                        let out = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\
                             Connection: keep-alive\r\n\r\n{:x}\r\n{events}\r\n0\r\n\r\n",
                            events.len()
                        );
                        if conn.write_all(out.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (path, accepted)
    }

    fn hello() -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![ChatMessage::text(Role::User, "hello")],
            tools: Vec::new(),
            tool_choice: None,
            stream: None,
            stream_options: None,
        }
    }

    #[test]
    fn streamed_calls_one_after_another_share_one_connection() {
        let dir = tempfile::tempdir().unwrap();
        let (path, accepted) = streaming_socket(dir.path());
        let llm = Llm::new(Arc::new(Rpc::new(&crate::rpc::Endpoint::Unix(path), "t".into())));
        let req = hello();
        for _ in 0..3 {
            let answer = llm.stream("core", Some("job"), &req, &mut |_| {}).unwrap();
            assert_eq!(answer.choices[0].message.content.as_deref(), Some("hi"));
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "a new connection for each streamed call");
    }

    /// Connections opened for `callers` streaming at once, three rounds,
    /// through a client that keeps `idle` of them.
    fn connections_for(callers: usize, idle: usize) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let (path, accepted) = streaming_socket(dir.path());
        let rpc = Rpc::with_idle(&crate::rpc::Endpoint::Unix(path), "t".into(), idle);
        let llm = Arc::new(Llm::new(Arc::new(rpc)));
        let barrier = Arc::new(std::sync::Barrier::new(callers));
        let jobs: Vec<_> = (0..callers)
            .map(|_| {
                let (llm, barrier) = (llm.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let req = hello();
                    for _ in 0..3 {
                        barrier.wait();
                        llm.stream("core", Some("job"), &req, &mut |_| {}).unwrap();
                        barrier.wait();
                    }
                })
            })
            .collect();
        for j in jobs {
            j.join().unwrap();
        }
        accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn concurrent_streamed_calls_keep_their_connections_between_rounds() {
        // Six core jobs asking at once, three rounds: with a client sized for
        // them, the six connections of the first round serve the next two.
        assert_eq!(connections_for(6, 6), 6);
        // Sized for fewer (ureq's default keeps three), the rest are closed
        // after each round and opened again: a choird thread each time.
        let opened = connections_for(6, 2);
        assert!(opened >= 10, "{opened} connections: a client keeping 2 should have closed 4 after each round");
    }
}
