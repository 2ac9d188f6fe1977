//! Tool manifests: the dual view of a tool (R-TOOL-1). The LLM view is what a
//! model may see; the runtime view is how the arbiter runs the tool and is
//! **never** sent to a model. Both the agent (at start) and choird (at image
//! build and proposal review) validate manifests with [`ToolManifest::validate`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::validate_tool_name;

/// A complete tool manifest as stored in `<name>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolManifest {
    /// What the model sees.
    pub llm: LlmView,
    /// How the arbiter runs it.
    pub runtime: RuntimeView,
}

/// The model-facing part of a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmView {
    /// Canonical dotted name, e.g. `choir.fs.read`.
    pub name: String,
    /// One or two sentences for the model.
    pub description: String,
    /// JSON Schema (an object schema) of the input.
    pub parameters: Value,
}

/// Lock mode on a named resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockMode {
    /// Shared: compatible with other shared holders.
    S,
    /// Exclusive: compatible with nothing.
    X,
}

/// A lock a tool needs while it runs. `resource` may contain `{field}`
/// placeholders filled from the validated input (e.g. `file:{path}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockSpec {
    /// Resource name or template.
    pub resource: String,
    /// Shared or exclusive.
    pub mode: LockMode,
}

/// How a tool affects the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SideEffect {
    /// Observes only.
    Read,
    /// Changes the workspace.
    Write,
    /// Acts outside the workspace (network, messages, money).
    External,
}

/// Which lanes see a tool's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exposure {
    /// Only the edge lane.
    Edge,
    /// Only core jobs.
    Core,
    /// Every lane.
    Both,
    /// No lane (the tool is internal).
    None,
}

/// The arbiter-facing part of a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeView {
    /// Executable for external tools (relative to the manifest's directory);
    /// absent for built-ins.
    #[serde(default)]
    pub exec_path: Option<String>,
    /// Hard execution limit.
    pub timeout_ms: u64,
    /// The whole lockset, acquired atomically.
    #[serde(default)]
    pub locks: Vec<LockSpec>,
    /// Whether the tool needs the network (then it runs on the host).
    #[serde(default)]
    pub network: bool,
    /// Secrets the tool may receive.
    #[serde(default)]
    pub secret_resources: Vec<String>,
    /// Read, write or external.
    pub side_effect: SideEffect,
    /// Whether running it twice equals running it once.
    #[serde(default)]
    pub idempotent: bool,
    /// Manifest version.
    pub version: String,
    /// Lanes that may see the output.
    #[serde(default = "exposure_both")]
    pub exposure: Exposure,
    /// Whether the output is masked from model context (only a summary shown).
    #[serde(default)]
    pub prompt_mask: bool,
}

fn exposure_both() -> Exposure {
    Exposure::Both
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ManifestError {
    /// Dotted path of the offending field.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ToolManifest {
    /// Checks everything that can be checked without the filesystem: the name,
    /// the input schema (a valid JSON Schema describing an object), the timeout
    /// and the lock templates (every placeholder names a string property).
    pub fn validate(&self) -> Result<(), ManifestError> {
        let err = |field: &str, reason: String| ManifestError { field: field.to_owned(), reason };
        validate_tool_name(&self.llm.name).map_err(|e| err("llm.name", e.to_string()))?;
        if self.llm.description.trim().is_empty() {
            return Err(err("llm.description", "must not be empty".into()));
        }
        if self.llm.parameters.get("type").and_then(Value::as_str) != Some("object") {
            return Err(err("llm.parameters", "must be a JSON Schema with \"type\": \"object\"".into()));
        }
        jsonschema::meta::validate(&self.llm.parameters)
            .map_err(|e| err("llm.parameters", format!("not a valid JSON Schema: {e}")))?;
        if self.runtime.timeout_ms == 0 || self.runtime.timeout_ms > 3_600_000 {
            return Err(err("runtime.timeout_ms", "must be between 1 and 3600000".into()));
        }
        for (i, lock) in self.runtime.locks.iter().enumerate() {
            for field in placeholders(&lock.resource).map_err(|r| err(&format!("runtime.locks[{i}].resource"), r))? {
                let ty = self.llm.parameters.pointer(&format!("/properties/{field}/type"));
                if ty.and_then(Value::as_str) != Some("string") {
                    return Err(err(
                        &format!("runtime.locks[{i}].resource"),
                        format!("placeholder {{{field}}} must name a string property of llm.parameters"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The `{field}` placeholders of a lock template, in order.
pub fn placeholders(template: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let end = after.find('}').ok_or_else(|| format!("unclosed '{{' in {template:?}"))?;
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad placeholder {{{name}}} in {template:?}"));
        }
        out.push(name.to_owned());
        rest = &after[end + 1..];
    }
    if rest.contains('}') {
        return Err(format!("stray '}}' in {template:?}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest() -> ToolManifest {
        serde_json::from_value(json!({
            "llm": {"name": "choir.fs.read", "description": "Read a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
            "runtime": {"timeout_ms": 1000, "locks": [{"resource": "file:{path}", "mode": "S"}],
                        "side_effect": "read", "version": "1"}
        }))
        .unwrap()
    }

    #[test]
    fn a_good_manifest_validates() {
        manifest().validate().unwrap();
    }

    #[test]
    fn bad_manifests_name_the_field() {
        let mut m = manifest();
        m.llm.name = "read".into();
        assert_eq!(m.validate().unwrap_err().field, "llm.name");
        let mut m = manifest();
        m.llm.parameters = json!({"type": "object", "properties": {"path": {"type": 7}}});
        assert_eq!(m.validate().unwrap_err().field, "llm.parameters");
        let mut m = manifest();
        m.runtime.locks[0].resource = "file:{nope}".into();
        assert_eq!(m.validate().unwrap_err().field, "runtime.locks[0].resource");
        let mut m = manifest();
        m.runtime.timeout_ms = 0;
        assert_eq!(m.validate().unwrap_err().field, "runtime.timeout_ms");
        let unknown = serde_json::from_value::<ToolManifest>(json!({"llm": {}, "runtime": {}, "extra": 1}));
        assert!(unknown.is_err());
    }
}
