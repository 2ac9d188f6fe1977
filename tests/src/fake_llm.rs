//! A scripted, protocol-exact fake of OpenAI's chat-completions endpoint
//! (`POST /v1/chat/completions`, <https://platform.openai.com/docs/api-reference/chat/create>).
//! It answers each request with the next scripted step, in the documented
//! response shape, and records every request (path, headers, JSON body) so
//! tests can assert on exactly what the agent sent. It is not a model: it never
//! looks at the conversation.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// An assistant message with text content.
    Text(String),
    /// An assistant message calling tools: (canonical or wire name, arguments
    /// JSON text exactly as the "model" produces it).
    ToolCalls(Vec<(String, String)>),
    /// Text *and* tool calls in one assistant message (models "think aloud").
    Said(String, Vec<(String, String)>),
    /// For a streamed request: text sent in 8-character chunks, `delay` apart
    /// (a model that writes slowly).
    SlowText(String, Duration),
    /// For a streamed request: a tool call whose stream is cut in the middle
    /// (no `finish_reason`, no `[DONE]`).
    CutStream,
    /// For a streamed request: a text chunk, then half of the next one,
    /// and the body ends there (a connection cut inside a chunk).
    CutInsideChunk,
    /// A text answer that ends with this `finish_reason` (`length`: the
    /// model hit its output limit).
    Ended(String, String),
    /// For Anthropic's Messages API: a thinking block (its text and
    /// signature) before tool calls, as a model with extended thinking
    /// answers a tool turn.
    Thought(String, String, Vec<(String, String)>),
    /// A raw HTTP answer (errors, rate limits, garbage).
    Raw {
        /// HTTP status.
        status: u16,
        /// Body bytes.
        body: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
}

impl Step {
    /// Convenience: a tool call with JSON arguments.
    pub fn call(name: &str, args: Value) -> Step {
        Step::ToolCalls(vec![(name.to_owned(), args.to_string())])
    }

    /// Convenience: OpenAI's 429 for a rate limit, asking for a wait of
    /// `retry_after_s` seconds (`Retry-After`).
    pub fn rate_limited(retry_after_s: u64) -> Step {
        Step::Raw {
            status: 429,
            body: serde_json::json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null,
                                               "code": "rate_limit_exceeded"}})
            .to_string(),
            headers: vec![("Retry-After".into(), retry_after_s.to_string())],
        }
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Request path.
    pub path: String,
    /// `Authorization` header, if any.
    pub authorization: Option<String>,
    /// `x-api-key` and `anthropic-version` headers (Anthropic's API), if any.
    pub anthropic: (Option<String>, Option<String>),
    /// Parsed JSON body (`Value::Null` if it did not parse).
    pub body: Value,
    /// When the request arrived.
    pub at: Instant,
    /// When its answer was ready to be written back.
    pub answered_at: Option<Instant>,
}

/// Decides the answer to a request from its body and its number (1-based);
/// `None` falls back to the script. It runs outside the fake's lock, so it
/// may take its time.
pub type Responder = Arc<dyn Fn(&Value, u64) -> Option<Step> + Send + Sync>;

struct Shared {
    /// Keep request bodies (off for load benchmarks: only times are kept).
    keep_bodies: bool,
    script: VecDeque<Step>,
    responder: Option<Responder>,
    requests: Vec<Recorded>,
    /// When the script runs out: repeat this step forever (for the demo), or
    /// answer 500.
    fallback: Option<Step>,
    counter: u64,
    /// The CPU nice value answers run at (0: the bench's own).
    nice: i32,
}

/// The running fake. Stops when dropped.
pub struct FakeLlm {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: String,
}

impl FakeLlm {
    /// Starts on an ephemeral loopback port.
    pub fn start(script: Vec<Step>) -> FakeLlm {
        FakeLlm::start_on("127.0.0.1:0", script, None).expect("start the fake LLM")
    }

    /// Starts on `addr` with an optional fallback step.
    pub fn start_on(addr: &str, script: Vec<Step>, fallback: Option<Step>) -> std::io::Result<FakeLlm> {
        let server = Arc::new(crate::loopback::server_on(addr)?);
        let addr = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_default();
        let shared = Arc::new((
            Mutex::new(Shared {
                keep_bodies: true,
                script: script.into(),
                responder: None,
                requests: Vec::new(),
                fallback,
                counter: 0,
                nice: 0,
            }),
            Condvar::new(),
        ));
        let (s2, srv2) = (shared.clone(), server.clone());
        let thread = std::thread::Builder::new().name("fake-llm".into()).spawn(move || {
            while let Ok(mut rq) = srv2.recv() {
                let s2 = s2.clone();
                // One thread per request: a slow answer does not hold up others.
                std::thread::spawn(move || {
                let nice = s2.0.lock().nice;
                if nice != 0 {
                    // Best effort: a bench that asked for it says so in its report.
                    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice);
                }
                let mut body = String::new();
                let _ = rq.as_reader().read_to_string(&mut body);
                let header =
                    |name: &'static str| rq.headers().iter().find(|h| h.field.equiv(name)).map(|h| h.value.as_str().to_owned());
                let auth = header("Authorization");
                let anthropic = (header("x-api-key"), header("anthropic-version"));
                let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let (status, out, headers) = answer(&s2, rq.url(), auth, anthropic, parsed);
                if let Some(delay) = headers.iter().find(|(k, _)| k == "X-Fake-Chunk-Delay-Ms").and_then(|(_, v)| v.parse().ok()) {
                    // Send the events one by one, `delay` apart.
                    // Written by hand: tiny_http's chunked encoder would hold
                    // the events back until 8 KiB had gathered.
                    use std::io::Write;
                    let mut w = rq.into_writer();
                    let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
                    // The head goes out at once, as a real server's does.
                    let _ = w.flush();
                    for event in out.split_inclusive("\n\n") {
                        std::thread::sleep(Duration::from_millis(delay));
                        let _ = write!(w, "{:x}\r\n{event}\r\n", event.len());
                        let _ = w.flush();
                    }
                    let _ = w.write_all(b"0\r\n\r\n");
                    let _ = w.flush();
                    return;
                }
                let mut resp = tiny_http::Response::from_string(out).with_status_code(status);
                if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
                    resp.add_header(tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap());
                }
                for (k, v) in headers {
                    resp.add_header(tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).unwrap());
                }
                let _ = rq.respond(resp);
                });
            }
        })?;
        Ok(FakeLlm { shared, server, thread: Some(thread), addr })
    }

    /// Base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.0.lock().requests.clone()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        self.shared.0.lock().requests.len()
    }

    /// The requests from the `from`-th on (0-based), copying none before
    /// it: for benches, which look at one turn's request after another.
    pub fn requests_since(&self, from: usize) -> Vec<Recorded> {
        let g = self.shared.0.lock();
        g.requests[from.min(g.requests.len())..].to_vec()
    }

    /// Waits until at least `n` requests arrived.
    pub fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.0.lock();
        while g.requests.len() < n && !self.shared.1.wait_until(&mut g, deadline).timed_out() {}
        g.requests.clone()
    }

    /// Starts a fake whose answers come from `responder` (then the script).
    pub fn with_responder(responder: impl Fn(&Value, u64) -> Option<Step> + Send + Sync + 'static) -> FakeLlm {
        let fake = FakeLlm::start(Vec::new());
        fake.shared.0.lock().responder = Some(Arc::new(responder));
        fake
    }

    /// Stops keeping request bodies (they are still answered): for load tests.
    pub fn forget_bodies(&self) {
        self.shared.0.lock().keep_bodies = false;
    }

    /// Answers at this CPU nice value from now on (the next request on):
    /// for benches, where the fake stands in for a remote model whose work
    /// is not this machine's and should not compete with what is measured.
    pub fn answer_at_nice(&self, nice: i32) {
        self.shared.0.lock().nice = nice;
    }

    /// Steps not yet consumed.
    pub fn remaining(&self) -> usize {
        self.shared.0.lock().script.len()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(
    shared: &(Mutex<Shared>, Condvar),
    url: &str,
    auth: Option<String>,
    anthropic: (Option<String>, Option<String>),
    body: Value,
) -> (u16, String, Vec<(String, String)>) {
    let mut g = shared.0.lock();
    let kept = if g.keep_bodies { body.clone() } else { Value::Null };
    g.requests.push(Recorded {
        path: url.to_owned(),
        authorization: auth,
        anthropic,
        body: kept,
        at: Instant::now(),
        answered_at: None,
    });
    let number = g.requests.len() as u64;
    shared.1.notify_all();
    let responder = g.responder.clone();
    drop(g);
    let decided = responder.and_then(|r| r(&body, number));
    let mut g = shared.0.lock();
    if let Some(r) = g.requests.get_mut(number as usize - 1) {
        r.answered_at = Some(Instant::now());
    }
    if url == "/v1/messages" {
        let step = decided.or_else(|| g.script.pop_front()).or_else(|| g.fallback.clone());
        g.counter += 1;
        let n = g.counter;
        drop(g);
        return crate::fake_anthropic::answer(n, step, &body);
    }
    if url != "/v1/chat/completions" {
        return (404, json!({"error": {"message": format!("Unknown request URL: POST {url}"), "type": "invalid_request_error", "param": null, "code": "unknown_url"}}).to_string(), vec![]);
    }
    let step = match decided.or_else(|| g.script.pop_front()).or_else(|| g.fallback.clone()) {
        Some(s) => s,
        None => {
            return (500, json!({"error": {"message": "the scripted model has no more steps", "type": "server_error", "param": null, "code": null}}).to_string(), vec![]);
        }
    };
    g.counter += 1;
    let n = g.counter;
    let model = body.get("model").and_then(Value::as_str).unwrap_or("scripted").to_owned();
    let streaming = body.get("stream").and_then(Value::as_bool) == Some(true);
    let (message, finish) = match step {
        Step::Raw { status, body, headers } => return (status, body, headers),
        Step::CutStream => {
            let chunk = json!({"id": format!("chatcmpl-scripted-{n}"), "object": "chat.completion.chunk", "created": 1_700_000_000 + n,
                "model": model, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_cut", "type": "function",
                "function": {"name": "choir__fs__write", "arguments": "{\"path\": \"cut.txt\", \"con"}}]}, "finish_reason": null}]});
            return (200, format!("data: {chunk}\n\n"), vec![("Content-Type".into(), "text/event-stream".into())]);
        }
        Step::CutInsideChunk => {
            let chunk = |text: &str| {
                json!({"id": format!("chatcmpl-scripted-{n}"), "object": "chat.completion.chunk",
                "created": 1_700_000_000 + n, "model": model, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
            };
            let second = format!("data: {}", chunk(" and the rest"));
            let body = format!("data: {}\n\n{}", chunk("the start"), &second[..second.len() / 2]);
            return (200, body, vec![("Content-Type".into(), "text/event-stream".into())]);
        }
        Step::Ended(t, finish) => {
            let message = json!({"role": "assistant", "content": t, "refusal": null});
            if streaming {
                return (
                    200,
                    sse(n, &model, &message, &finish, &body),
                    vec![("Content-Type".into(), "text/event-stream".into())],
                );
            }
            let resp = json!({"id": format!("chatcmpl-scripted-{n}"), "object": "chat.completion", "created": 1_700_000_000 + n,
                "model": model, "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
            return (200, resp.to_string(), vec![]);
        }
        Step::Text(t) => (json!({"role": "assistant", "content": t, "refusal": null}), "stop"),
        Step::SlowText(t, delay) => {
            let message = json!({"role": "assistant", "content": t, "refusal": null});
            let headers = vec![("X-Fake-Chunk-Delay-Ms".to_owned(), delay.as_millis().to_string())];
            return (200, sse(n, &model, &message, "stop", &body), headers);
        }
        Step::ToolCalls(calls) | Step::Thought(_, _, calls) => (calls_message(n, &calls, None), "tool_calls"),
        Step::Said(text, calls) => (calls_message(n, &calls, Some(text)), "tool_calls"),
    };
    if streaming {
        return (
            200,
            sse(n, &model, &message, finish, &body),
            vec![("Content-Type".into(), "text/event-stream".into())],
        );
    }
    let resp = json!({
        "id": format!("chatcmpl-scripted-{n}"),
        "object": "chat.completion",
        "created": 1_700_000_000 + n,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        "system_fingerprint": "fp_scripted"
    });
    (200, resp.to_string(), vec![])
}

/// An assistant message calling `calls` (canonical names mapped to the wire),
/// with optional text beside them.
pub(crate) fn calls_message(n: u64, calls: &[(String, String)], text: Option<String>) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({
                "id": format!("call_{n}_{i}"),
                "type": "function",
                "function": {"name": choir_common::ids::wire_tool_name(name), "arguments": args}
            })
        })
        .collect();
    json!({"role": "assistant", "content": text, "tool_calls": calls, "refusal": null})
}

/// The same answer as `chat.completion.chunk` server-sent events, the way
/// OpenAI streams: content and tool-call arguments in pieces, then the finish
/// reason, then (when asked with `stream_options.include_usage`) usage, then `[DONE]`.
fn sse(n: u64, model: &str, message: &Value, finish: &str, request: &Value) -> String {
    let id = format!("chatcmpl-scripted-{n}");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000 + n, "model": model,
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    if let Some(text) = message["content"].as_str() {
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(8) {
            events.push(chunk(json!({"content": piece.iter().collect::<String>()}), Value::Null));
        }
    }
    for (i, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
        let args = call["function"]["arguments"].as_str().unwrap_or_default();
        let (head, tail) = args.split_at(args.len() / 2);
        events.push(chunk(
            json!({"tool_calls": [{"index": i, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": head}}]}),
            Value::Null,
        ));
        events.push(chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": tail}}]}), Value::Null));
    }
    events.push(chunk(json!({}), json!(finish)));
    if request["stream_options"]["include_usage"] == true {
        events.push(json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000 + n, "model": model, "choices": [],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}));
    }
    let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

/// Reads a scenario file: `{"steps": [{"content": "..."} | {"tool_calls":
/// [{"name": "...", "arguments": {...}}]}], "fallback": {...}}`.
pub fn load_scenario(text: &str) -> Result<(Vec<Step>, Option<Step>), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("scenario is not JSON: {e}"))?;
    let step = |s: &Value| -> Result<Step, String> {
        if let Some(c) = s.get("content").and_then(Value::as_str) {
            return Ok(Step::Text(c.to_owned()));
        }
        if let Some(calls) = s.get("tool_calls").and_then(Value::as_array) {
            let mut out = Vec::new();
            for c in calls {
                let name = c.get("name").and_then(Value::as_str).ok_or("tool call without a name")?;
                out.push((name.to_owned(), c.get("arguments").cloned().unwrap_or(json!({})).to_string()));
            }
            return Ok(Step::ToolCalls(out));
        }
        Err(format!("a step needs \"content\" or \"tool_calls\": {s}"))
    };
    let steps = v.get("steps").and_then(Value::as_array).ok_or("scenario needs a \"steps\" array")?;
    let steps = steps.iter().map(step).collect::<Result<Vec<_>, _>>()?;
    let fallback = v.get("fallback").map(step).transpose()?;
    Ok((steps, fallback))
}
