//! The scripted fake's Anthropic side: `POST /v1/messages`
//! (docs.anthropic.com/en/api/messages), answering a scripted step in the
//! Messages API's documented shapes — a whole `message`, or its streaming
//! events (`message_start`, `content_block_start` / `_delta` / `_stop` with
//! `text_delta`, `input_json_delta`, `thinking_delta`, `signature_delta`,
//! `ping`, `message_delta` with the stop reason and cumulative usage,
//! `message_stop`; docs.anthropic.com/en/docs/build-with-claude/streaming),
//! each SSE event with its `event:` line. Errors in its documented shape
//! (`{"type": "error", "error": {"type", "message"}}`).

use serde_json::{json, Value};

use crate::fake_llm::Step;

/// The answer to a Messages request for `step` (the `n`-th answered).
pub fn answer(n: u64, step: Option<Step>, request: &Value) -> (u16, String, Vec<(String, String)>) {
    let error = |status: u16, kind: &str, message: &str| {
        (status, json!({"type": "error", "error": {"type": kind, "message": message}}).to_string(), vec![])
    };
    if request["max_tokens"].as_u64().is_none() || !request["messages"].is_array() {
        return error(400, "invalid_request_error", "max_tokens: Field required");
    }
    let Some(step) = step else { return error(500, "api_error", "the scripted model has no more steps") };
    let model = request["model"].as_str().unwrap_or("claude-scripted").to_owned();
    let mut blocks: Vec<Value> = Vec::new();
    let (stop, calls) = match step {
        Step::Raw { status, body, headers } => return (status, body, headers),
        Step::Text(t) | Step::Ended(t, _) => {
            blocks.push(json!({"type": "text", "text": t}));
            ("end_turn", Vec::new())
        }
        Step::ToolCalls(calls) => ("tool_use", calls),
        Step::Said(t, calls) => {
            blocks.push(json!({"type": "text", "text": t}));
            ("tool_use", calls)
        }
        Step::Thought(thinking, signature, calls) => {
            blocks.push(json!({"type": "thinking", "thinking": thinking, "signature": signature}));
            ("tool_use", calls)
        }
        other => return error(500, "api_error", &format!("no Anthropic shape for {other:?}")),
    };
    for (i, (name, args)) in calls.iter().enumerate() {
        let input: Value = serde_json::from_str(args).unwrap_or(json!({}));
        blocks.push(json!({"type": "tool_use", "id": format!("toolu_{n:02}{i:02}"),
                           "name": choir_common::ids::wire_tool_name(name), "input": input}));
    }
    let usage = json!({"input_tokens": 20, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 300});
    let id = format!("msg_scripted_{n}");
    if request["stream"] != true {
        let message = json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": blocks,
                             "stop_reason": stop, "stop_sequence": null, "usage": usage});
        return (200, message.to_string(), vec![]);
    }
    let mut events: Vec<Value> = vec![json!({"type": "message_start", "message": {"id": id, "type": "message",
        "role": "assistant", "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 20, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 300}}})];
    for (index, block) in blocks.iter().enumerate() {
        match block["type"].as_str() {
            Some("text") => {
                events.push(json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}));
                events.push(json!({"type": "ping"}));
                let text: Vec<char> = block["text"].as_str().unwrap_or_default().chars().collect();
                for piece in text.chunks(8) {
                    events.push(json!({"type": "content_block_delta", "index": index,
                                       "delta": {"type": "text_delta", "text": piece.iter().collect::<String>()}}));
                }
            }
            Some("thinking") => {
                events.push(json!({"type": "content_block_start", "index": index,
                                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}}));
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "thinking_delta", "thinking": block["thinking"]}}));
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "signature_delta", "signature": block["signature"]}}));
            }
            _ => {
                events.push(json!({"type": "content_block_start", "index": index, "content_block":
                    {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}));
                let args = block["input"].to_string();
                let (head, tail) = args.split_at(args.len() / 2);
                for part in ["", head, tail] {
                    events.push(json!({"type": "content_block_delta", "index": index,
                                       "delta": {"type": "input_json_delta", "partial_json": part}}));
                }
            }
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 7}}));
    events.push(json!({"type": "message_stop"}));
    let body: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("message"))).collect();
    (200, body, vec![("Content-Type".into(), "text/event-stream".into())])
}
