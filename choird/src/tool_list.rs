//! Every tool an agent has, for the operator (`choirctl tools list AGENT`):
//! its built-ins, the host tools choird runs (with each one's status for
//! this agent and why it is not served), and the approved external tools of
//! the global and agent layers under `repos/`. Read from config and the
//! repos on disk, so it answers whether the agent runs or not.

use choir_common::admin::{ToolList, ToolRow};
use choir_common::ids::AgentId;
use choir_common::manifest::{load_tool_layer, BUILTIN_TOOLS};

use crate::error::Error;
use crate::host_tools::{Registry, ToolStatus};
use crate::shared::Shared;

/// Every tool name an agent may meet: its list's rows (installed, host,
/// built-in) and the fixed names of choird's and the proposal tools; what a
/// skill or a tool policy may name.
pub fn known_names(
    shared: &Shared,
    host_tools: &Registry,
    agent: &AgentId,
) -> Result<(ToolList, std::collections::BTreeSet<String>), Error> {
    use choir_common::tool_names::{BUILTIN_TOOLS, CHOIRD_TOOLS, HOST_TOOLS, PROPOSAL_TOOLS};
    let tools = list(shared, host_tools, agent)?;
    let fixed = [BUILTIN_TOOLS, HOST_TOOLS, CHOIRD_TOOLS, PROPOSAL_TOOLS].concat();
    let names = tools.tools.iter().map(|t| t.name.clone()).chain(fixed.iter().map(|n| (*n).to_owned())).collect();
    Ok((tools, names))
}

/// The tools of `agent`.
pub fn list(shared: &Shared, host_tools: &Registry, agent: &AgentId) -> Result<ToolList, Error> {
    let config = shared.config();
    let Some(agent_cfg) = config.agents.get(agent) else {
        return Err(Error::NotFound(format!("no agent {agent} in config.json")));
    };
    let mut rows: Vec<ToolRow> = BUILTIN_TOOLS
        .iter()
        .map(|n| ToolRow {
            name: (*n).to_owned(),
            kind: "built-in".into(),
            status: "system".into(),
            why: None,
            runs: "agent".into(),
            source: "built-in".into(),
        })
        .collect();
    for (name, status) in host_tools.statuses(agent) {
        // The host halves of built-ins are listed as those built-ins.
        if rows.iter().any(|r| r.name == name) {
            continue;
        }
        rows.push(ToolRow {
            name,
            kind: "host".into(),
            status: status.label().into(),
            why: status.why().map(str::to_owned),
            runs: "choird".into(),
            source: "choird".into(),
        });
    }
    let repos = shared.home.repos();
    for dir in [repos.join("global").join("tools"), repos.join("agents").join(agent.as_str()).join("tools")] {
        let loaded = load_tool_layer(&dir)
            .map_err(|e| Error::Invalid(format!("{}: {} (the agent would refuse to start)", e.file, e.reason)))?;
        for t in loaded {
            // The agent decides what it offers by the same rule.
            let status = ToolStatus::of_external(&t.manifest, &agent_cfg.secrets);
            let source = t.file.strip_prefix(shared.home.root()).unwrap_or(&t.file).display().to_string();
            // The agent layer replaces the global one by name.
            rows.retain(|r| r.name != t.manifest.llm.name);
            rows.push(ToolRow {
                name: t.manifest.llm.name.clone(),
                kind: "external".into(),
                status: status.label().into(),
                why: status.why().map(str::to_owned),
                runs: "agent".into(),
                source,
            });
        }
    }
    // MCP servers' pinned tools; a catalog waiting for approval says so.
    let pending = shared.store.approvals(Some("pending"), Some(agent), 500).unwrap_or_default();
    for (server, m) in crate::mcp_pins::manifests(&shared.home, agent) {
        let status = ToolStatus::of_external(&m, &agent_cfg.secrets);
        let waiting = pending.iter().find(|(i, _)| i.kind == "mcp" && i.subject.starts_with(&format!("mcp {server}:")));
        let why = match waiting {
            Some((i, _)) => Some(format!(
                "pinned; the server lists a change waiting for approval (proposal {}): a changed tool is off until then",
                i.id
            )),
            None => status.why().map(str::to_owned).or_else(|| Some("pinned".into())),
        };
        rows.push(ToolRow {
            name: m.llm.name.clone(),
            kind: "mcp".into(),
            status: status.label().into(),
            why,
            runs: "agent".into(),
            source: format!("MCP server {server}"),
        });
    }
    let policy = agent_cfg.tools.clone();
    for r in &mut rows {
        if let Some(why) = policy.refusal(&r.name) {
            r.status = "off".into();
            r.why = Some(why);
        }
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ToolList { agent: agent.to_string(), tools: rows, policy })
}

/// An agent's MCP servers (`choirctl mcp list|show`): each server's spec,
/// its pinned tools with their sha256 and settings, and the catalog
/// proposals waiting for a decision.
pub fn mcp(shared: &Shared, agent: &AgentId) -> Result<serde_json::Value, Error> {
    if !shared.config().agents.contains_key(agent) {
        return Err(Error::NotFound(format!("no agent {agent} in config.json")));
    }
    let servers: Vec<serde_json::Value> = crate::mcp_pins::servers(&shared.home, agent)
        .into_iter()
        .map(|(scope, file)| match file {
            Ok(f) => crate::mcp_pins::describe(scope, &f),
            Err(e) => serde_json::json!({"scope": scope.as_str(), "error": e}),
        })
        .collect();
    let pending: Vec<serde_json::Value> = shared
        .store
        .approvals(Some("pending"), Some(agent), 500)?
        .into_iter()
        .filter(|(i, _)| i.kind == "mcp")
        .map(|(i, _)| serde_json::json!({"id": i.id, "subject": i.subject, "sha256": i.sha256}))
        .collect();
    Ok(serde_json::json!({"agent": agent.as_str(), "servers": servers, "pending": pending}))
}

/// `choirctl mcp check`: an HTTP server is asked now (a session of its own,
/// its tools listed and compared with the pins; nothing filed); a stdio one
/// is the agent's to run, so what choird can say of it is said.
pub fn mcp_check(shared: &Shared, agent: &AgentId, server: &str) -> Result<serde_json::Value, Error> {
    let file = crate::mcp_pins::servers(&shared.home, agent)
        .into_iter()
        .filter_map(|(_, f)| f.ok())
        .find(|f| f.server.name == server)
        .ok_or_else(|| {
            Error::NotFound(format!("agent {agent} has no MCP server {}", crate::http::printable(server)))
        })?;
    let (config, secrets) = (shared.config(), shared.secrets());
    let (ok, found) = if file.server.is_http() {
        match crate::host_tools::mcp::probe(&config, &secrets, agent, &file) {
            Ok(found) => (!found.contains(';'), found),
            Err(e) => (false, e),
        }
    } else {
        let runs = match config.runtime {
            crate::config::RuntimeKind::Process if !std::path::Path::new(&file.server.command).is_file() => {
                return Ok(serde_json::json!({"server": server, "ok": false,
                    "found": format!("{} does not exist on this host", file.server.command)}));
            }
            _ => "the agent runs it and compares its catalog with the pins at every start and after every list change",
        };
        (true, format!("{} pinned tool(s); {runs}", file.tools.len()))
    };
    shared.audit(
        "admin",
        Some(agent),
        "mcp.check",
        if ok { "ok" } else { "differs" },
        serde_json::json!({"server": server}),
    );
    Ok(serde_json::json!({"server": server, "ok": ok, "found": found}))
}
