//! `bench-mcp` (`make bench`): what Choir adds to a call of an MCP tool —
//! the reference `mcp-server-time` (PyPI) over stdio, called directly by a
//! bare JSON-RPC client, and through the agent's arbiter (schema, allowlist,
//! locks, argument policy, the MCP client, the result's checks, the commit
//! log's append) — as a ratio, timed in alternating turns so both see the
//! same machine. And the idle memory a connected server costs: the server
//! process's own RSS, and what the agent's side of it holds (its threads and
//! the agent's RSS growth).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_agent::arbiter::lane_ctx::LaneCtx;
use choir_agent::arbiter::{Arbiter, Parts, ProposedCall};
use choir_agent::commitlog::{CommitLog, DurableLog};
use choir_agent::secrets::SecretStore;
use choir_agent::tools::{McpSetup, Registry};
use choir_agent::workspace::Workspace;
use choir_common::lane::Lane;
use choir_common::mcp::{Entry, Pin, ServerFile, ServerSpec};
use choir_tests::bench::{compare_through, proc_status};
use choir_tests::mcp::Servers;
use serde_json::{json, Value};

const N: usize = 300;

/// A bare client: one server, one request at a time.
struct Direct {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Direct {
    fn start(python: &str) -> Direct {
        let mut child = Command::new(python)
            .args(["-m", "mcp_server_time"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut d = Direct { child, out, next: 0 };
        d.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}),
        );
        d.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        d
    }

    fn send(&mut self, v: &Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        loop {
            line.clear();
            self.out.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v["result"].clone();
            }
        }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main() {
    let servers = Servers::prepare().expect("the MCP servers' venv (tests/mcp/setup.sh) is needed");
    let python = servers.python();
    let mut direct = Direct::start(&python);
    let listed = direct.request("tools/list", json!({}));
    let entry = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "get_current_time")
        .map(|t| Entry::from_listed(t).unwrap())
        .unwrap();
    let server_rss_kb = proc_status(direct.child.id(), "VmRSS:");

    // The same server pinned for an agent (read, idempotent: the bench
    // measures the path, not a confirmation).
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mut pin = Pin::strict(entry);
    pin.side_effect = choir_common::manifest::SideEffect::Read;
    pin.idempotent = true;
    let file = ServerFile {
        server: ServerSpec {
            name: "time".into(),
            command: python.clone(),
            url: None,
            auth_secret: None,
            args: vec!["-m".into(), "mcp_server_time".into()],
            env: Default::default(),
            secrets: Vec::new(),
            timeout_ms: 30_000,
        },
        tools: [("get_current_time".to_owned(), pin)].into_iter().collect(),
    };
    let choir_dir = dir.path().join("choir");
    std::fs::create_dir_all(choir_dir.join("mcp/agent")).unwrap();
    std::fs::write(choir_dir.join("mcp/agent/time.json"), serde_json::to_string(&file).unwrap()).unwrap();
    let threads_before = proc_status(std::process::id(), "Threads:");
    let registry = Registry::load(
        &choir_dir,
        &[],
        Arc::new(choir_agent::tools::host::NoHost),
        &[],
        &[],
        Some(McpSetup { workspace: ws.clone(), secrets: SecretStore::default(), filer: None }),
    )
    .unwrap();
    let server = registry.mcp_servers()[0].clone();
    let rss_before = proc_status(std::process::id(), "VmRSS:");
    server.check_now(Instant::now() + Duration::from_secs(30)).unwrap();
    let (log, _) = CommitLog::open(&dir.path().join("state")).unwrap();
    let (tx, _rx) = crossbeam_channel::bounded(1);
    let arbiter = Arbiter::new(Parts {
        registry,
        workspace: Workspace::open(&ws).unwrap(),
        state_dir: dir.path().join("state"),
        log: Arc::new(DurableLog::new(log).unwrap()),
        committed: tx,
        secrets: SecretStore::default(),
        proposals: None,
        policies: Vec::new(),
        board: None,
        operator_words: String::new(),
    });
    let lane = LaneCtx::new("edge", Lane::Edge);
    let call = ProposedCall {
        id: "c".into(),
        name: "mcp__time__get_current_time".into(),
        arguments: r#"{"timezone": "Etc/UTC"}"#.into(),
    };
    // Warm both paths.
    for _ in 0..20 {
        direct.request("tools/call", json!({"name": "get_current_time", "arguments": {"timezone": "Etc/UTC"}}));
        let inv = arbiter.invoke(&lane, &call, &[]).unwrap();
        assert_eq!(inv.status.as_str(), "success", "{:?} {:?}", inv.summary, inv.error);
    }
    let rss_after = proc_status(std::process::id(), "VmRSS:");
    let threads_after = proc_status(std::process::id(), "Threads:");
    let (mut raw, mut via) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for _ in 0..N {
        let t = Instant::now();
        let r = direct.request("tools/call", json!({"name": "get_current_time", "arguments": {"timezone": "Etc/UTC"}}));
        raw.push(t.elapsed());
        assert!(r["content"].is_array());
        let t = Instant::now();
        let inv = arbiter.invoke(&lane, &call, &[]).unwrap();
        via.push(t.elapsed());
        assert_eq!(inv.status.as_str(), "success");
    }
    compare_through("MCP tool call (mcp-server-time over stdio)", "the arbiter", raw, via);
    choir_tests::report!(
        "MCP server idle: the server process {} KB RSS (its own: Python and the SDK); the agent's side {} threads and \
         {} KB RSS growth per connected server",
        server_rss_kb,
        threads_after.saturating_sub(threads_before),
        rss_after.saturating_sub(rss_before)
    );
}
