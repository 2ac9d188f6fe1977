//! `choirctl approvals …` (the human side of the approval pipeline, with
//! the rollout that follows) and `choirctl tools validate` (the manifest
//! checks, offline, for authors).

use std::path::Path;

use anyhow::Context as _;

use choir_common::admin::{ApprovalDetail, ApprovalInfo, ApprovalList, ApproveRequest, RejectRequest};

use crate::ctx::{print_json, Ctx};

/// `approvals list`: pending proposals by default.
pub fn list(ctx: &Ctx, status: Option<&str>, agent: Option<&str>, all: bool) -> anyhow::Result<()> {
    let mut query = Vec::new();
    match (status, all) {
        (Some(s), _) => query.push(format!("status={s}")),
        (None, false) => query.push("status=pending".to_owned()),
        (None, true) => {}
    }
    if let Some(a) = agent {
        query.push(format!("agent={a}"));
    }
    let l: ApprovalList = ctx.client.get(&format!("approvals?{}", query.join("&")))?;
    if ctx.json {
        return print_json(&l);
    }
    if l.approvals.is_empty() {
        say!("no {} proposals", if all { "" } else { status.unwrap_or("pending") });
        return Ok(());
    }
    say!("{:>5} {:<12} {:<14} {:<9} {:<30} {:<23}  REASON", "ID", "AGENT", "KIND", "STATUS", "SUBJECT", "PROPOSED");
    for a in &l.approvals {
        let status = if a.intact { a.status.clone() } else { format!("{}!", a.status) };
        say!(
            "{:>5} {:<12} {:<14} {:<9} {:<30} {:<23}  {}",
            a.id,
            a.agent,
            a.kind,
            status,
            crate::term::one_line(&a.subject),
            crate::term::moment(&a.created_at),
            crate::term::one_line(a.reason.lines().next().unwrap_or(""))
        );
    }
    if l.approvals.iter().any(|a| !a.intact) {
        say!("\n! altered after it was proposed: it cannot be approved");
    }
    Ok(())
}

fn describe(a: &ApprovalInfo) {
    let at = match (&a.skill, &a.state) {
        (Some(skill), Some(state)) => {
            format!(", skill {}, state {}", crate::term::one_line(skill), crate::term::one_line(state))
        }
        _ => String::new(),
    };
    say!("proposal {} from agent {} ({}{at})", a.id, a.agent, crate::term::one_line(&a.lane));
    say!("kind:     {} ({} scope)", a.kind, a.scope);
    say!("subject:  {}", crate::term::one_line(&a.subject));
    say!("status:   {}", a.status);
    if let Some(by) = &a.decided_by {
        say!("decided:  by {by} at {}", a.decided_at.as_deref().unwrap_or("?"));
    }
    if let Some(r) = &a.decision_reason {
        say!("because:  {}", crate::term::one_line(r));
    }
    if let Some(applied) = &a.applied {
        say!("applied:  {applied}");
    }
    say!("sha256:   {}", a.sha256);
    if !a.intact {
        say!("INTEGRITY: the stored content no longer has this sha256: it was altered after it was proposed and cannot be approved");
    }
    // A confirmation's reason has a line per argument that triggered it.
    for (i, line) in a.reason.lines().enumerate() {
        say!("{}{}", if i == 0 { "reason:   " } else { "          " }, crate::term::one_line(line));
    }
}

/// `approvals show ID`: everything a human needs to decide.
pub fn show(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let d: ApprovalDetail = ctx.client.get(&format!("approvals/{id}"))?;
    if ctx.json {
        return print_json(&d);
    }
    describe(&d.info);
    if let Some(r) = &d.info.rollout {
        say!("rollout:   {}{}", r.state, r.outcome.as_deref().map(|o| format!(": {o}")).unwrap_or_default());
        for line in &r.lines {
            say!("  {}", crate::term::one_line(line));
        }
    }
    say!("\ncontent:\n{}", serde_json::to_string_pretty(&d.content)?);
    say!("\nchanges:\n{}", if d.diff.is_empty() { "(none)\n".to_owned() } else { d.diff.clone() });
    if d.info.status == "pending" && d.info.intact {
        say!("approve with: choirctl approvals approve {} --sha256 {}", d.info.id, d.info.sha256);
    }
    Ok(())
}

/// `approvals approve ID [--sha256 X] [--remember-days N] [--pin TOOL:CHOICE]...`.
/// Approves a proposal. Without `--sha256` the content approved is the one
/// stored now, and its sha256 is printed so the record shows what was
/// approved (with it, choird refuses content that is not what was read).
pub fn approve(
    ctx: &Ctx,
    id: &str,
    sha256: Option<String>,
    remember_days: Option<u64>,
    pin: &[String],
) -> anyhow::Result<()> {
    let pinned = sha256.is_some();
    let pins = if pin.is_empty() { None } else { Some(pin_choices(pin)?) };
    let req = ApproveRequest { sha256, by: None, remember_days, pins };
    let a: ApprovalInfo = ctx.client.post(&format!("approvals/{id}/approve"), &req)?;
    if ctx.json {
        return print_json(&a);
    }
    say!(
        "proposal {} ({} {}) approved: {}",
        a.id,
        a.kind,
        crate::term::one_line(&a.subject),
        a.applied.as_deref().unwrap_or("-")
    );
    if pinned {
        say!("content approved: sha256 {}", a.sha256);
    } else {
        say!(
            "content approved: sha256 {} (no --sha256 was given: this is what was stored when approved; give \
             --sha256 to approve only the content you read)",
            a.sha256
        );
    }
    if a.kind == "call" {
        say!("the agent runs that exact call once");
    } else if a.kind != "config_change" {
        match &a.rollout {
            Some(_) => return follow_rollout(ctx, a.id),
            None => say!("it reaches the agent with its next image: choirctl agent update {}", a.agent),
        }
    }
    Ok(())
}

/// Prints the rollout's progress until it ends; an error when it failed.
pub(crate) fn follow_rollout(ctx: &Ctx, id: i64) -> anyhow::Result<()> {
    let mut shown = 0usize;
    let mut state = String::new();
    loop {
        let d: ApprovalDetail = ctx.client.get(&format!("approvals/{id}"))?;
        let Some(r) = d.info.rollout else {
            say!("rollout: choird no longer tracks it; see choirctl approvals show {id}");
            return Ok(());
        };
        // What happened first, then the state it led to (a poll can see
        // both: "starting agent" belongs before "done").
        let start = shown.min(r.lines.len());
        for line in &r.lines[start..] {
            say!("  {}", crate::term::one_line(line));
        }
        shown = r.lines.len();
        if r.state != state {
            say!("rollout: {}", r.state);
            state.clone_from(&r.state);
        }
        if r.finished() {
            let outcome = r.outcome.unwrap_or_default();
            if r.state == "failed" {
                anyhow::bail!("approved, but the rollout failed: {outcome}");
            }
            say!("{outcome}");
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// `approvals reject ID --reason TEXT`.
pub fn reject(ctx: &Ctx, id: &str, reason: Option<String>) -> anyhow::Result<()> {
    let reason = reason.ok_or_else(|| anyhow::anyhow!("say why: choirctl approvals reject {id} --reason TEXT"))?;
    let a: ApprovalInfo = ctx.client.post(&format!("approvals/{id}/reject"), &RejectRequest { reason, by: None })?;
    if ctx.json {
        return print_json(&a);
    }
    say!("proposal {} ({} {}) rejected", a.id, a.kind, crate::term::one_line(&a.subject));
    Ok(())
}

/// `tools validate PATH`: a manifest file, or a directory of them (a layer),
/// checked offline exactly as an agent checks its tools at start.
pub fn tools_validate(json: bool, path: &str) -> anyhow::Result<()> {
    use choir_common::manifest::{load_tool_file, load_tool_layer};
    let p = Path::new(path);
    let tools = if p.is_dir() {
        load_tool_layer(p).map_err(|e| anyhow::anyhow!("{}: {}", e.file, e.reason))?
    } else {
        vec![load_tool_file(p).map_err(|e| anyhow::anyhow!("{}: {}", e.file, e.reason))?]
    };
    if json {
        let rows: Vec<serde_json::Value> = tools
            .iter()
            .map(|t| {
                serde_json::json!({"name": t.manifest.llm.name, "file": t.file, "exec": t.exec,
                    "side_effect": t.manifest.runtime.side_effect, "output_trust": t.manifest.runtime.output_trust})
            })
            .collect();
        return crate::ctx::print_json(&serde_json::json!({"valid": true, "tools": rows}));
    }
    if tools.is_empty() {
        say!("{path}: no tool manifests (*.json) here");
    }
    for t in &tools {
        say!(
            "{}: tool {} is valid ({:?}, output {:?}, runs {})",
            t.file.display(),
            t.manifest.llm.name,
            t.manifest.runtime.side_effect,
            t.manifest.runtime.output_trust,
            t.exec.display()
        );
    }
    Ok(())
}

/// The approver's per-tool choices from `--pin TOOL:CHOICE` flags.
pub fn pin_choices(flags: &[String]) -> anyhow::Result<serde_json::Value> {
    let mut out = serde_json::Map::new();
    for flag in flags {
        let (tool, choice) = flag.split_once(':').with_context(|| format!("--pin {flag:?}: TOOL:CHOICE"))?;
        let entry = out.entry(tool.to_owned()).or_insert_with(|| serde_json::json!({}));
        if choice == "skip" {
            entry["skip"] = serde_json::json!(true);
            continue;
        }
        let (key, value) = choice.split_once('=').with_context(|| format!("--pin {flag:?}: TOOL:KEY=VALUE"))?;
        match key {
            "side_effect" | "description" => entry[key] = serde_json::json!(value),
            "idempotent" => {
                entry[key] = serde_json::json!(value.parse::<bool>().with_context(|| format!("--pin {flag:?}: true or false"))?)
            }
            "timeout_ms" => {
                entry[key] = serde_json::json!(value.parse::<u64>().with_context(|| format!("--pin {flag:?}: milliseconds"))?)
            }
            "role" => {
                let (pointer, role) =
                    value.rsplit_once('=').with_context(|| format!("--pin {flag:?}: TOOL:role=/POINTER=ROLE"))?;
                if !entry["roles"].is_object() {
                    entry["roles"] = serde_json::json!({});
                }
                entry["roles"][pointer] = serde_json::json!(role);
            }
            "lock" => {
                let (resource, mode) =
                    value.rsplit_once('=').with_context(|| format!("--pin {flag:?}: TOOL:lock=RESOURCE=S|X"))?;
                anyhow::ensure!(matches!(mode, "S" | "X"), "--pin {flag:?}: a lock's mode is S (shared) or X");
                if !entry["locks"].is_array() {
                    entry["locks"] = serde_json::json!([]);
                }
                if let Some(locks) = entry["locks"].as_array_mut() {
                    locks.push(serde_json::json!({"resource": resource, "mode": mode}));
                }
            }
            other => anyhow::bail!(
                "--pin {flag:?}: no choice {other:?}; use skip, side_effect, idempotent, timeout_ms, description, role or \
                 lock"
            ),
        }
    }
    Ok(serde_json::Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_flags_become_each_tools_choices_and_a_bad_one_is_refused() {
        let flags: Vec<String> = [
            "a:skip",
            "b:side_effect=read",
            "b:idempotent=true",
            "b:timeout_ms=5000",
            "c:role=/to=destination",
            "c:role=/body=payload",
            "c:lock=external:mail=X",
            "c:description=Send a mail: to, body.",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let v = pin_choices(&flags).unwrap();
        assert_eq!(v["a"]["skip"], true);
        assert_eq!(v["b"], serde_json::json!({"side_effect": "read", "idempotent": true, "timeout_ms": 5000}));
        assert_eq!(v["c"]["roles"], serde_json::json!({"/to": "destination", "/body": "payload"}));
        assert_eq!(v["c"]["locks"], serde_json::json!([{"resource": "external:mail", "mode": "X"}]));
        assert_eq!(v["c"]["description"], "Send a mail: to, body.");
        for bad in ["nocolon", "a:idempotent=maybe", "a:lock=x=Q", "a:colour=red", "a:timeout_ms=soon"] {
            assert!(pin_choices(&[bad.to_owned()]).is_err(), "{bad}");
        }
    }
}
