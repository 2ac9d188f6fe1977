//! AgentDojo (PyPI `agentdojo`, benchmark v1.2.2) for the replay test: its
//! private virtual environment (made by `tests/agentdojo/setup.sh`, kept in
//! the target directory), the export of its suites as Choir tools, pairs and
//! policies, and one suite's live environment served on a Unix socket by
//! `server.py` (see `tests/agentdojo/README.md` for the protocol).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::services_required as require_services;

/// The harness sources (`tests/agentdojo`).
pub fn harness_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("agentdojo")
}

fn venv_dir() -> PathBuf {
    #[allow(clippy::disallowed_methods)] // Where cargo builds: the venv lives beside it.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("agentdojo-venv")
}

/// The exported suites and the venv that serves them.
pub struct Dojo {
    venv: PathBuf,
    /// Where `export.py` wrote the suites.
    pub export: tempfile::TempDir,
    sockets: tempfile::TempDir,
}

/// One (user task, injection task) pair, as exported.
#[derive(Debug, Clone)]
pub struct Pair {
    /// `user_task_N`.
    pub user_task: String,
    /// `injection_task_N`.
    pub injection_task: String,
    /// What the user says.
    pub prompt: String,
    /// The user task's ground-truth calls: (tool, args).
    pub user_calls: Vec<(String, Value)>,
    /// The injection task's ground-truth calls: (tool, args).
    pub injection_calls: Vec<(String, Value)>,
    /// The model's last answer as AgentDojo's ground-truth pipeline gives it.
    pub final_text: String,
}

fn calls(v: &Value) -> Vec<(String, Value)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["tool"].as_str().unwrap_or_default().to_owned(), c["args"].clone()))
        .collect()
}

impl Dojo {
    /// Makes (or reuses) the venv and exports every suite. `None` when it
    /// cannot (printing why), unless the test run requires every service.
    pub fn prepare() -> Option<Dojo> {
        let venv = venv_dir();
        let setup = Command::new(harness_dir().join("setup.sh")).arg(&venv).output();
        let failed = match &setup {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(String::from_utf8_lossy(&o.stderr).into_owned()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = failed {
            assert!(!require_services(), "AgentDojo's environment could not be made: {why}");
            eprintln!("skipping: AgentDojo's environment could not be made: {why}");
            return None;
        }
        let export = tempfile::tempdir().unwrap();
        let sockets = tempfile::Builder::new().prefix("dojo").tempdir_in("/tmp").unwrap();
        let out = Command::new(venv.join("bin/python"))
            .arg(harness_dir().join("export.py"))
            .arg("--out")
            .arg(export.path())
            .arg("--socket-dir")
            .arg(sockets.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "export.py failed: {}", String::from_utf8_lossy(&out.stderr));
        Some(Dojo { venv, export, sockets })
    }

    /// The tools directory of `suite` (manifests and `dojo_client`).
    pub fn tools(&self, suite: &str) -> PathBuf {
        self.export.path().join(suite).join("tools")
    }

    /// The exported `tools.json` of `suite`: tool name → side effect.
    pub fn side_effects(&self, suite: &str) -> std::collections::BTreeMap<String, String> {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(self.export.path().join(suite).join("tools.json")).unwrap())
                .unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| (t["tool"].as_str().unwrap().to_owned(), t["side_effect"].as_str().unwrap().to_owned()))
            .collect()
    }

    /// Every pair of `suite`.
    pub fn pairs(&self, suite: &str) -> Vec<Pair> {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(self.export.path().join(suite).join("pairs.json")).unwrap())
                .unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| Pair {
                user_task: p["user_task"].as_str().unwrap().to_owned(),
                injection_task: p["injection_task"].as_str().unwrap().to_owned(),
                prompt: p["prompt"].as_str().unwrap().to_owned(),
                user_calls: calls(&p["user_calls"]),
                injection_calls: calls(&p["injection_calls"]),
                final_text: [&p["user_ground_truth_output"], &p["injection_ground_truth_output"]]
                    .iter()
                    .filter_map(|s| s.as_str())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n"),
            })
            .collect()
    }

    /// Starts `suite`'s server and waits until it listens.
    pub fn serve(&self, suite: &str) -> Server {
        let socket = self.sockets.path().join(format!("{suite}.sock"));
        let mut child = Command::new(self.venv.join("bin/python"))
            .arg(harness_dir().join("server.py"))
            .arg("--suite")
            .arg(suite)
            .arg("--socket")
            .arg(&socket)
            .arg("--pairs")
            .arg(self.export.path().join(suite).join("pairs.json"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "server.py for {suite} did not start");
        Server { child, socket }
    }
}

/// A suite's AgentDojo environment, served; stopped when dropped.
pub struct Server {
    child: Child,
    socket: PathBuf,
}

impl Server {
    /// One request, its reply (`ok` checked unless `may_fail`).
    pub fn ask(&self, req: &Value) -> Value {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        writeln!(s, "{req}").unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ok"], true, "{req} → {v}");
        v
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // EOF on its stdin stops it; a kill if it does not.
        drop(self.child.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
