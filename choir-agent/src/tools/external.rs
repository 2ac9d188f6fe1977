//! External tools (R-TOOL-3): an executable that reads the validated input as
//! JSON on stdin and writes one JSON object on stdout. Its environment is
//! scrubbed to a fixed minimum plus its declared secrets
//! (`CHOIR_SECRET_<NAME>`); it runs in the workspace, in its own process group,
//! and the whole group is killed at the manifest's timeout (the partial output
//! is returned, marked `timed_out`). Output that is not a JSON object is an
//! error result, never a crash.

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

use serde_json::{json, Value};

use super::tool::{ExecContext, Tool, ToolError};
use crate::process::spawn::{capture, wait_until, Cmd, Ended};

/// Most stdout kept from a tool.
const STDOUT_CAP: usize = 4 * 1024 * 1024;
/// Most stderr kept from a tool.
const STDERR_CAP: usize = 64 * 1024;

/// An external tool.
pub struct ExternalTool {
    exec: PathBuf,
    name: String,
}

impl ExternalTool {
    /// A tool run from `exec`.
    pub fn new(exec: PathBuf, name: String) -> ExternalTool {
        ExternalTool { exec, name }
    }
}

fn env_name(secret: &str) -> String {
    let upper: String =
        secret.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("CHOIR_SECRET_{upper}")
}

impl Tool for ExternalTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let io = |e: std::io::Error| ToolError::new("tool_failed", format!("cannot run {}: {e}", self.name));
        let mut cmd = Cmd::new(&self.exec);
        cmd.cwd(ctx.workspace.root())
            .env("HOME", ctx.workspace.root())
            .env("LANG", "C.UTF-8")
            .env("CHOIR_WORKSPACE", ctx.workspace.root())
            .env("CHOIR_TOOL", &self.name)
            .env("CHOIR_LANE", ctx.lane);
        for (name, value) in ctx.secrets.iter() {
            cmd.env(&env_name(name), value);
        }
        let mut child = cmd.spawn(Stdio::piped(), Stdio::piped(), Stdio::piped()).map_err(io)?;
        let stdout = capture(
            child.stdout.take().ok_or_else(|| io(std::io::Error::other("no stdout")))?,
            STDOUT_CAP,
            "tool-stdout",
        )
        .map_err(io)?;
        let stderr = capture(
            child.stderr.take().ok_or_else(|| io(std::io::Error::other("no stderr")))?,
            STDERR_CAP,
            "tool-stderr",
        )
        .map_err(io)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A tool that exits without reading its input is not our error.
            let _ = stdin.write_all(input.to_string().as_bytes());
        }
        let ended = wait_until(&mut child, ctx.deadline).map_err(io)?;
        let (out, out_cut) = stdout.join().unwrap_or_default();
        let (err, _) = stderr.join().unwrap_or_default();
        let out = String::from_utf8_lossy(&out).into_owned();
        let err = String::from_utf8_lossy(&err).into_owned();
        let preview = |s: &str| s.chars().take(500).collect::<String>();
        match ended {
            Ended::TimedOut => Ok(json!({
                "summary": format!("{} timed out and was killed", self.name),
                "timed_out": true,
                "partial_stdout": preview(&out),
                "stderr": preview(&err),
            })),
            Ended::Exited(_) if ended.code() != 0 => Err(ToolError::new(
                "tool_failed",
                format!("{} exited with code {}: {}", self.name, ended.code(), preview(err.trim())),
            )),
            Ended::Exited(_) => {
                if out_cut {
                    return Err(ToolError::new(
                        "bad_tool_output",
                        format!("{} printed more than {STDOUT_CAP} bytes", self.name),
                    ));
                }
                match serde_json::from_str::<Value>(out.trim()) {
                    Ok(Value::Object(mut map)) => {
                        map.entry("summary").or_insert_with(|| json!(format!("{} finished", self.name)));
                        Ok(Value::Object(map))
                    }
                    _ => Err(ToolError::new(
                        "bad_tool_output",
                        format!("{} did not print a JSON object; it printed: {}", self.name, preview(out.trim())),
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    use crate::secrets::SecretStore;
    use crate::workspace::Workspace;

    fn script(dir: &std::path::Path, body: &str) -> PathBuf {
        let p = dir.join("tool.sh");
        std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn run(body: &str, secrets: SecretStore, timeout: Duration) -> (Result<Value, ToolError>, Duration) {
        let bin = tempfile::tempdir().unwrap();
        let ws_dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(ws_dir.path()).unwrap();
        let tool = ExternalTool::new(script(bin.path(), body), "test.tool".into());
        let ctx = ExecContext {
            workspace: &ws,
            lane: "edge",
            call_id: "test",
            state_dir: ws_dir.path(),
            deadline: Instant::now() + timeout,
            secrets,
            hooks: None,
            history: &[],
        };
        let started = Instant::now();
        (tool.execute(&ctx, &json!({"n": 1})), started.elapsed())
    }

    #[test]
    fn input_on_stdin_json_on_stdout() {
        let (r, _) = run(
            r#"read -r line; echo "{\"summary\": \"got it\", \"input\": $line}""#,
            SecretStore::default(),
            Duration::from_secs(10),
        );
        assert_eq!(r.unwrap(), json!({"summary": "got it", "input": {"n": 1}}));
    }

    #[test]
    fn the_environment_holds_only_the_minimum_and_declared_secrets() {
        let secrets = SecretStore::new([("git_identity".to_owned(), "tok".to_owned())].into());
        let (r, _) = run(
            r#"printf '{"env": "%s"}' "$(env | cut -d= -f1 | sort | tr '\n' ' ')""#,
            secrets,
            Duration::from_secs(10),
        );
        let env = r.unwrap()["env"].as_str().unwrap().to_owned();
        assert_eq!(
            env.split_whitespace().filter(|v| !matches!(*v, "PWD" | "SHLVL" | "_")).collect::<Vec<_>>(),
            vec!["CHOIR_LANE", "CHOIR_SECRET_GIT_IDENTITY", "CHOIR_TOOL", "CHOIR_WORKSPACE", "HOME", "LANG", "PATH"]
        );
    }

    #[test]
    fn a_timeout_kills_the_group_and_returns_partial_output() {
        let (r, took) =
            run("echo partial; sleep 30 & sleep 30; echo never", SecretStore::default(), Duration::from_millis(500));
        let v = r.unwrap();
        assert_eq!(v["timed_out"], true);
        assert_eq!(v["partial_stdout"], "partial\n");
        assert!(took < Duration::from_secs(5), "took {took:?}: the background sleep kept the pipe open");
    }

    #[test]
    fn non_json_output_and_failures_are_error_results() {
        let (r, _) = run("echo hello", SecretStore::default(), Duration::from_secs(10));
        assert_eq!(r.unwrap_err().code, "bad_tool_output");
        let (r, _) = run("echo '[1,2]'", SecretStore::default(), Duration::from_secs(10));
        assert_eq!(r.unwrap_err().code, "bad_tool_output");
        let (r, _) = run("echo oops >&2; exit 3", SecretStore::default(), Duration::from_secs(10));
        let e = r.unwrap_err();
        assert_eq!(e.code, "tool_failed");
        assert!(e.message.contains("code 3") && e.message.contains("oops"), "{e}");
    }
}
