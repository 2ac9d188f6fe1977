//! Tool manifests: the dual view of a tool (R-TOOL-1). The LLM view is what a
//! model may see; the runtime view is how the arbiter runs the tool and is
//! **never** sent to a model. Both the agent (at start) and choird (at image
//! build and proposal review) validate manifests with [`ToolManifest::validate`].

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::validate_tool_name;
use crate::trust::OutputTrust;

// The reserved names, where manifests have always offered them.
pub use crate::tool_names::{reserved_tool_name, BUILTIN_TOOLS, EDGE_ONLY_TOOLS, PROPOSAL_TOOLS};

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

impl SideEffect {
    /// `read`, `write` or `external`.
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::Read => "read",
            SideEffect::Write => "write",
            SideEffect::External => "external",
        }
    }
}

/// What an argument's value does (the set and its meaning: [`crate::roles`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Where data or an effect goes.
    Destination,
    /// What an effect acts on.
    Target,
    /// Content sent out.
    Payload,
    /// An address the tool fetches from (a URL to open): it discloses
    /// what it carries to whoever serves it.
    Locator,
    /// None of these.
    Inert,
}

impl Role {
    /// `destination`, `target`, `payload` or `inert`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Destination => "destination",
            Role::Target => "target",
            Role::Payload => "payload",
            Role::Locator => "locator",
            Role::Inert => "inert",
        }
    }
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
    /// Whether the output can carry text from outside (`untrusted`, the
    /// default) or is Choir's own (`trusted`); results of untrusted tools are
    /// marked as such wherever they enter a model's context (R-ARB-5).
    #[serde(default, skip_serializing_if = "OutputTrust::is_default")]
    pub output_trust: OutputTrust,
    /// What each argument's value does (pointer → role,
    /// [`crate::roles`]); none declared means the strictest default for an
    /// external tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub roles: BTreeMap<String, Role>,
    /// Pointers into the result whose values the tool itself produces and
    /// no outsider chooses: they vouch for a value though the rest of an
    /// untrusted result does not ([`crate::roles`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_fields: Vec<String>,
    /// Pointers into the result whose values are the user's private data
    /// (an identity document's number, a card, an account, a password):
    /// wherever they go next they carry the `private` label
    /// ([`crate::roles`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private_fields: Vec<String>,
}

impl RuntimeView {
    /// Whether a call reaches the outside world (`side_effect: external`):
    /// such a call holds an exclusive lock, is flagged for audit, and, when
    /// not idempotent, runs at most once. The one place this is derived.
    pub fn reaches_outside(&self) -> bool {
        self.side_effect == SideEffect::External
    }
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
        for pointer in self.runtime.roles.keys() {
            let at = format!("runtime.roles[{pointer:?}]");
            let segments = crate::pointer::split(pointer).map_err(|r| err(&at, r))?;
            if !crate::pointer::schema_has(&self.llm.parameters, &segments) {
                return Err(err(&at, format!("llm.parameters has no argument {pointer:?}")));
            }
        }
        if self.runtime.roles.len() > 64
            || self.runtime.trusted_fields.len() > 64
            || self.runtime.private_fields.len() > 64
        {
            return Err(err("runtime.roles", "at most 64 roles, 64 trusted fields and 64 private fields".into()));
        }
        for (i, pointer) in self.runtime.trusted_fields.iter().enumerate() {
            crate::pointer::split(pointer).map_err(|r| err(&format!("runtime.trusted_fields[{i}]"), r))?;
        }
        for (i, pointer) in self.runtime.private_fields.iter().enumerate() {
            crate::pointer::split(pointer).map_err(|r| err(&format!("runtime.private_fields[{i}]"), r))?;
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

/// An external tool manifest file that passed every check.
#[derive(Debug, Clone)]
pub struct LoadedTool {
    /// The manifest file.
    pub file: PathBuf,
    /// Its executable (next to it).
    pub exec: PathBuf,
    /// The parsed, validated manifest.
    pub manifest: ToolManifest,
}

/// A tool directory could not be used; names the file and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct ToolFileError {
    /// The offending file (or directory).
    pub file: String,
    /// What is wrong.
    pub reason: String,
}

/// Reads and checks one external tool manifest: strict parsing (unknown fields
/// refused, errors name the field), [`ToolManifest::validate`], no built-in
/// name, no network (host tools need EXECUTE_HOST_TOOL), and an executable
/// named by a plain relative path next to the manifest.
pub fn load_tool_file(file: &Path) -> Result<LoadedTool, ToolFileError> {
    let err = |reason: String| ToolFileError { file: file.display().to_string(), reason };
    let text = std::fs::read_to_string(file).map_err(|e| err(e.to_string()))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let manifest: ToolManifest = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        err(if at == "?" || at == "." { format!("not a valid manifest: {inner}") } else { format!("{at}: {inner}") })
    })?;
    manifest.validate().map_err(|e| err(e.to_string()))?;
    let name = &manifest.llm.name;
    if reserved_tool_name(name) {
        return Err(err(format!("{name} is a built-in tool and cannot be replaced")));
    }
    if manifest.runtime.network {
        return Err(err(format!(
            "{name}: runtime.network is true, but tools that need the network run on the host and this agent cannot run them yet"
        )));
    }
    let Some(exec) = &manifest.runtime.exec_path else {
        return Err(err("runtime.exec_path: an external tool must name its executable".into()));
    };
    let rel = Path::new(exec);
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(err(format!("runtime.exec_path: {exec:?} must be a plain path next to the manifest")));
    }
    let exec = file.parent().unwrap_or(Path::new(".")).join(rel);
    let meta = std::fs::metadata(&exec).map_err(|e| err(format!("runtime.exec_path: {}: {e}", exec.display())))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(err(format!("runtime.exec_path: {} is not an executable file", exec.display())));
    }
    Ok(LoadedTool { file: file.to_owned(), exec, manifest })
}

/// Loads every `*.json` manifest of one layer directory (sorted by file name);
/// a missing directory is an empty layer. Two files defining one tool name in
/// a layer are an error.
pub fn load_tool_layer(dir: &Path) -> Result<Vec<LoadedTool>, ToolFileError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| ToolFileError { file: dir.display().to_string(), reason: e.to_string() })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut out = Vec::new();
    for file in files {
        let tool = load_tool_file(&file)?;
        if let Some(prev) = seen.insert(tool.manifest.llm.name.clone(), file.clone()) {
            return Err(ToolFileError {
                file: file.display().to_string(),
                reason: format!("tool {} is also defined by {}", tool.manifest.llm.name, prev.display()),
            });
        }
        out.push(tool);
    }
    Ok(out)
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
    fn output_trust_defaults_to_untrusted_and_is_written_only_when_trusted() {
        let m = manifest();
        assert_eq!(m.runtime.output_trust, OutputTrust::Untrusted, "the safe default");
        assert!(serde_json::to_value(&m).unwrap()["runtime"].get("output_trust").is_none(), "unchanged when written");
        let mut v = serde_json::to_value(&m).unwrap();
        v["runtime"]["output_trust"] = json!("trusted");
        let trusted: ToolManifest = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(trusted.runtime.output_trust, OutputTrust::Trusted);
        assert_eq!(serde_json::to_value(&trusted).unwrap(), v);
        v["runtime"]["output_trust"] = json!("sometimes");
        assert!(serde_json::from_value::<ToolManifest>(v).is_err());
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
