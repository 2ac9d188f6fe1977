//! `choirctl skills list ID`, `skills validate PATH` (offline, a file or a
//! directory) and `tools add` / `skills add` (a reviewed file into `repos/`,
//! the path an approved proposal takes: validated as one, committed by the
//! operator, rolled out).

use std::path::Path;

use choir_common::admin::{AddRequest, ApprovalInfo, SkillList};
use choir_common::ids::AgentId;
use choir_common::skill::load_skill_file;

use crate::ctx::{print_json, Ctx};

/// `skills list ID`.
pub(crate) fn list(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let list: SkillList = ctx.client.get(&format!("agents/{id}/skills"))?;
    if ctx.json {
        return print_json(&list);
    }
    say!("{:<28} {:<9} {:<9} FILE", "SKILL", "STATUS", "SOURCE");
    for s in &list.skills {
        say!(
            "{:<28} {:<9} {:<9} {}",
            crate::term::one_line(&s.name),
            s.status,
            s.source,
            crate::term::one_line(&s.file)
        );
        if let Some(why) = &s.why {
            say!("{:<28} {}", "", crate::term::one_line(why));
        }
    }
    Ok(())
}

/// `skills validate PATH [--agent ID]`: a skill file, or every `*.json` of a
/// directory, checked as an agent checks them at start (against the tools
/// of the global layer, and the agent's with `--agent`).
pub(crate) fn validate(home: &Path, json: bool, path: &str, agent: Option<&str>) -> anyhow::Result<()> {
    let mut layers = vec![home.join("repos").join("global").join("tools")];
    if let Some(a) = agent {
        let id = AgentId::parse(a)?;
        layers.push(home.join("repos").join("agents").join(id.as_str()).join("tools"));
    }
    let known = choir_common::tool_layers::known_tool_names(&layers)?;
    let p = Path::new(path);
    let files: Vec<std::path::PathBuf> = if p.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(p)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        f.sort();
        f
    } else {
        vec![p.to_owned()]
    };
    let mut rows = Vec::new();
    let mut bad = 0;
    for file in &files {
        match load_skill_file(file, &|t| known.contains(t)) {
            Ok(skill) => {
                let s = &skill.spec;
                let terminal: Vec<&str> =
                    s.states.iter().filter(|(_, st)| st.terminal).map(|(n, _)| n.as_str()).collect();
                if !json {
                    say!(
                        "{}: skill {} is valid: {} states from {}, terminal {}, at most {} steps",
                        file.display(),
                        s.name,
                        s.states.len(),
                        s.initial_state,
                        terminal.join(", "),
                        s.max_steps
                    );
                }
                rows.push(serde_json::json!({"file": file, "name": s.name, "valid": true}));
            }
            Err(e) => {
                bad += 1;
                if !json {
                    say_err!("{}: {}", file.display(), e.error);
                }
                rows.push(serde_json::json!({"file": file, "valid": false, "error": e.error.to_string()}));
            }
        }
    }
    if json {
        print_json(&serde_json::json!({"valid": bad == 0, "skills": rows}))?;
    } else if files.is_empty() {
        say!("{path}: no skill files (*.json)");
    }
    if bad > 0 {
        anyhow::bail!(
            "{bad} of {} skill file(s) invalid; an agent with one of them would refuse to start",
            files.len()
        );
    }
    Ok(())
}

/// `tools add ID MANIFEST EXECUTABLE [--global]` and `skills add ID FILE [--global]`.
pub(crate) fn add(ctx: &Ctx, kind: &str, id: &str, files: &[&str], global: bool) -> anyhow::Result<()> {
    let read_json = |f: &str| -> anyhow::Result<serde_json::Value> {
        let text = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{f}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{f}: not JSON: {e}"))
    };
    let content = match (kind, files) {
        ("tool", [manifest, executable]) => {
            let exec = std::fs::read(executable).map_err(|e| anyhow::anyhow!("{executable}: {e}"))?;
            let exec = String::from_utf8(exec).map_err(|_| {
                anyhow::anyhow!("{executable}: an executable is added as text (a script); this one is not UTF-8")
            })?;
            serde_json::json!({"manifest": read_json(manifest)?, "executable": exec})
        }
        ("skill", [file]) => serde_json::json!({"skill": read_json(file)?}),
        ("tool", _) => anyhow::bail!("usage: choirctl tools add ID MANIFEST.json EXECUTABLE [--global]"),
        _ => anyhow::bail!("usage: choirctl skills add ID SKILL.json [--global]"),
    };
    let a: ApprovalInfo =
        ctx.client.post(&format!("agents/{id}/repos"), &AddRequest { kind: kind.to_owned(), global, content })?;
    if ctx.json {
        return print_json(&a);
    }
    say!(
        "{} {} added as approval {}: {}",
        a.kind,
        crate::term::one_line(&a.subject),
        a.id,
        a.applied.as_deref().unwrap_or("-")
    );
    match &a.rollout {
        Some(_) => crate::proposals::follow_rollout(ctx, a.id),
        None => {
            say!("it reaches the agent with its next image: choirctl agent update {}", a.agent);
            Ok(())
        }
    }
}
