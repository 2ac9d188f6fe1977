//! The client's tests: connections kept between calls, cancellation while
//! the model thinks, and each provider's documented stream and body shapes
//! (with the source of each quirk) read as that provider means them.

use super::*;
use crate::cancel::wake_ups;
use choir_common::openai::{ChatMessage, Role};

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
        let answer = llm.stream("core", Some("job"), &req, &mut |_| {}, None).unwrap();
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
                    llm.stream("core", Some("job"), &req, &mut |_| {}, None).unwrap();
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

/// `events`, each as one `data:` line and a blank line.
fn sse(events: &[&str]) -> String {
    events.iter().map(|l| format!("data: {l}\n\n")).collect()
}

fn read(text: &str) -> Result<ChatResponse, Attempt> {
    settle(stream::read(&mut std::io::Cursor::new(text.to_owned()), &mut |_| true))
}

fn answer(text: &str) -> ChatResponse {
    match read(text) {
        Ok(a) => a,
        Err(Attempt::Failed(e, _) | Attempt::Fatal(e)) => panic!("not an answer: {e}"),
        Err(Attempt::Cut(why)) => panic!("cut: {why}"),
    }
}

#[test]
fn chunks_assemble_into_content_and_tool_calls() {
    let r = answer(&sse(&[
        r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"choir__fs__read","arguments":"{\"pa"}}]}}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"a\"}"}}]}}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
        "[DONE]",
    ]));
    let m = &r.choices[0].message;
    assert_eq!(m.content.as_deref(), Some("Hello"));
    assert_eq!(m.tool_calls[0].id, "call_1");
    assert_eq!(m.tool_calls[0].function.arguments, r#"{"path": "a"}"#);
    assert_eq!(r.usage.unwrap().total_tokens, 5);
}

#[test]
fn a_cut_stream_is_a_retryable_error_not_a_partial_answer() {
    let r = read(&sse(&[
        r#"{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"choir__fs__write","arguments":"{\"path\": \"a"}}]}}]}"#,
    ]));
    assert!(matches!(r, Err(Attempt::Cut(_))));
}

/// Regression: a stream cut inside a chunk (its last line half there)
/// was a malformed answer, not retried; one cut at a chunk's boundary
/// was retried but told as "cannot reach choird". Both are cuts now.
#[test]
fn regression_a_stream_cut_inside_a_chunk_is_a_cut_like_one_cut_between_chunks() {
    let whole = r#"data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}]}"#;
    for text in [format!("{whole}\n\n{}", &whole[..40]), format!("{whole}\n\n")] {
        assert!(matches!(read(&text), Err(Attempt::Cut(_))), "{text}");
    }
    // A whole event that is not JSON is the provider's garbage, not a cut.
    assert!(matches!(read("data: {nope\n\n"), Err(Attempt::Fatal(LlmError::Malformed(_)))));
}

/// Regression: Gemini's OpenAI-compatible endpoint streams parallel calls
/// without `index`, each whole in one delta with its own id, the first
/// carrying `extra_content.google.thought_signature`, and may end a
/// tool-call turn with `finish_reason: "stop"` (openai/openai-python #2806,
/// googleapis/python-genai #2868; the signature:
/// ai.google.dev/gemini-api/docs/thought-signatures, "OpenAI compatibility").
/// Taking a missing index as 0 merged them into one invalid call.
#[test]
fn regression_geminis_parallel_calls_without_index_were_merged_into_one() {
    let r = answer(&sse(&[
        r#"{"id":"g1","model":"gemini-3-pro","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"function-call-1","type":"function","function":{"name":"choir__fs__read","arguments":"{\"path\":\"a.md\"}"},"extra_content":{"google":{"thought_signature":"c2lnbmF0dXJl"}}}]}}]}"#,
        r#"{"id":"g1","model":"gemini-3-pro","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"function-call-2","type":"function","function":{"name":"choir__fs__read","arguments":"{\"path\":\"b.md\"}"}}]}}]}"#,
        r#"{"id":"g1","model":"gemini-3-pro","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}}"#,
        "[DONE]",
    ]));
    let calls = &r.choices[0].message.tool_calls;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].function.arguments, r#"{"path":"a.md"}"#);
    assert_eq!(calls[1].function.arguments, r#"{"path":"b.md"}"#);
    assert_eq!(calls[0].extra_content.as_ref().unwrap()["google"]["thought_signature"], "c2lnbmF0dXJl");
    assert!(calls[1].extra_content.is_none());
    // Sent back as it came, with the call.
    let sent = serde_json::to_value(&calls[0]).unwrap();
    assert_eq!(sent["extra_content"]["google"]["thought_signature"], "c2lnbmF0dXJl");
    assert!(serde_json::to_value(&calls[1]).unwrap().get("extra_content").is_none());
}

/// Regression: Fireworks repeats `id`, `type` and the function's name on
/// every chunk (SillyTavern PR #5948, BerriAI/litellm #8988), as llama.cpp's
/// server did before its PR #13800; they were appended into
/// `choir__fs__writechoir__fs__write…` and an id of 77–180 characters.
#[test]
fn regression_a_repeated_name_and_id_were_concatenated() {
    let chunk = |args: &str| {
        format!(
            r#"{{"id":"f1","choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"call_fw8Qm2","type":"function","function":{{"name":"choir__fs__write","arguments":"{args}"}}}}]}}}}]}}"#
        )
    };
    let chunks = [
        chunk(r#"{\"path\": "#),
        chunk(r#"\"a.md\", "#),
        chunk(r#"\"content\": \"hi\"}"#),
        r#"{"id":"f1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.to_owned(),
    ];
    let r = answer(&sse(&chunks.iter().map(String::as_str).collect::<Vec<_>>()));
    let calls = &r.choices[0].message.tool_calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].function.name, "choir__fs__write");
    assert_eq!(calls[0].id, "call_fw8Qm2");
    assert_eq!(calls[0].function.arguments, r#"{"path": "a.md", "content": "hi"}"#);
}

/// Regression: an id longer than OpenAI accepts (its limit is 40:
/// `string_above_max_length`, agno-agi/agno #5382) entered the history and
/// failed every later turn; it is replaced, the same way every time.
#[test]
fn regression_an_id_past_the_providers_limit_stayed_in_the_history() {
    let long = "call_".repeat(16);
    let text = sse(&[
        &format!(
            r#"{{"id":"x","choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"{long}","function":{{"name":"choir__fs__read","arguments":"{{}}"}}}}]}}}}]}}"#
        ),
        r#"{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
    ]);
    let id = answer(&text).choices[0].message.tool_calls[0].id.clone();
    assert!(id.len() <= answer::MAX_ID && id.starts_with("call_"), "{id}");
    assert_eq!(answer(&text).choices[0].message.tool_calls[0].id, id, "stable");
}

/// Regression: OpenRouter's documented mid-stream error — HTTP 200, an
/// `error` object and `finish_reason: "error"` (openrouter.ai/docs/api/
/// reference/streaming, "Handling errors during streaming") — was taken as
/// a finished answer: the partial text shown as the answer, the provider's
/// message lost, and a complete tool call from that stream executed.
#[test]
fn regression_a_mid_stream_error_was_taken_as_a_finished_answer() {
    let text = sse(&[
        r#"{"id":"o1","choices":[{"index":0,"delta":{"content":"Writing it now"}}]}"#,
        r#"{"id":"o1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"choir__fs__write","arguments":"{\"path\":\"a\",\"content\":\"b\"}"}}]}}]}"#,
        r#"{"id":"o1","provider":"openai","error":{"code":"server_error","message":"Provider disconnected unexpectedly"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
    ]);
    match read(&text) {
        Err(Attempt::Failed(e, _)) => {
            let words = e.user_words();
            assert!(words.contains("Provider disconnected unexpectedly (server_error)"), "{words}");
        }
        Err(Attempt::Fatal(e)) => panic!("not retried: {e}"),
        Err(Attempt::Cut(why)) => panic!("{why}"),
        Ok(a) => panic!("taken as an answer: {a:?}"),
    }
    // OpenAI's bare error event, without choices, is the same.
    let bare = sse(&[
        r#"{"id":"o1","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
        r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}"#,
        r#"{"id":"o1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    ]);
    assert!(matches!(read(&bare), Err(Attempt::Failed(..))));
    // Negative control: without the error event the same stream is an answer.
    let clean = sse(&[
        r#"{"id":"o1","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
        r#"{"id":"o1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    ]);
    assert_eq!(answer(&clean).choices[0].message.content.as_deref(), Some("Hi"));
}

/// A content filter's ending and a model's refusal (OpenAI's
/// `finish_reason: "content_filter"` and `delta.refusal`, openai-python
/// `types/chat/chat_completion_chunk.py`) are what they are: not retried,
/// not a correction, no tool call of theirs runs.
#[test]
fn a_filtered_or_refused_answer_is_reported_as_such() {
    let filtered = sse(&[
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":"Here is"}}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"choir__exec","arguments":"{}"}}]}}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#,
    ]);
    assert!(matches!(read(&filtered), Err(Attempt::Fatal(LlmError::Filtered))));
    let refused = sse(&[
        r#"{"id":"a","choices":[{"index":0,"delta":{"role":"assistant","refusal":"I'm sorry, "}}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"refusal":"I can't help with that."}}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    ]);
    match read(&refused) {
        Err(Attempt::Fatal(e @ LlmError::Refused(_))) => {
            assert_eq!(e.user_words(), "My model declined to answer: I'm sorry, I can't help with that.")
        }
        other => panic!("{:?}", other.map(|a| a.choices[0].message.clone()).map_err(|_| ())),
    }
}

/// The framing the providers document: comments (OpenRouter's `:
/// OPENROUTER PROCESSING`, DeepSeek's `: keep-alive`), reasoning deltas
/// that are never text (`reasoning_content`: DeepSeek; `reasoning`:
/// OpenRouter, Ollama), no `[DONE]` after the finishing chunk, CRLF line
/// ends, an event's data split over several `data:` lines (the SSE
/// specification joins them with a newline), and usage only in Groq's
/// `x_groq.usage` (groq-python `types/chat/chat_completion_chunk.py`).
#[test]
fn the_providers_framing_is_read_as_the_specification_and_their_documents_say() {
    let text = ": OPENROUTER PROCESSING\n\n: keep-alive\n\n\
        data: {\"id\":\"d\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"let me think\"}}]}\r\n\r\n\
        event: message\nid: 7\ndata: {\"id\":\"d\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"more\",\n\
        data: \"content\":\"Answer\"}}]}\n\n\
        data: {\"id\":\"d\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\
        \"x_groq\":{\"id\":\"req_1\",\"usage\":{\"queue_time\":0.01,\"prompt_tokens\":23,\"completion_tokens\":5,\"total_tokens\":28}}}\n\n";
    let mut seen = String::new();
    let r = match settle(stream::read(&mut std::io::Cursor::new(text), &mut |t| {
        seen.push_str(t);
        true
    })) {
        Ok(r) => r,
        Err(_) => panic!("not read"),
    };
    assert_eq!(r.choices[0].message.content.as_deref(), Some("Answer"));
    assert_eq!(seen, "Answer", "no reasoning shown");
    let u = r.usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (23, 5));
}

/// Magistral streams and answers `content` as typed parts, its thinking
/// among them (docs.mistral.ai/capabilities/reasoning; client-python
/// `docs/models/thinkchunk.md`); Mistral answers `"tool_calls": null`
/// (client-python `docs/models/assistantmessage.md`). Regression: a whole
/// answer of either shape failed the job as "not a valid chat completion".
#[test]
fn regression_mistral_null_tool_calls_and_content_parts_were_not_a_chat_completion() {
    let r = answer(&sse(&[
        r#"{"id":"m","choices":[{"index":0,"delta":{"role":"assistant","content":[{"type":"thinking","thinking":[{"type":"text","text":"hmm"}]}]}}]}"#,
        r#"{"id":"m","choices":[{"index":0,"delta":{"content":[{"type":"text","text":"Paris."}]},"finish_reason":"stop"}]}"#,
    ]));
    assert_eq!(r.choices[0].message.content.as_deref(), Some("Paris."));
    let body = br#"{"id":"m2","object":"chat.completion","model":"mistral-large-latest","created":1,
        "choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","tool_calls":null,"prefix":false,
        "content":[{"type":"thinking","thinking":[{"type":"text","text":"so"}],"closed":true},{"type":"text","text":"Paris."}]}}],
        "usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;
    let r = whole(body).ok().unwrap();
    assert_eq!(r.choices[0].message.content.as_deref(), Some("Paris."));
    assert!(r.choices[0].message.tool_calls.is_empty());
    // A provider's error in place of the answer is a failed attempt, saying why.
    let err = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
    assert!(matches!(whole(err), Err(Attempt::Failed(LlmError::Provider(m), _)) if m.contains("Rate limit reached")));
}

/// A line longer than any chunk is refused, not buffered without end.
#[test]
fn a_line_without_end_is_bounded() {
    let huge = format!("data: {{\"x\":\"{}", "a".repeat(stream::MAX_LINE + 10));
    assert!(matches!(read(&huge), Err(Attempt::Fatal(LlmError::Malformed(m))) if m.contains("longer than")));
}

/// A stand-in for choird whose model thinks for `think` before answering.
fn slow_socket(dir: &std::path::Path, think: Duration) -> std::path::PathBuf {
    use std::io::{BufReader, Write};
    let path = dir.join("slow.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                while crate::rpc::read_request(&mut reader).is_some() {
                    std::thread::sleep(think);
                    let events = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"},\"finish_reason\":\"stop\"}]}\n\n";
                    let out = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n{events}",
                        events.len()
                    );
                    if conn.write_all(out.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    path
}

/// Regression: `agent cancel` did not stop a lane waiting for its model;
/// the lane waited for the whole answer (and its retries) first.
#[test]
fn regression_a_cancel_did_not_stop_a_lane_waiting_for_its_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = slow_socket(dir.path(), Duration::from_secs(20));
    let llm = Llm::new(Arc::new(Rpc::new(&crate::rpc::Endpoint::Unix(path), "t".into())));
    let cancel = Arc::new(Cancel::new());
    let setter = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        setter.set();
    });
    let started = std::time::Instant::now();
    let r = llm.stream("edge", None, &hello(), &mut |_| {}, Some(&cancel));
    assert!(matches!(r, Err(LlmError::Cancelled)), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "waited {:?}", started.elapsed());
    // Negative control: not cancelled, the same wait ends in the answer.
    let dir = tempfile::tempdir().unwrap();
    let path = slow_socket(dir.path(), Duration::from_millis(300));
    let llm = Llm::new(Arc::new(Rpc::new(&crate::rpc::Endpoint::Unix(path), "t".into())));
    let r = llm.stream("edge", None, &hello(), &mut |_| {}, Some(&Cancel::new())).unwrap();
    assert_eq!(r.choices[0].message.content.as_deref(), Some("late"));
}

/// A lane waiting for its model used to wake every 50 ms to look at its
/// cancel flag: twenty wake-ups a second of thinking, on every turn and
/// every core job's step. Now it sleeps until the answer or a cancel comes.
#[test]
fn regression_a_lane_woke_every_50_ms_while_its_model_thought() {
    let dir = tempfile::tempdir().unwrap();
    let path = slow_socket(dir.path(), Duration::from_millis(1_000));
    let llm = Llm::new(Arc::new(Rpc::new(&crate::rpc::Endpoint::Unix(path), "t".into())));
    let cancel = Cancel::new();
    let before = wake_ups();
    let r = llm.stream("edge", None, &hello(), &mut |_| {}, Some(&cancel)).unwrap();
    let woke = wake_ups() - before;
    assert_eq!(r.choices[0].message.content.as_deref(), Some("late"));
    // The answer's hand-overs (its text, its end) and the start of the
    // call's thread; with a look every 50 ms it was twenty more.
    assert!(woke <= 6, "the waiting lane woke {woke} times in a second of thinking");
    // A cancel still ends the wait at once: woken by it, not by a clock.
    let dir = tempfile::tempdir().unwrap();
    let path = slow_socket(dir.path(), Duration::from_secs(20));
    let llm = Llm::new(Arc::new(Rpc::new(&crate::rpc::Endpoint::Unix(path), "t".into())));
    let cancel = Arc::new(Cancel::new());
    let setter = cancel.clone();
    let before = wake_ups();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        setter.set();
    });
    let r = llm.stream("edge", None, &hello(), &mut |_| {}, Some(&cancel));
    let woke = wake_ups() - before;
    t.join().unwrap();
    assert!(matches!(r, Err(LlmError::Cancelled)), "{r:?}");
    assert!(woke <= 6, "the waiting lane woke {woke} times before its cancel");
}

/// A stream that ends on an error event (choird's own, when the endpoint
/// went silent mid-answer, or a provider's) is that error, not a cut.
#[test]
fn a_stream_ending_on_an_error_event_is_that_error_not_a_cut() {
    let text = sse(&[
        r#"{"id":"s","choices":[{"index":0,"delta":{"content":"first"}}]}"#,
        r#"{"error":{"message":"the edge model's endpoint was silent for more than 1 s","type":"choir_relay"}}"#,
    ]);
    match read(&text) {
        Err(Attempt::Failed(e, _)) => assert!(e.user_words().contains("silent for more than 1 s"), "{e}"),
        _ => panic!("not the error"),
    }
    // Negative control: without the error event it is a cut.
    let cut = sse(&[r#"{"id":"s","choices":[{"index":0,"delta":{"content":"first"}}]}"#]);
    assert!(matches!(read(&cut), Err(Attempt::Cut(_))));
}

/// DeepSeek's thinking mode requires a tool turn's `reasoning_content`
/// back with the turn (api-docs.deepseek.com/guides/thinking_mode): it is
/// kept on the turn's first call, never shown; a turn without calls keeps
/// nothing.
#[test]
fn a_tool_turns_reasoning_content_is_kept_to_go_back_and_never_shown() {
    let mut shown = String::new();
    let text = sse(&[
        r#"{"id":"d","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"I need "}}]}"#,
        r#"{"id":"d","choices":[{"index":0,"delta":{"reasoning_content":"the file."}}]}"#,
        r#"{"id":"d","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"choir__fs__read","arguments":"{}"}}]}}]}"#,
        r#"{"id":"d","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
    ]);
    let r = match settle(stream::read(&mut std::io::Cursor::new(text), &mut |t| {
        shown.push_str(t);
        true
    })) {
        Ok(r) => r,
        Err(_) => panic!("not read"),
    };
    assert!(shown.is_empty(), "{shown}");
    let extra = r.choices[0].message.tool_calls[0].extra_content.clone().unwrap();
    assert_eq!(extra["deepseek"]["reasoning_content"], "I need the file.");
    let plain = answer(&sse(&[
        r#"{"id":"d","choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":"Hi"},"finish_reason":"stop"}]}"#,
    ]));
    assert_eq!(plain.choices[0].message.content.as_deref(), Some("Hi"));
}

/// A stand-in for choird's agent socket that streams `deltas` (each its own
/// event and chunk, `gap` apart) and ends the answer.
fn delta_socket(dir: &std::path::Path, deltas: Vec<String>, gap: Duration) -> std::path::PathBuf {
    use std::io::{BufReader, Write};
    let path = dir.join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let Some(Ok(conn)) = listener.incoming().next() else { return };
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut conn = conn;
        if crate::rpc::read_request(&mut reader).is_none() {
            return;
        }
        let chunk = |w: &mut std::os::unix::net::UnixStream, event: &str| {
            let _ = write!(w, "{:x}\r\n{event}\r\n", event.len());
        };
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        );
        for d in &deltas {
            let event = serde_json::json!({"id": "c", "choices": [{"index": 0, "delta": {"content": d}, "finish_reason": null}]});
            chunk(&mut conn, &format!("data: {event}\n\n"));
            std::thread::sleep(gap);
        }
        let end = serde_json::json!({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        chunk(&mut conn, &format!("data: {end}\n\ndata: [DONE]\n\n"));
        let _ = write!(conn, "0\r\n\r\n");
    });
    path
}

/// Streams `deltas` `gap` apart through the client: the lane's text
/// hand-overs (each one a wake-up of the lane), their text joined, the
/// answer's content and how long the call took.
fn stream_deltas(deltas: Vec<String>, gap: Duration) -> (usize, String, Option<String>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let path = delta_socket(dir.path(), deltas, gap);
    let llm = Llm::new(Arc::new(Rpc::new(&crate::rpc::Endpoint::Unix(path), "t".into())));
    let (mut handed, mut text) = (0, String::new());
    let started = std::time::Instant::now();
    let answer = llm
        .stream(
            "edge",
            None,
            &hello(),
            &mut |t| {
                handed += 1;
                text.push_str(t);
            },
            None,
        )
        .unwrap();
    (handed, text, answer.choices[0].message.content.clone(), started.elapsed())
}

/// A provider streams a token or a few per event; each event's text used
/// to be handed to the lane on its own, a wake-up of the lane thread per
/// event (300 for this answer). Now what arrives within `TEXT_EVERY` goes
/// over at once, and all of it arrives, in order.
#[test]
fn streamed_text_reaches_the_lane_a_few_times_an_answer_not_once_an_event() {
    let deltas: Vec<String> = (0..300).map(|i| format!("w{i} ")).collect();
    let whole: String = deltas.concat();
    let (handed, text, content, took) = stream_deltas(deltas, Duration::ZERO);
    assert_eq!(content.as_deref(), Some(whole.as_str()));
    assert_eq!(text, whole, "the lane was handed every piece, in order");
    let bound = 2 + (took.as_millis() / TEXT_EVERY.as_millis()) as usize;
    assert!(handed <= bound, "{handed} hand-overs for 300 events in {took:?} (at most {bound})");
    // The control: text that streams slowly still reaches the lane while
    // the model writes, not only at the end.
    let slow: Vec<String> = (0..4).map(|i| format!("s{i} ")).collect();
    let (handed, text, _, _) = stream_deltas(slow, TEXT_EVERY * 2);
    assert_eq!(text, "s0 s1 s2 s3 ");
    assert!(handed >= 3, "slow text was held back until the end: {handed} hand-over(s)");
}
