//! Every skill an agent has, for the operator (`choirctl skills list AGENT`):
//! the built-ins, then each file of the global and the agent layer under
//! `repos/`, each with its status — `ok`, `invalid` (why; the agent would
//! refuse to start), `replaced` (an agent-layer file of the same name wins)
//! — and where it comes from. Read from the repos on disk, checked against
//! the tools the agent has, so it answers whether the agent runs or not.

use std::collections::BTreeSet;

use choir_common::admin::{SkillList, SkillRow};
use choir_common::ids::AgentId;
use choir_common::skill::{builtin_skills, load_skill_file};

use crate::error::Error;
use crate::shared::Shared;

/// The skills of `agent`; `tools` are the names of the tools it has.
pub fn list(shared: &Shared, agent: &AgentId, tools: &BTreeSet<String>) -> Result<SkillList, Error> {
    let registered = |t: &str| tools.contains(t);
    let mut rows: Vec<SkillRow> = builtin_skills(&registered)
        .map_err(|e| Error::Internal(e.to_string()))?
        .into_iter()
        .map(|s| row(&s.spec, None, "built-in", s.source.clone()))
        .collect();
    let builtin: BTreeSet<String> = rows.iter().map(|r| r.name.clone()).collect();
    let repos = shared.home.repos();
    for (layer, dir) in [
        ("global", repos.join("global").join("skills")),
        ("agent", repos.join("agents").join(agent.as_str()).join("skills")),
    ] {
        let mut files: Vec<_> = match std::fs::read_dir(&dir) {
            Ok(entries) => {
                entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
            }
            Err(_) => Vec::new(),
        };
        files.sort();
        for file in files {
            let shown = file.strip_prefix(shared.home.root()).unwrap_or(&file).display().to_string();
            let row = match load_skill_file(&file, &registered) {
                Ok(s) => {
                    let why = builtin.contains(&s.spec.name).then(|| {
                        format!(
                            "{} is a built-in skill and cannot be replaced (the agent would refuse to start)",
                            s.spec.name
                        )
                    });
                    row(&s.spec, why, layer, shown)
                }
                Err(e) => SkillRow {
                    name: file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
                    status: "invalid".into(),
                    why: Some(format!("{} (the agent would refuse to start)", e.error)),
                    source: layer.into(),
                    file: shown,
                    description: String::new(),
                    states: 0,
                },
            };
            if layer == "agent" && row.status == "ok" {
                for r in rows.iter_mut().filter(|r| r.source == "global" && r.name == row.name && r.status == "ok") {
                    r.status = "replaced".into();
                    r.why = Some(format!("the agent layer's {} replaces it", row.file));
                }
            }
            rows.push(row);
        }
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.file.cmp(&b.file)));
    Ok(SkillList { agent: agent.to_string(), skills: rows })
}

/// The tools of `agent` and its skills checked against them as the agent's
/// registry would hold them (every tool it has, and the names of choird's
/// tools whether or not they are served to it).
pub fn of_agent(
    shared: &Shared,
    host_tools: &crate::host_tools::Registry,
    agent: &AgentId,
) -> Result<(choir_common::admin::ToolList, SkillList), Error> {
    let (tools, names) = crate::tool_list::known_names(shared, host_tools, agent)?;
    let skills = list(shared, agent, &names)?;
    Ok((tools, skills))
}

/// A loaded skill's row: `ok`, or `invalid` with `why`.
fn row(spec: &choir_common::skill::SkillSpec, why: Option<String>, source: &str, file: String) -> SkillRow {
    SkillRow {
        name: spec.name.clone(),
        status: if why.is_some() { "invalid" } else { "ok" }.into(),
        why,
        source: source.into(),
        file,
        description: spec.description.clone(),
        states: spec.states.len(),
    }
}
