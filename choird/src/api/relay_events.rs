//! A whole chat completion as the events of a streamed one, for an agent
//! that asked for a stream from an endpoint configured not to stream
//! (`stream: false`): one chunk with the text and every tool call (each
//! with its `index`, id, name, arguments and `extra_content`), one with the
//! finish reason and the usage, then `[DONE]` — what an agent reading
//! OpenAI's stream format reads as the same answer.
//!
//! **Invariant:** nothing is added to the answer and nothing of it is lost
//! that the agent reads: text, refusal, tool calls, finish reason, usage,
//! and a provider's `error` in place of the answer.

use serde_json::{json, Value};

/// `answer` (a chat completion) as server-sent events.
pub fn whole_as_events(answer: &Value) -> Vec<u8> {
    let mut out = String::new();
    let mut event = |v: Value| {
        out.push_str("data: ");
        out.push_str(&v.to_string());
        out.push_str("\n\n");
    };
    let (id, model) = (answer["id"].clone(), answer["model"].clone());
    if let Some(error) = answer.get("error").filter(|e| !e.is_null()) {
        event(json!({"id": id, "model": model, "error": error, "choices": []}));
    }
    let choice = &answer["choices"][0];
    let message = &choice["message"];
    let mut delta = json!({"role": "assistant"});
    for field in ["content", "refusal"] {
        if !message[field].is_null() {
            delta[field] = message[field].clone();
        }
    }
    let calls: Vec<Value> = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(index, call)| {
            let mut c = call.clone();
            c["index"] = json!(index);
            c
        })
        .collect();
    if !calls.is_empty() {
        delta["tool_calls"] = Value::Array(calls);
    }
    event(json!({"id": id, "model": model, "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}));
    let finish = if choice["finish_reason"].is_null() { json!("stop") } else { choice["finish_reason"].clone() };
    let mut last = json!({"id": id, "model": model, "object": "chat.completion.chunk",
                          "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
    if let Some(usage) = answer.get("usage").filter(|u| u.is_object()) {
        last["usage"] = usage.clone();
    }
    event(last);
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_answer_becomes_the_events_of_the_same_answer() {
        let answer = json!({"id": "r1", "model": "m", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "On it.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "choir__fs__read", "arguments": "{}"},
                                "extra_content": {"google": {"thought_signature": "sig"}}},
                               {"id": "c2", "type": "function", "function": {"name": "choir__fs__read", "arguments": "{\"path\":\"b\"}"}}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}});
        let text = String::from_utf8(whole_as_events(&answer)).unwrap();
        let events: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(text.ends_with("data: [DONE]\n\n"));
        let delta = &events[0]["choices"][0]["delta"];
        assert_eq!(delta["content"], "On it.");
        assert_eq!(delta["tool_calls"][1]["index"], 1);
        assert_eq!(delta["tool_calls"][1]["function"]["arguments"], "{\"path\":\"b\"}");
        assert_eq!(delta["tool_calls"][0]["extra_content"]["google"]["thought_signature"], "sig");
        assert_eq!(events[1]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events[1]["usage"]["total_tokens"], 12);
    }
}
