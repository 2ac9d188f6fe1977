//! The OpenAI-compatible chat-completions wire format, as far as Choir uses it
//! (<https://platform.openai.com/docs/api-reference/chat>). The agent builds
//! requests with these types, choird's relay forwards them unchanged apart from
//! the model and the key, and the test fakes answer with them.
//!
//! Unknown response fields are ignored so providers that add fields still work;
//! requests are serialised exactly as declared here (tests assert on them).

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
    #[serde(default)]
    pub content: Option<String>,
    /// Tool calls proposed by the model (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with only text.
    pub fn text(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role, content: Some(content.into()), tool_calls: Vec::new(), tool_call_id: None }
    }

    /// A tool result answering `call_id`.
    pub fn tool_result(call_id: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: Role::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.to_owned()),
        }
    }
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
    /// JSON Schema of the arguments; shared, so offering a registered
    /// tool each step copies no schema (serialized as the schema itself).
    pub parameters: std::sync::Arc<Value>,
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
