//! `bench-mcp` (`make bench`): what Choir adds to a call of an MCP tool —
//! the reference `mcp-server-time` (PyPI) over stdio, called directly by a
//! bare JSON-RPC client, and through the agent's arbiter (schema, allowlist,
//! locks, argument policy, the MCP client, the result's checks, the commit
//! log's append); and the same server over Streamable HTTP, called directly
//! by a bare HTTP client and through choird (EXECUTE_HOST_TOOL with the
//! agent's token: validation, policy, the catalog listed before and after
//! the call, the audit) — as ratios, timed in alternating turns so both see
//! the same machine. And the idle memory a connected server costs: the
//! server process's own RSS, and what the agent's side of it holds.

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
use choir_tests::bench::{compare_through, proc_status, HostToolClient};
use choir_tests::harness::{bin, test_config, Choird};
use choir_tests::mcp::{HttpServer, Servers};
use choir_tests::pg::TestPg;
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
            network: Vec::new(),
            grants: Vec::new(),
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
        Some(McpSetup { workspace: ws.clone(), secrets: SecretStore::default(), host: None }),
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
    drop(arbiter);
    http(&servers);
}

/// The same server over Streamable HTTP: a bare client against choird.
fn http(servers: &Servers) {
    let server = HttpServer::start(servers, "time");
    let pg = TestPg::start().expect("PostgreSQL is needed (make deps)");
    let mut config = test_config("http://127.0.0.1:9", Some(&pg.url()), &["evil1"]);
    config["agent_binary"] = json!(bin("hostile-agent"));
    config["agents"]["evil1"]["web"] = json!({"allow_addresses": ["127.0.0.1/32"]});
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "evil1"]);
    choird.ctl_ok(&["mcp", "add", "evil1", "clock", "--url", &server.url]);
    let pending = || -> Option<(String, String)> {
        let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list"])).ok()?;
        let a = v["approvals"].as_array()?.iter().find(|a| a["kind"] == "mcp" && a["status"] == "pending")?.clone();
        Some((a["id"].to_string(), a["sha256"].as_str()?.to_owned()))
    };
    let started = Instant::now();
    while pending().is_none() {
        assert!(started.elapsed() < Duration::from_secs(60), "no catalog proposal");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (id, sha) = pending().unwrap();
    choird.ctl_ok(&[
        "approvals",
        "approve",
        &id,
        "--sha256",
        &sha,
        "--pin",
        "get_current_time:side_effect=read",
        "--pin",
        "get_current_time:idempotent=true",
    ]);
    choird.wait_running("evil1");
    let c = HostToolClient::of(&choird, "evil1");
    // The bare client: one session, then calls.
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let post = |sid: Option<&str>, body: Value| -> (Option<String>, String) {
        let mut req = agent
            .post(&server.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2025-11-25");
        if let Some(s) = sid {
            req = req.header("Mcp-Session-Id", s);
        }
        let mut resp = req.send(body.to_string().as_bytes()).unwrap();
        let sid = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        (sid, resp.body_mut().read_to_string().unwrap_or_default())
    };
    let (sid, _) = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
               "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}),
    );
    let sid = sid.expect("a session id");
    post(Some(&sid), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "get_current_time", "arguments": {"timezone": "Etc/UTC"}}});
    let via_input = json!({"timezone": "Etc/UTC"});
    for i in 0..10 {
        assert!(post(Some(&sid), call.clone()).1.contains("datetime"));
        let r = c.tool("mcp.clock.get_current_time", via_input.clone(), &format!("w{i}"));
        assert!(r.to_string().contains("datetime"), "{r}");
    }
    let n = N / 3;
    let (mut raw, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let t = Instant::now();
        assert!(post(Some(&sid), call.clone()).1.contains("datetime"));
        raw.push(t.elapsed());
        // Paced as an agent's calls are (choird's per-agent rate limit).
        std::thread::sleep(choir_tests::bench::PACE);
        let t = Instant::now();
        c.tool("mcp.clock.get_current_time", via_input.clone(), &format!("c{i}"));
        via.push(t.elapsed());
    }
    compare_through(
        "MCP tool call (mcp-server-time over Streamable HTTP, one call = tools/list + tools/call + tools/list through choird)",
        "choird",
        raw,
        via,
    );
}
