//! MCP proposals: a new server the operator adds (`{"spec": ServerSpec}`,
//! only through `choirctl mcp add`), and a server's catalog an agent found
//! (`{"server": NAME, "catalog": [entry, ...]}`), which an approval turns
//! into pins ([`choir_common::mcp`]).
//!
//! choird decides for itself: it recomputes every entry's sha256 from the
//! content, classifies each tool as new, changed, unchanged or gone against
//! the pins in `repos/`, reads every string for instruction-like text, and
//! writes a pin only from content whose digest the approver approved, with
//! the approver's own settings (side effect, idempotence, timeout, locks,
//! roles, a description of their own, or leaving a tool out).
//!
//! **Invariant:** nothing an agent sends changes how a server is started:
//! a catalog proposal keeps the server part of the file as it is, and a
//! server part arrives only from the operator.

use std::collections::BTreeMap;
use std::path::PathBuf;

use choir_common::ids::AgentId;
use choir_common::mcp::{
    check_server_name, choir_name, findings, load_server_file, Entry, Pin, ServerFile, ServerSpec, MAX_TOOLS,
};
use choir_common::rpc::ProposalScope;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::home::Home;

/// The layer directory of `scope`'s server files.
fn dir(home: &Home, agent: &AgentId, scope: ProposalScope) -> PathBuf {
    match scope {
        ProposalScope::Global => home.repos().join("global").join("mcp"),
        ProposalScope::Agent => home.repos().join("agents").join(agent.as_str()).join("mcp"),
    }
}

/// The file of server `name` an agent runs: its own layer's, else the
/// global one; with the scope it is in.
pub fn server_file(home: &Home, agent: &AgentId, name: &str) -> Option<(ProposalScope, PathBuf)> {
    [ProposalScope::Agent, ProposalScope::Global]
        .into_iter()
        .map(|scope| (scope, dir(home, agent, scope).join(format!("{name}.json"))))
        .find(|(_, p)| p.is_file())
}

/// The servers an agent runs (its layer replacing the global one by name).
pub fn servers(home: &Home, agent: &AgentId) -> Vec<(ProposalScope, Result<ServerFile, String>)> {
    let mut names: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for scope in [ProposalScope::Agent, ProposalScope::Global] {
        if let Ok(entries) = std::fs::read_dir(dir(home, agent, scope)) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "json") {
                    names.insert(p.file_stem().unwrap_or_default().to_string_lossy().into_owned());
                }
            }
        }
    }
    names
        .into_iter()
        .filter_map(|n| server_file(home, agent, &n))
        .map(|(scope, p)| (scope, load_server_file(&p).map(|l| l.server).map_err(|e| e.to_string())))
        .collect()
}

/// A checked MCP proposal.
pub struct Checked {
    /// What it is, in a line.
    pub subject: String,
    /// Where the file it writes lives.
    pub scope: ProposalScope,
}

/// Checks an MCP proposal. `from_operator`: a new server may be added (only
/// `choirctl mcp add`); an agent's proposal may only be a catalog.
pub fn check(
    home: &Home,
    agent: &AgentId,
    scope: ProposalScope,
    content: &Value,
    from_operator: bool,
) -> Result<Checked, String> {
    if let Some(name) = content.get("remove") {
        let keys: Vec<&String> = content.as_object().map(|o| o.keys().collect()).unwrap_or_default();
        let name = name.as_str().unwrap_or_default();
        if !from_operator || keys != ["remove"] {
            return Err(String::from("an MCP server is removed by the operator (choirctl mcp rm) and nothing else"));
        }
        check_server_name(name)?;
        if !dir(home, agent, scope).join(format!("{name}.json")).is_file() {
            return Err(format!("there is no MCP server {name} in this layer ({})", scope.as_str()));
        }
        return Ok(Checked { subject: format!("mcp server {name} (removed)"), scope });
    }
    if let Some(spec) = content.get("spec") {
        if !from_operator {
            return Err(String::from(
                "an MCP server is added by the operator (choirctl mcp add), never by a proposal from an agent",
            ));
        }
        let keys: Vec<&String> = content.as_object().map(|o| o.keys().collect()).unwrap_or_default();
        let replace = content.get("replace") == Some(&Value::Bool(true));
        if keys != ["spec"] && !(replace && keys == ["replace", "spec"]) {
            return Err(String::from(
                "an MCP server is {\"spec\": {...}} (and \"replace\": true to change one) and nothing else",
            ));
        }
        let spec = parse_spec(spec)?;
        let reach = spec.url.clone().unwrap_or(spec.command.clone());
        match (server_file(home, agent, &spec.name), replace) {
            (Some((_, file)), false) => {
                return Err(format!(
                    "MCP server {} already exists ({}); remove it first (choirctl mcp rm), or change it (choirctl mcp grant)",
                    spec.name,
                    file.display()
                ))
            }
            (Some((at, _)), true) if at != scope => {
                return Err(format!("MCP server {} is in the {} layer, not this one", spec.name, at.as_str()))
            }
            (None, true) => return Err(format!("there is no MCP server {} to change", spec.name)),
            (Some(_), true) => {
                let (_, file) = written(home, agent, content, &BTreeMap::new())?;
                file.validate()?;
                let grants: Vec<&str> = spec.grants.iter().map(|g| g.as_str()).collect();
                return Ok(Checked {
                    subject: format!(
                        "mcp server {} (changed: {reach}; network: {}; grants: {}; its {} pins kept, checked again)",
                        spec.name,
                        if spec.network.is_empty() { "none".to_owned() } else { spec.network.join(", ") },
                        if grants.is_empty() { "none".to_owned() } else { grants.join(", ") },
                        file.tools.len()
                    ),
                    scope,
                });
            }
            (None, false) => {}
        }
        let file = ServerFile { server: spec.clone(), tools: BTreeMap::new() };
        file.validate()?;
        return Ok(Checked { subject: format!("mcp server {} (new: {reach})", spec.name), scope });
    }
    let (name, entries) = catalog(content)?;
    let Some((scope, path)) = server_file(home, agent, &name) else {
        return Err(format!("there is no MCP server {name} for this agent"));
    };
    let current = load_server_file(&path).map_err(|e| format!("the server's file cannot be read: {e}"))?;
    let c = classify(&current.server, &entries);
    Ok(Checked {
        subject: format!(
            "mcp {name}: {} new, {} changed, {} gone, {} unchanged",
            c.new.len(),
            c.changed.len(),
            c.gone.len(),
            c.unchanged.len()
        ),
        scope,
    })
}

fn parse_spec(v: &Value) -> Result<ServerSpec, String> {
    let text = v.to_string();
    let de = &mut serde_json::Deserializer::from_str(&text);
    let spec: ServerSpec =
        serde_path_to_error::deserialize(de).map_err(|e| format!("spec.{}: {}", e.path(), e.inner()))?;
    spec.validate().map_err(|e| format!("spec: {e}"))?;
    Ok(spec)
}

/// The server and the entries of a catalog proposal, checked.
fn catalog(content: &Value) -> Result<(String, Vec<Entry>), String> {
    let keys: Vec<&String> = content.as_object().map(|o| o.keys().collect()).unwrap_or_default();
    if keys != ["catalog", "server"] {
        return Err(String::from("an MCP catalog is {\"server\": NAME, \"catalog\": [...]} and nothing else"));
    }
    let name = content["server"].as_str().unwrap_or_default().to_owned();
    choir_common::mcp::check_server_name(&name)?;
    let listed = content["catalog"].as_array().ok_or_else(|| String::from("catalog: a list of tools"))?;
    if listed.len() > MAX_TOOLS {
        return Err(format!("catalog: at most {MAX_TOOLS} tools"));
    }
    let mut entries: Vec<Entry> = Vec::new();
    let mut names = BTreeMap::new();
    for (i, v) in listed.iter().enumerate() {
        let keys_ok = v.as_object().is_some_and(|o| {
            o.keys().all(|k| matches!(k.as_str(), "name" | "description" | "inputSchema" | "annotations"))
        });
        if !keys_ok {
            return Err(format!("catalog[{i}]: name, description, inputSchema and annotations only"));
        }
        let e = Entry::from_listed(v).map_err(|e| format!("catalog[{i}]: {e}"))?;
        jsonschema::meta::validate(&e.input_schema)
            .map_err(|err| format!("catalog[{i}].inputSchema is not a JSON Schema: {err}"))?;
        let choir = choir_name(&name, &e.name)?;
        if let Some(other) = names.insert(choir.clone(), e.name.clone()) {
            return Err(format!("catalog: tools {other:?} and {:?} would both be {choir}", e.name));
        }
        entries.push(e);
    }
    Ok((name, entries))
}

/// A catalog against the pins.
#[derive(Default)]
struct Classes {
    new: Vec<String>,
    changed: Vec<String>,
    gone: Vec<String>,
    unchanged: Vec<String>,
}

fn classify(current: &ServerFile, entries: &[Entry]) -> Classes {
    let mut c = Classes::default();
    for e in entries {
        match current.tools.get(&e.name) {
            None => c.new.push(e.name.clone()),
            Some(p) if p.sha256 != e.sha256() => c.changed.push(e.name.clone()),
            Some(_) => c.unchanged.push(e.name.clone()),
        }
    }
    for t in current.tools.keys() {
        if !entries.iter().any(|e| e.name == *t) {
            c.gone.push(t.clone());
        }
    }
    c
}

/// What the approver decides for one tool (`choirctl approvals approve
/// --pin TOOL:KEY=VALUE`); unset fields keep the strictest default (or, for
/// an unchanged tool, its current pin).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinChoice {
    /// Leave the tool out (not offered).
    #[serde(default)]
    pub skip: bool,
    /// `read`, `write` or `external`.
    #[serde(default)]
    pub side_effect: Option<choir_common::manifest::SideEffect>,
    /// Whether calling it twice equals once.
    #[serde(default)]
    pub idempotent: Option<bool>,
    /// Its timeout (ms).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The description the model is shown instead of the server's.
    #[serde(default)]
    pub description: Option<String>,
    /// Argument roles (pointer → role).
    #[serde(default)]
    pub roles: Option<BTreeMap<String, choir_common::manifest::Role>>,
    /// Locks.
    #[serde(default)]
    pub locks: Option<Vec<choir_common::manifest::LockSpec>>,
}

/// Parses and checks the approver's choices against the proposal's catalog.
pub fn choices(content: &Value, pins: Option<&Value>) -> Result<BTreeMap<String, PinChoice>, String> {
    let Some(pins) = pins else { return Ok(BTreeMap::new()) };
    let parsed: BTreeMap<String, PinChoice> = serde_json::from_value(pins.clone()).map_err(|e| format!("pins: {e}"))?;
    let listed: Vec<&str> =
        content["catalog"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str()).collect();
    for (tool, choice) in &parsed {
        if !listed.contains(&tool.as_str()) {
            return Err(format!("pins: the proposal lists no tool {tool:?}"));
        }
        if choice.description.as_ref().is_some_and(|d| d.trim().is_empty() || d.len() > 4096) {
            return Err(format!("pins.{tool}.description: 1 to 4096 bytes"));
        }
    }
    Ok(parsed)
}

/// The file a removal deletes (`mcp/<name>.json`), if `content` is one.
pub fn removed(content: &Value) -> Option<String> {
    content.get("remove")?.as_str().filter(|n| check_server_name(n).is_ok()).map(|n| format!("mcp/{n}.json"))
}

/// The server file an approved MCP proposal writes (its path in the
/// proposal's layer, and its content), with the approver's `choices`; for a
/// catalog, built on the server's current file.
pub fn written(
    home: &Home,
    agent: &AgentId,
    content: &Value,
    choices: &BTreeMap<String, PinChoice>,
) -> Result<(String, ServerFile), String> {
    if let Some(spec) = content.get("spec") {
        let spec = parse_spec(spec)?;
        let rel = format!("mcp/{}.json", spec.name);
        // A changed server keeps its pins: each is compared with what it
        // lists again at its next start, as always.
        let tools = match content.get("replace") == Some(&Value::Bool(true)) {
            true => server_file(home, agent, &spec.name)
                .and_then(|(_, p)| load_server_file(&p).ok())
                .map(|l| l.server.tools)
                .ok_or_else(|| format!("there is no MCP server {} to change", spec.name))?,
            false => BTreeMap::new(),
        };
        return Ok((rel, ServerFile { server: spec, tools }));
    }
    let (name, entries) = catalog(content)?;
    let (_, path) = server_file(home, agent, &name).ok_or_else(|| format!("there is no MCP server {name} any more"))?;
    let current = load_server_file(&path).map_err(|e| format!("the server's file cannot be read: {e}"))?;
    let mut next = ServerFile { server: current.server.server.clone(), tools: BTreeMap::new() };
    for e in entries {
        let choice = choices.get(&e.name).cloned().unwrap_or_default();
        if choice.skip {
            continue;
        }
        // An unchanged tool keeps its settings; a new or changed one starts strict.
        let mut pin = match current.server.tools.get(&e.name) {
            Some(p) if p.sha256 == e.sha256() => p.clone(),
            _ => Pin::strict(e.clone()),
        };
        if let Some(v) = choice.side_effect {
            pin.side_effect = v;
        }
        if let Some(v) = choice.idempotent {
            pin.idempotent = v;
        }
        if let Some(v) = choice.timeout_ms {
            pin.timeout_ms = Some(v);
        }
        if let Some(v) = choice.description {
            pin.description = Some(v);
        }
        if let Some(v) = choice.roles {
            pin.roles = v;
        }
        if let Some(v) = choice.locks {
            pin.locks = v;
        }
        next.tools.insert(e.name.clone(), pin);
    }
    next.validate().map_err(|e| format!("the pinned tools are invalid: {e}"))?;
    Ok((format!("mcp/{name}.json"), next))
}

/// What the approver reads: per tool, its state against the pins, its
/// sha256, what the model would be shown, the server's hints (marked as
/// such) and every instruction-like finding.
pub fn render(home: &Home, agent: &AgentId, content: &Value) -> String {
    let mut out = String::new();
    if let Some(rel) = removed(content) {
        return format!("removes {rel}: its tools are no longer offered\n");
    }
    if let Some(spec) = content.get("spec") {
        let how = if spec.get("url").is_some() {
            "reached by choird over HTTP through the agent's egress policy"
        } else {
            "runs inside the agent's container, with a cleared environment"
        };
        out.push_str(&format!(
            "adds MCP server ({how}):\n{}\n",
            serde_json::to_string_pretty(spec).unwrap_or_default()
        ));
        return out;
    }
    let Ok((name, entries)) = catalog(content) else {
        return "(the catalog does not read)\n".into();
    };
    let current = server_file(home, agent, &name).and_then(|(_, p)| load_server_file(&p).ok()).map(|l| l.server);
    let empty = ServerFile {
        server: ServerSpec {
            name: name.clone(),
            command: String::new(),
            url: None,
            auth_secret: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            secrets: Vec::new(),
            timeout_ms: 1,
            network: Vec::new(),
            grants: Vec::new(),
        },
        tools: BTreeMap::new(),
    };
    let current = current.unwrap_or(empty);
    let c = classify(&current, &entries);
    out.push_str(&format!(
        "MCP server {name} lists {} tool(s): pins what is approved; a tool not approved is not offered.\n\
         Default for every new or changed tool: side_effect external, not idempotent, no roles (the strictest\n\
         argument policy); set others with: choirctl approvals approve ID --sha256 … --pin TOOL:KEY=VALUE\n",
        entries.len()
    ));
    for e in &entries {
        let state = if c.new.contains(&e.name) {
            "NEW"
        } else if c.changed.contains(&e.name) {
            "CHANGED since its approval"
        } else {
            "unchanged"
        };
        let clean = choir_common::text::clean;
        out.push_str(&format!(
            "\n== {} ({state}) as {}\n   sha256 {}\n   description: {}\n   inputSchema: {}\n   annotations (the server's hints, not trusted): {}\n",
            clean(&e.name),
            choir_name(&name, &e.name).unwrap_or_default(),
            e.sha256(),
            clean(&e.description),
            clean(&serde_json::to_string(&e.input_schema).unwrap_or_default()),
            clean(&serde_json::to_string(&e.annotations).unwrap_or_default()),
        ));
        if let Some(p) = current.tools.get(&e.name).filter(|p| p.sha256 != e.sha256()) {
            for d in choir_common::mcp::drift(&p.entry, e) {
                out.push_str(&format!("   changed: {}\n", clean(&d)));
            }
        }
        for f in findings(e) {
            out.push_str(&format!("   ⚠ reads like an instruction to the model: {}\n", clean(&f)));
        }
    }
    for g in &c.gone {
        out.push_str(&format!("\n== {g} (GONE: the server no longer lists it; its pin is removed)\n"));
    }
    out
}

/// The manifest of every tool pinned for an agent, with its server.
pub fn manifests(home: &Home, agent: &AgentId) -> Vec<(String, choir_common::manifest::ToolManifest)> {
    servers(home, agent)
        .into_iter()
        .filter_map(|(_, f)| f.ok())
        .flat_map(|f| {
            let granted = f.grant_tools().into_iter().map(|(_, m)| m);
            let all: Vec<_> = f.manifests().into_iter().map(|(_, m)| m).chain(granted).collect();
            all.into_iter().map(move |m| (f.server.name.clone(), m))
        })
        .collect()
}

/// The admin view of one server: its spec and, per pinned tool, its Choir
/// name, sha256 and settings.
pub fn describe(scope: ProposalScope, file: &ServerFile) -> Value {
    let tools: Vec<Value> = file
        .tools
        .iter()
        .map(|(t, p)| {
            json!({
                "tool": t,
                "name": choir_name(&file.server.name, t).unwrap_or_default(),
                "sha256": p.sha256,
                "side_effect": p.side_effect.as_str(),
                "idempotent": p.idempotent,
                "timeout_ms": p.timeout_ms.unwrap_or(file.server.timeout_ms),
                "roles": p.roles,
                "description": p.description.clone().unwrap_or_else(|| p.entry.description.clone()),
                "findings": findings(&p.entry),
            })
        })
        .collect();
    json!({"server": file.server, "scope": scope.as_str(), "tools": tools})
}
