//! Lane tools: `choir.core.start`, `choir.core.status`, `choir.core.cancel`,
//! `choir.skill.run` and `choir.memory.compact`. They go through the arbiter like any tool (schema,
//! allowlist, commit), but what they act on is the calling lane itself — its
//! core pool or its working memory — reached through [`LaneHooks`](super::tool::LaneHooks).

use std::sync::Arc;

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::host::HostCaller;
use super::tool::{ExecContext, JobRequest, Tool, ToolError};
use crate::origin::Origin;

/// A lane tool's manifest. Lane tools answer with the lane's own state
/// (a job started or cancelled, compaction asked for): `trusted`, except
/// `choir.core.status`, which returns finished jobs' reports — written after
/// reading their tools' output, possibly untrusted — so it is `untrusted`.
fn manifest(name: &str, description: &str, parameters: Value, side_effect: &str) -> ToolManifest {
    let trust = if name == "choir.core.status" { "untrusted" } else { "trusted" };
    super::fs::builtin_manifest(json!({
        "llm": {"name": name, "description": description, "parameters": parameters},
        "runtime": {"timeout_ms": 10000, "side_effect": side_effect, "version": "1", "output_trust": trust}
    }))
}

/// The lane tools' manifests, with their implementations.
pub fn tools() -> Vec<(ToolManifest, std::sync::Arc<dyn Tool>)> {
    let name = json!({"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,31}$", "description": "A short name for the job, e.g. weekly-report"});
    vec![
        (
            manifest(
                "choir.core.start",
                "Start a named core job: long work done in the background by a stronger model with its own budget. Its report comes back to you when it finishes.",
                json!({
                    "type": "object",
                    "properties": {
                        "name": name,
                        "objective": {"type": "string", "minLength": 1, "description": "What the job must achieve, with all the details it needs"},
                        "skill": {"type": "string", "description": "Optional skill to run the job with"},
                        "input": {"type": "object", "description": "The skill's input (matching its input schema)"},
                        "allowed_tools": {"type": "array", "maxItems": 64, "uniqueItems": true,
                                          "items": {"type": "string", "minLength": 1, "maxLength": 100},
                                          "description": "Only these tools for the job (the task's allowlist); without it, every tool a job may use"}
                    },
                    "required": ["name", "objective"],
                    "additionalProperties": false
                }),
                "write",
            ),
            std::sync::Arc::new(LaneTool::Start),
        ),
        (
            manifest(
                "choir.core.status",
                "Show the state, progress and budget of core jobs (one by name, or all).",
                json!({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": false}),
                "read",
            ),
            std::sync::Arc::new(LaneTool::Status),
        ),
        (
            manifest(
                "choir.core.cancel",
                "Cancel a running core job by name.",
                json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": false}),
                "write",
            ),
            std::sync::Arc::new(LaneTool::Cancel),
        ),
        (
            manifest(
                "choir.skill.run",
                "Run one of your skills (a guided, step-by-step procedure) now, in this conversation; its outcome comes back to you when it ends. For long work, start a core job with a skill instead.",
                json!({
                    "type": "object",
                    "properties": {
                        "skill": {"type": "string", "minLength": 1},
                        "input": {"type": "object", "description": "The skill's input (matching its input schema)"}
                    },
                    "required": ["skill"],
                    "additionalProperties": false
                }),
                "write",
            ),
            std::sync::Arc::new(LaneTool::Skill),
        ),
        (
            manifest(
                "choir.memory.compact",
                "Fold the older part of this conversation into a short summary to free context; recent turns and your current objective stay as they are.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
                "write",
            ),
            std::sync::Arc::new(LaneTool::Compact(None)),
        ),
    ]
}

/// `choir.memory.compact` with its host half: after asking for the lane's
/// working memory to be folded, it asks choird to fold the agent's session
/// tier into knowledge summaries.
pub fn compact_with_host(host: Arc<dyn HostCaller>) -> Arc<dyn Tool> {
    Arc::new(LaneTool::Compact(Some(host)))
}

/// A lane tool.
pub enum LaneTool {
    /// `choir.core.start`.
    Start,
    /// `choir.core.status`.
    Status,
    /// `choir.core.cancel`.
    Cancel,
    /// `choir.skill.run`.
    Skill,
    /// `choir.memory.compact` (with choird's half when it serves one).
    Compact(Option<Arc<dyn HostCaller>>),
}

impl Tool for LaneTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let hooks =
            ctx.hooks.ok_or_else(|| ToolError::new("not_available", "this tool is not available in this lane"))?;
        let s = |k: &str| input.get(k).and_then(Value::as_str);
        let skill_input = input.get("input").cloned().unwrap_or_else(|| json!({}));
        match self {
            LaneTool::Start => {
                let allowed: Option<Vec<String>> = input
                    .get("allowed_tools")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect());
                hooks.core_start(JobRequest {
                    name: s("name").unwrap_or_default(),
                    objective: s("objective").unwrap_or_default(),
                    skill: s("skill").map(|k| (k, &skill_input)),
                    allowed_tools: allowed.as_deref(),
                    inherited: ctx.history.iter().filter(|e| e.origin != Origin::Model).cloned().collect(),
                })
            }
            LaneTool::Skill => hooks.skill_run(s("skill").unwrap_or_default(), &skill_input),
            LaneTool::Status => hooks.core_status(s("name")),
            LaneTool::Cancel => hooks.core_cancel(s("name").unwrap_or_default()),
            LaneTool::Compact(None) => hooks.compact(),
            LaneTool::Compact(Some(host)) => {
                let mut out = hooks.compact()?;
                let lane_part = out["summary"].as_str().unwrap_or_default().to_owned();
                let host_part = match host.call("choir.memory.compact", &json!({}), ctx.lane, ctx.call_id, ctx.deadline)
                {
                    Ok(r) => {
                        out["memory"] = r.clone();
                        r["summary"].as_str().unwrap_or("session memory folded").to_owned()
                    }
                    Err(e) => format!("session memory not folded ({})", e.message),
                };
                out["summary"] = json!(format!("{lane_part}; {host_part}"));
                Ok(out)
            }
        }
    }
}
