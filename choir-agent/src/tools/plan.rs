//! `choir.plan`: the model says which tools what the user asked needs,
//! before it reads anything from outside. The call does nothing but answer;
//! its meaning is the arbiter's: the plans committed before untrusted
//! content entered the turn are its trusted intent
//! ([`crate::arbiter::intent`]), and a plan made later is refused there.

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::tool::{ExecContext, Tool, ToolError};
pub use choir_common::tool_names::PLAN_TOOL;

/// Most tools one plan may name.
pub const MAX_PLANNED: usize = 64;

/// Its manifest.
pub fn manifest() -> ToolManifest {
    super::fs::builtin_manifest(json!({
        "llm": {"name": PLAN_TOOL,
                "description": "Before you read anything from outside (a page, a mail, a file, a search), name the tools this request needs. A tool that acts outside (sends, posts, pays, books, deletes) and is not in your plan needs a human's confirmation once outside content has been read; a plan cannot be made or widened after that.",
                "parameters": {"type": "object", "properties": {
                    "tools": {"type": "array", "minItems": 1, "maxItems": MAX_PLANNED, "uniqueItems": true,
                              "items": {"type": "string", "minLength": 1, "maxLength": 100},
                              "description": "The tools' names, as offered"},
                    "times": {"type": "object", "maxProperties": MAX_PLANNED,
                              "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 1000},
                              "description": "How many calls of a tool the request needs, when you know (a call beyond that needs a confirmation)"},
                    "why": {"type": "string", "maxLength": 1000, "description": "One line: what the user asked for"}},
                "required": ["tools"], "additionalProperties": false}},
        // Choir's own answer, naming what the model planned.
        "runtime": {"timeout_ms": 1000, "side_effect": "read", "idempotent": true, "version": "1",
                    "output_trust": "trusted"}
    }))
}

/// The implementation: an acknowledgement.
pub struct PlanTool;

impl Tool for PlanTool {
    fn execute(&self, _ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let tools: Vec<&str> = input["tools"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        Ok(json!({"summary": format!("planned: {}", tools.join(", "))}))
    }
}
