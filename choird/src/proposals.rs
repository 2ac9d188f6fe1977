//! Proposals (R-TOOL-8) and how an approved one is applied (R-CTL-1).
//!
//! An agent's meta-tool call arrives as REQUEST_APPROVAL; [`validate`] checks
//! it exactly as image builds and agents check the real thing (a tool
//! manifest as at start-up, a skill against the tools that layer would have,
//! a config change naming existing keys and still parsing), and binds it to
//! the sha256 of its canonical JSON. [`render`] shows a human what it is and
//! what it would replace; [`apply`] writes an approved tool or skill into the
//! repository clone under `repos/` and commits it with git, the approver
//! recorded, or changes `config.json`.
//!
//! **Invariant:** what [`apply`] writes is derived only from content whose
//! sha256 matches the approval (the caller checks before calling), so no
//! byte reaches a repository without a human approving exactly it.

use std::path::{Path, PathBuf};

use choir_common::commit::canonical_json;
use choir_common::ids::AgentId;
use choir_common::manifest::{load_tool_layer, reserved_tool_name, ToolManifest};
use choir_common::rpc::{confirmed_calls, ApprovalRequest, ProposalKind, ProposalScope, MAX_CALLS_CONFIRMED};
use choir_common::skill::{builtin_skill_names, parse_skill, SkillSpec};
use choir_common::tool_layers::known_tool_names;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::home::Home;
use crate::spawn::Cmd;

/// Largest proposal content accepted, in bytes of canonical JSON.
pub const MAX_CONTENT: usize = 256 * 1024;

/// A validated proposal, ready to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// What it is.
    pub kind: ProposalKind,
    /// Where it goes.
    pub scope: ProposalScope,
    /// The tool or skill name, or the config keys.
    pub subject: String,
    /// Canonical JSON of the content (what is hashed, stored and applied).
    pub canonical: String,
    /// sha256 of `canonical`, hex.
    pub sha256: String,
}

/// Why a proposal is refused; the message is for the model that made it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Why an approved proposal could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// git failed.
    #[error("git: {0}")]
    Git(String),
    /// The content no longer applies (e.g. the config moved on).
    #[error("{0}")]
    Stale(String),
}

/// sha256 of a string, hex.
pub fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The repository clone a scope writes to.
pub fn repo_dir(home: &Home, agent: &AgentId, scope: ProposalScope) -> PathBuf {
    match scope {
        ProposalScope::Global => home.repos().join("global"),
        ProposalScope::Agent => home.repos().join("agents").join(agent.as_str()),
    }
}

/// The tool layers an agent's image would carry, for checking skills: the
/// global one, plus the agent's own for an agent-scoped skill.
fn tool_layers(home: &Home, agent: &AgentId, scope: ProposalScope) -> Vec<PathBuf> {
    let mut layers = vec![home.repos().join("global").join("tools")];
    if scope == ProposalScope::Agent {
        layers.push(home.repos().join("agents").join(agent.as_str()).join("tools"));
    }
    layers
}

/// Checks a proposal completely and binds it to its digest. `agent_config`
/// is the proposing agent's current section of `config.json` (as JSON).
pub fn validate(
    home: &Home,
    agent: &AgentId,
    agent_config: &Value,
    req: &ApprovalRequest,
) -> Result<Proposal, Invalid> {
    if req.reason.trim().is_empty() {
        return Err(Invalid("a proposal needs a reason for the human who decides".into()));
    }
    let canonical = canonical_json(&req.content);
    if canonical.len() > MAX_CONTENT {
        return Err(Invalid(format!("the proposal is {} bytes; at most {MAX_CONTENT} are accepted", canonical.len())));
    }
    let mut scope = req.scope;
    let subject = match req.kind {
        ProposalKind::Mcp => {
            let checked = crate::mcp_pins::check(home, agent, req.scope, &req.content, req.lane == OPERATOR_LANE)
                .map_err(Invalid)?;
            // A catalog's pins go where its server's file is.
            scope = checked.scope;
            checked.subject
        }
        ProposalKind::Tool => check_tool(home, agent, req.scope, &req.content)?,
        ProposalKind::Skill => check_skill(home, agent, req.scope, &req.content)?.name,
        ProposalKind::ConfigChange => {
            if req.scope != ProposalScope::Agent {
                return Err(Invalid("a config change concerns the proposing agent only (scope agent)".into()));
            }
            let (keys, _) = changed_config(agent_config, &req.content)?;
            format!("config: {}", keys.join(", "))
        }
        ProposalKind::Call => check_call(&req.content)?,
        ProposalKind::Schedule => {
            if req.scope != ProposalScope::Agent {
                return Err(Invalid("a scheduled job belongs to the proposing agent only (scope agent)".into()));
            }
            check_schedule(&req.content)?
        }
    };
    // A tool or skill exactly as installed would change nothing: not a
    // question for a human.
    let written = files(home, agent, scope, req.kind, &req.content);
    let dir = repo_dir(home, agent, scope);
    if !written.is_empty()
        && written.iter().all(|(rel, text)| std::fs::read_to_string(dir.join(rel)).is_ok_and(|t| t == *text))
    {
        return Err(Invalid(format!("{subject} is already installed exactly so: nothing to approve")));
    }
    Ok(Proposal { kind: req.kind, scope, subject, sha256: digest(&canonical), canonical })
}

/// The lane of a proposal the operator made with choirctl (`tools add`,
/// `mcp add`); choird never takes it from an agent.
pub const OPERATOR_LANE: &str = "operator";

/// A scheduled job proposal (`{"job": JobSpec}`), checked on its own (the
/// daemon checks it against the agent too); its subject names the job and
/// when it fires.
fn check_schedule(content: &Value) -> Result<String, Invalid> {
    let keys: Vec<&String> = content.as_object().map(|o| o.keys().collect()).unwrap_or_default();
    if keys != ["job"] {
        return Err(Invalid("a schedule proposal is {\"job\": {...}} and nothing else".into()));
    }
    let spec: choir_common::schedule::JobSpec = serde_json::from_value(content["job"].clone())
        .map_err(|e| Invalid(format!("the proposed job does not read: {e}")))?;
    crate::schedule::spec::check(&spec).map_err(Invalid)?;
    let when = match (&spec.cron, spec.every_s) {
        (Some(c), _) => format!("cron {c} {}", spec.tz.as_deref().unwrap_or("UTC")),
        (_, Some(s)) => format!("every {s} s"),
        _ => String::new(),
    };
    Ok(format!("schedule: {} ({when})", spec.name))
}

/// Longest a lane waits for a confirmation.
pub const MAX_CONFIRM_S: u64 = 3600;

/// A confirmation request: one exact, named call, or the calls of one turn
/// decided together (`calls`, 2 to [`MAX_CALLS_CONFIRMED`]); returns its
/// subject.
fn check_call(content: &Value) -> Result<String, Invalid> {
    if !content["timeout_s"].as_u64().is_some_and(|t| (1..=MAX_CONFIRM_S).contains(&t)) {
        return Err(Invalid(format!("timeout_s: how long the lane waits, 1 to {MAX_CONFIRM_S} seconds")));
    }
    let group = content.get("calls").is_some();
    if group {
        let n = content["calls"].as_array().map_or(0, Vec::len);
        if !(2..=MAX_CALLS_CONFIRMED).contains(&n) {
            return Err(Invalid(format!("calls: 2 to {MAX_CALLS_CONFIRMED} calls decided together")));
        }
        if content.get("tool").is_some() || content.get("input").is_some() {
            return Err(Invalid("calls: the calls are its elements, with no tool or input beside them".into()));
        }
    }
    let calls = confirmed_calls(content);
    let mut tools: Vec<&str> = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let at = if group { format!("calls[{i}].") } else { String::new() };
        let tool = call["tool"].as_str().unwrap_or_default();
        if choir_common::ids::validate_tool_name(tool).is_err() {
            return Err(Invalid(format!("{at}tool: name the tool the call is of")));
        }
        if !call["input"].is_object() {
            return Err(Invalid(format!("{at}input: the call's arguments, as an object")));
        }
        if !call["call_id"].as_str().is_some_and(|c| !c.is_empty() && c.len() <= 200) {
            return Err(Invalid(format!("{at}call_id: the call's id")));
        }
        if !tools.contains(&tool) {
            tools.push(tool);
        }
    }
    Ok(if group { format!("{} calls: {}", calls.len(), tools.join(", ")) } else { format!("call {}", tools[0]) })
}

fn parse_manifest(v: &Value) -> Result<ToolManifest, Invalid> {
    let text = v.to_string();
    let de = &mut serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        Invalid(format!("manifest.{at}: {}", e.into_inner()))
    })
}

/// The manifest and executable of a tool proposal, checked; returns the name.
fn check_tool(home: &Home, agent: &AgentId, scope: ProposalScope, content: &Value) -> Result<String, Invalid> {
    let manifest = parse_manifest(&content["manifest"])?;
    manifest.validate().map_err(|e| Invalid(format!("manifest: {e}")))?;
    let name = manifest.llm.name.clone();
    if reserved_tool_name(&name) {
        return Err(Invalid(format!("{name} is reserved for a built-in tool; choose another name")));
    }
    if manifest.runtime.network {
        return Err(Invalid(format!(
            "{name}: runtime.network is true; tools that need the network run on the host and cannot be proposed"
        )));
    }
    let exec = exec_name(&manifest)?;
    let Some(script) = content["executable"].as_str() else {
        return Err(Invalid("executable: the executable's text is missing".into()));
    };
    if !script.starts_with("#!") {
        return Err(Invalid("executable: must be a script starting with #! (an interpreter line)".into()));
    }
    if script.contains('\0') {
        return Err(Invalid("executable: must be text".into()));
    }
    let tools = repo_dir(home, agent, scope).join("tools");
    let layer = load_tool_layer(&tools).map_err(|e| Invalid(format!("the existing tools cannot be read: {e}")))?;
    let file = manifest_file_name(&name);
    for t in layer {
        let other_exec = t.exec.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let other_file = t.file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        if t.manifest.llm.name == name {
            continue;
        }
        if other_exec == exec || other_exec == file {
            return Err(Invalid(format!(
                "runtime.exec_path {exec} is already the executable of {}; choose another file name",
                t.manifest.llm.name
            )));
        }
        // `a.b_c` and `a_b.c` would both be written as `a_b_c.json`.
        if other_file == file || other_file == exec {
            return Err(Invalid(format!(
                "{name} would be stored as tools/{file}, which is already the file of {}; choose another name",
                t.manifest.llm.name
            )));
        }
    }
    Ok(name)
}

/// The file a new tool's manifest is written to.
fn manifest_file_name(name: &str) -> String {
    format!("{}.json", name.replace('.', "_"))
}

/// The executable's file name: a plain name next to the manifest.
fn exec_name(manifest: &ToolManifest) -> Result<String, Invalid> {
    let exec = manifest.runtime.exec_path.clone().unwrap_or_default();
    let ok = !exec.is_empty()
        && exec.len() <= 64
        && !exec.starts_with('.')
        && !exec.ends_with(".json")
        && exec.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(exec)
    } else {
        Err(Invalid(format!(
            "manifest.runtime.exec_path {exec:?}: name a file next to the manifest (letters, digits, '_', '-', '.'; not .json)"
        )))
    }
}

/// The skill of a skill proposal, checked against the tools its layer has.
fn check_skill(home: &Home, agent: &AgentId, scope: ProposalScope, content: &Value) -> Result<SkillSpec, Invalid> {
    let spec = parse_skill(&content["skill"].to_string()).map_err(|e| Invalid(format!("skill: {e}")))?;
    if builtin_skill_names().contains(&spec.name) {
        return Err(Invalid(format!("{} is a built-in skill and cannot be replaced; choose another name", spec.name)));
    }
    let known = known_tool_names(&tool_layers(home, agent, scope))
        .map_err(|e| Invalid(format!("the existing tools cannot be read: {e}")))?;
    spec.validate(&|t| known.contains(t)).map_err(|e| Invalid(format!("skill {}: {e}", spec.name)))?;
    Ok(spec)
}

/// The settings an agent may propose to change, with the values allowed:
/// only how it behaves, never what it may reach or spend. Everything else —
/// secret bindings, workspace, network, runtime, resources, models, token
/// and core budgets, autostart, fail-closed time — is the operator's alone
/// and refused at proposal time.
pub const PROPOSABLE_SETTINGS: &[(&str, u64, u64)] =
    &[("max_steps_per_turn", 1, 256), ("retry_budget", 0, 10), ("context_tokens", 1_000, 1_000_000)];

/// `tool_exposure` is proposable too (`all` or `find`).
const PROPOSABLE_EXPOSURE: &str = "tool_exposure";

/// Checks one proposed setting against [`PROPOSABLE_SETTINGS`].
fn proposable(key: &str, value: &Value) -> Result<(), Invalid> {
    if key == PROPOSABLE_EXPOSURE {
        return match value.as_str() {
            Some("all" | "find") => Ok(()),
            _ => Err(Invalid(format!("{key} must be \"all\" or \"find\""))),
        };
    }
    match PROPOSABLE_SETTINGS.iter().find(|(k, _, _)| *k == key) {
        Some((_, lo, hi)) => match value.as_u64() {
            Some(v) if (*lo..=*hi).contains(&v) => Ok(()),
            _ => Err(Invalid(format!("{key} must be a whole number from {lo} to {hi}"))),
        },
        None => {
            let mut allowed: Vec<&str> = PROPOSABLE_SETTINGS.iter().map(|(k, _, _)| *k).collect();
            allowed.push(PROPOSABLE_EXPOSURE);
            Err(Invalid(format!(
                "{key} cannot be changed by a proposal: it decides what the agent may reach or spend, so only the \
                 operator changes it in config.json; an agent may propose: {}",
                allowed.join(", ")
            )))
        }
    }
}

/// Keys a config change sets, and the agent's section with them applied.
fn changed_config(current: &Value, content: &Value) -> Result<(Vec<String>, Value), Invalid> {
    let Some(changes) = content["changes"].as_object().filter(|c| !c.is_empty()) else {
        return Err(Invalid("changes: name at least one setting and its new value".into()));
    };
    let Some(section) = current.as_object() else {
        return Err(Invalid("this agent has no settings section".into()));
    };
    let mut updated = section.clone();
    for (key, value) in changes {
        if !section.contains_key(key) {
            let known: Vec<&str> = section.keys().map(String::as_str).collect();
            return Err(Invalid(format!("{key} is not a setting; settings are: {}", known.join(", "))));
        }
        proposable(key, value)?;
        updated.insert(key.clone(), value.clone());
    }
    let updated = Value::Object(updated);
    let parsed: Result<crate::config::AgentConfig, _> = serde_json::from_value(updated.clone());
    parsed.map_err(|e| Invalid(format!("the changed settings do not parse: {e}")))?;
    Ok((changes.keys().cloned().collect(), updated))
}

/// Where a proposal's files go: (relative path in the repo, text).
fn files(
    home: &Home,
    agent: &AgentId,
    scope: ProposalScope,
    kind: ProposalKind,
    content: &Value,
) -> Vec<(String, String)> {
    match kind {
        ProposalKind::Tool => {
            let manifest = parse_manifest(&content["manifest"]).ok();
            let name = manifest.as_ref().map(|m| m.llm.name.clone()).unwrap_or_default();
            let exec = manifest.as_ref().and_then(|m| m.runtime.exec_path.clone()).unwrap_or_default();
            let tools = repo_dir(home, agent, scope).join("tools");
            // An existing tool of that name keeps its file.
            let file = load_tool_layer(&tools)
                .ok()
                .and_then(|l| l.into_iter().find(|t| t.manifest.llm.name == name))
                .and_then(|t| t.file.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_else(|| manifest_file_name(&name));
            vec![
                (format!("tools/{file}"), pretty(&content["manifest"])),
                (format!("tools/{exec}"), content["executable"].as_str().unwrap_or_default().to_owned()),
            ]
        }
        ProposalKind::Skill => {
            let name = content["skill"]["name"].as_str().unwrap_or_default().to_owned();
            let skills = repo_dir(home, agent, scope).join("skills");
            let file = skill_file(&skills, &name).unwrap_or_else(|| format!("{name}.json"));
            vec![(format!("skills/{file}"), pretty(&content["skill"]))]
        }
        ProposalKind::Mcp => crate::mcp_pins::written(home, agent, content, &Default::default())
            .map(|(rel, file)| vec![(rel, pretty(&serde_json::to_value(&file).unwrap_or_default()))])
            .unwrap_or_default(),
        ProposalKind::ConfigChange | ProposalKind::Call | ProposalKind::Schedule => Vec::new(),
    }
}

/// The file in `dir` defining skill `name`, if any.
fn skill_file(dir: &Path, name: &str) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    files.into_iter().find_map(|p| {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).ok()?).ok()?;
        (v["name"] == name).then(|| p.file_name().map(|f| f.to_string_lossy().into_owned())).flatten()
    })
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// A unified diff of `old` → `new` under `path`.
fn diff(path: &str, old: Option<&str>, new: &str) -> String {
    let old_text = old.unwrap_or("");
    let d = similar::TextDiff::from_lines(old_text, new);
    let from = if old.is_some() { format!("a/{path}") } else { "/dev/null".to_owned() };
    d.unified_diff().context_radius(3).header(&from, &format!("b/{path}")).to_string()
}

/// What a human sees of a proposal: its content, and a diff against what it
/// would replace (files in the repository, or the agent's current settings).
pub fn render(
    home: &Home,
    agent: &AgentId,
    kind: ProposalKind,
    scope: ProposalScope,
    content: &Value,
    agent_config: &Value,
) -> String {
    let repo = repo_dir(home, agent, scope);
    let mut out = String::new();
    match kind {
        ProposalKind::ConfigChange => match changed_config(agent_config, content) {
            Ok((_, updated)) => out.push_str(&diff(
                &format!("config.json agents.{agent}"),
                Some(&pretty(agent_config)),
                &pretty(&updated),
            )),
            Err(e) => out.push_str(&format!("(cannot be applied to the current config: {e})\n")),
        },
        ProposalKind::Schedule => {
            out.push_str(&format!(
                "adds this scheduled job for agent {agent}, exactly (its prompt runs as a core job at every firing):\n{}",
                pretty(&content["job"])
            ));
        }
        ProposalKind::Call => {
            let calls = confirmed_calls(content);
            let shown = |call: &Value| format!("{} {}", call["tool"].as_str().unwrap_or("?"), pretty(&call["input"]));
            if let [call] = calls.as_slice() {
                out.push_str(&format!("runs once, exactly:\n{}", shown(call)));
            } else {
                out.push_str(&format!(
                    "runs each of these {} calls once, exactly (one decision for all):",
                    calls.len()
                ));
                for (i, call) in calls.iter().enumerate() {
                    out.push_str(&format!("\n{}. {}", i + 1, shown(call)));
                }
            }
        }
        ProposalKind::Mcp => {
            out.push_str(&crate::mcp_pins::render(home, agent, content));
            for (rel, text) in files(home, agent, scope, kind, content) {
                let old = std::fs::read_to_string(repo.join(&rel)).ok();
                out.push_str(&diff(&format!("{}/{rel}", scope_path(agent, scope)), old.as_deref(), &text));
            }
        }
        _ => {
            for (rel, text) in files(home, agent, scope, kind, content) {
                let old = std::fs::read_to_string(repo.join(&rel)).ok();
                out.push_str(&diff(&format!("{}/{rel}", scope_path(agent, scope)), old.as_deref(), &text));
            }
        }
    }
    out
}

fn scope_path(agent: &AgentId, scope: ProposalScope) -> String {
    match scope {
        ProposalScope::Global => "repos/global".to_owned(),
        ProposalScope::Agent => format!("repos/agents/{agent}"),
    }
}

/// What an approval records about the proposal it applies.
#[derive(Debug, Clone)]
pub struct Approval<'a> {
    /// The proposal's id.
    pub id: i64,
    /// The proposing agent.
    pub agent: &'a AgentId,
    /// What it is.
    pub kind: ProposalKind,
    /// Where it goes.
    pub scope: ProposalScope,
    /// Its subject.
    pub subject: &'a str,
    /// The approved content.
    pub content: &'a Value,
    /// Its digest.
    pub sha256: &'a str,
    /// Why the agent proposed it.
    pub reason: &'a str,
    /// Who approved it.
    pub approver: &'a str,
    /// For an MCP catalog: the approver's choices per tool.
    pub pins: Option<&'a Value>,
}

/// Applies an approved tool or skill: writes its files into the repository
/// clone and commits them (author and committer: the approver). Returns the
/// commit id. Config changes are applied by the daemon (see
/// [`apply_config`]).
pub fn apply(home: &Home, a: &Approval<'_>) -> Result<String, ApplyError> {
    let repo = repo_dir(home, a.agent, a.scope);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ApplyError::Io { path, source }
    };
    std::fs::create_dir_all(&repo).map_err(io(&repo))?;
    if !repo.join(".git").exists() {
        git(&repo, a.approver, &["init", "--quiet"])?;
    }
    let written = if a.kind == ProposalKind::Mcp && crate::mcp_pins::removed(a.content).is_some() {
        Vec::new()
    } else if a.kind == ProposalKind::Mcp {
        let choices = crate::mcp_pins::choices(a.content, a.pins).map_err(ApplyError::Stale)?;
        let (rel, file) = crate::mcp_pins::written(home, a.agent, a.content, &choices).map_err(ApplyError::Stale)?;
        vec![(rel, pretty(&serde_json::to_value(&file).unwrap_or_default()))]
    } else {
        files(home, a.agent, a.scope, a.kind, a.content)
    };
    if a.kind == ProposalKind::Tool {
        // Checked again now: another tool approved meanwhile may hold the file.
        let tools = repo.join("tools");
        for t in load_tool_layer(&tools).unwrap_or_default() {
            if t.manifest.llm.name == a.subject {
                continue;
            }
            let theirs: Vec<String> = [&t.file, &t.exec]
                .iter()
                .filter_map(|p| p.file_name().map(|f| format!("tools/{}", f.to_string_lossy())))
                .collect();
            if let Some((rel, _)) = written.iter().find(|(rel, _)| theirs.contains(rel)) {
                return Err(ApplyError::Stale(format!(
                    "{rel} now belongs to tool {}; the proposal must be made again under another name",
                    t.manifest.llm.name
                )));
            }
        }
    }
    for (rel, text) in &written {
        let path = repo.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let tmp = path.with_extension("choir-tmp");
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        let executable = a.kind == ProposalKind::Tool && !rel.ends_with(".json");
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
    }
    // A removed MCP server: its file goes, with git.
    let removed = crate::mcp_pins::removed(a.content);
    if let Some(rel) = &removed {
        if repo.join(rel).exists() {
            git(&repo, a.approver, &["rm", "--quiet", "--", rel])?;
        }
    }
    if removed.is_none() {
        let mut add = vec!["add", "--"];
        add.extend(written.iter().map(|(rel, _)| rel.as_str()));
        git(&repo, a.approver, &add)?;
    }
    let message = format!(
        "Approve proposal {}: {} {}\n\nProposed by agent {} ({}).\nReason: {}\n\nChoir-Approval: {}\nChoir-Content-Sha256: {}\nApproved-by: {}\n",
        a.id,
        a.kind.as_str(),
        a.subject,
        a.agent,
        a.scope.as_str(),
        a.reason,
        a.id,
        a.sha256,
        a.approver
    );
    git(&repo, a.approver, &["commit", "--quiet", "--allow-empty", "-m", &message])?;
    let head = git(&repo, a.approver, &["rev-parse", "HEAD"])?;
    Ok(head.trim().to_owned())
}

/// Runs git in `repo` as `who` (author and committer), with no user or
/// system configuration read.
fn git(repo: &Path, who: &str, args: &[&str]) -> Result<String, ApplyError> {
    let mut cmd = Cmd::new("git");
    cmd.arg("-C").arg(repo.as_os_str()).args(args);
    let email = format!("{}@choir.local", who.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
    for (k, v) in [
        ("GIT_AUTHOR_NAME", who),
        ("GIT_AUTHOR_EMAIL", email.as_str()),
        ("GIT_COMMITTER_NAME", who),
        ("GIT_COMMITTER_EMAIL", email.as_str()),
        ("GIT_CONFIG_NOSYSTEM", "1"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("HOME", "/nonexistent"),
    ] {
        cmd.env(k, v);
    }
    let out = cmd.run().map_err(|e| ApplyError::Git(e.to_string()))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The new `config.json` text with an approved config change applied to
/// agent `agent`, and the keys it changes.
pub fn apply_config(config_text: &str, agent: &AgentId, content: &Value) -> Result<(String, Vec<String>), ApplyError> {
    let doc: Value =
        serde_json::from_str(config_text).map_err(|e| ApplyError::Stale(format!("config.json does not parse: {e}")))?;
    let section = doc["agents"].get(agent.as_str()).cloned().unwrap_or_else(|| json!({}));
    // Compare against the full section (defaults included) so only existing keys are accepted.
    let full: Value = serde_json::from_value::<crate::config::AgentConfig>(section.clone())
        .ok()
        .and_then(|c| serde_json::to_value(c).ok())
        .ok_or_else(|| ApplyError::Stale(format!("agents.{agent} no longer parses")))?;
    let (keys, _) = changed_config(&full, content).map_err(|e| ApplyError::Stale(e.0))?;
    // Only the changed values are written, in the operator's own text.
    let mut text = config_text.to_owned();
    for key in &keys {
        text = crate::config::edit::set(&text, &["agents", agent.as_str(), key], Some(&content["changes"][key]))
            .map_err(ApplyError::Stale)?;
    }
    crate::config::Config::parse(&text).map_err(|(field, reason)| {
        ApplyError::Stale(format!("the changed config.json is invalid: {field}: {reason}"))
    })?;
    Ok((text, keys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use choir_common::rpc::{ProposalKind, ProposalScope};

    fn manifest(name: &str, exec: &str) -> Value {
        json!({
            "llm": {"name": name, "description": "Count words.", "parameters": {"type": "object"}},
            "runtime": {"exec_path": exec, "timeout_ms": 1000, "side_effect": "read", "version": "1"}
        })
    }

    fn request(kind: ProposalKind, content: Value) -> ApprovalRequest {
        ApprovalRequest {
            kind,
            scope: ProposalScope::Agent,
            content,
            reason: "r".into(),
            lane: "edge".into(),
            skill: None,
            state: None,
            conversation: None,
        }
    }

    /// An identical re-proposal of what is installed was listed as pending.
    #[test]
    fn regression_a_proposal_identical_to_what_is_installed_waited_for_a_human() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_owned());
        let agent = AgentId::parse("demo").unwrap();
        let content = json!({"manifest": manifest("count.words", "count_words"), "executable": "#!/bin/sh\necho {}\n"});
        let layer = repo_dir(&home, &agent, ProposalScope::Agent);
        for (rel, text) in files(&home, &agent, ProposalScope::Agent, ProposalKind::Tool, &content) {
            std::fs::create_dir_all(layer.join(&rel).parent().unwrap()).unwrap();
            std::fs::write(layer.join(&rel), text).unwrap();
            std::fs::set_permissions(layer.join(&rel), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        let err = validate(&home, &agent, &json!({}), &request(ProposalKind::Tool, content.clone())).unwrap_err();
        assert!(err.0.contains("already installed exactly so"), "{}", err.0);
        // Negative control: a changed executable is a real proposal.
        let mut changed = content;
        changed["executable"] = json!("#!/bin/sh\necho changed\n");
        assert!(validate(&home, &agent, &json!({}), &request(ProposalKind::Tool, changed)).is_ok());
    }

    #[test]
    fn regression_tool_names_whose_files_collide_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_owned());
        let agent = AgentId::parse("demo").unwrap();
        let tools = home.repos().join("agents/demo/tools");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::write(tools.join("x_a_b.json"), manifest("x_a.b", "count_ab").to_string()).unwrap();
        std::fs::write(tools.join("count_ab"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(tools.join("count_ab"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let content = json!({"manifest": manifest("x.a_b", "other"), "executable": "#!/bin/sh\necho {}\n"});
        let err = validate(&home, &agent, &json!({}), &request(ProposalKind::Tool, content)).unwrap_err();
        assert!(err.0.contains("tools/x_a_b.json") && err.0.contains("x_a.b"), "{}", err.0);
        // Another name is fine.
        let content = json!({"manifest": manifest("x.other", "other"), "executable": "#!/bin/sh\necho {}\n"});
        assert!(validate(&home, &agent, &json!({}), &request(ProposalKind::Tool, content)).is_ok());
    }

    #[test]
    fn an_agent_cannot_propose_away_its_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_owned());
        let agent = AgentId::parse("demo").unwrap();
        let settings = serde_json::to_value(crate::config::AgentConfig::default()).unwrap();
        for (key, value) in [
            ("secrets", json!(["llm_key"])),
            ("workspace", json!("/")),
            ("network", json!("bridge")),
            ("resources", json!({"memory_mb": 65536, "cpus": 64.0, "pids": 100000})),
            ("models", json!({"edge": "gpt-expensive"})),
            ("token_budget", json!({"per_day": 1000000000})),
            ("core_budget", json!({"steps": 1, "tokens": 1000000000, "wall_s": 1})),
            ("quotas", json!({"memory_items": 1000000000})),
            ("fail_closed_s", json!(100000)),
            ("autostart", json!(true)),
            ("max_core_jobs", json!(100)),
        ] {
            let req = request(ProposalKind::ConfigChange, json!({"changes": {key: value}}));
            let err = validate(&home, &agent, &settings, &req).unwrap_err();
            assert!(err.0.contains("cannot be changed by a proposal"), "{key}: {}", err.0);
        }
        let req = request(ProposalKind::ConfigChange, json!({"changes": {"max_steps_per_turn": 100000}}));
        assert!(validate(&home, &agent, &settings, &req).unwrap_err().0.contains("from 1 to 256"));
        let req =
            request(ProposalKind::ConfigChange, json!({"changes": {"max_steps_per_turn": 8, "tool_exposure": "find"}}));
        assert!(validate(&home, &agent, &settings, &req).is_ok());
    }
}
