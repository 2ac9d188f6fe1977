//! The tool registry (R-TOOL-1, -2, -6): every tool an agent can call, with its
//! manifest, its input schema compiled once, its implementation and its status.
//!
//! Load order: built-ins, then `<choir>/tools/global/*.json`, then
//! `<choir>/tools/agent/*.json`; an agent tool replaces a global one of the same
//! name, and nothing replaces a built-in. Any bad file fails start-up with the
//! file and the reason. **Invariant:** the registry is immutable after start,
//! and what a model is offered ([`Registry::llm_tools`]) is built from LLM views
//! of `system` and `connected` tools only.

pub mod exec;
pub mod external;
pub mod find;
pub mod fs;
pub mod host;
pub mod lane;
pub mod mcp;
pub mod plan;
pub mod propose;
pub mod search;
pub mod tool;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use choir_common::ids::wire_tool_name;
use choir_common::manifest::{load_tool_layer, ToolManifest};
use choir_common::openai::{FunctionSpec, ToolSpec};
use choir_common::tool_policy::ToolPolicy;

pub use tool::{ExecContext, LaneHooks, Tool, ToolError};

pub use choir_common::tool_status::ToolStatus;

/// A registered tool.
pub struct Registered {
    /// Its manifest.
    pub manifest: ToolManifest,
    /// Its input schema, compiled.
    pub validator: jsonschema::Validator,
    /// Its implementation.
    pub tool: Arc<dyn Tool>,
    /// Status.
    pub status: ToolStatus,
    /// Where it came from (`built-in`, `host` or the manifest file).
    pub source: String,
    /// What the model is shown of it, made once at registration (its
    /// schema shared, not copied, into every request that offers it).
    pub spec: ToolSpec,
    /// Its line in a system prompt's list of tools (`\n- name: the first
    /// sentence of its description`), made once at registration.
    pub summary: String,
}

/// The first sentence of `s` (all of it when it has one sentence): what a
/// prompt's list says of a tool or a skill.
pub fn first_sentence(s: &str) -> &str {
    match s.find(". ") {
        Some(i) => &s[..=i],
        None => s,
    }
}

/// A tool's or a skill's line in a system prompt's list: `\n- name: the
/// first sentence of its description`.
pub fn list_line(name: &str, description: &str) -> String {
    format!("\n- {name}: {}", first_sentence(description))
}

impl Registered {
    /// Whether models may be offered it now: its status offers it and it
    /// is not disabled (an MCP tool its server changed since approval).
    pub fn offered(&self) -> bool {
        self.status.offered() && self.tool.unavailable().is_none()
    }

    /// Whether choird runs it (EXECUTE_HOST_TOOL), so choird can keep a
    /// call that must not run twice to at most once.
    pub fn runs_on_host(&self) -> bool {
        self.source == HOST_SOURCE
    }

    /// Whether a call must never run twice: a host tool choird keeps to at
    /// most once, or an external tool run here that reaches the outside
    /// world and is not idempotent (its intent is committed before it runs,
    /// so a restart finds a call whose outcome is unknown and says it may
    /// have run instead of running it again).
    pub fn at_most_once(&self) -> bool {
        let r = &self.manifest.runtime;
        !r.idempotent && (self.runs_on_host() || (self.source != BUILT_IN_SOURCE && r.reaches_outside()))
    }
}

/// The `source` of the tools built into the agent.
const BUILT_IN_SOURCE: &str = "built-in";

/// The `source` of host tools.
const HOST_SOURCE: &str = "host";

/// A manifest could not be registered.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct RegistryError {
    /// The manifest file (or `built-in`).
    pub file: String,
    /// Why it was refused.
    pub reason: String,
}

/// The operator's tool policy as the registry and `choir.tools.find` share
/// it (replaced whenever choird's dynamic config changes).
pub type SharedPolicy = Arc<parking_lot::RwLock<ToolPolicy>>;

/// All tools, by canonical name.
///
/// **Invariant:** what is offered to the model (names, the `tools` list,
/// discovery) is what the status offers *and* the operator's policy permits.
#[derive(Default)]
pub struct Registry {
    tools: BTreeMap<String, Registered>,
    policy: SharedPolicy,
    mcp: Vec<Arc<mcp::McpServer>>,
}

/// Where MCP servers run and where their catalogs are filed.
pub struct McpSetup {
    /// The directory they run in.
    pub workspace: std::path::PathBuf,
    /// The agent's secrets (each server gets those it declares).
    pub secrets: crate::secrets::SecretStore,
    /// Files what a server lists that is not approved as it is.
    pub host: Option<Arc<dyn mcp::McpHost>>,
}

impl Registry {
    /// The built-in tools only.
    pub fn builtins() -> Result<Registry, RegistryError> {
        let mut r = Registry::default();
        let builtin: Vec<(ToolManifest, Arc<dyn Tool>)> = vec![
            (fs::read_manifest(), Arc::new(fs::ReadTool)),
            (fs::write_manifest(), Arc::new(fs::WriteTool)),
            (search::manifest(), Arc::new(search::SearchTool)),
            (exec::manifest(), Arc::new(exec::ExecTool)),
            (plan::manifest(), Arc::new(plan::PlanTool)),
            // Ranks the registry's tools; rebuilt over the final registry by `load`.
            (find::manifest(), Arc::new(find::FindTool::new(Vec::new(), None, SharedPolicy::default()))),
        ];
        let builtin = builtin.into_iter().chain(lane::tools()).chain(propose::tools());
        for (manifest, tool) in builtin {
            r.insert(BUILT_IN_SOURCE, manifest, tool, ToolStatus::System)?;
        }
        Ok(r)
    }

    /// Built-ins, host tools (run through `host`; connected if choird serves
    /// them, i.e. they are in `served`), and the external tools under
    /// `choir_dir/tools/{global,agent}`. `bound_secrets` are the secret names
    /// bound to this agent. `host_manifests` are the manifests choird sent
    /// for the host tools it serves: one this agent was not built knowing
    /// is registered from it (connected); none replaces a tool already
    /// registered. With `mcp`, the pinned tools of the MCP servers under
    /// `choir_dir/mcp/{global,agent}` too.
    pub fn load(
        choir_dir: &Path,
        bound_secrets: &[String],
        host: Arc<dyn host::HostCaller>,
        served: &[String],
        host_manifests: &[ToolManifest],
        mcp: Option<McpSetup>,
    ) -> Result<Registry, RegistryError> {
        let mut r = Registry::builtins()?;
        for manifest in choir_common::host_tools::manifests() {
            let name = manifest.llm.name.clone();
            let status = ToolStatus::of_host(&name, served);
            r.insert(HOST_SOURCE, manifest, Arc::new(host::HostTool::new(&name, host.clone())), status)?;
        }
        for manifest in host_manifests {
            let name = manifest.llm.name.clone();
            if r.contains(&name) || !served.contains(&name) || manifest.runtime.exec_path.is_some() {
                continue;
            }
            let tool = Arc::new(host::HostTool::new(&name, host.clone()));
            if let Err(e) = r.insert(HOST_SOURCE, manifest.clone(), tool, ToolStatus::Connected) {
                log::warn!("host tool {name} is not offered: its manifest from choird is refused: {}", e.reason);
            }
        }
        for layer in ["global", "agent"] {
            let dir = choir_dir.join("tools").join(layer);
            let loaded =
                load_tool_layer(&dir).map_err(|e| RegistryError { file: e.file.clone(), reason: e.reason.clone() })?;
            for t in loaded {
                let status = ToolStatus::of_external(&t.manifest, bound_secrets);
                let tool = Arc::new(external::ExternalTool::new(t.exec.clone(), t.manifest.llm.name.clone()));
                // A later layer (agent) replaces an earlier one (global) by name.
                r.insert(&t.file.display().to_string(), t.manifest, tool, status)?;
            }
        }
        if let Some(setup) = mcp {
            let (servers, tools) = mcp::load(choir_dir, &setup.workspace, &setup.secrets, setup.host)
                .map_err(|e| RegistryError { file: e.file.clone(), reason: e.reason.clone() })?;
            for (source, manifest, tool) in tools {
                let name = manifest.llm.name.clone();
                if r.contains(&name) {
                    return Err(RegistryError { file: source, reason: format!("{name} is already a tool") });
                }
                let status = ToolStatus::of_external(&manifest, bound_secrets);
                r.insert(&source, manifest, Arc::new(tool), status)?;
            }
            r.mcp = servers;
        }
        if served.iter().any(|s| s == "choir.memory.compact") {
            let compact = r.get("choir.memory.compact").map(|t| t.manifest.clone());
            if let Some(m) = compact {
                r.insert(BUILT_IN_SOURCE, m, lane::compact_with_host(host.clone()), ToolStatus::System)?;
            }
        }
        // Tool discovery over the agent's own offered tools (Choir's are always listed).
        let views: Vec<find::View> = r
            .tools
            .values()
            .filter(|t| t.offered() && !choir_common::manifest::reserved_tool_name(&t.manifest.llm.name))
            .map(|t| find::View {
                name: t.manifest.llm.name.clone(),
                description: t.manifest.llm.description.clone(),
                parameters: t.manifest.llm.parameters.clone(),
            })
            .collect();
        let ranker = served.iter().any(|s| s == find::NAME).then(|| host.clone());
        let find = find::FindTool::new(views, ranker, r.policy.clone());
        r.insert(BUILT_IN_SOURCE, find::manifest(), Arc::new(find), ToolStatus::System)?;
        Ok(r)
    }

    fn insert(
        &mut self,
        source: &str,
        manifest: ToolManifest,
        tool: Arc<dyn Tool>,
        status: ToolStatus,
    ) -> Result<(), RegistryError> {
        let err = |reason: String| RegistryError { file: source.to_owned(), reason };
        manifest.validate().map_err(|e| err(e.to_string()))?;
        let validator =
            jsonschema::validator_for(&manifest.llm.parameters).map_err(|e| err(format!("llm.parameters: {e}")))?;
        let spec = ToolSpec {
            kind: "function".to_owned(),
            function: FunctionSpec {
                name: wire_tool_name(&manifest.llm.name),
                description: manifest.llm.description.clone(),
                parameters: choir_common::openai::Schema::new(&manifest.llm.parameters),
            },
        };
        let summary = list_line(&manifest.llm.name, &manifest.llm.description);
        self.tools.insert(
            manifest.llm.name.clone(),
            Registered { manifest, validator, tool, status, source: source.to_owned(), spec, summary },
        );
        Ok(())
    }

    /// Replaces the operator's tool policy (dynamic config).
    pub fn set_policy(&self, policy: &ToolPolicy) {
        let mut p = self.policy.write();
        if *p != *policy {
            log::info!("tool policy: allow {:?}, deny {:?}", policy.allow, policy.deny);
            *p = policy.clone();
        }
    }

    /// Why the operator's policy refuses `tool` (none: it permits it).
    pub fn policy_refusal(&self, tool: &str) -> Option<String> {
        self.policy.read().refusal(tool)
    }

    fn offers(&self, t: &Registered, policy: &ToolPolicy) -> bool {
        t.offered() && policy.permits(&t.manifest.llm.name)
    }

    /// A tool by canonical name (whatever its status).
    pub fn get(&self, name: &str) -> Option<&Registered> {
        self.tools.get(name)
    }

    /// Whether a tool of this name is registered (whatever its status).
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Names of the tools that may be offered, sorted.
    pub fn names(&self) -> Vec<String> {
        let policy = self.policy.read();
        self.tools.values().filter(|t| self.offers(t, &policy)).map(|t| t.manifest.llm.name.clone()).collect()
    }

    /// The MCP servers whose tools are registered.
    pub fn mcp_servers(&self) -> &[Arc<mcp::McpServer>] {
        &self.mcp
    }

    /// Every tool with its status, for reports.
    pub fn statuses(&self) -> Vec<(String, ToolStatus)> {
        self.tools.values().map(|t| (t.manifest.llm.name.clone(), t.status.clone())).collect()
    }

    /// The OpenAI `tools` list: LLM views of offered tools (restricted to
    /// `only` when given), with wire-safe names. Runtime views never appear.
    pub fn llm_tools(&self, only: Option<&[String]>) -> Vec<ToolSpec> {
        let policy = self.policy.read();
        self.tools
            .values()
            .filter(|t| self.offers(t, &policy))
            .filter(|t| only.is_none_or(|names| names.contains(&t.manifest.llm.name)))
            .map(|t| t.spec.clone())
            .collect()
    }

    /// The lines of a prompt's list of the tools [`Registry::llm_tools`]
    /// offers, in its order.
    pub fn summary(&self, only: Option<&[String]>) -> String {
        let policy = self.policy.read();
        let mut out = String::new();
        for t in self.tools.values().filter(|t| self.offers(t, &policy)) {
            if only.is_none_or(|names| names.contains(&t.manifest.llm.name)) {
                out.push_str(&t.summary);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompts_tool_list_names_what_is_offered_with_its_first_sentence() {
        let r = Registry::builtins().unwrap();
        // What the offer says, line by line: the list is made of the same tools.
        let from_offer = |only: Option<&[String]>| -> String {
            r.llm_tools(only)
                .iter()
                .map(|spec| {
                    let name = choir_common::ids::canonical_tool_name(&spec.function.name).unwrap();
                    format!("\n- {name}: {}", first_sentence(&spec.function.description))
                })
                .collect()
        };
        assert_eq!(r.summary(None), from_offer(None));
        let only = ["choir.fs.read".to_owned(), "choir.exec".to_owned()];
        let listed = r.summary(Some(&only));
        assert_eq!(listed, from_offer(Some(&only)));
        assert!(listed.starts_with("\n- choir.exec: ") && listed.contains("\n- choir.fs.read: "), "{listed}");
        assert_eq!(listed.matches("\n- ").count(), 2, "{listed}");
        assert_eq!(first_sentence("Reads a file. Then more."), "Reads a file.");
        assert_eq!(first_sentence("One sentence"), "One sentence");
    }

    #[test]
    fn builtins_validate_and_match_the_shared_list() {
        let r = Registry::builtins().unwrap();
        assert_eq!(r.names(), choir_common::manifest::BUILTIN_TOOLS);
    }

    #[test]
    fn builtins_declare_whether_their_output_can_carry_text_from_outside() {
        use choir_common::trust::OutputTrust;
        let r = Registry::builtins().unwrap();
        let untrusted: Vec<String> = r
            .names()
            .into_iter()
            .filter(|n| r.get(n).is_some_and(|t| t.manifest.runtime.output_trust == OutputTrust::Untrusted))
            .collect();
        // Workspace files, command output, and job reports that quote them.
        assert_eq!(
            untrusted,
            ["choir.core.status", "choir.exec", "choir.fs.read", "choir.fs.search", "choir.fs.write"]
        );
    }
}
