//! The tool registry (R-TOOL-1, R-TOOL-2): every tool an agent can call, with
//! its manifest and its input schema compiled once at load. Built-ins are
//! registered first; external tools (later) are loaded from `/choir/tools`.
//!
//! **Invariant:** the registry is immutable after start; what a model is
//! offered ([`Registry::llm_tools`]) is built from LLM views only.

pub mod fs;

use std::collections::BTreeMap;
use std::sync::Arc;

use choir_common::ids::wire_tool_name;
use choir_common::manifest::ToolManifest;
use choir_common::openai::{FunctionSpec, ToolSpec};
use serde_json::Value;

use crate::workspace::Workspace;

/// What a tool gets to run with.
pub struct ExecContext<'a> {
    /// The workspace, for path-confined file access.
    pub workspace: &'a Workspace,
}

/// A tool failed while running (not a rejection: the arbiter rejects before).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// Stable code, e.g. `not_found`.
    pub code: String,
    /// For the model.
    pub message: String,
}

impl ToolError {
    /// A tool error.
    pub fn new(code: &str, message: impl Into<String>) -> ToolError {
        ToolError { code: code.to_owned(), message: message.into() }
    }
}

/// A tool implementation.
pub trait Tool: Send + Sync {
    /// Runs with validated input. The result object should carry a `summary`.
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError>;
}

/// A registered tool.
pub struct Registered {
    /// Its manifest.
    pub manifest: ToolManifest,
    /// Its input schema, compiled.
    pub validator: jsonschema::Validator,
    /// Its implementation.
    pub tool: Arc<dyn Tool>,
}

/// A manifest could not be registered.
#[derive(Debug, thiserror::Error)]
#[error("tool {source_name}: {reason}")]
pub struct RegistryError {
    /// Where the manifest came from (file or `built-in`).
    pub source_name: String,
    /// Why it was refused.
    pub reason: String,
}

/// All tools, by canonical name.
#[derive(Default)]
pub struct Registry {
    tools: BTreeMap<String, Registered>,
}

impl Registry {
    /// The built-in tools.
    pub fn builtins() -> Result<Registry, RegistryError> {
        let mut r = Registry::default();
        r.add("built-in", fs::read_manifest(), Arc::new(fs::ReadTool))?;
        r.add("built-in", fs::write_manifest(), Arc::new(fs::WriteTool))?;
        Ok(r)
    }

    /// Validates and adds a tool; a later tool of the same name replaces an
    /// earlier one (agent overrides global).
    pub fn add(&mut self, source: &str, manifest: ToolManifest, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let err = |reason: String| RegistryError { source_name: source.to_owned(), reason };
        manifest.validate().map_err(|e| err(e.to_string()))?;
        let validator =
            jsonschema::validator_for(&manifest.llm.parameters).map_err(|e| err(format!("llm.parameters: {e}")))?;
        self.tools.insert(manifest.llm.name.clone(), Registered { manifest, validator, tool });
        Ok(())
    }

    /// A tool by canonical name.
    pub fn get(&self, name: &str) -> Option<&Registered> {
        self.tools.get(name)
    }

    /// Canonical names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The OpenAI `tools` list for the given names (all when `None`): LLM
    /// views only, with wire-safe names.
    pub fn llm_tools(&self, only: Option<&[String]>) -> Vec<ToolSpec> {
        self.tools
            .values()
            .filter(|t| only.is_none_or(|names| names.contains(&t.manifest.llm.name)))
            .map(|t| ToolSpec {
                kind: "function".to_owned(),
                function: FunctionSpec {
                    name: wire_tool_name(&t.manifest.llm.name),
                    description: t.manifest.llm.description.clone(),
                    parameters: t.manifest.llm.parameters.clone(),
                },
            })
            .collect()
    }
}
