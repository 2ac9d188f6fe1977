//! Loading argument policies: for each agent, the built-in
//! default, `repos/global/policy.json` and `repos/agents/<id>/policy.json`
//! merged ([`PolicySet::merge`]), each file checked against the tools that
//! agent can have (built-ins, choird's host tools, the approved external
//! tools of both layers) with every rule's examples run
//! ([`PolicyFile::parse`]). **A policy that fails does not replace the one
//! in force**: the error (file, rule, example) is logged, audited and
//! returned to `choirctl policy reload`; the agent keeps its previous rules
//! (at start, the built-in default). The agents get theirs through
//! FETCH_DYNAMIC_CONFIG; a change bumps the config version.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use choir_common::arg_policy::{
    known_from, KnownTools, PolicyError, PolicyFile, PolicySet, BUILT_IN, DEFAULT_POLICY, MAX_POLICY_BYTES,
};
use choir_common::arg_policy::{CallFacts, Remembered};
use choir_common::ids::AgentId;
use choir_common::manifest::{load_tool_layer, RuntimeView, SideEffect, BUILTIN_TOOLS};
use choir_common::roles::RoleMap;
use parking_lot::RwLock;

use crate::home::Home;
use crate::host_tools::Registry;

/// The argument policy in force for each agent.
#[derive(Default)]
pub struct ArgPolicies {
    current: RwLock<BTreeMap<AgentId, Arc<PolicySet>>>,
}

/// What a reload did for one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The agent's policy is now this many rules (changed or not).
    Loaded { rules: usize, changed: bool },
    /// Refused; the agent keeps the previous policy.
    Refused(PolicyError),
}

/// The tools `agent` can have, for checking its policy.
fn known_tools(home: &Home, host_tools: &Registry, agent: &AgentId) -> Result<KnownTools, PolicyError> {
    let host = host_tools.all();
    let mut manifests = Vec::new();
    let repos = home.repos();
    for dir in [repos.join("global").join("tools"), repos.join("agents").join(agent.as_str()).join("tools")] {
        let loaded = load_tool_layer(&dir).map_err(|e| PolicyError {
            file: e.file,
            rule: None,
            example: None,
            reason: format!("{} (tools must load before a policy can be checked)", e.reason),
        })?;
        manifests.extend(loaded.into_iter().map(|t| t.manifest));
    }
    manifests.extend(crate::mcp_pins::manifests(home, agent).into_iter().map(|(_, m)| m));
    let mut known = known_from(BUILTIN_TOOLS.iter().copied(), manifests.iter());
    for (name, manifest) in host {
        known.insert(name, manifest.map(|m| m.llm.parameters));
    }
    Ok(known)
}

/// The runtime view of `tool` as `agent` would have it: a host tool's, or
/// an approved external tool's (the agent's layer over the global one).
/// `None` for a built-in of the agent's own (choird holds no manifest of
/// those) or a tool that is not there.
pub fn runtime_of(home: &Home, host_tools: &Registry, agent: &AgentId, tool: &str) -> Option<RuntimeView> {
    if let Some(m) = host_tools.manifest(tool) {
        return Some(m.runtime);
    }
    let repos = home.repos();
    [repos.join("agents").join(agent.as_str()).join("tools"), repos.join("global").join("tools")]
        .iter()
        .filter_map(|dir| load_tool_layer(dir).ok())
        .flatten()
        .find(|t| t.manifest.llm.name == tool)
        .map(|t| t.manifest.runtime)
        .or_else(|| {
            crate::mcp_pins::manifests(home, agent)
                .into_iter()
                .find(|(_, m)| m.llm.name == tool)
                .map(|(_, m)| m.runtime)
        })
}

/// Reads one policy file: `None` if there is none. Refuses a link, a
/// non-file or an oversized file before reading it.
fn read_policy(path: &Path, label: &str) -> Result<Option<String>, PolicyError> {
    let err = |reason: String| PolicyError { file: label.to_owned(), rule: None, example: None, reason };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.to_string())),
    };
    if !meta.file_type().is_file() {
        return Err(err("not a regular file (links are not followed)".into()));
    }
    if meta.len() > MAX_POLICY_BYTES {
        return Err(err(format!("{} bytes; at most {MAX_POLICY_BYTES}", meta.len())));
    }
    std::fs::read_to_string(path).map(Some).map_err(|e| err(e.to_string()))
}

/// `agent`'s policy from the files as they are now, with the destinations
/// the operator asked to remember that have not expired.
pub fn load(home: &Home, host_tools: &Registry, agent: &AgentId) -> Result<PolicySet, PolicyError> {
    let known = known_tools(home, host_tools, agent)?;
    let mut layers = vec![PolicyFile::parse(BUILT_IN, DEFAULT_POLICY, &known)?];
    let agent_file = format!("repos/agents/{agent}/policy.json");
    for label in ["repos/global/policy.json", agent_file.as_str()] {
        if let Some(text) = read_policy(&home.root().join(label), label)? {
            layers.push(PolicyFile::parse(label, &text, &known)?);
        }
    }
    let mut set = PolicySet::merge(layers);
    let now = choir_common::arg_policy::now_unix();
    set.remembered = read_remembered(home, agent)?.into_iter().filter(|r| r.until_unix > now).collect();
    Ok(set)
}

/// Where the destinations remembered for `agent` are kept.
pub fn remembered_file(home: &Home, agent: &AgentId) -> std::path::PathBuf {
    remembered_dir(home).join(format!("{agent}.json"))
}

/// Where the remembered destinations of every agent are kept.
pub fn remembered_dir(home: &Home) -> std::path::PathBuf {
    home.root().join("remembered")
}

/// The remembered destinations of `agent` as written (expired ones too).
pub fn read_remembered(home: &Home, agent: &AgentId) -> Result<Vec<Remembered>, PolicyError> {
    let label = format!("remembered/{agent}.json");
    let Some(text) = read_policy(&remembered_file(home, agent), &label)? else { return Ok(Vec::new()) };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        remembered: Vec<Remembered>,
    }
    serde_json::from_str::<File>(&text).map(|f| f.remembered).map_err(|e| PolicyError {
        file: label,
        rule: None,
        example: None,
        reason: e.to_string(),
    })
}

/// Adds `values` (normal forms) to what `agent` remembers, until
/// `until_unix`; returns the values added. Written whole and renamed into
/// place.
pub fn remember(
    home: &Home,
    agent: &AgentId,
    values: &[String],
    until_unix: u64,
    approval: i64,
    tool: &str,
    by: &str,
) -> Result<Vec<String>, String> {
    let mut all = read_remembered(home, agent).map_err(|e| e.to_string())?;
    let now = choir_common::arg_policy::now_unix();
    all.retain(|r| r.until_unix > now && !values.contains(&r.value));
    for v in values {
        all.push(Remembered { value: v.clone(), until_unix, approval, tool: tool.to_owned(), by: by.to_owned() });
    }
    if all.len() > MAX_REMEMBERED {
        return Err(format!("more than {MAX_REMEMBERED} remembered destinations for {agent}; forget some first"));
    }
    let path = remembered_file(home, agent);
    let dir = path.parent().unwrap_or(home.root());
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!(".{agent}.json.tmp"));
    let text = serde_json::to_string_pretty(&serde_json::json!({"remembered": all})).map_err(|e| e.to_string())?;
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)).map_err(|e| e.to_string())?;
    Ok(values.to_vec())
}

/// Most remembered destinations one agent keeps.
pub const MAX_REMEMBERED: usize = 1000;

/// The destination values of `tool` called with `input`, normalised, by
/// the tool's roles (what remembering an approval keeps: where things go,
/// never what an effect acts on — an id approved once is no blessing of
/// every later effect on it).
pub fn destinations_of(runtime: Option<&RuntimeView>, input: &serde_json::Value) -> Vec<String> {
    let Some(roles) = runtime.map(RoleMap::of) else { return Vec::new() };
    let found = roles.values(choir_common::roles::Role::Destination, input);
    let mut values: Vec<String> = found.into_iter().map(|(_, v)| choir_common::provenance::normalise(&v).1).collect();
    values.sort();
    values.dedup();
    values
}

impl ArgPolicies {
    /// The policy in force for `agent` (the built-in default's rules until
    /// one was loaded).
    pub fn get(&self, agent: &AgentId) -> Arc<PolicySet> {
        if let Some(p) = self.current.read().get(agent) {
            return p.clone();
        }
        BUILTIN.clone()
    }

    /// Reloads the policies of `agents` from disk; a refused one keeps
    /// what it had.
    pub fn reload<'a>(
        &self,
        home: &Home,
        host_tools: &Registry,
        agents: impl IntoIterator<Item = &'a AgentId>,
    ) -> Vec<(AgentId, Reloaded)> {
        let mut out = Vec::new();
        for agent in agents {
            match load(home, host_tools, agent) {
                Ok(set) => {
                    let rules = set.rules.len();
                    let mut current = self.current.write();
                    let changed = current.get(agent).is_none_or(|p| **p != set);
                    if changed {
                        current.insert(agent.clone(), Arc::new(set));
                    }
                    out.push((agent.clone(), Reloaded::Loaded { rules, changed }));
                }
                Err(e) => {
                    log::error!("argument policy of agent {agent} refused, the previous one stays in force: {e}");
                    out.push((agent.clone(), Reloaded::Refused(e)));
                }
            }
        }
        out
    }
}

/// The built-in default alone, for an agent whose policy was never loaded
/// (parsed once; `arg_policy`'s tests check it against Choir's tools, and a
/// default that did not parse fails start-up's first reload loudly).
static BUILTIN: std::sync::LazyLock<Arc<PolicySet>> = std::sync::LazyLock::new(|| {
    let file: PolicyFile = serde_json::from_str(DEFAULT_POLICY).unwrap_or_else(|e| {
        log::error!("the built-in argument policy does not parse: {e}");
        PolicyFile::default()
    });
    let mut set = PolicySet::merge([file]);
    for r in &mut set.rules {
        r.file = BUILT_IN.to_owned();
    }
    Arc::new(set)
});

/// The answer to `choirctl policy reload`.
pub fn report(results: &[(AgentId, Reloaded)]) -> serde_json::Value {
    let agents: Vec<serde_json::Value> = results
        .iter()
        .map(|(agent, r)| match r {
            Reloaded::Loaded { rules, changed } => {
                serde_json::json!({"agent": agent, "status": "loaded", "rules": rules, "changed": changed})
            }
            Reloaded::Refused(e) => serde_json::json!({"agent": agent, "status": "refused", "error": e.to_string(),
                "file": e.file, "rule": e.rule, "example": e.example}),
        })
        .collect();
    serde_json::json!({"agents": agents})
}

/// `choirctl policy test`: the decision on a call whose values have the
/// sources the operator names (the rest: made by the model).
pub fn test(
    set: &PolicySet,
    runtime: Option<&RuntimeView>,
    t: &choir_common::admin::PolicyTest,
) -> Result<choir_common::arg_policy::Evaluation, crate::error::Error> {
    use choir_common::provenance::Source;
    if choir_common::ids::validate_tool_name(&t.tool).is_err() {
        return Err(crate::error::Error::Malformed(format!("{} is not a tool name", crate::http::printable(&t.tool))));
    }
    // A pointer names a value; the value's sources are looked up by it.
    let by_value: BTreeMap<String, Vec<Source>> = t
        .from
        .iter()
        .filter_map(|(p, s)| {
            t.input.pointer(p).map(|v| (v.as_str().map(str::to_owned).unwrap_or(v.to_string()), s.clone()))
        })
        .collect();
    if let Some(p) = t.from.keys().find(|p| t.input.pointer(p).is_none()) {
        return Err(crate::error::Error::Malformed(format!("--from {p}: the input has no value there")));
    }
    let compiled = set.compile().map_err(crate::error::Error::Internal)?;
    let roles = runtime.map(RoleMap::of).unwrap_or_default();
    let facts = CallFacts {
        roles: &roles,
        side_effect: runtime.map_or(SideEffect::Read, |r| r.side_effect),
        after_untrusted: t.after_untrusted,
        in_intent: t.in_intent,
    };
    Ok(compiled.evaluate(&t.tool, &facts, &t.input, &mut |v| {
        let sources: std::collections::BTreeSet<Source> =
            by_value.get(v).map(|s| s.iter().copied().collect()).unwrap_or_else(|| [Source::Model].into());
        sources.into()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_file_that_is_a_link_a_fifo_or_too_big_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.json");
        std::fs::write(&secret, r#"{"rules": []}"#).unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let e = read_policy(&link, "link.json").unwrap_err().to_string();
        assert!(e.contains("not a regular file (links are not followed)"), "{e}");
        let fifo = dir.path().join("fifo.json");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        // Refused without opening it: a FIFO would block the reload forever.
        let e = read_policy(&fifo, "fifo.json").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; MAX_POLICY_BYTES as usize + 1]).unwrap();
        let e = read_policy(&big, "big.json").unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
        assert_eq!(read_policy(&dir.path().join("none.json"), "none.json").unwrap(), None);
        assert!(read_policy(&secret, "secret.json").unwrap().is_some());
    }

    #[test]
    fn an_agent_remembers_at_most_a_thousand_destinations_and_a_refused_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let agent = AgentId::parse("demo").unwrap();
        let until = choir_common::arg_policy::now_unix() + 86_400;
        let many: Vec<String> = (0..MAX_REMEMBERED - 1).map(|i| format!("u{i}@corp.test")).collect();
        remember(&home, &agent, &many, until, 1, "choir.email.send", "admin").unwrap();
        let before = std::fs::read(remembered_file(&home, &agent)).unwrap();
        // Two more would make 1,001: refused whole, the file unchanged.
        let two = ["a@corp.test".to_owned(), "b@corp.test".to_owned()];
        let e = remember(&home, &agent, &two, until, 2, "choir.email.send", "admin").unwrap_err();
        assert!(e.contains("more than 1000 remembered destinations") && e.contains("forget some first"), "{e}");
        assert_eq!(std::fs::read(remembered_file(&home, &agent)).unwrap(), before);
        // One more fits; one already kept is renewed, not counted twice.
        remember(&home, &agent, &two[..1], until, 3, "choir.email.send", "admin").unwrap();
        remember(&home, &agent, &many[..1], until + 1, 4, "choir.email.send", "admin").unwrap();
        let kept = read_remembered(&home, &agent).unwrap();
        assert_eq!(kept.len(), MAX_REMEMBERED);
        assert_eq!(kept.iter().find(|r| r.value == many[0]).map(|r| r.approval), Some(4));
        // Expired ones make room.
        let past = choir_common::arg_policy::now_unix() - 1;
        remember(&home, &agent, &many[1..], past, 5, "choir.email.send", "admin").unwrap();
        remember(&home, &agent, &two[1..], until, 6, "choir.email.send", "admin").unwrap();
        assert_eq!(read_remembered(&home, &agent).unwrap().len(), 3);
    }

    #[test]
    fn the_built_in_default_is_what_an_unloaded_agent_runs_under() {
        let p = ArgPolicies::default();
        let set = p.get(&AgentId::parse("demo").unwrap());
        assert!(set.rules.iter().any(|r| r.id == "destination-not-given"));
        assert!(set.rules.iter().all(|r| r.file == BUILT_IN));
    }
}
