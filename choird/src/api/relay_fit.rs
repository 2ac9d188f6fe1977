//! A relayed conversation fitted to the endpoint it goes to: what one
//! provider needs back, another refuses. The agent keeps each provider's
//! round-trip data on the tool call that came with it (`extra_content`);
//! choird puts it where the receiving endpoint wants it, or leaves it out.
//!
//! * Gemini (`preset: gemini`) and endpoints without a preset get the
//!   `google` part of `extra_content` as it came (Gemini's thought
//!   signatures must come back, and a Gemini endpoint configured without its
//!   preset must still work); nothing else of it;
//! * Gemini (`preset: gemini`) gets, on a tool turn's first call that has
//!   no signature (a turn rebuilt from the commit log after a restart, or
//!   another provider's turn of a fallback chain), the placeholder its
//!   documentation gives for history Gemini did not produce
//!   (`skip_thought_signature_validator`; ai.google.dev/gemini-api/docs/
//!   thought-signatures), instead of a refused request;
//! * every other preset gets no `extra_content`: Mistral refuses unknown
//!   fields (422 `extra_forbidden`), and a fallback chain may carry Gemini's
//!   signatures to any of them;
//! * DeepSeek (`preset: deepseek`) gets a tool turn's `reasoning_content`
//!   back on the assistant message, where its thinking mode requires it
//!   (api-docs.deepseek.com/guides/thinking_mode: "The reasoning_content in
//!   the thinking mode must be passed back to the API");
//! * Mistral (`preset: mistral`) gets tool call ids of exactly nine
//!   letters and digits, the only form it accepts (mistralai/client-js #69):
//!   an id of another form (from another provider of the chain) is
//!   replaced, the same way in the call and in its result.
//!
//! **Invariant:** a conversation that needs no change is forwarded as the
//! agent sent it, byte for byte (it is not parsed unless it holds an
//! `extra_content` or goes to Mistral); no provider's round-trip data
//! reaches another provider.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::Preset;

/// Whether `messages` (the raw JSON text) must be fitted for `preset`.
pub fn needed(messages: &str, preset: Option<Preset>) -> bool {
    match preset {
        Some(Preset::Mistral) => true,
        Some(Preset::Gemini) => messages.contains("\"tool_calls\""),
        _ => messages.contains("\"extra_content\""),
    }
}

/// The signature Gemini accepts for a tool turn it did not produce.
const GEMINI_PLACEHOLDER: &str = "skip_thought_signature_validator";

/// Fits `messages` (parsed) for `preset`.
pub fn fit(messages: &mut Value, preset: Option<Preset>) {
    let Some(messages) = messages.as_array_mut() else { return };
    for m in messages {
        let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) else {
            if preset == Some(Preset::Mistral) {
                if let Some(id) = m.get_mut("tool_call_id") {
                    *id = Value::String(mistral_id(id.as_str().unwrap_or_default()));
                }
            }
            continue;
        };
        let mut reasoning = None;
        for c in calls.iter_mut() {
            if let Some(obj) = c.as_object_mut() {
                if let Some(extra) = obj.remove("extra_content") {
                    if let Some(r) = extra["deepseek"]["reasoning_content"].as_str() {
                        reasoning.get_or_insert_with(|| r.to_owned());
                    }
                    if matches!(preset, None | Some(Preset::Gemini)) {
                        // The signature alone: the agent carries it, so
                        // nothing else rides along.
                        if let Some(sig) = extra["google"]["thought_signature"].as_str() {
                            let google = serde_json::json!({"google": {"thought_signature": sig}});
                            obj.insert("extra_content".into(), google);
                        }
                    }
                }
                if preset == Some(Preset::Mistral) {
                    let id = obj.get("id").and_then(Value::as_str).unwrap_or_default();
                    obj.insert("id".into(), Value::String(mistral_id(id)));
                }
            }
        }
        if preset == Some(Preset::Gemini) {
            if let Some(first) = calls.first_mut().and_then(Value::as_object_mut) {
                if !first.contains_key("extra_content") {
                    let google = serde_json::json!({"google": {"thought_signature": GEMINI_PLACEHOLDER}});
                    first.insert("extra_content".into(), google);
                }
            }
        }
        if let (Some(r), Some(Preset::Deepseek), Some(obj)) = (reasoning, preset, m.as_object_mut()) {
            obj.insert("reasoning_content".into(), Value::String(r));
        }
    }
}

/// `id` as Mistral accepts it: kept when it is nine letters and digits,
/// else nine derived from it.
fn mistral_id(id: &str) -> String {
    if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.to_owned();
    }
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    Sha256::digest(id.as_bytes()).iter().take(9).map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conversation() -> Value {
        json!([
            {"role": "user", "content": "read a"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "function-call-1", "type": "function", "function": {"name": "choir__fs__read", "arguments": "{}"},
                 "extra_content": {"google": {"thought_signature": "sig", "cached_content": "forged"},
                                   "deepseek": {"reasoning_content": "I should read a."}}},
                {"id": "Ab3dE6gH9", "type": "function", "function": {"name": "choir__fs__read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "function-call-1", "content": "A"},
            {"role": "tool", "tool_call_id": "Ab3dE6gH9", "content": "B"}
        ])
    }

    #[test]
    fn each_endpoint_gets_what_it_needs_back_and_nothing_it_refuses() {
        let text = conversation().to_string();
        assert!(needed(&text, Some(Preset::Openai)) && needed(&text, None));
        assert!(!needed(r#"[{"role":"user","content":"hi"}]"#, Some(Preset::Openai)), "forwarded as sent");
        assert!(needed(r#"[{"role":"user","content":"hi"}]"#, Some(Preset::Mistral)));

        for preset in [None, Some(Preset::Gemini)] {
            let mut gemini = conversation();
            fit(&mut gemini, preset);
            assert_eq!(gemini[1]["tool_calls"][0]["extra_content"], json!({"google": {"thought_signature": "sig"}}));
            assert!(!gemini.to_string().contains("reasoning"), "{gemini}");
        }

        let mut openai = conversation();
        fit(&mut openai, Some(Preset::Openai));
        assert!(!openai.to_string().contains("extra_content"));
        assert!(openai[1].get("reasoning_content").is_none());
        assert_eq!(openai[1]["tool_calls"][0]["id"], "function-call-1", "ids kept");

        let mut deepseek = conversation();
        fit(&mut deepseek, Some(Preset::Deepseek));
        assert_eq!(deepseek[1]["reasoning_content"], "I should read a.");
        assert!(!deepseek.to_string().contains("extra_content"));

        let mut mistral = conversation();
        fit(&mut mistral, Some(Preset::Mistral));
        let id = mistral[1]["tool_calls"][0]["id"].as_str().unwrap().to_owned();
        assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        assert_eq!(mistral[3 - 1]["tool_call_id"], id.as_str(), "the result follows its call");
        assert_eq!(mistral[1]["tool_calls"][1]["id"], "Ab3dE6gH9", "a Mistral id is kept");
        assert_eq!(mistral[3]["tool_call_id"], "Ab3dE6gH9");

        // A tool turn without its signature, to Gemini: the documented placeholder.
        let mut rebuilt = conversation();
        rebuilt[1]["tool_calls"][0].as_object_mut().unwrap().remove("extra_content");
        assert!(needed(&rebuilt.to_string(), Some(Preset::Gemini)));
        fit(&mut rebuilt, Some(Preset::Gemini));
        assert_eq!(rebuilt[1]["tool_calls"][0]["extra_content"]["google"]["thought_signature"], GEMINI_PLACEHOLDER);
        assert!(rebuilt[1]["tool_calls"][1].get("extra_content").is_none(), "the first call only");
        // Negative control: without the preset, nothing is made up.
        let mut unknown = conversation();
        unknown[1]["tool_calls"][0].as_object_mut().unwrap().remove("extra_content");
        fit(&mut unknown, None);
        assert!(!unknown.to_string().contains("extra_content"));
    }
}
