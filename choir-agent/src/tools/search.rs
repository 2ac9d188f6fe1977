//! `choir.fs.search`: ripgrep over a workspace path (`file:S` on that path).
//! ripgrep's `--json` output is parsed into matches; the count is bounded and
//! ripgrep is stopped once enough are found. ripgrep does not follow symlinks
//! while walking, and the searched path itself is first resolved beneath the
//! workspace root, so a search cannot read outside the workspace through a link.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::tool::{ExecContext, Tool, ToolError};
use crate::process::spawn::{kill_group, Cmd};
use crate::workspace::PathError;

/// Default and largest number of matches returned.
const DEFAULT_MATCHES: u64 = 50;
const MAX_MATCHES: u64 = 500;
/// Longest line text kept per match.
const LINE_CAP: usize = 300;

/// Manifest of `choir.fs.search`.
pub fn manifest() -> ToolManifest {
    super::fs::builtin_manifest(json!({
        "llm": {
            "name": "choir.fs.search",
            "description": "Search files in the workspace with ripgrep (regular expressions). Returns matching lines with their paths and line numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "description": "Regular expression (Rust regex syntax)"},
                    "path": {"type": "string", "description": "File or directory to search, relative to /workspace; default the whole workspace"},
                    "glob": {"type": "string", "description": "Only files matching this glob, e.g. *.rs"},
                    "case_insensitive": {"type": "boolean"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 500}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }
        },
        "runtime": {
            "timeout_ms": 30000,
            "locks": [{"resource": "file:{path}", "mode": "S"}],
            "side_effect": "read",
            "idempotent": true,
            "version": "1",
            // Matching lines are workspace file content: untrusted, private.
            "output_trust": "untrusted",
            "private_fields": [""]
        }
    }))
}

/// `choir.fs.search`.
pub struct SearchTool;

impl Tool for SearchTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let pattern = input.get("pattern").and_then(Value::as_str).unwrap_or_default();
        let raw_path = input.get("path").and_then(Value::as_str).unwrap_or(".");
        let rel = ctx.workspace.normalize(raw_path).map_err(|e| ToolError::new("path_forbidden", e.to_string()))?;
        // Only a directory (whose special files ripgrep skips) or a regular
        // file: a FIFO or device would block ripgrep until the timeout.
        match ctx.workspace.kind(&rel) {
            Ok(Some(rustix::fs::FileType::Directory | rustix::fs::FileType::RegularFile)) => {}
            Ok(Some(other)) => {
                return Err(ToolError::new(
                    "not_a_file",
                    format!(
                        "{} is {}; only regular files and directories can be searched",
                        rel.as_str(),
                        crate::workspace::kind_name(other)
                    ),
                ))
            }
            Ok(None) => return Err(ToolError::new("not_found", format!("{} does not exist", rel.as_str()))),
            Err(e @ PathError::Escapes(_)) => return Err(ToolError::new("path_forbidden", e.to_string())),
            Err(e) => return Err(ToolError::new("io_error", e.to_string())),
        }
        let limit = input.get("max_results").and_then(Value::as_u64).unwrap_or(DEFAULT_MATCHES).min(MAX_MATCHES);

        let mut cmd = Cmd::new("rg");
        cmd.args(["--json", "--no-config", "--max-columns", "1000"]);
        if input.get("case_insensitive").and_then(Value::as_bool) == Some(true) {
            cmd.args(["-i"]);
        }
        if let Some(glob) = input.get("glob").and_then(Value::as_str) {
            cmd.args(["--glob", glob]);
        }
        // The agent's own state is never searched.
        cmd.args(["--glob", "!.choir/**", "-e", pattern, "--", rel.as_str()]).cwd(ctx.workspace.root());
        let mut child = cmd.spawn(Stdio::null(), Stdio::piped(), Stdio::piped()).map_err(|e| {
            ToolError::new("search_failed", format!("cannot run ripgrep (rg): {e}; is ripgrep installed?"))
        })?;
        let stderr = crate::process::spawn::capture(
            child.stderr.take().ok_or_else(|| ToolError::new("search_failed", "no stderr"))?,
            4096,
            "rg-stderr",
        )
        .map_err(|e| ToolError::new("search_failed", e.to_string()))?;
        let stdout = child.stdout.take().ok_or_else(|| ToolError::new("search_failed", "no stdout"))?;
        let mut matches = Vec::new();
        let mut truncated = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
            if v["type"] != "match" {
                continue;
            }
            if matches.len() as u64 >= limit {
                truncated = true;
                kill_group(&child);
                break;
            }
            let data = &v["data"];
            let text: String = data["lines"]["text"]
                .as_str()
                .unwrap_or_default()
                .trim_end_matches('\n')
                .chars()
                .take(LINE_CAP)
                .collect();
            matches.push(json!({
                "path": data["path"]["text"],
                "line": data["line_number"],
                "text": text,
            }));
            if std::time::Instant::now() > ctx.deadline {
                truncated = true;
                kill_group(&child);
                break;
            }
        }
        let status =
            crate::process::spawn::reap(&mut child).map_err(|e| ToolError::new("search_failed", e.to_string()))?;
        let (err, _) = stderr.join().unwrap_or_default();
        // rg: 0 = matches, 1 = none, 2 = error (e.g. a bad pattern).
        if !truncated && status.code() == Some(2) && matches.is_empty() {
            return Err(ToolError::new("search_failed", String::from_utf8_lossy(&err).trim().to_owned()));
        }
        Ok(json!({
            "summary": format!("{} match{} for {pattern:?} in {}{}", matches.len(), if matches.len() == 1 { "" } else { "es" }, rel.as_str(), if truncated { " (more not shown)" } else { "" }),
            "matches": matches,
            "truncated": truncated,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretStore;
    use crate::workspace::Workspace;
    use std::time::{Duration, Instant};

    fn search(root: &std::path::Path, input: Value) -> Result<Value, ToolError> {
        let ws = Workspace::open(root).unwrap();
        let ctx = ExecContext {
            workspace: &ws,
            lane: "edge",
            call_id: "test",
            state_dir: root,
            deadline: Instant::now() + Duration::from_secs(30),
            secrets: SecretStore::default(),
            hooks: None,
            history: &[],
        };
        SearchTool.execute(&ctx, &input)
    }

    #[test]
    fn finds_matches_bounds_them_and_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/a.rs"), "fn needle() {}\nfn other() {}\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), (0..100).map(|i| format!("needle {i}\n")).collect::<String>())
            .unwrap();
        std::fs::create_dir_all(dir.path().join(".choir")).unwrap();
        std::fs::write(dir.path().join(".choir/commit.log"), "needle in state\n").unwrap();
        std::fs::write(outside.path().join("secret.txt"), "needle outside\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();

        let r = search(dir.path(), json!({"pattern": "needle", "path": "src"})).unwrap();
        assert_eq!(r["matches"], json!([{"path": "src/a.rs", "line": 1, "text": "fn needle() {}"}]));
        let r = search(dir.path(), json!({"pattern": "needle", "max_results": 10})).unwrap();
        assert_eq!(r["matches"].as_array().unwrap().len(), 10);
        assert_eq!(r["truncated"], true);
        let all = search(dir.path(), json!({"pattern": "needle", "max_results": 500})).unwrap();
        let text = all.to_string();
        assert!(!text.contains("outside") && !text.contains("in state"), "{text}");
        assert_eq!(
            search(dir.path(), json!({"pattern": "needle", "path": "link"})).unwrap_err().code,
            "path_forbidden"
        );
        assert_eq!(search(dir.path(), json!({"pattern": "(", "path": "src"})).unwrap_err().code, "search_failed");
        assert_eq!(search(dir.path(), json!({"pattern": "zzz"})).unwrap()["matches"], json!([]));
    }
}
