//! The LLM relay (R-RPC-5): agents call an OpenAI-compatible base URL per lane
//! on their socket (`/llm/<lane>/v1/chat/completions`); choird checks the lease
//! and the budget, forces the lane's configured model, adds the API key from
//! `secrets.json` and forwards the body to the configured endpoint. Every call
//! is recorded in `llm_calls`.
//!
//! **Invariant:** the API key exists only in choird's memory and in the
//! upstream request; it is never sent to an agent or logged.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::Lane;
use crate::daemon::Daemon;
use crate::http::{ApiError, Request, Response};

/// Largest request body relayed.
pub const MAX_REQUEST: usize = 16 * 1024 * 1024;
/// Largest upstream answer accepted.
const MAX_ANSWER: u64 = 32 * 1024 * 1024;

/// Answers `POST /llm/<lane>/v1/chat/completions`.
pub fn handle(d: &Arc<Daemon>, lane: &str, req: &Request) -> Result<Response, ApiError> {
    let who = req
        .caller
        .clone()
        .ok_or_else(|| ApiError::Internal("a model call reached the relay unauthenticated".into()))?;
    let lane = Lane::parse(lane).ok_or_else(|| ApiError::NotFound(format!("no lane {lane:?}; use edge or core")))?;
    if req.body.len() > MAX_REQUEST {
        return Err(ApiError::PayloadTooLarge(format!("LLM request over {MAX_REQUEST} bytes")));
    }
    let mut body: Value =
        serde_json::from_slice(&req.body).map_err(|e| ApiError::BadRequest(format!("LLM request is not JSON: {e}")))?;
    let obj = body.as_object_mut().ok_or_else(|| ApiError::BadRequest("LLM request must be a JSON object".into()))?;
    if !obj.get("messages").is_some_and(Value::is_array) {
        return Err(ApiError::BadRequest("LLM request needs a \"messages\" array".into()));
    }
    let streaming = obj.get("stream").and_then(Value::as_bool) == Some(true);
    d.llm_budget_check(&who)?;
    let config = d.config();
    let model = config.model(&who.agent, lane);
    obj.insert("model".into(), Value::String(model.clone()));
    let endpoint = config.endpoint(lane).clone();
    let key = match &endpoint.api_key_secret {
        None => None,
        Some(name) => Some(d.secrets().get(name).map(str::to_owned).ok_or_else(|| {
            ApiError::Unavailable(format!(
                "the {} lane's API key secret {name:?} is not set in secrets.json",
                lane.as_str()
            ))
        })?),
    };
    let url = format!("{}/chat/completions", endpoint.base_url.trim_end_matches('/'));
    let payload = serde_json::to_vec(&body).map_err(|e| ApiError::Internal(e.to_string()))?;

    let started = Instant::now();
    let mut request = d
        .upstream
        .post(&url)
        .config()
        .timeout_global(Some(Duration::from_secs(endpoint.timeout_s)))
        .build()
        .header("Content-Type", "application/json");
    if let Some(key) = &key {
        request = request.header("Authorization", &format!("Bearer {key}"));
    }
    let result = request.send(&payload[..]);
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let answer = match result {
        Ok(a) => a,
        Err(e) => {
            let _ = d.store.record_llm_call(&who.agent, who.session, lane.as_str(), &model, 0, 0, 0, elapsed_ms);
            return Err(match e {
                ureq::Error::Timeout(_) => ApiError::Timeout(format!(
                    "LLM endpoint {} did not answer within {} s",
                    endpoint.base_url, endpoint.timeout_s
                )),
                other => ApiError::BadGateway(format!("cannot reach LLM endpoint {}: {other}", endpoint.base_url)),
            });
        }
    };
    let status = answer.status().as_u16();
    if streaming && status == 200 {
        // Server-sent events pass through as they come; usage is read on the way.
        let tap = UsageTap {
            inner: answer.into_body().into_reader(),
            line: Vec::new(),
            usage: (0, 0),
            done: false,
            record: Some(Box::new({
                let (d, who, model) = (d.clone(), who.clone(), model.clone());
                let lane = lane.as_str();
                move |(prompt, completion): (u64, u64)| {
                    let ms = started.elapsed().as_millis() as u64;
                    d.llm_tokens_used(&who, prompt + completion);
                    if let Err(e) =
                        d.store.record_llm_call(&who.agent, who.session, lane, &model, 200, prompt, completion, ms)
                    {
                        log::error!("LLM call of {} not recorded: {e}", who.agent);
                    }
                }
            })),
        };
        let mut resp = Response::streaming(tap);
        resp.content_type = "text/event-stream";
        return Ok(resp);
    }
    let mut answer = answer;
    let retry_after = answer.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let bytes = answer
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_vec()
        .map_err(|e| ApiError::BadGateway(format!("LLM endpoint {}: bad answer body: {e}", endpoint.base_url)))?;
    let usage = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| v.get("usage").cloned());
    let count = |k: &str| usage.as_ref().and_then(|u| u.get(k)).and_then(Value::as_u64).unwrap_or(0);
    let (prompt, completion) = (count("prompt_tokens"), count("completion_tokens"));
    d.llm_tokens_used(&who, prompt + completion);
    if let Err(e) =
        d.store.record_llm_call(&who.agent, who.session, lane.as_str(), &model, status, prompt, completion, elapsed_ms)
    {
        log::error!("LLM call of {} not recorded: {e}", who.agent);
    }
    let mut resp =
        Response { status, body: bytes, content_type: "application/json", headers: Vec::new(), stream: None };
    if let Some(ra) = retry_after {
        resp.headers.push(("Retry-After".into(), ra));
    }
    Ok(resp)
}

/// A completion choird asks for on an agent's behalf (e.g. folding its
/// memory), with the agent's model for `lane`, counted against its budget
/// and recorded like its own calls. Returns the answer's text.
pub fn complete_for(d: &Daemon, who: &crate::daemon::Authed, lane: Lane, messages: Value) -> Result<String, ApiError> {
    d.llm_budget_check(who)?;
    let config = d.config();
    let model = config.model(&who.agent, lane);
    let endpoint = config.endpoint(lane).clone();
    let mut request = d
        .upstream
        .post(&format!("{}/chat/completions", endpoint.base_url.trim_end_matches('/')))
        .config()
        .timeout_global(Some(Duration::from_secs(endpoint.timeout_s)))
        .build()
        .header("Content-Type", "application/json");
    if let Some(name) = &endpoint.api_key_secret {
        let key = d.secrets().get(name).map(str::to_owned).ok_or_else(|| {
            ApiError::Unavailable(format!("the {} lane's API key secret {name:?} is not set", lane.as_str()))
        })?;
        request = request.header("Authorization", &format!("Bearer {key}"));
    }
    let started = Instant::now();
    let body = serde_json::json!({"model": model, "messages": messages}).to_string();
    let mut answer = request
        .send(body.as_bytes())
        .map_err(|e| ApiError::BadGateway(format!("cannot reach LLM endpoint {}: {e}", endpoint.base_url)))?;
    let status = answer.status().as_u16();
    let bytes = answer.body_mut().with_config().limit(MAX_ANSWER).read_to_vec().unwrap_or_default();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let count = |k: &str| v["usage"][k].as_u64().unwrap_or(0);
    d.llm_tokens_used(who, count("prompt_tokens") + count("completion_tokens"));
    let ms = started.elapsed().as_millis() as u64;
    if let Err(e) = d.store.record_llm_call(
        &who.agent,
        who.session,
        lane.as_str(),
        &model,
        status,
        count("prompt_tokens"),
        count("completion_tokens"),
        ms,
    ) {
        log::error!("LLM call of {} not recorded: {e}", who.agent);
    }
    if status != 200 {
        return Err(ApiError::BadGateway(format!("the model answered {status}")));
    }
    v["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_owned)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| ApiError::BadGateway("the model's answer had no text".into()))
}

/// Records a streamed call's (prompt, completion) tokens once it ended.
type RecordUsage = Box<dyn FnOnce((u64, u64)) + Send>;

/// Passes a server-sent event stream through, picking up the `usage` of the
/// final chunk, and records the call once the stream ends (or is dropped).
struct UsageTap<R: Read> {
    inner: R,
    line: Vec<u8>,
    usage: (u64, u64),
    done: bool,
    record: Option<RecordUsage>,
}

impl<R: Read> UsageTap<R> {
    fn finish(&mut self) {
        if let Some(record) = self.record.take() {
            record(self.usage);
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let Some(data) = line.strip_prefix(b"data:") else { continue };
            let Ok(v) = serde_json::from_slice::<Value>(data) else { continue };
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                self.usage = (n("prompt_tokens"), n("completion_tokens"));
            }
        }
    }
}

impl<R: Read> Read for UsageTap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.scan(&buf[..n]);
        if n == 0 && !self.done {
            self.done = true;
            self.finish();
        }
        Ok(n)
    }
}

impl<R: Read> Drop for UsageTap<R> {
    fn drop(&mut self) {
        self.finish();
    }
}
