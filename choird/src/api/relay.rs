//! The LLM relay (R-RPC-5): agents call an OpenAI-compatible base URL per lane
//! on their socket (`/llm/<lane>/v1/chat/completions`); choird checks the lease
//! and the budget, forces the lane's configured model, adds the API key from
//! `secrets.json` and forwards the body to the configured endpoint. Every call
//! is recorded in `llm_calls`.
//!
//! **Invariant:** the API key exists only in choird's memory and in the
//! upstream request; it is never sent to an agent or logged.
//! **Invariant:** a connection thread that relayed a core call runs at
//! [`choir_common::nice::BACKGROUND_NICE`] until its connection ends; an
//! agent can only slow its own connections this way.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::api::relay_fit;
use crate::config::{Lane, Protocol};
use crate::error::Error;
use crate::http::{Caller, Request, Response};
use crate::shared::Shared;
use crate::store::ledger::Call;
use crate::store::Tokens;

/// Largest request body relayed.
pub const MAX_REQUEST: usize = 16 * 1024 * 1024;
/// Largest upstream answer accepted.
const MAX_ANSWER: u64 = 32 * 1024 * 1024;
/// Largest refusal read from a provider (its words are cut far shorter).
const MAX_REFUSAL: u64 = 1024 * 1024;
/// What is read of an upstream stream past its `[DONE]`, after the agent
/// has its end: a provider's body ends right after it (its chunked
/// terminator), and read to that end its connection goes back to the
/// client's pool for the next call — otherwise every call would pay a new
/// TCP connection and, to a real provider, a TLS handshake. An upstream
/// still talking past this much loses its connection instead. One silent
/// after `[DONE]` without ending its body holds this agent connection's
/// thread for one read timeout (the endpoint's `timeout_s`): a next call
/// the agent sends over the same connection meanwhile waits for it (the
/// agent's pool hands out its oldest idle connection). Every provider
/// Choir speaks to ends its body with its last event.
const STREAM_TAIL: u64 = 64 * 1024;

/// The request fields forwarded upstream; every other field an agent sends
/// (`n`, `service_tier`, provider routing lists, extra headers or bodies …)
/// is dropped: an agent cannot buy more than one answer per call, pick a
/// pricier tier, or steer choird's request.
pub const FORWARDED_FIELDS: &[&str] = &[
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "response_format",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
];

/// The core job a call is for, as the agent names it in `?job=` (for the
/// ledger only: agent-claimed, it decides nothing); a name that is not
/// `[A-Za-z0-9_.-]{1,64}` is not recorded.
fn job_of(req: &Request) -> Option<String> {
    req.query("job")
        .filter(|j| !j.is_empty() && j.len() <= 64)
        .filter(|j| j.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .map(str::to_owned)
}

/// Answers `POST /llm/<lane>/v1/chat/completions` for `who`, authenticated
/// at admission.
pub fn handle(d: &Arc<Shared>, lane: Lane, who: &Caller, req: &Request) -> Result<Response, Error> {
    let edge = lane == Lane::Edge;
    if edge {
        choir_common::hop::mark("relay.in");
    }
    if lane == Lane::Core {
        // A core job's call is background work: this connection's thread
        // (which relays it, streams the answer and records it) runs below
        // the edge's from here on. The agent keeps its core jobs' calls on
        // connections of their own, so its edge never lands on this one.
        choir_common::nice::lower_this_thread();
    }
    let job = job_of(req);
    if req.body.len() > MAX_REQUEST {
        return Err(Error::TooLarge(format!("LLM request over {MAX_REQUEST} bytes")));
    }
    let mut obj = forwarded(&req.body)?;
    strip_switched_off(d, &who.agent, &mut obj)?;
    let streaming = obj.get("stream").map(|v| v.get()) == Some("true");
    let raw = |v: &Value| serde_json::value::to_raw_value(v).map_err(|e| Error::Internal(e.to_string()));
    let config = d.config();
    let secrets = d.secrets();
    let asked =
        crate::budget::COMPLETION_FIELDS.iter().find_map(|k| obj.get(*k).and_then(|v| v.get().parse::<u64>().ok()));
    let reservation = reserve(d, &config, &who.agent, crate::budget::estimate_with(req.body.len(), asked))?;
    // The lane's endpoint, then its fallbacks: the next is tried when one is
    // down, rate limited or overloaded, never when it refused the request.
    let chain = config.chain(&who.agent, lane);
    let mut at = 0;
    let (endpoint, model, payload, upstream_streams, answer, started, elapsed_ms) = loop {
        let (endpoint, model) = (chain[at].0, chain[at].1.clone());
        // The conversation is copied only when another endpoint may still
        // need it: a lane without fallbacks (or the last of a chain) takes it.
        let mut obj = if at + 1 == chain.len() { std::mem::take(&mut obj) } else { obj.clone() };
        // Streamed upstream only when the endpoint streams; otherwise its
        // whole answer is streamed to the agent by choird (`whole_as_events`).
        let upstream_streams = streaming && endpoint.streams();
        if streaming && !upstream_streams {
            obj.insert("stream".into(), raw(&Value::Bool(false))?);
        }
        if upstream_streams && endpoint.sends_stream_options() {
            // Streamed calls are counted too: the endpoint must report usage.
            obj.insert("stream_options".into(), raw(&serde_json::json!({"include_usage": true}))?);
        }
        obj.insert("model".into(), raw(&Value::String(model.clone()))?);
        if endpoint.parallel_tool_calls == Some(false) && obj.contains_key("tools") {
            obj.insert("parallel_tool_calls".into(), raw(&Value::Bool(false))?);
        }
        let fitted = match obj.get("messages") {
            Some(m) if endpoint.protocol == Protocol::Openai && relay_fit::needed(m.get(), endpoint.preset) => {
                let mut messages: Value = serde_json::from_str(m.get()).map_err(|e| Error::Malformed(e.to_string()))?;
                relay_fit::fit(&mut messages, endpoint.preset);
                Some(messages)
            }
            _ => None,
        };
        if let Some(messages) = fitted {
            obj.insert("messages".into(), raw(&messages)?);
        }
        let payload = serde_json::to_vec(&obj).map_err(|e| Error::Internal(e.to_string()))?;
        let started = Instant::now();
        if edge {
            choir_common::hop::mark("relay.upstream");
        }
        let result =
            d.upstream.chat(endpoint, &secrets, lane, &payload, upstream_streams, &format!("agent {}", who.agent));
        if edge {
            choir_common::hop::mark("relay.answered");
        }
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let last = at + 1 == chain.len();
        let failed = |status: u16| {
            d.store.record_llm_call(Call::now(
                &who.agent,
                who.session,
                lane.as_str(),
                job.as_deref(),
                &model,
                status,
                Tokens::default(),
                elapsed_ms,
                false,
                None,
            ));
        };
        let why = match result {
            Ok(a) if a.status == 200 || last || !crate::upstream::refusal::retryable(a.status) => {
                break (endpoint, model, payload, upstream_streams, a, started, elapsed_ms)
            }
            Ok(mut a) => {
                let bytes = a.read_to_vec(MAX_REFUSAL).unwrap_or_default();
                failed(a.status);
                let header = |name: &str| a.header(name);
                let key = crate::upstream::Upstream::key(endpoint, &secrets);
                crate::upstream::refusal::refusal(lane, &model, a.status, &header, &bytes, key).to_string()
            }
            Err(e @ Error::Provider { retryable: true, .. }) if !last => {
                failed(0);
                e.to_string()
            }
            Err(e) => {
                failed(0);
                return Err(e);
            }
        };
        let next = &chain[at + 1].1;
        log::warn!("agent {}: {why}; trying the fallback model {next:?}", who.agent);
        d.upstream.fell_back(who.agent.as_str(), lane, next);
        d.audit(
            "choird",
            Some(&who.agent),
            "llm.fallback",
            "ok",
            serde_json::json!({"lane": lane.as_str(), "from": model, "to": next, "why": why}),
        );
        at += 1;
    };
    // Said to the agent when a fallback answered, so its user is told.
    let fell_back = (at > 0).then(|| ("X-Choir-Fallback".to_owned(), model.clone()));
    let status = answer.status;
    let prompt_estimate = payload.len() as u64 / crate::budget::BYTES_PER_TOKEN;
    if upstream_streams && status == 200 {
        // Server-sent events pass through as they come; usage is read on the way.
        let tap = UsageTap::new(
            answer.body,
            format!(
                "the {} model's endpoint was silent for more than {} s (its timeout_s) in the middle of its answer",
                lane.as_str(),
                endpoint.timeout_s
            ),
            Some(Box::new({
                let (d, who, model, job) = (d.clone(), who.clone(), model.clone(), job.clone());
                let lane = lane.as_str();
                move |usage: Option<Tokens>, bytes: u64| {
                    let ms = started.elapsed().as_millis() as u64;
                    let estimated = usage.is_none();
                    let used =
                        usage.unwrap_or_else(|| Tokens::plain(prompt_estimate, bytes / crate::budget::BYTES_PER_TOKEN));
                    let (prompt, completion) = (used.prompt, used.completion);
                    d.store.record_llm_call(Call::now(
                        &who.agent,
                        who.session,
                        lane,
                        job.as_deref(),
                        &model,
                        200,
                        used,
                        ms,
                        estimated,
                        d.config().llm.cost(&model, prompt, completion),
                    ));
                    warn_budget(&d, &who.agent, reservation.settle(prompt + completion));
                }
            })),
        );
        let mut resp = Response::streaming(tap);
        resp.content_type = "text/event-stream";
        resp.headers.extend(fell_back);
        if edge {
            choir_common::hop::mark("relay.out");
        }
        return Ok(resp);
    }
    let mut answer = answer;
    let limit = if status == 200 { MAX_ANSWER } else { MAX_REFUSAL };
    let bytes = answer.read_to_vec(limit).map_err(|e| {
        log::warn!("agent {}: the {} model's answer could not be read: {e}", who.agent, lane.as_str());
        Error::Upstream(format!("the {} model's answer could not be read", lane.as_str()))
    })?;
    let parsed = serde_json::from_slice::<Value>(&bytes).ok();
    let (used, estimated) = match parsed.as_ref().and_then(Tokens::reported) {
        Some(used) => (used, false),
        // An answer without usage still costs: estimated from its size.
        None if status == 200 => {
            (Tokens::plain(prompt_estimate, bytes.len() as u64 / crate::budget::BYTES_PER_TOKEN), true)
        }
        None => (Tokens::default(), false),
    };
    let (prompt, completion) = (used.prompt, used.completion);
    d.store.record_llm_call(Call::now(
        &who.agent,
        who.session,
        lane.as_str(),
        job.as_deref(),
        &model,
        status,
        used,
        elapsed_ms,
        estimated,
        config.llm.cost(&model, prompt, completion),
    ));
    warn_budget(d, &who.agent, reservation.settle(prompt + completion));
    if status != 200 {
        let header = |name: &str| answer.header(name);
        let key = crate::upstream::Upstream::key(endpoint, &secrets);
        let e = crate::upstream::refusal::refusal(lane, &model, status, &header, &bytes, key);
        log::warn!("agent {}: {e}", who.agent);
        return Err(e);
    }
    if streaming {
        // The endpoint does not stream: its whole answer, as the events of one.
        let Some(parsed) = parsed else {
            return Err(Error::Upstream(format!("the {} model's answer is not JSON", lane.as_str())));
        };
        let mut resp = Response::json(200, &Value::Null);
        resp.body = crate::api::relay_events::whole_as_events(&parsed);
        resp.content_type = "text/event-stream";
        resp.headers.extend(fell_back);
        return Ok(resp);
    }
    let resp = Response {
        status,
        body: bytes,
        content_type: "application/json",
        headers: fell_back.into_iter().collect(),
        stream: None,
        tunnel: None,
    };
    if edge {
        choir_common::hop::mark("relay.out");
    }
    Ok(resp)
}

/// A completion choird asks for on an agent's behalf (e.g. folding its
/// memory), with the agent's model for `lane`, counted against its budget
/// and recorded like its own calls. Returns the answer's text.
pub fn complete_for(d: &Shared, who: &Caller, lane: Lane, messages: Value) -> Result<String, Error> {
    let config = d.config();
    let model = config.model(&who.agent, lane);
    let body = serde_json::json!({"model": model, "messages": messages});
    let text = body.to_string();
    let reservation = reserve(d, &config, &who.agent, crate::budget::estimate(text.len(), &body))?;
    let started = Instant::now();
    let secrets = d.secrets();
    let mut answer = d.upstream.chat(
        config.endpoint(lane),
        &secrets,
        lane,
        text.as_bytes(),
        false,
        &format!("agent {}", who.agent),
    )?;
    let status = answer.status;
    let bytes = answer.read_to_vec(MAX_ANSWER).unwrap_or_default();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let (used, estimated) = match Tokens::reported(&v) {
        Some(used) => (used, false),
        None => {
            let per = crate::budget::BYTES_PER_TOKEN;
            (Tokens::plain(text.len() as u64 / per, bytes.len() as u64 / per), status == 200)
        }
    };
    let (prompt, completion) = (used.prompt, used.completion);
    let ms = started.elapsed().as_millis() as u64;
    d.store.record_llm_call(Call::now(
        &who.agent,
        who.session,
        lane.as_str(),
        None,
        &model,
        status,
        used,
        ms,
        estimated,
        config.llm.cost(&model, prompt, completion),
    ));
    warn_budget(d, &who.agent, reservation.settle(prompt + completion));
    if status != 200 {
        let header = |name: &str| answer.header(name);
        let key = crate::upstream::Upstream::key(config.endpoint(lane), &secrets);
        return Err(crate::upstream::refusal::refusal(lane, &model, status, &header, &bytes, key));
    }
    let message: Option<choir_common::openai::ChatMessage> =
        serde_json::from_value(v["choices"][0]["message"].clone()).ok();
    message
        .and_then(|m| m.content)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| Error::Upstream("the model's answer had no text".into()))
}

/// Records a streamed call once it ended: the usage it reported (`None` when
/// it reported none) and the bytes of its events (for an estimate).
type RecordUsage = Box<dyn FnOnce(Option<Tokens>, u64) + Send>;

/// Passes a server-sent event stream through, picking up the `usage` of the
/// final chunk, and records the call once the stream ends (or is dropped).
struct UsageTap<R: Read> {
    inner: R,
    line: Vec<u8>,
    usage: Option<Tokens>,
    bytes: u64,
    done: bool,
    /// `[DONE]` came: what is left upstream is the body's tail, read to
    /// its end when the tap is dropped ([`STREAM_TAIL`]).
    tail: bool,
    /// An error event still to go out (the upstream broke off between events).
    broke: Option<Vec<u8>>,
    /// What a silence past the endpoint's `timeout_s` is called.
    silence: String,
    record: Option<RecordUsage>,
}

impl<R: Read> UsageTap<R> {
    /// A tap on `inner` calling a silence past the read timeout `silence`,
    /// recording the call with `record` once it ends.
    fn new(inner: R, silence: String, record: Option<RecordUsage>) -> UsageTap<R> {
        UsageTap {
            inner,
            line: Vec::new(),
            usage: None,
            bytes: 0,
            done: false,
            tail: false,
            broke: None,
            silence,
            record,
        }
    }

    fn finish(&mut self) {
        if let Some(record) = self.record.take() {
            record(self.usage, self.bytes);
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        for &b in bytes {
            if b != b'\n' {
                // A line is an event's data; nothing sane is longer.
                if self.line.len() < 4 * 1024 * 1024 {
                    self.line.push(b);
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let Some(data) = line.strip_prefix(b"data:") else { continue };
            if data.trim_ascii() == b"[DONE]" {
                // The end of the stream: recorded once it has gone out (when
                // the tap is dropped), so the record is not in the agent's way.
                self.done = true;
                self.tail = true;
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(data) else { continue };
            if let Some(used) = Tokens::reported(&v) {
                self.usage = Some(used);
            }
        }
    }
}

impl<R: Read> Read for UsageTap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(event) = self.broke.take() {
            let n = event.len().min(buf.len());
            buf[..n].copy_from_slice(&event[..n]);
            if n < event.len() {
                self.broke = Some(event[n..].to_vec());
            }
            return Ok(n);
        }
        if self.done {
            // `[DONE]` went out with the previous read: the stream ends here
            // (nothing after it is passed on) and the call is recorded when
            // the server drops the tap, after the stream's end went out.
            return Ok(0);
        }
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            // Broken off between two events: the agent is told why, as an
            // error event (it uses nothing of the answer, and may try again).
            // Inside an event, the cut itself says it.
            Err(e) if self.line.is_empty() => {
                let timed_out = matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
                    || matches!(
                        e.get_ref().and_then(|x| x.downcast_ref::<ureq::Error>()),
                        Some(ureq::Error::Timeout(_))
                    );
                let why = if timed_out {
                    self.silence.clone()
                } else {
                    log::warn!("an upstream answer broke off: {e}");
                    "the model's connection broke off in the middle of its answer".to_owned()
                };
                let event = serde_json::json!({"error": {"message": why, "type": "choir_relay"}});
                self.broke = Some(format!("data: {event}\n\n").into_bytes());
                self.done = true;
                return self.read(buf);
            }
            Err(e) => return Err(e),
        };
        self.scan(&buf[..n]);
        if n == 0 {
            self.done = true;
        }
        Ok(n)
    }
}

impl<R: Read> Drop for UsageTap<R> {
    fn drop(&mut self) {
        self.finish();
        // After `[DONE]` only: the rest of the upstream's body, bounded, so
        // its connection is reused. Broken off, or dropped mid-stream (the
        // agent went away), the connection is dropped with it.
        if self.tail {
            let _ = std::io::copy(&mut (&mut self.inner).take(STREAM_TAIL), &mut std::io::sink());
        }
    }
}

/// Tells the operator (log, audit) and the agent's admins (Telegram) that a
/// budget reached its warning share.
/// Reserves a call's estimated tokens (from its `bytes` and `body`) against
/// the agent's token budget and the host's, under one lock.
fn reserve(
    d: &Shared,
    config: &crate::config::Config,
    agent: &choir_common::ids::AgentId,
    tokens: u64,
) -> Result<crate::budget::Reservation, Error> {
    let budget = config.agents.get(agent).map(|a| a.token_budget).unwrap_or_default();
    d.budgets.reserve(&d.store, agent, budget, config.token_budget, tokens)
}

/// The fields of an agent's chat request that are forwarded, each kept as
/// the JSON text the agent sent (checked to be JSON, never rebuilt: the
/// messages and tools of a turn are copied, not parsed into a tree and
/// written out again). Refused: a body that is not JSON, not an object,
/// nested deeper than [`MAX_DEPTH`], or without a `messages` array.
/// Leaves out of a model request the MCP tools choird switched off for
/// this agent (their server changed them since approval), whatever the
/// agent offered: choird decides what a model may be offered of them.
fn strip_switched_off(
    d: &Shared,
    agent: &choir_common::ids::AgentId,
    obj: &mut BTreeMap<String, Box<RawValue>>,
) -> Result<(), Error> {
    let off = d.mcp_disabled.read();
    let Some(off) = off.get(agent).filter(|o| !o.is_empty()) else { return Ok(()) };
    let Some(tools) = obj.get("tools") else { return Ok(()) };
    let mut tools: Vec<Value> = serde_json::from_str(tools.get()).map_err(|e| Error::Malformed(e.to_string()))?;
    let before = tools.len();
    tools.retain(|t| !t["function"]["name"].as_str().is_some_and(|n| off.contains(n)));
    if tools.len() != before {
        let raw = serde_json::value::to_raw_value(&tools).map_err(|e| Error::Internal(e.to_string()))?;
        obj.insert("tools".into(), raw);
    }
    Ok(())
}

fn forwarded(body: &[u8]) -> Result<BTreeMap<String, Box<RawValue>>, Error> {
    let sent: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            Error::Malformed("LLM request must be a JSON object".into())
        } else {
            Error::Malformed(format!("LLM request is not JSON: {e}"))
        }
    })?;
    if !sent.get("messages").is_some_and(|m| m.get().starts_with('[')) {
        return Err(Error::Malformed("LLM request needs a \"messages\" array".into()));
    }
    if depth(body) > MAX_DEPTH {
        return Err(Error::Malformed(format!("LLM request is nested deeper than {MAX_DEPTH} levels")));
    }
    Ok(sent.into_iter().filter(|(k, _)| FORWARDED_FIELDS.contains(&k.as_str())).collect())
}

/// How deep a request's JSON may nest (what a parse into a tree allows;
/// nothing a chat request needs comes near it).
const MAX_DEPTH: usize = 128;

/// The deepest nesting of arrays and objects in valid JSON `text`
/// (brackets inside strings not counted). A string's contents, most of a
/// request's bytes (the tools' descriptions and schemas, the history), are
/// skipped to their next quote or backslash at once, not looked at byte by
/// byte. At worst (a string of escapes only) that is one search per
/// escape, within the request's size bound, which the JSON parse before it
/// has paid for already.
fn depth(text: &[u8]) -> usize {
    let (mut now, mut max, mut i) = (0usize, 0usize, 0usize);
    while let Some(&b) = text.get(i) {
        i += 1;
        match b {
            b'"' => loop {
                let Some(j) = text.get(i..).and_then(|rest| memchr::memchr2(b'"', b'\\', rest)) else {
                    return max;
                };
                let at = i + j;
                i = at + 1;
                if text[at] == b'"' {
                    break;
                }
                // A backslash: the byte after it is escaped, whatever it is.
                i += 1;
            },
            b'[' | b'{' => {
                now += 1;
                max = max.max(now);
            }
            b']' | b'}' => now = now.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fn warn_budget(d: &Shared, agent: &choir_common::ids::AgentId, warnings: Vec<String>) {
    for text in warnings {
        log::warn!("{text}");
        d.audit("choird", Some(agent), "budget.warning", "ok", serde_json::json!({"message": text}));
        d.events.send(crate::events::Event::BudgetWarning { agent: agent.clone(), text });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_request_is_forwarded_field_by_field_as_sent_and_bad_bodies_are_refused_saying_why() {
        let body = br#"{"messages": [{"role": "user", "content": "hi \"[{\" there"}], "max_tokens": 7,
                        "tools": [ {"type": "function"} ], "api_key": "not forwarded", "model": "mine"}"#;
        let f = forwarded(body).unwrap();
        let keys: Vec<&str> = f.keys().map(String::as_str).collect();
        assert_eq!(keys, ["max_tokens", "messages", "tools"], "only forwarded fields; the model is choird's");
        assert_eq!(f["messages"].get(), r#"[{"role": "user", "content": "hi \"[{\" there"}]"#, "the agent's text");
        assert_eq!(f["tools"].get(), r#"[ {"type": "function"} ]"#);

        let refused = |body: &[u8]| match forwarded(body) {
            Err(Error::Malformed(m)) => m,
            other => panic!("not refused: {other:?}"),
        };
        assert!(refused(b"{\"messages\": [").starts_with("LLM request is not JSON"));
        assert_eq!(refused(b"[1, 2]"), "LLM request must be a JSON object");
        assert_eq!(refused(br#"{"messages": {"role": "user"}}"#), "LLM request needs a \"messages\" array");
        assert_eq!(refused(br#"{"model": "x"}"#), "LLM request needs a \"messages\" array");
        // As deep as a tree parse allowed, and one deeper.
        let nested = |n: usize| format!(r#"{{"messages": [{}{}]}}"#, "[".repeat(n - 2), "]".repeat(n - 2));
        assert!(forwarded(nested(MAX_DEPTH).as_bytes()).is_ok());
        assert!(refused(nested(MAX_DEPTH + 1).as_bytes()).contains("nested deeper than 128"));
        assert!(refused(nested(100_000).as_bytes()).contains("nested deeper"));
    }

    #[test]
    fn the_depth_skips_strings_whole_and_counts_as_a_json_parser_nests() {
        // The oracle: a JSON parser's tree, measured.
        fn tree(v: &Value) -> usize {
            match v {
                Value::Array(a) => 1 + a.iter().map(tree).max().unwrap_or(0),
                Value::Object(o) => 1 + o.values().map(tree).max().unwrap_or(0),
                _ => 0,
            }
        }
        let cases: &[&str] = &[
            r#"{"messages": []}"#,
            r#"{"a": "[[[{{{", "b": [[1]]}"#,
            r#"{"a": "\"[[[", "b": [1]}"#,
            r#"{"a": "\\", "b": [[[2]]]}"#,
            r#"{"a": "\\\"[[", "b": {"c": [{}]}}"#,
            r#"{"a": "\u005b\u007b", "b": "é [ ü", "c": [[["x]"]]]}"#,
            r#"[[[[["]]]]]"]]]]]"#,
            r#"[{"a\"]": {"\\": ["}", {"x": []}]}}]"#,
        ];
        for case in cases {
            let parsed: Value = serde_json::from_str(case).unwrap();
            assert_eq!(depth(case.as_bytes()), tree(&parsed), "{case}");
        }
        assert_eq!(depth(br#"{"a": "\"[[[", "b": [1]}"#), 2, "an escaped quote does not end the string");
        assert_eq!(depth(br#"{"a": "\\", "b": [[[2]]]}"#), 4, "an escaped backslash does not escape the quote");
        // A negative control: counting brackets inside strings would say 7 here.
        assert_eq!(depth(br#"{"a": "[[[{{{", "b": [[1]]}"#), 3);
        // What is not JSON (the parse before refuses it) ends the scan, never a panic.
        assert_eq!(depth(br#"{"end": "\"#), 1);
        assert_eq!(depth(br#"[{"end": "abc"#), 2);
        assert_eq!(depth(b""), 0);
    }

    #[test]
    fn a_streamed_call_is_recorded_once_after_its_end_went_out_and_the_stream_ends_there() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n\
                      data: [DONE]\n\ndata: {\"after\":\"the end\"}\n\n";
        type Records = Vec<(Option<Tokens>, u64)>;
        let recorded: Arc<Mutex<Records>> = Arc::default();
        let mut tap = UsageTap::new(
            std::io::Cursor::new(stream.as_bytes().to_vec()),
            "silent".into(),
            Some(Box::new({
                let recorded = recorded.clone();
                move |usage, bytes| recorded.lock().unwrap().push((usage, bytes))
            })),
        );
        // The whole stream up to [DONE] goes out before anything is recorded.
        let mut out = vec![0u8; 4096];
        let n = tap.read(&mut out).unwrap();
        assert!(String::from_utf8_lossy(&out[..n]).contains("data: [DONE]"));
        assert!(recorded.lock().unwrap().is_empty(), "recorded before the end went out");
        // The stream ends there; the call is recorded, once, when the server
        // drops the tap after writing the stream's last chunk.
        assert_eq!(tap.read(&mut out).unwrap(), 0);
        assert_eq!(tap.read(&mut out).unwrap(), 0);
        assert!(recorded.lock().unwrap().is_empty(), "recorded before the stream's end went out");
        drop(tap);
        assert_eq!(*recorded.lock().unwrap(), [(Some(Tokens::plain(7, 2)), stream.len() as u64)]);
    }

    /// A provider streaming as OpenAI's API does (chunked, kept alive): one
    /// event, `[DONE]`, then `after_done` as raw bytes (the chunked
    /// terminator, or more); answers every request on a connection until
    /// its client closes it. Counts the connections it accepted.
    fn provider(after_done: Vec<u8>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/chat/completions", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let after_done = after_done.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut conn = conn;
                    loop {
                        let mut length = 0usize;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                                length = v.trim().parse().unwrap();
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0u8; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        let mut out =
                            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                                .to_vec();
                        for event in ["data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", "data: [DONE]\n\n"]
                        {
                            out.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
                        }
                        if conn.write_all(&out).and_then(|()| conn.write_all(&after_done)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// One streamed call through a tap, as the relay makes it: read by the
    /// server until it ends (`reads` reads at most), then dropped.
    fn relayed(agent: &ureq::Agent, url: &str, reads: usize) -> String {
        let answer = agent
            .post(url)
            .config()
            .timeout_per_read(Some(std::time::Duration::from_millis(500)))
            .build()
            .send(&b"{}"[..])
            .unwrap();
        let mut tap = UsageTap::new(answer.into_body().into_reader(), "silent".into(), None);
        let (mut out, mut buf) = (Vec::new(), [0u8; 8]);
        for _ in 0..reads {
            match tap.read(&mut buf).unwrap() {
                0 => break,
                n => out.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_streamed_model_call_leaves_its_upstream_connection_for_the_next_call() {
        use std::sync::atomic::Ordering;
        let agent = crate::resolver::agent(ureq::config::Config::builder().http_status_as_error(false));
        let (url, accepted) = provider(b"0\r\n\r\n".to_vec());
        for _ in 0..3 {
            assert!(relayed(&agent, &url, usize::MAX).ends_with("data: [DONE]\n\n"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "three calls over one kept connection");
        // The control: a call dropped before its end (its agent went away)
        // takes its connection with it, and the next call opens another.
        assert!(!relayed(&agent, &url, 2).contains("[DONE]"));
        relayed(&agent, &url, usize::MAX);
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "the cut call's connection was not reused");

        // A provider talking on past [DONE] (here 1 MiB of events, never
        // ending) is read STREAM_TAIL bytes at most; its connection goes.
        let mut flood = Vec::new();
        let event = format!("data: {}\n\n", "x".repeat(1000));
        for _ in 0..1024 {
            flood.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
        }
        let (url, accepted) = provider(flood);
        for _ in 0..2 {
            let out = relayed(&agent, &url, usize::MAX);
            assert!(
                out.contains("data: [DONE]\n") && out.len() < 200,
                "the read that took [DONE] ends the stream: {out}"
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // One that never ends its body after [DONE] costs one read timeout, then its connection.
        let (url, accepted) = provider(Vec::new());
        for _ in 0..2 {
            assert!(relayed(&agent, &url, usize::MAX).contains("data: [DONE]\n"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
