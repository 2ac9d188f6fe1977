//! `choirctl policy reload|show|test`: the argument policies;
//! `choirctl policy tools`: an agent's tool policy.

use std::collections::BTreeMap;

use anyhow::Context;
use choir_common::admin::PolicyTest;
use choir_common::arg_policy::{Evaluation, PolicySet};
use choir_common::provenance::Source;
use choir_common::tool_policy::ToolPolicy;
use serde_json::Value;

use crate::ctx::{print_json, Ctx};

/// Reloads every agent's policy; fails if any was refused.
pub fn reload(ctx: &Ctx) -> anyhow::Result<()> {
    let r: Value = ctx.client.post("policy/reload", &serde_json::json!({}))?;
    let agents = r["agents"].as_array().cloned().unwrap_or_default();
    let refused: Vec<&Value> = agents.iter().filter(|a| a["status"] == "refused").collect();
    if ctx.json {
        print_json(&r)?;
    } else {
        for a in &agents {
            let id = a["agent"].as_str().unwrap_or("?");
            match a["status"].as_str() {
                Some("loaded") => {
                    let changed = if a["changed"] == true { "loaded" } else { "unchanged" };
                    say!("{id}: {changed}, {} rule(s)", a["rules"]);
                }
                _ => say!("{id}: REFUSED, the previous policy stays in force: {}", a["error"].as_str().unwrap_or("?")),
            }
        }
    }
    if !refused.is_empty() {
        anyhow::bail!("{} agent(s) kept their previous policy; fix the file named above and reload", refused.len());
    }
    Ok(())
}

/// The policy in force for one agent.
pub fn show(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let set: PolicySet = ctx.client.get(&format!("agents/{id}/policy"))?;
    if ctx.json {
        return print_json(&set);
    }
    say!("agent {id}: {} rule(s); a confirmation waits {} s", set.rules.len(), set.confirm_wait_s);
    for r in &set.rules {
        let cond = match &r.call {
            Some(call) => serde_json::to_string(call)?,
            None => serde_json::to_string(&r.condition)?,
        };
        let what = match (&r.argument, r.role) {
            (Some(a), _) => a.clone(),
            (None, Some(role)) => format!("role {}", role.as_str()),
            (None, None) => "the call".to_owned(),
        };
        let tool = if r.tool == "*" { "every tool" } else { &r.tool };
        let when = if r.when.is_empty() { String::new() } else { format!(" when {}", serde_json::to_string(&r.when)?) };
        say!("  {:<8} {tool} {what}{when} if {cond}   [{} in {}]", r.then.as_str(), r.id, r.file);
    }
    if !set.remembered.is_empty() {
        say!("remembered destinations (the operator's until then):");
        for r in &set.remembered {
            let until = jiff::Timestamp::from_second(r.until_unix as i64).map(|t| t.to_string()).unwrap_or_default();
            say!("  {}   until {until}, approval #{} of {} by {}", r.value, r.approval, r.tool, r.by);
        }
    }
    Ok(())
}

/// Parses `--from POINTER=SOURCE[,SOURCE]`.
fn parse_from(from: &[String]) -> anyhow::Result<BTreeMap<String, Vec<Source>>> {
    let mut out = BTreeMap::new();
    for f in from {
        let (pointer, sources) =
            f.split_once('=').with_context(|| format!("--from {f}: write POINTER=SOURCE, e.g. /to/0=untrusted"))?;
        let sources = sources
            .split(',')
            .map(|s| {
                serde_json::from_value(Value::String(s.trim().to_owned())).with_context(|| {
                    format!("--from {f}: {s:?} is not a source (user, operator, trusted, untrusted, model)")
                })
            })
            .collect::<anyhow::Result<Vec<Source>>>()?;
        out.insert(pointer.to_owned(), sources);
    }
    Ok(out)
}

/// The decision on one call.
/// `--after-untrusted` and `--outside-intent` of `policy test`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallFlags {
    /// Judge as if untrusted content had entered the lane.
    pub after_untrusted: bool,
    /// Judge as if the tool was not part of the turn's intent.
    pub outside_intent: bool,
}

pub fn test(ctx: &Ctx, id: &str, tool: &str, args: &str, from: &[String], flags: CallFlags) -> anyhow::Result<()> {
    let input: Value = serde_json::from_str(args).with_context(|| format!("ARGS is not JSON: {args}"))?;
    let t = PolicyTest {
        tool: tool.to_owned(),
        input,
        from: parse_from(from)?,
        after_untrusted: Some(flags.after_untrusted),
        in_intent: Some(!flags.outside_intent),
    };
    let e: Evaluation = ctx.client.post(&format!("agents/{id}/policy/test"), &t)?;
    if ctx.json {
        return print_json(&e);
    }
    say!("decision: {}", e.decision.as_str());
    for h in &e.hits {
        let why = h.why.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        let on = if h.pointer.is_empty() { "the call" } else { &h.pointer };
        say!("  rule {} ({}) → {} on {on}{why}", h.rule, h.file, h.decision.as_str());
    }
    if e.hits.is_empty() {
        say!("  no rule held");
    }
    say!("values:");
    for v in &e.values {
        let sources: Vec<&str> = v.sources.iter().map(|s| s.as_str()).collect();
        say!("  {} = {:?} from {}", v.pointer, v.value, sources.join(", "));
    }
    if e.values.is_empty() {
        say!("  (no rule of {tool} looks at any of its values)");
    }
    Ok(())
}

/// Changes to a tool policy asked on the command line.
#[derive(Default)]
pub struct ToolChanges {
    /// Patterns to add to `allow` (creating the list).
    pub allow: Vec<String>,
    /// Patterns to add to `deny`.
    pub deny: Vec<String>,
    /// Patterns to take out of both lists.
    pub remove: Vec<String>,
    /// Start from no policy.
    pub reset: bool,
    /// Keep patterns that match none of the agent's tools (for a tool not
    /// installed yet).
    pub force: bool,
}

impl ToolChanges {
    fn any(&self) -> bool {
        self.reset || !(self.allow.is_empty() && self.deny.is_empty() && self.remove.is_empty())
    }
}

/// Shows, or changes and shows, an agent's tool policy.
pub fn tools(ctx: &Ctx, id: &str, changes: &ToolChanges) -> anyhow::Result<()> {
    choir_common::ids::AgentId::parse(id)?;
    let path = format!("agents/{id}/policy/tools");
    let mut policy: ToolPolicy = ctx.client.get(&path)?;
    if changes.any() {
        if changes.reset {
            policy = ToolPolicy::default();
        }
        for p in changes.allow.iter().chain(&changes.deny).chain(&changes.remove) {
            if !choir_common::tool_policy::valid_pattern(p) {
                anyhow::bail!("{p:?} is not a tool name or a `prefix.*` pattern (see `choirctl tools list {id}`)");
            }
        }
        policy.deny.retain(|p| !changes.remove.contains(p) && !changes.allow.contains(p));
        if let Some(a) = policy.allow.as_mut() {
            a.retain(|p| !changes.remove.contains(p) && !changes.deny.contains(p));
        }
        for p in &changes.deny {
            if !policy.deny.contains(p) {
                policy.deny.push(p.clone());
            }
        }
        if !changes.allow.is_empty() {
            let a = policy.allow.get_or_insert_with(Vec::new);
            for p in &changes.allow {
                if !a.contains(p) {
                    a.push(p.clone());
                }
            }
        }
        let put = if changes.force { format!("{path}?force=1") } else { path.clone() };
        policy = ctx.client.put(&put, &policy)?;
    }
    if ctx.json {
        return print_json(&policy);
    }
    match &policy.allow {
        Some(a) => say!("allow: {}", if a.is_empty() { "nothing".to_owned() } else { a.join(", ") }),
        None => say!("allow: every tool"),
    }
    say!("deny:  {}", if policy.deny.is_empty() { "nothing".to_owned() } else { policy.deny.join(", ") });
    if changes.any() {
        say!("applied: a running agent offers and runs only what this permits from its next step");
    }
    Ok(())
}
