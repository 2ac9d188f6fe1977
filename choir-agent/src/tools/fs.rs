//! Built-in workspace file tools: `choir.fs.read` (`file:S`) and
//! `choir.fs.write` (`file:X`). Paths arrive already normalised by the arbiter
//! and are opened through [`crate::workspace::Workspace`], so they cannot leave
//! the workspace.

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::{ExecContext, Tool, ToolError};
use crate::workspace::PathError;

/// Largest file `choir.fs.read` returns.
const READ_CAP: u64 = 1024 * 1024;

fn manifest(v: Value) -> ToolManifest {
    // The built-in manifests are literals checked by the `builtins_validate` test.
    serde_json::from_value(v).unwrap_or_else(|e| panic!("built-in manifest: {e}"))
}

/// Manifest of `choir.fs.read`.
pub fn read_manifest() -> ToolManifest {
    manifest(json!({
        "llm": {
            "name": "choir.fs.read",
            "description": "Read a UTF-8 text file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Path relative to /workspace"}},
                "required": ["path"],
                "additionalProperties": false
            }
        },
        "runtime": {
            "timeout_ms": 10000,
            "locks": [{"resource": "file:{path}", "mode": "S"}],
            "side_effect": "read",
            "idempotent": true,
            "version": "1"
        }
    }))
}

/// Manifest of `choir.fs.write`.
pub fn write_manifest() -> ToolManifest {
    manifest(json!({
        "llm": {
            "name": "choir.fs.write",
            "description": "Write a text file in the workspace, replacing it or appending to it.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to /workspace"},
                    "content": {"type": "string"},
                    "mode": {"type": "string", "enum": ["overwrite", "append"]}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }
        },
        "runtime": {
            "timeout_ms": 10000,
            "locks": [{"resource": "file:{path}", "mode": "X"}],
            "side_effect": "write",
            "idempotent": false,
            "version": "1"
        }
    }))
}

fn path_error(e: PathError) -> ToolError {
    match e {
        PathError::NotFound(_) => ToolError::new("not_found", e.to_string()),
        PathError::Escapes(_) | PathError::Refused { .. } => ToolError::new("path_forbidden", e.to_string()),
        PathError::Io { .. } => ToolError::new("io_error", e.to_string()),
    }
}

fn str_arg<'a>(input: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    input
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::new("invalid_arguments", format!("{key} must be a string")))
}

/// `choir.fs.read`.
pub struct ReadTool;

impl Tool for ReadTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let rel = ctx.workspace.normalize(str_arg(input, "path")?).map_err(path_error)?;
        let bytes = ctx.workspace.read(&rel, READ_CAP).map_err(path_error)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ToolError::new("binary_file", format!("{} is not UTF-8 text", rel.as_str())))?;
        Ok(json!({
            "summary": format!("read {} bytes from {}", text.len(), rel.as_str()),
            "path": rel.as_str(),
            "content": text,
        }))
    }
}

/// `choir.fs.write`.
pub struct WriteTool;

impl Tool for WriteTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let rel = ctx.workspace.normalize(str_arg(input, "path")?).map_err(path_error)?;
        let content = str_arg(input, "content")?;
        let append = input.get("mode").and_then(Value::as_str) == Some("append");
        let mut data = Vec::new();
        if append && ctx.workspace.exists(&rel).map_err(path_error)? {
            data = ctx.workspace.read(&rel, 64 * READ_CAP).map_err(path_error)?;
        }
        data.extend_from_slice(content.as_bytes());
        ctx.workspace.write_atomic(&rel, &data).map_err(path_error)?;
        Ok(json!({
            "summary": format!("{} {} bytes to {}", if append { "appended" } else { "wrote" }, content.len(), rel.as_str()),
            "path": rel.as_str(),
            "bytes": data.len(),
        }))
    }
}
