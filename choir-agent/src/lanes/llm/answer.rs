//! What a model's answer *is*, once read (streamed or whole): the same
//! judgement for both shapes.
//!
//! * A provider's error inside an answer (OpenRouter ends a stream that failed
//!   upstream with `finish_reason: "error"` and an `error` object, HTTP 200;
//!   OpenAI may send a bare `{"error": …}` event) is a failed attempt: nothing
//!   of that answer is used, and the provider's message is kept.
//! * `finish_reason: "content_filter"` and a `refusal` are the model or its
//!   provider declining: reported as such, never retried, never corrected,
//!   and no tool call of that answer runs.
//! * Tool call ids are made what the next request's provider accepts:
//!   `[A-Za-z0-9_-]{1,40}` (OpenAI refuses longer ids with
//!   `string_above_max_length`; a provider or proxy repeating `id` on every
//!   chunk produced ids of 77–180 characters, which then failed every later
//!   turn from the history). Another id is replaced by one derived from it,
//!   the same every time it is read; ids are unique within an answer.
//!
//! **Invariant:** an id longer than [`MAX_ID`] never enters the history.

use std::collections::HashSet;

use choir_common::openai::{ChatResponse, ToolCall};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Longest tool call id kept as the provider gave it (OpenAI's limit).
pub const MAX_ID: usize = 40;

/// Why an answer was not one to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The provider reported an error in place of (or in the middle of) the
    /// answer: its message.
    ProviderError(String),
    /// The provider's content filter stopped the answer.
    Filtered,
    /// The model declined, saying this.
    Refused(String),
}

/// The provider's message in an `error` value (an object with `message`,
/// possibly under `metadata`, or a bare string), cut to 300 characters.
pub fn error_message(error: &Value) -> String {
    let text = match error {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let message = o.get("message").and_then(Value::as_str).unwrap_or("no message");
            match o.get("code").filter(|c| !c.is_null()) {
                Some(Value::String(c)) => format!("{message} ({c})"),
                Some(c) => format!("{message} ({c})"),
                None => message.to_owned(),
            }
        }
        other => other.to_string(),
    };
    clean(&text)
}

/// `text` on one line, every hostile character escaped (controls, bidi
/// overrides, invisible characters), at most 300 characters.
fn clean(text: &str) -> String {
    choir_common::text::clipped(text, 300)
}

/// Judges an assembled answer: `Ok` when it may be acted on (its tool call
/// ids made safe), else why not. `error` is a provider error seen in the
/// answer, if any.
pub fn judge(mut answer: ChatResponse, error: Option<String>) -> Result<ChatResponse, Verdict> {
    let finish = answer.choices.first().and_then(|c| c.finish_reason.clone());
    if let Some(message) = error {
        return Err(Verdict::ProviderError(message));
    }
    if finish.as_deref() == Some("error") {
        return Err(Verdict::ProviderError("the answer ended with an error the provider did not describe".into()));
    }
    if finish.as_deref() == Some("content_filter") {
        return Err(Verdict::Filtered);
    }
    if let Some(said) = answer.choices.first().and_then(|c| c.message.refusal.clone()).filter(|r| !r.trim().is_empty())
    {
        return Err(Verdict::Refused(clean(&said)));
    }
    let response_id = answer.id.clone();
    if let Some(choice) = answer.choices.first_mut() {
        safe_ids(&mut choice.message.tool_calls, &response_id);
    }
    Ok(answer)
}

/// Keeps a tool turn's `reasoning` (DeepSeek's `reasoning_content`, which
/// its thinking mode requires back with the turn) on the turn's first call,
/// as `extra_content.deepseek.reasoning_content`: choird gives it back to an
/// endpoint that wants it and to no other. Never part of the answer's text.
pub fn keep_reasoning(calls: &mut [ToolCall], reasoning: &str) {
    let Some(first) = calls.first_mut() else { return };
    if reasoning.is_empty() || reasoning.len() > choir_common::openai::MAX_EXTRA_CONTENT {
        return;
    }
    let extra = first.extra_content.get_or_insert_with(|| Value::Object(Default::default()));
    if let Some(obj) = extra.as_object_mut() {
        obj.insert("deepseek".into(), serde_json::json!({"reasoning_content": reasoning}));
    }
}

/// Whether `id` is kept as the provider gave it.
fn acceptable(id: &str) -> bool {
    (1..=MAX_ID).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Makes every call's id acceptable and unique within the answer.
pub fn safe_ids(calls: &mut [ToolCall], response_id: &str) {
    let mut taken = HashSet::new();
    for (n, call) in calls.iter_mut().enumerate() {
        if !acceptable(&call.id) || taken.contains(&call.id) {
            let digest = Sha256::digest(format!("{response_id}\n{n}\n{}", call.id).as_bytes());
            call.id = format!("call_{}", &hex::encode(digest)[..24]);
        }
        taken.insert(call.id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use choir_common::openai::FunctionCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall { name: "choir__fs__read".into(), arguments: "{}".into() },
            extra_content: None,
        }
    }

    #[test]
    fn ids_are_kept_when_acceptable_and_replaced_stably_when_not() {
        let long = "call_".repeat(20);
        let mut calls = vec![call("call_abc-1"), call(&long), call(""), call("call_abc-1"), call("a b")];
        safe_ids(&mut calls, "resp");
        assert_eq!(calls[0].id, "call_abc-1", "an acceptable id is kept");
        let mut again = vec![call("call_abc-1"), call(&long), call(""), call("call_abc-1"), call("a b")];
        safe_ids(&mut again, "resp");
        let ids: HashSet<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), 5, "unique within the answer: {calls:?}");
        for (c, a) in calls.iter().zip(&again) {
            assert!(acceptable(&c.id), "{}", c.id);
            assert_eq!(c.id, a.id, "the same answer gives the same ids");
        }
    }

    #[test]
    fn an_error_a_filter_or_a_refusal_is_no_answer_to_act_on() {
        let answer = |finish: &str, refusal: Option<&str>| -> ChatResponse {
            let mut v = serde_json::json!({"id": "r", "choices": [{"index": 0, "finish_reason": finish,
                "message": {"role": "assistant", "content": "partial", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "choir__fs__write", "arguments": "{}"}}]}}]});
            if let Some(r) = refusal {
                v["choices"][0]["message"]["refusal"] = r.into();
            }
            serde_json::from_value(v).unwrap()
        };
        assert!(matches!(judge(answer("error", None), None), Err(Verdict::ProviderError(_))));
        assert_eq!(
            judge(answer("stop", None), Some("upstream died".into())),
            Err(Verdict::ProviderError("upstream died".into()))
        );
        assert_eq!(judge(answer("content_filter", None), None), Err(Verdict::Filtered));
        assert_eq!(
            judge(answer("stop", Some("I can't help with that.")), None),
            Err(Verdict::Refused("I can't help with that.".into()))
        );
        // Negative control: the same answer finished cleanly is acted on.
        assert_eq!(judge(answer("tool_calls", None), None).unwrap().choices[0].message.tool_calls.len(), 1);
    }

    #[test]
    fn a_providers_error_message_is_read_from_its_usual_shapes_and_cut_short() {
        assert_eq!(
            error_message(&serde_json::json!({"code": "server_error", "message": "upstream died"})),
            "upstream died (server_error)"
        );
        assert_eq!(error_message(&serde_json::json!({"code": 502, "message": "bad\ngateway"})), "bad\\ngateway (502)");
        let spoofed = error_message(&serde_json::json!("ok\u{202e}txt.exe"));
        assert!(!spoofed.contains('\u{202e}'), "a bidi override shown as is: {spoofed}");
        assert_eq!(error_message(&serde_json::json!("overloaded")), "overloaded");
        assert_eq!(error_message(&Value::String("x".repeat(1000))).chars().count(), 301);
    }
}
