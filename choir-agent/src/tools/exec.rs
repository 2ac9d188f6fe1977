//! `choir.exec` (R-TOOL-5): a shell command in the workspace, holding
//! `workspace:X`.
//!
//! Each lane has a persistent shell *state*: the working directory and the
//! exported variables survive from one call to the next. Each call runs a fresh
//! `bash` in its own process group that first restores that state and saves it
//! again on exit, so a timeout can kill the command and everything it started
//! without losing the lane's shell. Output (stdout and stderr) streams to a log
//! file under `.choirtmp/exec/` — never into memory — and the model gets the
//! exit code, a 500-character preview, whether it was truncated, and the log
//! path. Logs older than 30 days are pruned.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::tool::{ExecContext, Tool, ToolError};
use crate::process::spawn::{wait_until, Cmd, Ended};

/// Characters of output shown to the model.
pub const PREVIEW: usize = 500;
/// How long command logs are kept.
const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Restores the lane's state, runs the command, saves the state on any exit.
const WRAPPER: &str = r#"
__choir_state=$1
if [ -f "$__choir_state" ]; then . "$__choir_state" >/dev/null 2>&1; fi
__choir_save() {
  { printf 'cd -- %q\n' "$PWD"; export -p; } > "$__choir_state.tmp" 2>/dev/null && mv -f "$__choir_state.tmp" "$__choir_state"
}
trap __choir_save EXIT
__choir_cmd=$CHOIR_COMMAND
unset CHOIR_COMMAND
eval "$__choir_cmd"
"#;

/// Manifest of `choir.exec`.
pub fn manifest() -> ToolManifest {
    super::fs::builtin_manifest(json!({
        "llm": {
            "name": "choir.exec",
            "description": "Run a bash command in the workspace. The working directory and exported variables persist between calls. Output goes to a log file; you get the exit code, a preview and the log path.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "minLength": 1},
                    "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600, "description": "Default 300"}
                },
                "required": ["command"],
                "additionalProperties": false
            }
        },
        "runtime": {
            "timeout_ms": 600000,
            "locks": [{"resource": "workspace", "mode": "X"}],
            "side_effect": "write",
            "idempotent": false,
            "version": "1",
            // A command's output is whatever the programs it ran print
            // (workspace files among it): untrusted, private.
            "output_trust": "untrusted",
            "private_fields": [""]
        }
    }))
}

/// `choir.exec`.
pub struct ExecTool;

fn lane_file(lane: &str) -> String {
    lane.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

impl Tool for ExecTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let command = input.get("command").and_then(Value::as_str).unwrap_or_default();
        let timeout = Duration::from_secs(input.get("timeout_s").and_then(Value::as_u64).unwrap_or(300));
        let deadline = (Instant::now() + timeout).min(ctx.deadline);
        let io = |what: &str, e: std::io::Error| ToolError::new("exec_failed", format!("{what}: {e}"));

        let root = ctx.workspace.root();
        let log_dir = root.join(".choirtmp").join("exec");
        std::fs::create_dir_all(&log_dir).map_err(|e| io("cannot create the log directory", e))?;
        prune(&log_dir);
        let state_dir = ctx.state_dir.join("exec");
        std::fs::create_dir_all(&state_dir).map_err(|e| io("cannot create the shell state directory", e))?;
        let state = state_dir.join(format!("{}.sh", lane_file(ctx.lane)));

        let mut rnd = [0u8; 4];
        getrandom::fill(&mut rnd).map_err(|e| io("no randomness", std::io::Error::other(e.to_string())))?;
        let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let name = format!("cmd_{}_{stamp}_{}.log", lane_file(ctx.lane), hex::encode(rnd));
        let log_path: PathBuf = log_dir.join(&name);
        let log = std::fs::File::create(&log_path).map_err(|e| io("cannot create the log file", e))?;
        let log2 = log.try_clone().map_err(|e| io("cannot share the log file", e))?;

        let mut cmd = Cmd::new("/bin/bash");
        cmd.args(["--noprofile", "--norc", "-c", WRAPPER, "choir-exec"])
            .args([state.as_os_str()])
            .cwd(root)
            .env("HOME", root)
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .env("CHOIR_COMMAND", command);
        let mut child =
            cmd.spawn(Stdio::null(), Stdio::from(log), Stdio::from(log2)).map_err(|e| io("cannot start bash", e))?;
        let ended = wait_until(&mut child, deadline).map_err(|e| io("lost the command", e))?;

        let (preview, bytes) = preview_of(&log_path);
        let rel_log = format!(".choirtmp/exec/{name}");
        let timed_out = matches!(ended, Ended::TimedOut);
        let summary = if timed_out {
            format!("timed out after {} s and was killed; partial output in {rel_log}", timeout.as_secs())
        } else {
            format!("exit code {}; {bytes} bytes of output in {rel_log}", ended.code())
        };
        Ok(json!({
            "summary": summary,
            "exit_code": if timed_out { Value::Null } else { json!(ended.code()) },
            "timed_out": timed_out,
            "output_preview": preview,
            "truncated": bytes > preview.len() as u64,
            "output_bytes": bytes,
            "log_path": rel_log,
        }))
    }
}

/// The first [`PREVIEW`] characters of the log and its size, without reading
/// the whole file.
fn preview_of(path: &Path) -> (String, u64) {
    use std::io::Read;
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut head = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(PREVIEW as u64 * 4).read_to_end(&mut head);
    }
    let text: String = String::from_utf8_lossy(&head).chars().take(PREVIEW).collect();
    (text, bytes)
}

/// Deletes command logs older than the retention period.
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > RETENTION);
        if old && e.file_name().to_string_lossy().starts_with("cmd_") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretStore;
    use crate::workspace::Workspace;

    struct Fixture {
        dir: tempfile::TempDir,
        state: tempfile::TempDir,
        ws: Workspace,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        Fixture { dir, state, ws }
    }

    fn exec(f: &Fixture, lane: &str, input: Value) -> Value {
        let ctx = ExecContext {
            workspace: &f.ws,
            lane,
            call_id: "test",
            state_dir: f.state.path(),
            deadline: Instant::now() + Duration::from_secs(60),
            secrets: SecretStore::default(),
            hooks: None,
            history: &[],
        };
        ExecTool.execute(&ctx, &input).unwrap()
    }

    #[test]
    fn cwd_and_exported_variables_persist_per_lane() {
        let f = fixture();
        exec(&f, "edge", json!({"command": "mkdir -p sub && cd sub && export GREETING='hello world' && LOCAL=1"}));
        let out = exec(&f, "edge", json!({"command": "pwd; echo \"$GREETING|${LOCAL:-unset}\""}));
        let root = f.dir.path().canonicalize().unwrap();
        assert_eq!(out["output_preview"], format!("{}/sub\nhello world|unset\n", root.display()));
        assert_eq!(out["exit_code"], 0);
        // Another lane has its own shell.
        let other = exec(&f, "core-1", json!({"command": "pwd; echo \"${GREETING:-none}\""}));
        assert_eq!(other["output_preview"], format!("{}\nnone\n", root.display()));
    }

    #[test]
    fn exit_codes_and_exit_itself_are_reported() {
        let f = fixture();
        assert_eq!(exec(&f, "edge", json!({"command": "false"}))["exit_code"], 1);
        assert_eq!(exec(&f, "edge", json!({"command": "cd /tmp; exit 7"}))["exit_code"], 7);
        // State was saved even though the command called exit.
        assert_eq!(exec(&f, "edge", json!({"command": "pwd"}))["output_preview"], "/tmp\n");
    }

    #[test]
    fn a_timeout_kills_children_and_returns_partial_output() {
        let f = fixture();
        let marker = f.dir.path().join("survivor");
        let started = Instant::now();
        let out = exec(
            &f,
            "edge",
            json!({"command": format!("echo started; (sleep 3; touch {}) & sleep 30", marker.display()), "timeout_s": 1}),
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(out["timed_out"], true);
        assert_eq!(out["exit_code"], Value::Null);
        assert_eq!(out["output_preview"], "started\n");
        std::thread::sleep(Duration::from_secs(4));
        assert!(!marker.exists(), "the background child survived the timeout");
    }

    #[test]
    fn fifty_megabytes_stream_to_the_log_with_a_bounded_preview() {
        let f = fixture();
        let out = exec(&f, "edge", json!({"command": "head -c 52428800 /dev/zero | tr '\\0' 'x'"}));
        assert_eq!(out["output_bytes"], 52_428_800);
        assert_eq!(out["truncated"], true);
        assert_eq!(out["output_preview"].as_str().unwrap().len(), PREVIEW);
        let log = f.dir.path().join(out["log_path"].as_str().unwrap());
        assert_eq!(std::fs::metadata(log).unwrap().len(), 52_428_800);
    }

    #[test]
    fn old_logs_are_pruned() {
        let f = fixture();
        let dir = f.dir.path().join(".choirtmp/exec");
        std::fs::create_dir_all(&dir).unwrap();
        let old = dir.join("cmd_old.log");
        std::fs::write(&old, "x").unwrap();
        let month_ago = SystemTime::now() - Duration::from_secs(31 * 24 * 3600);
        std::fs::File::options().write(true).open(&old).unwrap().set_modified(month_ago).unwrap();
        exec(&f, "edge", json!({"command": "true"}));
        assert!(!old.exists());
    }
}
