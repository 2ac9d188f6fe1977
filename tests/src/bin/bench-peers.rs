//! `bench-peers` (`make bench-peers`): Choir beside the systems a user would
//! pick instead, on the same machine, in one interleaved run, with one fake
//! OpenAI-compatible model answering all of them at once (this process's
//! [`FakeLlm`], streamed or not as each asks): nanobot (PyPI `nanobot-ai`)
//! and ZeroClaw (crates.io `zeroclaw`), pinned and installed into
//! `target/peers` by `scripts/install-peers.sh`. Each system is driven
//! through its own entry point, as its users drive it:
//!
//! - **Choir**: choird with its managed PostgreSQL kept by `choird cluster`
//!   (the `choir-db` unit, as `make install` sets it up), process runtime;
//!   a turn is the admin API's chat (`POST /admin/v1/agents/ID/chat` with a
//!   conversation id). Per turn: the message stored, handed to the agent,
//!   one model call with the conversation's history and Choir's tools, the
//!   model's answer committed to the hash-chained log and replicated to
//!   PostgreSQL before the reply is released, the reply stored.
//! - **nanobot**: one `nanobot serve` (its OpenAI-compatible Agent API) per
//!   agent; a turn is `POST /v1/chat/completions` with a `session_id`. Per
//!   turn: one streamed model call with the session's history, its tools
//!   and an ~8.6 K-character system prompt; the session file rewritten
//!   (JSONL, no database). Its tokenizer download is refused (a proxy on a
//!   closed port), as offline; it falls back to an estimate.
//! - **ZeroClaw**: one `zeroclaw gateway` per agent, pairing on with a
//!   preset token, its webhook rate limit off; a turn is `POST /webhook`.
//!   Per turn: one model call with a system prompt and the message alone —
//!   **no history, no tools** (the webhook has no conversation), the
//!   message saved to its SQLite memory (its default). Its per-turn
//!   figures are therefore a floor, not like for like; its footprint and
//!   start-up are.
//!
//! For 1, 5 and 10 agents each: every agent answers a few turns, the
//! systems sit idle 70 s (long enough for choird's pool to close what a
//! burst opened), then PSS (RSS beside it) of all of each system's
//! processes, median of three samples 10 s apart. Then `CHOIR_PEERS_TURNS`
//! turns (default 2,000) for each system, interleaved turn by turn (Choir,
//! nanobot, ZeroClaw, Choir, …) so a noisy moment is shared, round-robin
//! over 50 conversations spread over the agents: a turn's overhead is its
//! time at the client less the model's time for the calls it made (the
//! fake's arrival-to-answer); CPU per turn is utime+stime of every process
//! of the system over the run, divided by its turns. With one agent, five
//! restarts of each: the serving process(es) stopped (SIGTERM) and started
//! again, timed to the first answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use choir_tests::bench::{cpu_time, process_tree, smaps_rollup};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird, ClusterKeeper, TempHome};
use choir_tests::report;
use serde_json::{json, Value};

/// The versions `scripts/install-peers.sh` installs.
const NANOBOT: &str = "0.3.5";
const ZEROCLAW: &str = "0.1.7";
/// Conversations the turns go round.
const CONVERSATIONS: usize = 50;
/// What the fake model answers.
const ANSWER: &str = "ok";

/// One system under test.
trait System {
    fn name(&self) -> &'static str;
    /// One message to agent `agent` in `conversation`; the reply's text.
    fn turn(&self, agent: usize, conversation: &str, text: &str) -> Result<String, String>;
    /// Every process of the system now.
    fn processes(&self) -> Vec<u32>;
    /// Stops agent 0's serving process(es) and starts them again, returning
    /// at once (the caller times the first answer).
    fn restart(&mut self);
}

fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(120)))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

fn post(http: &ureq::Agent, url: &str, auth: Option<&str>, body: Value) -> Result<Value, String> {
    let mut req = http.post(url);
    if let Some(a) = auth {
        req = req.header("Authorization", a);
    }
    let mut resp = req.send_json(body).map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: Value = resp.body_mut().read_json().map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    Ok(body)
}

/// Choir: choird, its agents, `choird cluster` and its PostgreSQL.
struct Choir {
    choird: Choird,
    keeper: ClusterKeeper,
    http: ureq::Agent,
}

impl Choir {
    fn start(n: usize, model: &str) -> Choir {
        let names: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut config = test_config(model, None, &refs);
        for a in &refs {
            config["agents"][a]["autostart"] = json!(true);
        }
        let home = TempHome::new(&config, &json!({"llm_key": "k"}));
        let keeper = ClusterKeeper::start(home.path());
        let choird = Choird::start_in(home);
        for a in &refs {
            choird.wait_running(a);
        }
        let http = choir_common::unix_http::agent_for_socket(
            &choird.home.path().join("socks/choird.sock"),
            Some(Duration::from_secs(120)),
        );
        Choir { choird, keeper, http }
    }
}

impl System for Choir {
    fn name(&self) -> &'static str {
        "Choir"
    }
    fn turn(&self, agent: usize, conversation: &str, text: &str) -> Result<String, String> {
        let url = format!("http://localhost/admin/v1/agents/a{agent}/chat");
        let mut resp = self
            .http
            .post(&url)
            .send_json(json!({"text": text, "conversation": conversation, "timeout_s": 60}))
            .map_err(|e| e.to_string())?;
        let body: Value = resp.body_mut().read_json().map_err(|e| e.to_string())?;
        body["reply"].as_str().map(str::to_owned).ok_or_else(|| body.to_string())
    }
    fn processes(&self) -> Vec<u32> {
        let postmaster = choir_tests::bench::postmaster_of(&self.choird);
        let mut p = process_tree(self.choird.pid());
        p.push(self.keeper.pid());
        p.extend(process_tree(postmaster));
        p
    }
    fn restart(&mut self) {
        self.choird.stop();
        self.choird.spawn_again();
    }
}

impl Drop for Choir {
    fn drop(&mut self) {
        // choird, then the cluster, then (with choird's handle) the home.
        self.choird.stop();
        self.keeper.stop();
    }
}

/// A peer: one serving process per agent, each with a private directory.
struct Peer {
    name: &'static str,
    dir: tempfile::TempDir,
    /// The command line for agent `i` on `port`.
    command: fn(&Path, usize, u16) -> Command,
    /// The request for one message: URL path, auth, body.
    request: fn(&str, &str) -> (&'static str, Option<&'static str>, Value),
    /// The reply's text in the answer.
    reply: fn(&Value) -> Option<String>,
    agents: Vec<(Child, u16)>,
    http: ureq::Agent,
}

impl Peer {
    fn start(
        name: &'static str,
        n: usize,
        setup: impl Fn(&Path, usize, u16),
        command: fn(&Path, usize, u16) -> Command,
        request: fn(&str, &str) -> (&'static str, Option<&'static str>, Value),
        reply: fn(&Value) -> Option<String>,
    ) -> Peer {
        let dir = tempfile::Builder::new().prefix("choir-peer-").tempdir().unwrap();
        let mut peer = Peer { name, dir, command, request, reply, agents: Vec::new(), http: http() };
        for i in 0..n {
            let port = choir_tests::ports::unused_port();
            setup(peer.dir.path(), i, port);
            let child = peer.spawn(i, port);
            peer.agents.push((child, port));
        }
        for i in 0..n {
            peer.wait_healthy(i);
        }
        peer
    }

    fn spawn(&self, i: usize, port: u16) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("a{i}.log")))
            .unwrap();
        (self.command)(self.dir.path(), i, port)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: cannot start agent {i}: {e}", self.name))
    }

    fn wait_healthy(&self, i: usize) {
        let url = format!("http://127.0.0.1:{}/health", self.agents[i].1);
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if self.http.get(&url).call().is_ok_and(|r| r.status().is_success()) {
                return;
            }
            let log = std::fs::read_to_string(self.dir.path().join(format!("a{i}.log"))).unwrap_or_default();
            assert!(Instant::now() < deadline, "{} agent {i} not healthy after 180 s:\n{log}", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl System for Peer {
    fn name(&self) -> &'static str {
        self.name
    }
    fn turn(&self, agent: usize, conversation: &str, text: &str) -> Result<String, String> {
        let (path, auth, body) = (self.request)(conversation, text);
        let url = format!("http://127.0.0.1:{}{path}", self.agents[agent].1);
        let answer = post(&self.http, &url, auth, body)?;
        (self.reply)(&answer).ok_or_else(|| answer.to_string())
    }
    fn processes(&self) -> Vec<u32> {
        self.agents.iter().flat_map(|(c, _)| process_tree(c.id())).collect()
    }
    fn restart(&mut self) {
        let port = self.agents[0].1;
        choir_tests::harness::terminate(&mut self.agents[0].0, Duration::from_secs(30));
        self.agents[0].0 = self.spawn(0, port);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        for (c, _) in &mut self.agents {
            // The whole group: whatever a peer started goes with it.
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
            }
            choir_tests::harness::terminate(c, Duration::from_secs(30));
        }
    }
}

fn peers_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("peers")
}

fn nanobot(n: usize, model: &str) -> Peer {
    let model = model.to_owned();
    Peer::start(
        "nanobot",
        n,
        move |dir, i, port| {
            let me = dir.join(format!("a{i}"));
            std::fs::create_dir_all(me.join("home")).unwrap();
            let config = json!({
                "agents": {"defaults": {
                    "workspace": me.join("workspace"), "model": "fake-model", "provider": "custom",
                    "timezone": "UTC", "maxTokens": 1024, "contextWindowTokens": 200000,
                    "idleCompactAfterMinutes": 0, "dream": {"enabled": false}
                }},
                "providers": {"custom": {"apiKey": "sk-dummy", "apiBase": model}},
                "api": {"host": "127.0.0.1", "port": port, "timeout": 120}
            });
            std::fs::write(me.join("config.json"), config.to_string()).unwrap();
        },
        |dir, i, _| {
            let me = dir.join(format!("a{i}"));
            let mut cmd = Command::new(peers_dir().join("nanobot-venv/bin/nanobot"));
            cmd.arg("serve").arg("--config").arg(me.join("config.json")).env("HOME", me.join("home"));
            // Offline: its tokenizer download is refused at once, not waited on.
            for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
                cmd.env(k, "http://127.0.0.1:9");
            }
            cmd.env("NO_PROXY", "127.0.0.1,localhost").env("no_proxy", "127.0.0.1,localhost");
            cmd
        },
        |conversation, text| {
            let body = json!({"model": "fake-model", "session_id": conversation,
                "messages": [{"role": "user", "content": text}]});
            ("/v1/chat/completions", None, body)
        },
        |a| a["choices"][0]["message"]["content"].as_str().map(str::to_owned),
    )
}

fn zeroclaw(n: usize, model: &str) -> Peer {
    let model = model.to_owned();
    Peer::start(
        "ZeroClaw",
        n,
        move |dir, i, port| {
            let me = dir.join(format!("a{i}"));
            std::fs::create_dir_all(me.join("home")).unwrap();
            std::fs::create_dir_all(me.join("cfg")).unwrap();
            let config = format!(
                "default_provider = \"custom:{model}\"\ndefault_model = \"fake-model\"\napi_key = \"sk-dummy\"\n\
                 default_temperature = 0.7\n\n[gateway]\nhost = \"127.0.0.1\"\nport = {port}\n\
                 require_pairing = true\npaired_tokens = [\"zc-bench-token\"]\nwebhook_rate_limit_per_minute = 0\n"
            );
            let path = me.join("cfg/config.toml");
            std::fs::write(&path, config).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        },
        |dir, i, port| {
            let me = dir.join(format!("a{i}"));
            let mut cmd = Command::new(peers_dir().join("zeroclaw/bin/zeroclaw"));
            cmd.args(["gateway", "--port", &port.to_string()])
                .env("HOME", me.join("home"))
                .env("ZEROCLAW_CONFIG_DIR", me.join("cfg"));
            for k in ["PORT", "HOST", "MODEL", "PROVIDER", "API_KEY"] {
                cmd.env_remove(k);
            }
            cmd
        },
        |_, text| ("/webhook", Some("Bearer zc-bench-token"), json!({"message": text})),
        |a| a["response"].as_str().map(str::to_owned),
    )
}

/// PSS and RSS (kB) of `pids`.
fn memory(pids: &[u32]) -> (u64, u64) {
    (pids.iter().map(|p| smaps_rollup(*p, "Pss:")).sum(), pids.iter().map(|p| smaps_rollup(*p, "Rss:")).sum())
}

fn cpu(pids: &[u32]) -> Duration {
    pids.iter().map(|p| cpu_time(*p)).sum()
}

fn pct(v: &mut [Duration], q: f64) -> f64 {
    choir_tests::bench::pct(v, q).as_secs_f64() * 1e3
}

/// One system's figures at one count of agents.
#[derive(Default, Clone)]
struct Row {
    pss_kb: u64,
    rss_kb: u64,
    processes: usize,
    overhead: Vec<Duration>,
    cpu: Duration,
    turns: usize,
    restart: Vec<Duration>,
}

impl Row {
    fn mb(&self) -> f64 {
        self.pss_kb as f64 / 1024.0
    }
    fn p(&self, q: f64) -> f64 {
        pct(&mut self.overhead.clone(), q)
    }
    fn cpu_ms(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e3 / self.turns.max(1) as f64
    }
    fn restart_ms(&self) -> Option<f64> {
        let mut v = self.restart.clone();
        v.sort();
        v.get(v.len() / 2).map(|d| d.as_secs_f64() * 1e3)
    }
}

/// One timed turn: its overhead (time at the client less the model's time
/// for the calls made meanwhile).
fn timed_turn(sys: &dyn System, llm: &FakeLlm, agent: usize, conversation: &str, i: usize) -> Duration {
    let before = llm.request_count();
    let t0 = Instant::now();
    let reply = sys.turn(agent, conversation, &format!("turn {i}")).unwrap_or_else(|e| panic!("{}: {e}", sys.name()));
    let wall = t0.elapsed();
    assert_eq!(reply, ANSWER, "{} answered", sys.name());
    let model: Duration = llm
        .requests_since(before)
        .iter()
        .map(|r| r.answered_at.map_or(Duration::ZERO, |a| a.saturating_duration_since(r.at)))
        .sum();
    wall.saturating_sub(model)
}

/// Restarts agent 0 of `sys` and times its first answer (a message sent
/// every 2 ms until one is answered).
fn restart_to_answer(sys: &mut dyn System) -> Duration {
    sys.restart();
    let t0 = Instant::now();
    loop {
        if sys.turn(0, "restart", "are you there?").is_ok_and(|r| r == ANSWER) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(180), "{}: no answer 180 s after a restart", sys.name());
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn measure(n: usize, llm: &FakeLlm, turns: usize) -> Vec<(&'static str, Row)> {
    let model = llm.base_url();
    let mut systems: Vec<Box<dyn System>> =
        vec![Box::new(Choir::start(n, &model)), Box::new(nanobot(n, &model)), Box::new(zeroclaw(n, &model))];
    for sys in &systems {
        for a in 0..n {
            for i in 0..3 {
                timed_turn(sys.as_ref(), llm, a, &format!("warm-{a}"), i);
            }
        }
    }
    std::thread::sleep(choird::db::IDLE_CLOSE + Duration::from_secs(10));
    let mut rows: Vec<Row> = vec![Row::default(); systems.len()];
    let mut samples: Vec<Vec<(u64, u64, usize)>> = vec![Vec::new(); systems.len()];
    for s in 0..3 {
        for (k, sys) in systems.iter().enumerate() {
            let pids = sys.processes();
            let (pss, rss) = memory(&pids);
            samples[k].push((pss, rss, pids.len()));
        }
        if s < 2 {
            std::thread::sleep(Duration::from_secs(10));
        }
    }
    for (row, mut s) in rows.iter_mut().zip(samples) {
        s.sort();
        (row.pss_kb, row.rss_kb, row.processes) = s[1];
    }
    let before: Vec<Duration> = systems.iter().map(|s| cpu(&s.processes())).collect();
    for i in 0..turns {
        let c = i % CONVERSATIONS;
        for (k, sys) in systems.iter().enumerate() {
            rows[k].overhead.push(timed_turn(sys.as_ref(), llm, c % n, &format!("people-{c}"), i));
        }
    }
    for (k, sys) in systems.iter().enumerate() {
        rows[k].cpu = cpu(&sys.processes()).saturating_sub(before[k]);
        rows[k].turns = turns;
    }
    if n == 1 {
        for _ in 0..5 {
            for (k, sys) in systems.iter_mut().enumerate() {
                rows[k].restart.push(restart_to_answer(sys.as_mut()));
            }
        }
    }
    let names: Vec<&'static str> = systems.iter().map(|s| s.name()).collect();
    drop(systems);
    names.into_iter().zip(rows).collect()
}

fn check_installed() {
    let version = |bin: &str| {
        Command::new(peers_dir().join(bin))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let (nb, zc) = (version("nanobot-venv/bin/nanobot"), version("zeroclaw/bin/zeroclaw"));
    assert!(
        nb.contains(NANOBOT) && zc.contains(ZEROCLAW),
        "the peers are not installed in {} (nanobot {NANOBOT}: {nb:?}; zeroclaw {ZEROCLAW}: {zc:?}): run `make bench-peers`, which runs scripts/install-peers.sh",
        peers_dir().display()
    );
}

fn main() {
    check_installed();
    let turns = std::env::var("CHOIR_PEERS_TURNS").ok().and_then(|t| t.parse().ok()).unwrap_or(2000);
    let counts: Vec<usize> = std::env::var("CHOIR_PEERS_AGENTS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 5, 10]);
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Text(ANSWER.into())));
    llm.forget_bodies();
    report!(
        "Choir vs nanobot {NANOBOT} vs ZeroClaw {ZEROCLAW}: one fake model, {turns} turns each over {CONVERSATIONS} conversations, interleaved"
    );
    let mut table = Vec::new();
    for n in counts {
        let rows = measure(n, &llm, turns);
        for (name, r) in &rows {
            report!(
                "{n} agent(s), {name}: idle PSS {:.1} MB (RSS {:.1} MB, {} processes); overhead per turn p50 {:.2} / p99 {:.2} ms; CPU per turn {:.2} ms{}",
                r.mb(),
                r.rss_kb as f64 / 1024.0,
                r.processes,
                r.p(0.5),
                r.p(0.99),
                r.cpu_ms(),
                r.restart_ms().map(|ms| format!("; restart → first answer {ms:.0} ms (median of 5)")).unwrap_or_default()
            );
        }
        table.push((n, rows));
    }
    print_table(&table);
}

/// One row of the table: a figure of a system's [`Row`] (none: not measured).
type Metric = fn(&Row) -> Option<f64>;

/// The markdown table, each peer's figure with Choir's ratio to it.
fn print_table(table: &[(usize, Vec<(&'static str, Row)>)]) {
    let ratio = |c: f64, p: f64| if p > 0.0 { format!("{:.2}×", c / p) } else { "–".into() };
    println!("\n| agents | metric | Choir | nanobot (Choir ÷) | ZeroClaw (Choir ÷) |\n|---|---|---|---|---|");
    for (n, rows) in table {
        let [c, nb, zc] = [&rows[0].1, &rows[1].1, &rows[2].1];
        let metrics: [(&str, Metric, &str); 5] = [
            ("idle, whole system PSS", |r| Some(r.mb()), "MB"),
            ("overhead per turn p50", |r| Some(r.p(0.5)), "ms"),
            ("overhead per turn p99", |r| Some(r.p(0.99)), "ms"),
            ("CPU per turn, all processes", |r| Some(r.cpu_ms()), "ms"),
            ("restart → first answer", Row::restart_ms, "ms"),
        ];
        for (what, f, unit) in metrics {
            let (Some(cv), Some(nv), Some(zv)) = (f(c), f(nb), f(zc)) else { continue };
            println!(
                "| {n} | {what} | {cv:.2} {unit} | {nv:.2} {unit} ({}) | {zv:.2} {unit} ({}) |",
                ratio(cv, nv),
                ratio(cv, zv)
            );
        }
    }
}
