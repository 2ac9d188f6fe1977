//! `choir.tools.find` (R-TOOL-7): ranks the agent's offered tools (its
//! external ones: Choir's own are always listed) against a query, so a model
//! can find a tool without every schema in its context.
//!
//! Ranking is by embedding similarity of the tools' descriptions, computed by
//! choird (which embeds each description once and keeps it, keyed by its
//! hash); when choird cannot (memory not configured, embedding endpoint
//! down), by keywords: query words against each tool's name and description,
//! weighted by how rare the word is among the tools. Either way the answer
//! carries the tools' LLM views, and the lane is told which tools were found
//! (with `tool_exposure: find` they are offered from then on).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::host::HostCaller;
use super::tool::{ExecContext, Tool, ToolError};

/// The tool's name.
pub const NAME: &str = "choir.tools.find";

/// Its manifest.
pub fn manifest() -> ToolManifest {
    super::fs::builtin_manifest(json!({
        "llm": {"name": NAME,
                "description": "Find the tools that fit a task: describe what you want to do, get the best-matching tools with their parameters.",
                "parameters": {"type": "object", "properties": {
                    "query": {"type": "string", "minLength": 1, "description": "What you want to do, in a few words"},
                    "k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "How many tools (default 5)"}},
                "required": ["query"], "additionalProperties": false}},
        // LLM views of this agent's approved manifests, ranked by Choir: trusted.
        "runtime": {"timeout_ms": 30000, "side_effect": "read", "idempotent": true, "version": "1",
                    "output_trust": "trusted"}
    }))
}

/// One tool as the model may see it.
#[derive(Debug, Clone)]
pub struct View {
    /// Canonical name.
    pub name: String,
    /// Description.
    pub description: String,
    /// JSON Schema of its input.
    pub parameters: Value,
}

/// The implementation, built over the registry's offered tools.
pub struct FindTool {
    views: Vec<View>,
    policy: Arc<parking_lot::RwLock<choir_common::tool_policy::ToolPolicy>>,
    host: Option<Arc<dyn HostCaller>>,
}

impl FindTool {
    /// Over `views`; ranks through `host` when given.
    /// Only tools `policy` permits (at the time of the search) are found.
    pub fn new(
        views: Vec<View>,
        host: Option<Arc<dyn HostCaller>>,
        policy: Arc<parking_lot::RwLock<choir_common::tool_policy::ToolPolicy>>,
    ) -> FindTool {
        FindTool { views, host, policy }
    }
}

const STOP: &[&str] = &[
    "a", "an", "and", "the", "of", "to", "in", "on", "for", "with", "by", "from", "at", "as", "or", "is", "are", "be",
    "it", "its", "this", "that", "my", "me", "i", "you", "your", "what", "which", "how", "do", "can", "into", "one",
    "all", "some", "please", "want", "need", "would", "like", "about", "via",
];

/// Lowercase word stems: common English endings dropped.
fn stems(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 1 && !STOP.contains(w))
        .map(|w| {
            for suffix in ["ing", "ies", "es", "ed", "s", "er"] {
                if w.len() > suffix.len() + 2 {
                    if let Some(stem) = w.strip_suffix(suffix) {
                        return stem.to_owned();
                    }
                }
            }
            w.to_owned()
        })
        .collect()
}

/// Keyword ranking: Σ over query stems found in a tool of idf, name matches
/// counting double. Returns (index, score) best first.
pub fn keyword_rank(views: &[View], query: &str) -> Vec<(usize, f64)> {
    let docs: Vec<(HashSet<String>, HashSet<String>)> = views
        .iter()
        .map(|v| (stems(&v.name).into_iter().collect(), stems(&v.description).into_iter().collect()))
        .collect();
    let n = docs.len().max(1) as f64;
    let mut df: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, desc) in &docs {
        for w in name.union(desc) {
            *df.entry(w.as_str()).or_default() += 1;
        }
    }
    let q: HashSet<String> = stems(query).into_iter().collect();
    let mut scored: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, (name, desc))| {
            let s: f64 = q
                .iter()
                .map(|w| {
                    let idf = (n / (1.0 + df.get(w.as_str()).copied().unwrap_or(0) as f64)).ln() + 1.0;
                    idf * (2.0 * f64::from(u8::from(name.contains(w))) + f64::from(u8::from(desc.contains(w))))
                })
                .sum();
            (i, s)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored
}

impl Tool for FindTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let query = input["query"].as_str().unwrap_or_default();
        let k = input["k"].as_u64().unwrap_or(5).clamp(1, 20) as usize;
        let semantic = self.host.as_ref().and_then(|host| {
            let tools: Vec<Value> =
                self.views.iter().map(|v| json!({"name": v.name, "description": v.description})).collect();
            let asked = json!({"query": query, "k": k, "tools": tools});
            match host.call(NAME, &asked, ctx.lane, ctx.call_id, ctx.deadline) {
                Ok(r) => Some(
                    r["ranked"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|t| {
                            let i = self.views.iter().position(|v| Some(v.name.as_str()) == t["name"].as_str())?;
                            Some((i, t["score"].as_f64().unwrap_or(0.0)))
                        })
                        .collect::<Vec<_>>(),
                ),
                Err(e) => {
                    log::warn!("choir.tools.find: ranking by meaning failed ({e}); ranking by keywords");
                    None
                }
            }
        });
        let method = if semantic.is_some() { "semantic" } else { "keyword" };
        let ranked = semantic.unwrap_or_else(|| keyword_rank(&self.views, query));
        let policy = self.policy.read().clone();
        let found: Vec<Value> = ranked
            .into_iter()
            .filter(|(i, _)| self.views.get(*i).is_some_and(|v| policy.permits(&v.name)))
            .filter(|(_, s)| method == "semantic" || *s > 0.0)
            .take(k)
            .map(|(i, score)| {
                let v = &self.views[i];
                json!({"name": v.name, "description": v.description, "parameters": v.parameters,
                       "score": (score * 1000.0).round() / 1000.0})
            })
            .collect();
        let names: Vec<String> = found.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect();
        if let Some(hooks) = ctx.hooks {
            hooks.discovered(&names);
        }
        Ok(json!({
            "summary": if names.is_empty() { "no tool matches".to_owned() } else { format!("best matches ({method}): {}", names.join(", ")) },
            "method": method,
            "tools": found,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, description: &str) -> View {
        View { name: name.into(), description: description.into(), parameters: json!({"type": "object"}) }
    }

    #[test]
    fn keywords_rank_by_rare_shared_stems_names_first() {
        let views = vec![
            view("x.mail.send", "Send an email message to someone."),
            view("x.calendar.add", "Add an event to the calendar."),
            view("x.files.delete", "Delete files from the workspace."),
        ];
        assert_eq!(keyword_rank(&views, "emailing my boss")[0].0, 0);
        assert_eq!(keyword_rank(&views, "schedule events in my calendar")[0].0, 1);
        assert_eq!(keyword_rank(&views, "deleting old files")[0].0, 2);
        assert!(keyword_rank(&views, "zebra")[0].1 == 0.0);
    }
}
