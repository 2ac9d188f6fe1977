//! Real providers' wire formats through the real choird and agent (process
//! runtime, real PostgreSQL): each test's fake answers in one provider's
//! documented shape (the source of each quirk beside it) and asserts what
//! the user gets, what ran, what choird sent upstream and what the ledger
//! holds. The reader's finer cases are unit tests in
//! `choir-agent/src/lanes/llm/tests.rs`.

use std::time::{Duration, Instant};

use choir_tests::fake_llm::Step;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

/// An event stream answer with these `events` (each a JSON chunk or
/// `[DONE]`), sent `delay_ms` apart when given.
fn events(events: &[Value], done: bool, delay_ms: Option<u64>) -> Step {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    let mut headers = vec![("Content-Type".to_owned(), "text/event-stream".to_owned())];
    if let Some(ms) = delay_ms {
        headers.push(("X-Fake-Chunk-Delay-Ms".to_owned(), ms.to_string()));
    }
    Step::Raw { status: 200, body, headers }
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "gen-1", "object": "chat.completion.chunk", "created": 1_764_000_000, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// The agent's chat answer (stdout and stderr together) and how long it took.
fn chat(s: &Scenario, text: &str) -> (String, Duration) {
    let started = Instant::now();
    let out = s.choird.ctl(&["chat", "demo", text]);
    (format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)), started.elapsed())
}

fn started(script: Vec<Step>, config: impl FnOnce(&mut Value) + 'static) -> Option<Scenario> {
    Scenario::new().model(script).config(config).secrets(json!({"llm_key": "sk-test-key-0123456789"})).running().build()
}

/// Regression: OpenRouter's documented mid-stream error — HTTP 200, an
/// `error` object and `finish_reason: "error"`
/// (openrouter.ai/docs/api/reference/streaming, "Handling errors during
/// streaming") — was taken as a finished answer: the partial text became the
/// answer and the complete tool call of that failed stream was executed.
#[test]
fn regression_a_tool_call_from_a_stream_that_ended_in_an_error_was_executed() {
    let failed = events(
        &[
            chunk(json!({"role": "assistant", "content": "Writing it"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_or1", "type": "function",
                    "function": {"name": "choir__fs__write", "arguments": "{\"path\": \"from-failed.txt\", \"content\": \"x\"}"}}]}),
                Value::Null,
            ),
            json!({"id": "gen-1", "object": "chat.completion.chunk", "created": 1_764_000_000, "model": "m", "provider": "openai",
                   "error": {"code": "server_error", "message": "Provider disconnected unexpectedly"},
                   "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]}),
        ],
        false,
        None,
    );
    let Some(s) = started(vec![failed.clone(), Step::Text("the whole answer".into())], |_| {}) else { return };
    let (said, _) = chat(&s, "write it");
    assert_eq!(said, "the whole answer\n", "retried, and the retry's answer shown");
    let ws = s.choird.workspace("demo").join("from-failed.txt");
    assert!(!ws.exists(), "the failed stream's tool call ran");
    assert_eq!(s.llm.request_count(), 2);
    drop(s);
    // Every attempt failing so: the provider's words reach the user.
    let Some(s) = started(vec![failed.clone(), failed.clone(), failed.clone(), failed], |_| {}) else { return };
    let (said, _) = chat(&s, "write it");
    assert!(said.contains("Provider disconnected unexpectedly (server_error)"), "{said}");
    assert!(!said.contains("Writing it"), "the partial text shown as an answer: {said}");
    assert!(!s.choird.workspace("demo").join("from-failed.txt").exists());
}

/// Regression: a provider's 401 was told as "choird refused our lease"
/// (the relay passed the provider's status to the agent as its own), and a
/// wait of an hour asked with `Retry-After` cost the user minutes of
/// retries before they heard anything.
#[test]
fn regression_a_providers_refusal_was_told_as_choirds_and_a_long_wait_was_retried() {
    // OpenAI's documented 401 body (platform.openai.com/docs/guides/error-codes).
    let unauthorized = Step::Raw {
        status: 401,
        body: json!({"error": {"message": "Incorrect API key provided: sk-test-key-0123456789. You can find your API key at https://platform.openai.com/account/api-keys.",
                               "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}})
        .to_string(),
        headers: vec![],
    };
    let Some(s) = started(vec![unauthorized], |_| {}) else { return };
    let (said, _) = chat(&s, "hi");
    assert!(said.contains("provider answered 401: Incorrect API key provided"), "{said}");
    assert!(said.contains("fake-edge"), "names the model: {said}");
    assert!(!said.contains("lease") && !said.contains("sk-test-key-0123456789"), "{said}");
    assert_eq!(s.llm.request_count(), 1, "a refused key is not tried again");
    let log = std::fs::read_to_string(s.choird.home.path().join("logs/choird.log")).unwrap_or_default();
    assert!(!log.contains("sk-test-key-0123456789"), "the key in choird's log");
    drop(s);

    let limited = Step::Raw {
        status: 429,
        body: json!({"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}})
            .to_string(),
        headers: vec![("Retry-After".into(), "3600".into())],
    };
    let Some(s) = started(vec![limited], |_| {}) else { return };
    let (said, took) = chat(&s, "hi");
    assert!(said.contains("asks me to wait 1 h") && said.contains("Rate limit reached"), "{said}");
    assert!(took < Duration::from_secs(20), "told after {took:?}");
    assert_eq!(s.llm.request_count(), 1);
    drop(s);
    // Negative control: a short wait asked with `retry-after-ms` is waited and tried again.
    let short = Step::Raw {
        status: 429,
        body: json!({"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}).to_string(),
        headers: vec![("retry-after-ms".into(), "200".into()), ("Retry-After".into(), "3600".into())],
    };
    let Some(s) = started(vec![short, Step::Text("after the wait".into())], |_| {}) else { return };
    assert_eq!(chat(&s, "hi").0, "after the wait\n");
    assert_eq!(s.llm.request_count(), 2);
}

/// Regression: `timeout_s` capped the whole streamed answer, so a healthy
/// stream still delivering a token a second was cut at the limit and tried
/// again from scratch. It is now the longest silence; `answer_timeout_s`
/// bounds the whole.
#[test]
fn regression_a_healthy_stream_longer_than_timeout_s_was_cut() {
    let slow =
        Step::SlowText("a long answer, one piece at a time, never silent for long".into(), Duration::from_millis(400));
    let Some(s) = started(vec![slow], |c| c["llm"]["edge"]["timeout_s"] = json!(2)) else { return };
    let (said, took) = chat(&s, "tell me slowly");
    assert_eq!(said, "a long answer, one piece at a time, never silent for long\n");
    assert!(
        took > Duration::from_secs(2),
        "the stream took {took:?}: longer than timeout_s, or the test shows nothing"
    );
    assert_eq!(s.llm.request_count(), 1, "not cut and tried again");
    drop(s);
    // Negative control: a stream silent for longer than timeout_s is ended,
    // and the user is told why.
    let stalled = events(
        &[chunk(json!({"content": "first"}), Value::Null), chunk(json!({"content": " late"}), json!("stop"))],
        true,
        Some(3500),
    );
    let script = vec![stalled.clone(), stalled.clone(), stalled.clone(), stalled];
    let Some(s) = started(script, |c| c["llm"]["edge"]["timeout_s"] = json!(1)) else { return };
    let (said, _) = chat(&s, "tell me");
    assert!(said.contains("silent for more than 1 s (its timeout_s) in the middle of its answer"), "{said}");
}

/// An endpoint that must not be sent `stream_options` (Mistral answers 422
/// `extra_forbidden`, BerriAI/litellm #8978) and one set not to stream:
/// choird leaves the field out, asks for a whole answer and streams it to
/// the agent itself. Regression: Mistral's documented `"tool_calls": null`
/// and Magistral's content parts (client-python `docs/models/
/// assistantmessage.md`, `thinkchunk.md`) failed as "not a valid chat
/// completion".
#[test]
fn regression_an_endpoint_refusing_stream_options_could_not_be_used_and_mistral_bodies_failed() {
    let magistral = Step::Raw {
        status: 200,
        body: json!({"id": "cmpl-1", "object": "chat.completion", "model": "magistral-medium-latest", "created": 1_764_000_000,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "tool_calls": null, "prefix": false,
                "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "The user wants the capital."}]},
                            {"type": "text", "text": "Paris."}]}}],
            "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}})
        .to_string(),
        headers: vec![],
    };
    let Some(s) = started(vec![magistral], |c| {
        c["llm"]["edge"]["preset"] = json!("mistral");
        c["llm"]["edge"]["stream"] = json!(false);
    }) else {
        return;
    };
    let (said, _) = chat(&s, "capital of France?");
    assert_eq!(said, "Paris.\n", "the thinking is not the answer");
    let sent = &s.llm.requests()[0].body;
    assert_eq!(sent["stream"], false, "{sent}");
    assert!(sent.get("stream_options").is_none(), "{sent}");
    let mut db = s.pg.client();
    let row = db.query_one("SELECT prompt_tokens, completion_tokens, estimated FROM llm_calls", &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, bool>(2)), (31, 9, false));
    drop(s);
    // Negative control: a preset that takes it is sent it, streamed.
    let Some(s) = started(vec![Step::Text("streamed".into())], |c| c["llm"]["edge"]["preset"] = json!("vllm")) else {
        return;
    };
    assert_eq!(chat(&s, "hi").0, "streamed\n");
    let sent = &s.llm.requests()[0].body;
    assert_eq!((&sent["stream"], &sent["stream_options"]["include_usage"]), (&json!(true), &json!(true)));
}

/// Regression: Gemini's `thought_signature` (on the tool call, as
/// `extra_content.google.thought_signature`;
/// ai.google.dev/gemini-api/docs/thought-signatures, "Signatures for OpenAI
/// compatibility") was dropped, so every tool round's follow-up was refused.
/// Its parallel calls carry no `index` (openai/openai-python #2806), and
/// usage reported only in Groq's `x_groq.usage` (groq-python
/// `chat_completion_chunk.py`) was missed and over-estimated.
#[test]
fn regression_geminis_thought_signature_was_dropped_and_its_parallel_calls_merged() {
    let gemini = events(
        &[
            chunk(
                json!({"role": "assistant", "tool_calls": [{"id": "function-call-1", "type": "function",
                    "function": {"name": "choir__fs__write", "arguments": "{\"path\":\"a.txt\",\"content\":\"A\"}"},
                    "extra_content": {"google": {"thought_signature": "Q2lnbmF0dXJlLWdlbWluaQ=="}}}]}),
                Value::Null,
            ),
            chunk(
                json!({"role": "assistant", "tool_calls": [{"id": "function-call-2", "type": "function",
                    "function": {"name": "choir__fs__write", "arguments": "{\"path\":\"b.txt\",\"content\":\"B\"}"}}]}),
                Value::Null,
            ),
            json!({"id": "gen-1", "object": "chat.completion.chunk", "model": "gemini-3-pro",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "x_groq": {"id": "req_1", "usage": {"prompt_tokens": 1234, "completion_tokens": 56, "total_tokens": 1290}}}),
        ],
        true,
        None,
    );
    let Some(s) = started(vec![gemini, Step::Text("both written".into())], |_| {}) else { return };
    assert_eq!(chat(&s, "write both").0, "both written\n");
    let ws = s.choird.workspace("demo");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "A");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "B");
    let follow_up = &s.llm.requests()[1].body;
    let assistant = follow_up["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap();
    let calls = assistant["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{assistant}");
    assert_eq!(calls[0]["extra_content"]["google"]["thought_signature"], "Q2lnbmF0dXJlLWdlbWluaQ==");
    assert!(calls[1].get("extra_content").is_none());
    let mut db = s.pg.client();
    let first = db
        .query_one("SELECT prompt_tokens, completion_tokens, estimated FROM llm_calls ORDER BY id LIMIT 1", &[])
        .unwrap();
    assert_eq!((first.get::<_, i64>(0), first.get::<_, i64>(1), first.get::<_, bool>(2)), (1234, 56, false));
}

/// Anthropic's Messages API spoken natively (`"protocol": "anthropic"`): a
/// tool turn with extended thinking streamed as Anthropic's events, the
/// thinking block sent back complete and unmodified with its signature on
/// the follow-up (build-with-claude/thinking-tool-workflows), the system
/// prompt and tool list marked for caching, the key in `x-api-key`, cache
/// reads in the ledger's prompt tokens, and a 529 `overloaded_error` tried
/// again.
#[test]
fn an_anthropic_messages_round_trip_with_tools_and_thinking() {
    let script = vec![
        Step::Raw {
            status: 529,
            body: json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_1"})
                .to_string(),
            headers: vec![],
        },
        Step::Thought(
            "The user wants a file.".into(),
            "EqQBCkgIARABGAIiQL".into(),
            vec![("choir.fs.write".into(), json!({"path": "claude.txt", "content": "from claude"}).to_string())],
        ),
        Step::Text("Written.".into()),
    ];
    let Some(s) = started(script, |c| {
        c["llm"]["edge"]["protocol"] = json!("anthropic");
        c["llm"]["edge"]["thinking_budget_tokens"] = json!(2048);
    }) else {
        return;
    };
    let (said, _) = chat(&s, "write claude.txt");
    assert_eq!(said, "Written.\n");
    assert_eq!(std::fs::read_to_string(s.choird.workspace("demo").join("claude.txt")).unwrap(), "from claude");
    let reqs = s.llm.requests();
    assert_eq!(reqs.len(), 3, "the 529 was tried again");
    let first = &reqs[1];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.anthropic, (Some("sk-test-key-0123456789".into()), Some("2023-06-01".into())));
    assert!(first.authorization.is_none(), "the key only in x-api-key");
    let body = &first.body;
    assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 2048}));
    assert!(body["max_tokens"].as_u64().unwrap() > 2048);
    assert_eq!(body["system"].as_array().unwrap().last().unwrap()["cache_control"]["type"], "ephemeral");
    assert_eq!(body["tools"].as_array().unwrap().last().unwrap()["cache_control"]["type"], "ephemeral");
    assert_eq!(body["stream"], true);
    // The follow-up carries the thinking block back, unmodified, before the call.
    let follow = &reqs[2].body["messages"];
    let assistant = follow.as_array().unwrap().iter().rev().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        assistant["content"][0],
        json!({"type": "thinking", "thinking": "The user wants a file.", "signature": "EqQBCkgIARABGAIiQL"})
    );
    assert_eq!(assistant["content"][1]["type"], "tool_use");
    assert_eq!(assistant["content"][1]["input"], json!({"path": "claude.txt", "content": "from claude"}));
    let result = follow.as_array().unwrap().last().unwrap();
    assert_eq!((&result["role"], &result["content"][0]["type"]), (&json!("user"), &json!("tool_result")));
    assert_eq!(result["content"][0]["tool_use_id"], assistant["content"][1]["id"]);
    // The ledger: input plus cache reads as prompt tokens, reported, not estimated.
    let mut db = s.pg.client();
    let rows =
        db.query("SELECT status, prompt_tokens, completion_tokens, estimated FROM llm_calls ORDER BY id", &[]).unwrap();
    let seen: Vec<(i32, i64, i64, bool)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    assert_eq!(seen[0].0, 529);
    assert_eq!(&seen[1..], &[(200, 320, 7, false), (200, 320, 7, false)]);
}

/// A fallback chain the operator wrote: when the lane's model is overloaded
/// (Anthropic's 529 `overloaded_error`, docs.anthropic.com/en/api/errors)
/// choird tries the next model at once, records both calls and the switch,
/// and the answer says which model answered; when the first *refuses* the
/// request (a 400), nothing else is tried.
#[test]
fn a_fallback_on_overload_lands_on_the_second_model_and_says_so_and_none_on_a_refusal() {
    let overloaded = Step::Raw {
        status: 529,
        body: json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string(),
        headers: vec![],
    };
    let second = choir_tests::fake_llm::FakeLlm::start(vec![Step::Text("from the second".into())]);
    let url = second.base_url();
    let with_fallback = move |c: &mut Value| {
        c["llm"]["edge"]["fallbacks"] =
            json!([{"base_url": url, "model": "fake-second", "api_key_secret": "llm_key", "timeout_s": 30}]);
    };
    let Some(s) = started(vec![overloaded], with_fallback.clone()) else { return };
    let (said, _) = chat(&s, "hi");
    assert_eq!(
        said,
        "from the second\n\n(Answered by the fallback model fake-second: the usual one was unavailable.)\n"
    );
    assert_eq!((s.llm.request_count(), second.request_count()), (1, 1));
    assert_eq!(second.requests()[0].body["model"], "fake-second", "the fallback's own model");
    let mut db = s.pg.client();
    let calls: Vec<(String, i32)> = db
        .query("SELECT model, status FROM llm_calls ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(calls, [("fake-edge".to_owned(), 529), ("fake-second".to_owned(), 200)]);
    let audit = s.choird.ctl_ok(&["audit", "--json"]);
    assert!(audit.contains("llm.fallback") && audit.contains("Overloaded (overloaded_error)"), "{audit}");
    let usage = s.choird.ctl_ok(&["usage", "--by", "model"]);
    assert!(usage.contains("fake-second"), "{usage}");
    let status = s.choird.ctl_ok(&["agent", "status", "demo"]);
    assert!(status.contains("model fallbacks: 1 in the last 24 h; the last: the edge lane to fake-second"), "{status}");
    // And in the agent's own commit log, as replicated.
    choir_tests::observe::wait_for("the fallback's event replicated", std::time::Duration::from_secs(10), || {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM commit_events WHERE event->>'kind' = 'model_fallback' \
                 AND event->'result'->>'model' = 'fake-second'",
                &[],
            )
            .unwrap()
            .get(0);
        n == 1
    });
    drop(s);

    // A refusal is not an outage: the fallback is never asked.
    let refused = Step::Raw {
        status: 400,
        body: json!({"error": {"message": "Invalid prompt: your prompt was flagged as potentially violating our usage policy.",
                               "type": "invalid_request_error", "code": "invalid_prompt"}})
        .to_string(),
        headers: vec![],
    };
    let before = second.request_count();
    let Some(s) = started(vec![refused], with_fallback) else { return };
    let (said, _) = chat(&s, "hi");
    assert!(said.contains("provider answered 400: Invalid prompt"), "{said}");
    assert!(!said.contains("fallback"), "{said}");
    assert_eq!(second.request_count(), before, "a refusal went to the fallback");
}

/// What one provider needs back another refuses: DeepSeek's thinking mode
/// requires a tool turn's `reasoning_content` back on the assistant message
/// (api-docs.deepseek.com/guides/thinking_mode); Mistral accepts only tool
/// call ids of nine letters and digits (mistralai/client-js #69) and no
/// unknown field. choird fits the conversation to the endpoint it goes to.
#[test]
fn each_endpoint_gets_back_what_it_requires_and_nothing_it_refuses() {
    let thinking_turn = events(
        &[
            chunk(json!({"role": "assistant", "reasoning_content": "The user wants "}), Value::Null),
            chunk(json!({"reasoning_content": "a file."}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_00_deepseekid", "type": "function",
                    "function": {"name": "choir__fs__write", "arguments": "{\"path\":\"d.txt\",\"content\":\"D\"}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
        ],
        true,
        None,
    );
    let Some(s) = started(vec![thinking_turn.clone(), Step::Text("done".into())], |c| {
        c["llm"]["edge"]["preset"] = json!("deepseek")
    }) else {
        return;
    };
    assert_eq!(chat(&s, "write d").0, "done\n");
    let follow = s.llm.requests()[1].body.clone();
    let assistant = follow["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap().clone();
    assert_eq!(assistant["reasoning_content"], "The user wants a file.", "{assistant}");
    assert!(!follow.to_string().contains("extra_content"), "{follow}");
    drop(s);

    // Mistral: the same history's ids made its form; no reasoning, no extra fields.
    let Some(s) =
        started(vec![thinking_turn, Step::Text("done".into())], |c| c["llm"]["edge"]["preset"] = json!("mistral"))
    else {
        return;
    };
    assert_eq!(chat(&s, "write d").0, "done\n");
    let follow = s.llm.requests()[1].body.clone();
    let messages = follow["messages"].as_array().unwrap();
    let id =
        messages.iter().find(|m| m["role"] == "assistant").unwrap()["tool_calls"][0]["id"].as_str().unwrap().to_owned();
    assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
    assert_eq!(messages.iter().find(|m| m["role"] == "tool").unwrap()["tool_call_id"], id.as_str());
    assert!(
        !follow.to_string().contains("reasoning_content") && !follow.to_string().contains("extra_content"),
        "{follow}"
    );
}
