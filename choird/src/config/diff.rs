//! What changed between two configurations, by when each change takes
//! effect: at once, at the next start of choird, or at an agent's next start.
//! A reload reports it (`choirctl reload`, SIGHUP), so a change choird read
//! but cannot apply yet is never mistaken for one in force.

use choir_common::admin::ReloadReport;
use serde_json::Value;

use super::Config;

/// Top-level fields read only at choird's start.
const AT_CHOIRD_START: &[&str] = &[
    "database_url",
    "postgres_bin_dir",
    "http_listen",
    "http_allow_non_loopback",
    "metrics_listen",
    "console_listen",
    "admin_group",
    "memory",
];

/// Fields read only when an agent starts (its process or container).
fn at_agent_start(path: &[String]) -> bool {
    match path.first().map(String::as_str) {
        Some("runtime" | "agent_binary") => true,
        Some("docker") => true,
        Some("agents") => {
            // An agent learns which host tools it has (web, mail, Notion,
            // voice) when it starts.
            matches!(
                path.get(2).map(String::as_str),
                Some("resources" | "network" | "autostart" | "web" | "email" | "notion" | "voice")
            ) || (path.get(2).map(String::as_str) == Some("quotas")
                && path.get(3).map(String::as_str) == Some("workspace_mb"))
        }
        _ => false,
    }
}

/// The changed fields of `new` against `old`, sorted into the report.
pub fn changes(old: &Config, new: &Config) -> ReloadReport {
    let (a, b) = (serde_json::to_value(old).unwrap_or_default(), serde_json::to_value(new).unwrap_or_default());
    let mut paths = Vec::new();
    walk(&a, &b, &mut Vec::new(), &mut paths);
    let mut report = ReloadReport::default();
    for path in paths {
        let shown = path.join(".");
        if path.first().is_some_and(|f| AT_CHOIRD_START.contains(&f.as_str())) {
            report.after_choird_restart.push(shown);
        } else if at_agent_start(&path) {
            report.after_agent_restart.push(shown);
        } else {
            report.applied.push(shown);
        }
    }
    report
}

/// Collects the paths where `a` and `b` differ: down to an agent's own
/// fields (`agents.ops.max_steps`) and a section's (`telegram.bots`), a whole
/// agent when it was added or removed.
fn walk(a: &Value, b: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if a == b {
        return;
    }
    let deep = at.len() < 3 || (at.first().map(String::as_str) == Some("agents") && at.len() < 4);
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if deep && !(at.len() == 2 && at[0] == "agents" && x.is_empty()) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                at.push(k.clone());
                walk(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), at, out);
                at.pop();
            }
        }
        _ => out.push(at.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(edit: impl FnOnce(&mut Value)) -> Config {
        let mut v: Value = serde_json::from_str(crate::home::STARTER_CONFIG).unwrap();
        v["agents"] = serde_json::json!({"ops": {"max_steps_per_turn": 16}});
        edit(&mut v);
        Config::parse(&v.to_string()).unwrap()
    }

    #[test]
    fn each_change_is_sorted_by_when_it_takes_effect() {
        let old = config(|_| {});
        let new = config(|v| {
            v["agents"]["ops"]["max_steps_per_turn"] = 20.into();
            v["agents"]["ops"]["network"] = "bridge".into();
            v["metrics_listen"] = "127.0.0.1:9100".into();
            v["agents"]["new"] = serde_json::json!({});
            v["agents"]["ops"]["web"] = serde_json::json!({"allow_domains": ["example.com"]});
            v["memory"] =
                serde_json::json!({"embeddings": {"base_url": "http://127.0.0.1:9/v1", "model": "e", "dimensions": 8}});
        });
        let r = changes(&old, &new);
        assert_eq!(r.applied, ["agents.new", "agents.ops.max_steps_per_turn"]);
        assert_eq!(r.after_agent_restart, ["agents.ops.network", "agents.ops.web"]);
        assert_eq!(r.after_choird_restart, ["memory", "metrics_listen"]);
        assert_eq!(changes(&old, &old), ReloadReport::default(), "nothing changed, nothing said");
    }
}
