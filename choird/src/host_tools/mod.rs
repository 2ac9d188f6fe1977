//! Host tools (R-TOOL-5b): the tools choird runs for agents through
//! EXECUTE_HOST_TOOL, each in a folder or file of its own here — agent
//! memory ([`memory`]), the web ([`web`], with its browser, [`browser`]),
//! mail ([`mail`]), Notion ([`notion`]) and voice ([`speech`]). One registry; each tool is a type implementing
//! [`HostTool`] (its manifest, its status for an agent, and `execute`), and
//! everything else lives here, once: which tools an agent is served
//! (INIT_HELLO's `bindings.host_tools` and their manifests), validation of
//! the input against the manifest, the audit record of every call, and
//! **at-most-once execution** of tools whose manifest says they are not
//! idempotent.
//!
//! Adding a host tool is one file (a type implementing [`HostTool`]) and one
//! registration line in `serve.rs` (see docs/host-tools.md).
//!
//! **Invariant:** a call of a non-idempotent host tool runs at most once per
//! `(agent, call_id)`: the call is claimed in `host_calls` before it runs; a
//! repeat gets the stored outcome, or — when the first run's outcome was
//! never stored (choird died meanwhile) — a refusal saying it will not run
//! again. Rate limits are the verb's (`EXECUTE_HOST_TOOL` is charged to the
//! agent's verb bucket before its body is read).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use choir_common::ids::AgentId;
use choir_common::manifest::ToolManifest;
use choir_common::rpc::ExecuteHostToolRequest;
use serde_json::{json, Value};

use crate::config::Config;
use crate::error::Error;
use crate::http::Caller;
use crate::secrets::Secrets;
use crate::shared::Shared;
use crate::store::host_calls::Claim;

pub mod browser;
pub mod mail;
pub mod mcp;
pub mod memory;
pub mod notion;
pub mod speech;
#[cfg(feature = "test-tools")]
pub mod test_echo;
pub mod web;

/// A host tool's status for one agent (R-TOOL-6): the one definition both
/// binaries use.
pub use choir_common::tool_status::ToolStatus;

/// Why choird does not run `name` for `agent`, whatever the agent says:
/// the tool is not served to it (missing configuration or secret), or the
/// operator's tool policy (`agents.<id>.tools`) turns it off. The agent
/// applies the same policy first; this is the check an agent binary cannot
/// skip.
fn refusal(config: &Config, secrets: &Secrets, agent: &AgentId, name: &str, r: &Registered) -> Option<Error> {
    if let ToolStatus::Available(why) = r.tool.status(config, secrets, agent) {
        return Some(Error::NotImplemented(format!("{name} is not served: {why}")));
    }
    let why = config.agents.get(agent).and_then(|a| a.tools.refusal(name))?;
    Some(Error::Forbidden(why))
}

/// One call, as a tool sees it: the agent it runs for (from its session,
/// never from the request) and the validated input.
pub struct HostCall<'a> {
    /// The calling agent.
    pub caller: &'a Caller,
    /// The tool's name (one type may serve several).
    pub tool: &'a str,
    /// The calling lane.
    pub lane: &'a str,
    /// The model's call id.
    pub call_id: Option<&'a str>,
    /// The input, validated against the manifest when there is one.
    pub input: &'a Value,
}

/// A tool choird runs for agents.
pub trait HostTool: Send + Sync {
    /// The name agents call it by.
    fn name(&self) -> &str;
    /// Its manifest; `None` for the host half of an agent's built-in tool
    /// (e.g. `choir.memory.compact`), whose input the tool checks itself.
    fn manifest(&self) -> Option<ToolManifest>;
    /// Its status for `agent` under this config.
    fn status(&self, config: &Config, secrets: &Secrets, agent: &AgentId) -> ToolStatus;
    /// Readies whatever the agent needs before its first call (at INIT_HELLO).
    fn prepare(&self, _agent: &AgentId) -> Result<(), Error> {
        Ok(())
    }
    /// Runs one call.
    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error>;
    /// Tries the tool's connection for `agent` on demand (a login, a
    /// `users/me`), for `choirctl tools check`: what worked, or why not.
    fn check(&self, _agent: &AgentId) -> Result<String, Error> {
        Err(Error::NotImplemented(format!("{} has nothing to check", self.name())))
    }
    /// Stops whatever the tool started (choird is shutting down).
    fn stop(&self) {}
    /// What the audit record of a call adds beyond tool, lane, call id and
    /// time (e.g. a post's destination and status). Never a secret.
    fn audit_detail(&self, _input: &Value, _result: &Result<Value, Error>) -> Value {
        Value::Null
    }
}

struct Registered {
    tool: Arc<dyn HostTool>,
    validator: Option<jsonschema::Validator>,
    idempotent: bool,
    /// `side_effect: external`: every call is audited, beyond any quota.
    external: bool,
}

/// Host tools that differ per agent (an agent's MCP servers reached over
/// HTTP, [`mcp`]): looked up by name for the calling agent when no tool of
/// that name is registered for all.
pub trait PerAgentTools: Send + Sync {
    /// The tools `agent` has, with their manifests.
    fn served(&self, agent: &AgentId) -> Vec<(String, Option<ToolManifest>)>;
    /// The tool `name` of `agent`, if it has one.
    fn tool(&self, agent: &AgentId, name: &str) -> Option<Arc<dyn HostTool>>;
    /// Readies them at INIT_HELLO.
    fn prepare(&self, agent: &AgentId);
    /// Reads the source of `agent`'s tools named `source` again now (an MCP
    /// server's catalog), filing what changed; what it found.
    fn refresh(&self, agent: &AgentId, source: &str) -> Result<String, Error>;
}

/// The host tools choird serves.
pub struct Registry {
    shared: Arc<Shared>,
    tools: BTreeMap<String, Registered>,
    /// Tools of an agent's own (its MCP servers over HTTP).
    per_agent: Option<Box<dyn PerAgentTools>>,
}

/// Why a tool cannot be registered.
#[derive(Debug, thiserror::Error)]
#[error("host tool {name}: {reason}")]
pub struct RegistryError {
    name: String,
    reason: String,
}

impl Registry {
    /// An empty registry.
    pub fn new(shared: Arc<Shared>) -> Registry {
        Registry { shared, tools: BTreeMap::new(), per_agent: None }
    }

    /// Serves each agent's own tools through `tools` too.
    pub fn set_per_agent(&mut self, tools: Box<dyn PerAgentTools>) {
        self.per_agent = Some(tools);
    }

    /// Registers a tool (its manifest validated, its schema compiled).
    pub fn register(&mut self, tool: Arc<dyn HostTool>) -> Result<(), RegistryError> {
        let name = tool.name().to_owned();
        let err = |reason: String| RegistryError { name: name.clone(), reason };
        if self.tools.contains_key(&name) {
            return Err(err("registered twice".into()));
        }
        let (validator, idempotent, external) = match tool.manifest() {
            Some(m) => {
                m.validate().map_err(|e| err(e.to_string()))?;
                if m.llm.name != name {
                    return Err(err(format!("its manifest names {}", m.llm.name)));
                }
                let v = jsonschema::validator_for(&m.llm.parameters).map_err(|e| err(e.to_string()))?;
                let external = m.runtime.reaches_outside();
                (Some(v), m.runtime.idempotent, external)
            }
            None => (None, true, false),
        };
        self.tools.insert(name, Registered { tool, validator, idempotent, external });
        Ok(())
    }

    /// The tools `agent` is served (connected or system), with their
    /// manifests where they have one.
    pub fn served(&self, agent: &AgentId) -> Vec<(String, Option<ToolManifest>)> {
        let (config, secrets) = (self.shared.config(), self.shared.secrets());
        let mut served: Vec<(String, Option<ToolManifest>)> = self
            .tools
            .iter()
            .filter(|(name, r)| refusal(&config, &secrets, agent, name, r).is_none())
            .map(|(name, r)| (name.clone(), r.tool.manifest()))
            .collect();
        let permitted = |name: &str| config.agents.get(agent).is_some_and(|a| a.tools.refusal(name).is_none());
        if let Some(own) = &self.per_agent {
            served.extend(own.served(agent).into_iter().filter(|(name, _)| permitted(name)));
        }
        served
    }

    /// One registered tool's manifest, if it has one.
    pub fn manifest(&self, name: &str) -> Option<ToolManifest> {
        self.tools.get(name).and_then(|r| r.tool.manifest())
    }

    /// Every registered tool, with its manifest where it has one.
    pub fn all(&self) -> Vec<(String, Option<ToolManifest>)> {
        self.tools.iter().map(|(name, r)| (name.clone(), r.tool.manifest())).collect()
    }

    /// Every registered tool's status for `agent`.
    pub fn statuses(&self, agent: &AgentId) -> Vec<(String, ToolStatus)> {
        let (config, secrets) = (self.shared.config(), self.shared.secrets());
        self.tools.iter().map(|(n, r)| (n.clone(), r.tool.status(&config, &secrets, agent))).collect()
    }

    /// `choirctl mcp refresh AGENT SERVER`: the agent's own tools' source
    /// read again now (audited).
    pub fn refresh_own(&self, agent: &AgentId, source: &str) -> Result<String, Error> {
        let own = self.per_agent.as_ref().ok_or_else(|| Error::NotFound("no per-agent tools are served".into()))?;
        let result = own.refresh(agent, source);
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        self.shared.audit("admin", Some(agent), "mcp.refresh", outcome, json!({"server": source}));
        result
    }

    /// `choirctl tools check AGENT TOOL`: tries the tool's connection.
    pub fn check(&self, agent: &AgentId, tool: &str) -> Result<String, Error> {
        let Some(r) = self.tools.get(tool) else {
            return Err(Error::NotFound(format!("{} is not a host tool choird serves", crate::http::printable(tool))));
        };
        let (config, secrets) = (self.shared.config(), self.shared.secrets());
        if let ToolStatus::Available(why) = r.tool.status(&config, &secrets, agent) {
            return Err(Error::Conflict(format!("{tool} is not served to {agent}: {why}")));
        }
        let result = r.tool.check(agent);
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        self.shared.audit("admin", Some(agent), "tools.check", outcome, json!({"tool": tool}));
        result
    }

    /// Stops every tool's helpers (a browser, …) at shutdown.
    pub fn stop_all(&self) {
        for r in self.tools.values() {
            r.tool.stop();
        }
    }

    /// Readies every tool served to `agent` (INIT_HELLO).
    pub fn prepare(&self, agent: &AgentId) -> Result<(), Error> {
        let (config, secrets) = (self.shared.config(), self.shared.secrets());
        for r in self.tools.values() {
            if matches!(r.tool.status(&config, &secrets, agent), ToolStatus::System | ToolStatus::Connected) {
                r.tool.prepare(agent)?;
            }
        }
        if let Some(own) = &self.per_agent {
            own.prepare(agent);
        }
        Ok(())
    }

    /// EXECUTE_HOST_TOOL for the authenticated `caller`: validated, run (at
    /// most once when not idempotent), audited.
    pub fn execute(&self, caller: &Caller, req: &ExecuteHostToolRequest) -> Result<Value, Error> {
        let started = Instant::now();
        let result = self.run(caller, req);
        let outcome = match &result {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code().to_owned(),
        };
        let mut detail = json!({"tool": req.tool, "lane": req.lane, "call_id": req.call_id, "ms": started.elapsed().as_millis() as u64});
        if let Some(Value::Object(extra)) = self.tools.get(&req.tool).map(|r| r.tool.audit_detail(&req.input, &result))
        {
            for (k, v) in extra {
                detail[k] = v;
            }
        }
        if self.tools.get(&req.tool).is_some_and(|r| r.external) {
            // An action on the outside world is audited whatever the agent's quota.
            self.shared.audit_always(Some(&caller.agent), "EXECUTE_HOST_TOOL", &outcome, detail);
        } else {
            self.shared.audit("agent-rpc", Some(&caller.agent), "EXECUTE_HOST_TOOL", &outcome, detail);
        }
        result
    }

    fn run(&self, caller: &Caller, req: &ExecuteHostToolRequest) -> Result<Value, Error> {
        // A tool of the agent's own (an MCP tool over HTTP) is registered
        // for this call, from its manifest.
        let own = match (self.tools.contains_key(&req.tool), &self.per_agent) {
            (false, Some(own)) => own.tool(&caller.agent, &req.tool).and_then(|t| {
                let m = t.manifest()?;
                Some(Registered {
                    validator: Some(jsonschema::validator_for(&m.llm.parameters).ok()?),
                    idempotent: m.runtime.idempotent,
                    external: m.runtime.reaches_outside(),
                    tool: t,
                })
            }),
            _ => None,
        };
        let Some(r) = self.tools.get(&req.tool).or(own.as_ref()) else {
            return Err(Error::NotFound(format!(
                "{} is not a host tool choird serves",
                crate::http::printable(&req.tool)
            )));
        };
        let (config, secrets) = (self.shared.config(), self.shared.secrets());
        if let Some(refused) = refusal(&config, &secrets, &caller.agent, &req.tool, r) {
            return Err(refused);
        }
        if let Some(v) = &r.validator {
            let problems: Vec<String> = v.iter_errors(&req.input).map(|e| e.to_string()).collect();
            if !problems.is_empty() {
                return Err(Error::Malformed(format!("invalid arguments: {}", problems.join("; "))));
            }
        }
        let call =
            HostCall { caller, tool: &req.tool, lane: &req.lane, call_id: req.call_id.as_deref(), input: &req.input };
        if r.idempotent {
            return r.tool.execute(&call);
        }
        let Some(call_id) = req.call_id.as_deref().filter(|c| !c.is_empty() && c.len() <= 200) else {
            return Err(Error::Malformed(format!("{} runs at most once per call: send its call_id", req.tool)));
        };
        let store = &self.shared.store;
        match store.claim_host_call(&caller.agent, call_id, &req.tool, &req.input)? {
            Claim::New => {}
            Claim::Done(stored) => {
                log::info!("agent {}: {} {call_id} ran before; its stored outcome is returned", caller.agent, req.tool);
                return match stored {
                    Ok(v) => Ok(v),
                    Err(message) => Err(Error::Invalid(message)),
                };
            }
            Claim::Unfinished => {
                return Err(Error::Conflict(format!(
                    "{} {call_id} was started before and its outcome was never recorded; it runs at most once, so it \
                     will not run again",
                    req.tool
                )))
            }
            Claim::Different => {
                return Err(Error::Conflict(format!(
                    "call id {call_id} was used before for another call; a call id names one call"
                )))
            }
        }
        let result = r.tool.execute(&call);
        let stored = match &result {
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = store.finish_host_call(&caller.agent, call_id, &stored) {
            log::error!("agent {}: the outcome of {} {call_id} was not recorded: {e}", caller.agent, req.tool);
        }
        result
    }
}
