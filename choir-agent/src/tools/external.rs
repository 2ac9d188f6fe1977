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

/// A tool's `HOME`: a directory that does not exist and that the agent's
/// uid cannot create (`/` is root's), so no dotfile the model wrote
/// (`~/.gitconfig`, `~/.npmrc`, …) configures a tool. Tools keep their state
/// in the workspace, explicitly.
pub const TOOL_HOME: &str = "/nonexistent";

/// What git reads besides the repository's own config, for every external
/// tool: no system or global config, and every key that names a program to
/// run reset to a harmless one (`GIT_CONFIG_COUNT` entries outrank the
/// repository's `.git/config`, which the model writes). Hooks, fsmonitor,
/// pagers, editors, credential helpers, ssh and signing programs are off.
/// Not covered, because their names are the model's to choose: filter,
/// diff and merge drivers a `.gitattributes` names — see tools/README.md:
/// a tool holding a secret must not run git on a repository the model
/// can write.
pub const GIT_OVERRIDES: [(&str, &str); 11] = [
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.askPass", ""),
    ("core.sshCommand", "ssh"),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("gpg.program", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
];

/// The environment every program run as a tool gets (an external tool, an
/// MCP server): the workspace as its directory, no `HOME` anything can
/// configure, git's overrides, and the secrets it declared as
/// `CHOIR_SECRET_<NAME>`.
pub fn tool_env(
    cmd: &mut Cmd,
    workspace: &std::path::Path,
    name: &str,
    lane: &str,
    secrets: &crate::secrets::SecretStore,
) {
    cmd.cwd(workspace)
        .env("HOME", TOOL_HOME)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_COUNT", GIT_OVERRIDES.len().to_string())
        .env("LANG", "C.UTF-8")
        .env("CHOIR_WORKSPACE", workspace)
        .env("CHOIR_TOOL", name)
        .env("CHOIR_LANE", lane);
    for (i, (key, value)) in GIT_OVERRIDES.iter().enumerate() {
        cmd.env(&format!("GIT_CONFIG_KEY_{i}"), key).env(&format!("GIT_CONFIG_VALUE_{i}"), value);
    }
    for (name, value) in secrets.iter() {
        cmd.env(&env_name(name), value);
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
        tool_env(&mut cmd, ctx.workspace.root(), &self.name, ctx.lane, &ctx.secrets);
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
            env.split_whitespace()
                .filter(|v| !matches!(*v, "PWD" | "SHLVL" | "_") && !v.starts_with("GIT_CONFIG_"))
                .collect::<Vec<_>>(),
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

    /// A repository the model prepared: an fsmonitor program and a
    /// pre-commit hook in `.git/config`, and a `~/.gitconfig` in the
    /// workspace (the old HOME) naming a pager. Returns the workspace and
    /// the marker file any of them would write.
    fn planted_repo() -> (tempfile::TempDir, std::path::PathBuf) {
        let ws = tempfile::tempdir().unwrap();
        let root = ws.path();
        // Test set-up: git run plainly, outside Choir's spawner.
        #[allow(clippy::disallowed_methods)]
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .args(args)
                .current_dir(root)
                .env("HOME", root)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        let marker = root.join("stolen");
        let evil = root.join("evil.sh");
        std::fs::write(&evil, format!("#!/bin/sh\nenv > {}\n", marker.display())).unwrap();
        std::fs::set_permissions(&evil, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(root.join("a.txt"), "a").unwrap();
        git(&["config", "core.fsmonitor", evil.to_str().unwrap()]);
        std::fs::create_dir_all(root.join("hooks")).unwrap();
        std::fs::copy(&evil, root.join("hooks/pre-commit")).unwrap();
        git(&["config", "core.hooksPath", root.join("hooks").to_str().unwrap()]);
        std::fs::write(root.join(".gitconfig"), format!("[core]\n\tpager = {}\n", evil.display())).unwrap();
        (ws, marker)
    }

    fn run_in(ws: &std::path::Path, body: &str, secrets: SecretStore) -> Result<Value, ToolError> {
        let bin = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(ws).unwrap();
        let tool = ExternalTool::new(script(bin.path(), body), "test.git".into());
        let ctx = ExecContext {
            workspace: &workspace,
            lane: "edge",
            call_id: "test",
            state_dir: ws,
            deadline: Instant::now() + Duration::from_secs(20),
            secrets,
            hooks: None,
            history: &[],
        };
        tool.execute(&ctx, &json!({}))
    }

    #[test]
    fn regression_a_secret_tool_running_git_ran_the_models_hooks_with_its_secret() {
        let secrets = || SecretStore::new([("github_token".to_owned(), "ghp-SECRET".to_owned())].into());
        let body = "git status --porcelain >/dev/null 2>&1; git -c user.name=t -c user.email=t@t commit -qam x \
                    >/dev/null 2>&1; git log -p >/dev/null 2>&1; echo '{\"summary\": \"done\"}'";
        let (ws, marker) = planted_repo();
        run_in(ws.path(), &format!("git add a.txt; {body}"), secrets()).unwrap();
        assert!(
            !marker.exists(),
            "the model's program ran inside the secret tool: {:?}",
            std::fs::read_to_string(&marker)
        );
        // The negative control: the same git run with the old environment
        // (HOME in the workspace, the repository's config unopposed) runs
        // the model's program, secret in hand.
        let (ws, marker) = planted_repo();
        let old = format!(
            "git add a.txt; env -u GIT_CONFIG_COUNT -u GIT_CONFIG_NOSYSTEM -u GIT_CONFIG_GLOBAL HOME={} sh -c '{}'",
            ws.path().display(),
            body.replace('\'', "'\\''")
        );
        run_in(ws.path(), &old, secrets()).unwrap();
        let stolen = std::fs::read_to_string(&marker).unwrap_or_default();
        assert!(stolen.contains("ghp-SECRET"), "the control must show the attack works: {stolen:?}");
    }
}
