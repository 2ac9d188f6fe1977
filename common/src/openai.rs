//! The OpenAI-compatible chat-completions wire format, as far as Choir uses it
//! (<https://platform.openai.com/docs/api-reference/chat>). The agent builds
//! requests with these types, choird's relay forwards them unchanged apart from
//! the model and the key, and the test fakes answer with them.
//!
//! Unknown response fields are ignored so providers that add fields still work;
//! requests are serialised exactly as declared here (tests assert on them).
//!
//! Answers are read as the providers really send them, not only as OpenAI
//! documents them: `"tool_calls": null` (Mistral), `content` as an array of
//! typed parts (Magistral's `text` and `thinking` parts; only the text is the
//! answer), usage reported beside the standard field (Groq's `x_groq.usage`),
//! and a tool call's `extra_content` (Gemini's `thought_signature`, which must
//! come back with the call in the next request or that request is refused) is
//! kept as it came and sent back as it was.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A `POST /v1/chat/completions` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Model name; the relay replaces it with the lane's configured model.
    pub model: String,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Function tools the model may call (LLM view only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// `"auto"`, `"none"` or `"required"`; absent when there are no tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<String>,
    /// Server-sent events instead of one JSON answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options (`{"include_usage": true}` asks for a final usage chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<Value>,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the agent runtime.
    System,
    /// The human user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The speaker.
    pub role: Role,
    /// Text content; `null` for an assistant message that only calls tools.
    /// An answer whose content is an array of parts is read as the text of
    /// its `text` parts (a model's `thinking` parts are not its answer).
    #[serde(default, deserialize_with = "content_text")]
    pub content: Option<String>,
    /// Tool calls proposed by the model (assistant messages only); `null`
    /// reads as none.
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The model declined to answer, saying this (OpenAI's `refusal`);
    /// never sent back.
    #[serde(default, skip_serializing)]
    pub refusal: Option<String>,
    /// The call this message answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with only text.
    pub fn text(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role, content: Some(content.into()), tool_calls: Vec::new(), tool_call_id: None, refusal: None }
    }

    /// A tool result answering `call_id`.
    pub fn tool_result(call_id: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: Role::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.to_owned()),
            refusal: None,
        }
    }
}

/// Reads `content` as a string, `null`, or an array of typed parts (the
/// text of its `text` parts, joined; `None` when it has none).
fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => None,
        Value::String(s) => Some(s),
        Value::Array(parts) => {
            let text: String = parts
                .iter()
                .filter(|p| p["type"] == "text" || (p.get("type").is_none() && p["text"].is_string()))
                .filter_map(|p| p["text"].as_str())
                .collect();
            (!text.is_empty()).then_some(text)
        }
        other => return Err(serde::de::Error::custom(format!("content is neither text nor parts: {other}"))),
    })
}

/// Reads `null` as an empty list.
fn null_as_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Largest `extra_content` of a tool call kept to be sent back (a Gemini
/// thought signature is a few KiB; Anthropic's thinking blocks, which choird
/// carries there, are as long as the thinking budget allows); a larger one
/// is dropped.
pub const MAX_EXTRA_CONTENT: usize = 1024 * 1024;

/// The prompt tokens a chat completion (or chunk) reports as read from and
/// written to the provider's prompt cache: Anthropic's
/// `cache_read_input_tokens` / `cache_creation_input_tokens` (as choird's
/// translation keeps them), else OpenAI's `prompt_tokens_details.cached_tokens`.
pub fn reported_cache(answer: &Value) -> (u64, u64) {
    let u = [&answer["usage"], &answer["x_groq"]["usage"]].into_iter().find(|u| u.is_object());
    let Some(u) = u else { return (0, 0) };
    let read = u["cache_read_input_tokens"].as_u64().or_else(|| u["prompt_tokens_details"]["cached_tokens"].as_u64());
    (read.unwrap_or(0), u["cache_creation_input_tokens"].as_u64().unwrap_or(0))
}

/// The token counts a chat completion (or its final stream chunk) reports:
/// the standard `usage`, or Groq's `x_groq.usage` when that is where they
/// are. `None` when neither is there.
pub fn reported_usage(answer: &Value) -> Option<Usage> {
    [&answer["usage"], &answer["x_groq"]["usage"]]
        .into_iter()
        .filter(|u| u.is_object())
        .find_map(|u| serde_json::from_value::<Usage>(u.clone()).ok())
        .map(|mut u| {
            if u.total_tokens == 0 {
                u.total_tokens = u.prompt_tokens + u.completion_tokens;
            }
            u
        })
}

/// A function call proposed by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for this call; tool results refer to it.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// Which function and with what arguments.
    pub function: FunctionCall,
    /// Provider data that must come back with the call (Gemini's
    /// `{"google": {"thought_signature": …}}`), kept as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_content: Option<Value>,
}

fn function_type() -> String {
    "function".to_owned()
}

/// Name and JSON-encoded arguments of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Wire name of the tool (see [`crate::ids::wire_tool_name`]).
    pub name: String,
    /// Arguments as a JSON document in a string, exactly as the model produced it.
    pub arguments: String,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's LLM view.
    pub function: FunctionSpec,
}

/// The LLM view of a tool, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionSpec {
    /// Wire name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Schema,
}

/// A tool's JSON Schema as the text a request carries: serialised once,
/// when the tool is registered, and shared, so a request offering the
/// tool copies the text instead of serialising the schema again (every
/// model call offers every tool, most of the request's bytes).
///
/// **Invariant:** the text is one valid JSON value (it comes from a
/// [`Value`] or from a JSON parser). Equal when the JSON is, whatever the
/// spacing.
#[derive(Debug, Clone)]
pub struct Schema(std::sync::Arc<serde_json::value::RawValue>);

impl Schema {
    /// `schema`'s text.
    pub fn new(schema: &Value) -> Schema {
        // Serialising a `Value` cannot fail (its keys are strings, its
        // numbers finite); `null` stands for what cannot happen.
        let raw =
            serde_json::value::to_raw_value(schema).unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned());
        Schema(raw.into())
    }

    /// The schema's JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The schema as a JSON value.
    pub fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Schema) -> bool {
        self.get() == other.get() || matches!((self.value(), other.value()), (Ok(a), Ok(b)) if a == b)
    }
}

impl Serialize for Schema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Schema {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Schema, D::Error> {
        Ok(Schema(std::sync::Arc::<serde_json::value::RawValue>::deserialize(d)?))
    }
}

/// A non-streaming chat-completions response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// Provider's response id.
    #[serde(default)]
    pub id: String,
    /// `"chat.completion"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// Candidate answers; Choir uses the first.
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Token accounting, when the provider reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The fallback model that answered in place of the lane's first (told
    /// by choird's relay, not by the provider); never serialised.
    #[serde(skip)]
    pub fallback: Option<String>,
}

/// One candidate answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Position among the choices.
    #[serde(default)]
    pub index: u32,
    /// The assistant message.
    pub message: ChatMessage,
    /// `stop`, `tool_calls`, `length`, ...
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the request.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Sum of both.
    #[serde(default)]
    pub total_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_goes_out_as_its_value_would_and_equals_the_same_json_however_spaced() {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string", "description": "a \"quoted\" path"}},
                            "required": ["path"], "additionalProperties": false});
        let spec = ToolSpec {
            kind: "function".into(),
            function: FunctionSpec {
                name: "choir_fs_read".into(),
                description: "Reads.".into(),
                parameters: Schema::new(&schema),
            },
        };
        let sent = serde_json::to_string(&spec).unwrap();
        let as_value = format!(
            r#"{{"type":"function","function":{{"name":"choir_fs_read","description":"Reads.","parameters":{}}}}}"#,
            serde_json::to_string(&schema).unwrap()
        );
        assert_eq!(sent, as_value, "the same bytes as the schema's value serialised");
        // Read back, spaced differently: the same schema.
        let spaced = sent.replace(':', " : ").replace(',', " ,\n ");
        let back: ToolSpec = serde_json::from_str(&spaced).unwrap();
        assert_ne!(back.function.parameters.get(), spec.function.parameters.get(), "the text kept as it came");
        assert_eq!(back, spec);
        assert_eq!(back.function.parameters.value().unwrap(), schema);
        // A different schema is not equal.
        let other = Schema::new(&json!({"type": "object"}));
        assert_ne!(other, spec.function.parameters);
    }
}
