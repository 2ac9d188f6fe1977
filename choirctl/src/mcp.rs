//! `choirctl mcp add|list|show` (the `--pin TOOL:CHOICE` flags of
//! `approvals approve` are read in `proposals`). A server is added as a reviewed
//! file (an approval the operator makes at once) with no tool; the agent
//! then files what the server lists, and the operator pins each tool.

use anyhow::Context as _;
use choir_common::admin::{AddRequest, ApprovalInfo};
use serde_json::{json, Map, Value};

use crate::ctx::{print_json, Ctx};

/// What a stdio server is granted beyond its tools.
pub struct Granted {
    /// Hosts it may reach (`HOST` or `HOST:PORT`).
    pub network: Vec<String>,
    /// `resources`, `prompts`, `sampling`.
    pub grants: Vec<String>,
}

impl Granted {
    /// Checked here, so a typo is told before anything is sent.
    fn set(&self, spec: &mut Value) -> anyhow::Result<()> {
        for n in &self.network {
            anyhow::ensure!(
                choir_common::mcp::parse_network(n).is_some(),
                "--network {n:?}: a host name, or HOST:PORT"
            );
        }
        for g in &self.grants {
            anyhow::ensure!(
                choir_common::mcp::Grant::parse(g).is_some(),
                "--grant {g:?}: resources, prompts or sampling"
            );
        }
        spec["network"] = json!(self.network);
        spec["grants"] = json!(self.grants);
        Ok(())
    }
}

/// How a server is reached.
pub enum Reach {
    /// A program the agent runs (stdio), and what it is granted.
    Command(String, Granted),
    /// An endpoint choird reaches, and the choird secret it gets.
    Url(String, Option<String>),
}

/// `mcp add ID NAME (--command PATH [--arg A]... [--env K=V]... [--secret S]... | --url URL [--auth-secret S])
/// [--timeout-ms N] [--global]`.
#[allow(clippy::too_many_arguments)] // One per flag of the command.
pub fn add(
    ctx: &Ctx,
    id: &str,
    name: &str,
    to: Reach,
    args: Vec<String>,
    env: &[String],
    secrets: Vec<String>,
    timeout_ms: Option<u64>,
    global: bool,
) -> anyhow::Result<()> {
    let mut vars = Map::new();
    for kv in env {
        let (k, v) = kv.split_once('=').with_context(|| format!("--env {kv:?}: KEY=VALUE"))?;
        vars.insert(k.to_owned(), json!(v));
    }
    let mut spec = json!({"name": name, "args": args, "env": vars, "secrets": secrets});
    match to {
        Reach::Command(c, granted) => {
            spec["command"] = json!(c);
            granted.set(&mut spec)?;
        }
        Reach::Url(u, auth) => {
            spec["url"] = json!(u);
            if let Some(a) = auth {
                spec["auth_secret"] = json!(a);
            }
        }
    }
    if let Some(t) = timeout_ms {
        spec["timeout_ms"] = json!(t);
    }
    let note = format!(
        "it has no tool yet: when the agent runs on it, it files what the server lists; then\n  choirctl approvals \
         list --agent {id}   and   choirctl approvals show ID"
    );
    submit(ctx, id, global, json!({"spec": spec}), &format!("MCP server {name} added"), Some(&note))
}

/// Posts an MCP change as an approval the operator makes at once, says
/// what happened (`done`, then `note`) and follows its rollout.
fn submit(ctx: &Ctx, id: &str, global: bool, content: Value, done: &str, note: Option<&str>) -> anyhow::Result<()> {
    let add = AddRequest { kind: "mcp".into(), global, content };
    let a: ApprovalInfo = ctx.client.post(&format!("agents/{id}/repos"), &add)?;
    if ctx.json {
        return print_json(&a);
    }
    say!("{done} as approval {}: {}", a.id, a.applied.as_deref().unwrap_or("-"));
    if let Some(note) = note {
        say!("{note}");
    }
    match &a.rollout {
        Some(_) => crate::proposals::follow_rollout(ctx, a.id),
        None => {
            say!("it reaches the agent with its next image: choirctl agent update {}", a.agent);
            Ok(())
        }
    }
}

/// `mcp grant ID NAME [--network H]... [--grant G]... [--global]`: the
/// server's spec as it is, with exactly these hosts and grants; its pins kept.
pub fn grant(ctx: &Ctx, id: &str, name: &str, granted: Granted, global: bool) -> anyhow::Result<()> {
    let r: Value = ctx.client.get(&format!("agents/{id}/mcp"))?;
    let scope = if global { "global" } else { "agent" };
    let mut spec = r["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["server"]["name"] == name && s["scope"] == scope)
        .map(|s| s["server"].clone())
        .with_context(|| format!("agent {id} has no MCP server {name} in the {scope} layer"))?;
    anyhow::ensure!(spec.get("url").is_none(), "MCP server {name} is reached over HTTP: grants are for stdio servers");
    granted.set(&mut spec)?;
    submit(ctx, id, global, json!({"spec": spec, "replace": true}), &format!("MCP server {name} changed"), None)
}

/// `mcp rm ID NAME [--global]`.
pub fn rm(ctx: &Ctx, id: &str, name: &str, global: bool) -> anyhow::Result<()> {
    submit(ctx, id, global, json!({"remove": name}), &format!("MCP server {name} removed"), None)
}

/// `mcp check ID NAME`: an error (exit 1) when it differs or cannot be reached.
pub fn check(ctx: &Ctx, id: &str, name: &str) -> anyhow::Result<()> {
    let r: Value = ctx.client.post(&format!("agents/{id}/mcp/{name}/check"), &json!({}))?;
    if ctx.json {
        print_json(&r)?;
    } else {
        say!("{name}: {}", crate::term::one_line(r["found"].as_str().unwrap_or("")));
    }
    anyhow::ensure!(r["ok"] == true, "MCP server {name} is not as approved, or could not be reached");
    Ok(())
}

/// `mcp list ID` / `mcp show ID NAME`.
pub fn list(ctx: &Ctx, id: &str, only: Option<&str>) -> anyhow::Result<()> {
    let mut r: Value = ctx.client.get(&format!("agents/{id}/mcp"))?;
    if let Some(name) = only {
        let found: Vec<Value> =
            r["servers"].as_array().into_iter().flatten().filter(|s| s["server"]["name"] == name).cloned().collect();
        anyhow::ensure!(!found.is_empty(), "agent {id} has no MCP server {name}");
        r["servers"] = json!(found);
    }
    if ctx.json {
        return print_json(&r);
    }
    let one = crate::term::one_line;
    for s in r["servers"].as_array().into_iter().flatten() {
        if let Some(e) = s["error"].as_str() {
            say!("(a server file of layer {} does not load: {})", s["scope"].as_str().unwrap_or("?"), one(e));
            continue;
        }
        let spec = &s["server"];
        let args: Vec<String> =
            spec["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str()).map(one).collect();
        say!(
            "{} ({}): {} {}",
            one(spec["name"].as_str().unwrap_or("?")),
            s["scope"].as_str().unwrap_or("?"),
            one(spec["command"].as_str().or(spec["url"].as_str()).unwrap_or("?")),
            args.join(" ")
        );
        for (key, what) in [("network", "may reach (through choird)"), ("grants", "granted")] {
            let items: Vec<String> =
                spec[key].as_array().into_iter().flatten().filter_map(|a| a.as_str()).map(one).collect();
            if !items.is_empty() {
                say!("  {what}: {}", items.join(", "));
            }
        }
        let tools = s["tools"].as_array().cloned().unwrap_or_default();
        if tools.is_empty() {
            say!("  no tool pinned yet");
        }
        for t in tools {
            say!(
                "  {}  {}{}  sha256 {}",
                one(t["name"].as_str().unwrap_or("?")),
                t["side_effect"].as_str().unwrap_or("?"),
                if t["idempotent"] == true { ", idempotent" } else { "" },
                &t["sha256"].as_str().unwrap_or("?")[..16.min(t["sha256"].as_str().unwrap_or("").len())]
            );
            if only.is_some() {
                say!("    {}", one(t["description"].as_str().unwrap_or("")));
                for f in t["findings"].as_array().into_iter().flatten() {
                    say!("    ⚠ {}", one(f.as_str().unwrap_or("")));
                }
            }
        }
    }
    for p in r["pending"].as_array().into_iter().flatten() {
        say!(
            "waiting for approval: proposal {} ({}): choirctl approvals show {}",
            p["id"],
            one(p["subject"].as_str().unwrap_or("")),
            p["id"]
        );
    }
    Ok(())
}
