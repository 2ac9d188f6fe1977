//! `bench-turns` (`make bench`): the control plane's own overhead per turn,
//! with a fake model that answers instantly — from a user message entering
//! choird to the model request leaving the relay, and from the model's answer
//! to the reply leaving choird; p50/p99 over 1,000 turns, idle and with 8 busy
//! core jobs. Process runtime (the container adds nothing per turn: the agent
//! talks to choird over the same socket protocol either way).
//!
//! Then the breakdown per hop: a second choird whose processes log turn marks
//! (`choir_common::hop`, `RUST_LOG=info,choir::hop=trace`), 500 turns, and the
//! p50/p99 of each step between consecutive marks (the marks cost a log line
//! each, so this run's totals are a little higher than the untraced ones).
//!
//! Each p50/p99 is also given as a ratio to the floor measured at the start
//! of the same run (one PostgreSQL commit plus three socket hops: see
//! `Floor`), so runs on a quiet and on a noisy day compare.
//!
//! The fake core model answers at nice 19: in production it is a remote
//! service whose work does not share this machine's CPU with the turn; the
//! core jobs' work that does (their agent threads, choird's relay and
//! replication for them, PostgreSQL) runs as it would. It answers at once
//! (the worst case: each core job steps as fast as the machine lets it);
//! `--core-model-ms N` makes it take N ms a call instead, as a remote model
//! does (`make bench` runs the default).
//!
//! Besides a new conversation per turn (the best case: nothing to recall,
//! no history), the untraced run answers 1,000 turns round-robin over 50
//! conversations carrying their history, as a family's or a team's do.
//! `--conversations-only` runs just the idle and the alternating runs;
//! `--pg-defaults` runs on a cluster at PostgreSQL's own defaults instead of
//! the small-host settings choird's managed cluster uses; `--answer-chars N`
//! makes the model's answer N characters long instead of "ok" (streamed in
//! 8-character events, as providers stream a token or a few an event);
//! `--model-ms N` makes the model think N ms before each answer, as a real
//! one does (what a turn costs while its model thinks), `--turns N`
//! sets the turns of the `--conversations-only` runs (default 1,000), and
//! `--pause-ms N` has the client wait N ms after each answer before its next
//! message, as people do: the CPU per turn then counts what the system's
//! threads do by the clock between turns (PostgreSQL's background writers,
//! choird's round), which back-to-back turns share out thin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::hops::{breakdown, marks, wall_us};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

/// The nice value the fake core model answers at (the agent's core job
/// threads run at `choir_agent::lanes::core::CORE_NICE`, 10; the stand-in for a
/// remote service gets the lowest priority there is).
const CORE_MODEL_NICE: i32 = 19;

fn pct(mut v: Vec<Duration>, q: f64) -> f64 {
    choir_tests::bench::pct(&mut v, q).as_secs_f64() * 1e3
}

/// Per turn: message in → model request out, model answer → reply out, and
/// the turn's wall-clock window (for the marks).
type Turns = (Vec<Duration>, Vec<Duration>, Vec<(u128, u128)>);

/// What the model answers every turn (`--answer-chars`).
static ANSWER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Turns of each `--conversations-only` run (`--turns`).
static TURNS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// The client's pause after each answer (`--pause-ms`).
static PAUSE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// The turns of a `--conversations-only` run.
fn measured_turns() -> usize {
    *TURNS.get().unwrap_or(&1000)
}

/// The value after `flag` on the command line, as a number.
fn number_after(args: &[String], flag: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == flag)?;
    Some(args.get(i + 1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{flag} takes a number")))
}

fn turns(choird: &Choird, edge: &FakeLlm, n: usize, tag: &str) -> Turns {
    turns_in(choird, edge, n, tag, None)
}

/// [`turns`], each in a conversation of its own, or — with `alternating`
/// — round-robin over that many conversations, each carrying its history
/// (as a family's or a team's do).
fn turns_in(choird: &Choird, edge: &FakeLlm, n: usize, tag: &str, alternating: Option<usize>) -> Turns {
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let (mut inbound, mut outbound, mut windows) = (Vec::new(), Vec::new(), Vec::new());
    let conversation = |i: usize| match alternating {
        Some(k) => format!("{tag}-{}", i % k),
        None => format!("{tag}-{i}"),
    };
    for i in 0..n {
        let before = edge.request_count();
        let w0 = wall_us();
        let t0 = Instant::now();
        let mut resp = admin
            .post("http://localhost/admin/v1/agents/demo/chat")
            .send_json(json!({"text": format!("turn {i}"), "conversation": conversation(i), "timeout_s": 60}))
            .unwrap();
        let body: Value = resp.body_mut().read_json().unwrap();
        let t3 = Instant::now();
        windows.push((w0, wall_us()));
        assert_eq!(body["reply"].as_str(), ANSWER.get().map(String::as_str), "{body}");
        let reqs = edge.requests_since(before);
        let r = &reqs[0];
        inbound.push(r.at - t0);
        outbound.push(t3 - r.answered_at.unwrap());
        if let Some(pause) = PAUSE.get() {
            std::thread::sleep(*pause);
        }
    }
    (inbound, outbound, windows)
}

/// The marks a turn passes, in order (choird's and the agent's).
fn hops() -> Vec<&'static str> {
    choir_tests::hops::path(&["message.in", "message.stored"], &["admin.answer"])
}

/// The settings choird's managed cluster changes for a small host
/// (`db::cluster`), each back at PostgreSQL's own default.
const PG_DEFAULTS: &[(&str, &str)] = &[
    ("shared_buffers", "128MB"),
    ("max_connections", "100"),
    ("max_logical_replication_workers", "4"),
    ("max_wal_senders", "10"),
    ("wal_level", "replica"),
    ("max_parallel_workers_per_gather", "2"),
    ("max_parallel_maintenance_workers", "2"),
    ("jit", "on"),
    ("autovacuum_max_workers", "3"),
    ("autovacuum_naptime", "60"),
    ("checkpoint_timeout", "300"),
];

fn main() {
    let mut pg = TestPg::start().expect("PostgreSQL is needed");
    // `--pg-defaults`: the cluster at PostgreSQL's defaults instead of the
    // small-host settings (ALTER SYSTEM outranks the settings file), to
    // measure what those settings cost a turn.
    if std::env::args().any(|a| a == "--pg-defaults") {
        let mut c = pg.client();
        for (k, v) in PG_DEFAULTS {
            c.batch_execute(&format!("ALTER SYSTEM SET {k} = '{v}'")).unwrap();
        }
        drop(c);
        pg.stop_immediate();
        pg.start_again();
        let shown: String = pg.client().query_one("SHOW wal_level", &[]).unwrap().get(0);
        assert_eq!(shown, "replica", "the defaults are in force");
        choir_tests::report!("PostgreSQL at its own defaults, not the small-host settings");
    }
    // Before choird starts: the machine as quiet as it gets in this run.
    let floor = Floor::measure(&pg);
    choir_tests::report!("{}", floor.describe());
    let args: Vec<String> = std::env::args().collect();
    let answer_chars = number_after(&args, "--answer-chars").unwrap_or(0) as usize;
    let think = Duration::from_millis(number_after(&args, "--model-ms").unwrap_or(0));
    if !think.is_zero() {
        choir_tests::report!("the model thinks {} ms before each answer", think.as_millis());
    }
    if let Some(n) = number_after(&args, "--turns") {
        TURNS.set(n as usize).expect("set once");
    }
    if let Some(ms) = number_after(&args, "--pause-ms") {
        choir_tests::report!("the client pauses {ms} ms after each answer");
        PAUSE.set(Duration::from_millis(ms)).expect("set once");
    }
    let answer: String = if answer_chars == 0 {
        "ok".into()
    } else {
        choir_tests::report!("the model answers {answer_chars} characters a turn");
        "the answer ".chars().cycle().take(answer_chars).collect::<String>().trim_end().to_owned()
    };
    ANSWER.set(answer.clone()).expect("set once");
    let edge = FakeLlm::with_responder(move |req, _| {
        std::thread::sleep(think);
        let last = req["messages"].as_array()?.last()?.clone();
        if last["content"] == "start eight" {
            let calls = (0..8)
                .map(|i| {
                    (
                        "choir.core.start".to_owned(),
                        json!({"name": format!("busy{i}"), "objective": "keep busy"}).to_string(),
                    )
                })
                .collect();
            return Some(Step::ToolCalls(calls));
        }
        Some(Step::Text(answer.clone()))
    });
    let core_model = Duration::from_millis(number_after(&args, "--core-model-ms").unwrap_or(0));
    if !core_model.is_zero() {
        choir_tests::report!("the core model takes {} ms a call", core_model.as_millis());
    }
    let core = FakeLlm::with_responder(move |req, _| {
        std::thread::sleep(core_model);
        // Compaction asks without tools: give it a summary, so histories stay bounded.
        if req.get("tools").is_none() {
            return Some(Step::Text("read small.txt many times".into()));
        }
        Some(Step::call("choir.fs.read", json!({"path": "small.txt"})))
    });
    core.forget_bodies();
    // The core model stands in for a remote provider: its work is not this
    // machine's in production, so it yields the CPU to what is measured
    // (choird, the agent and PostgreSQL serving the core jobs still compete).
    core.answer_at_nice(CORE_MODEL_NICE);
    // Only the timestamps are read back: cloning every body at each turn made
    // the busy run take a quarter of an hour of the bench's own time.
    edge.forget_bodies();
    let mut config = test_config(&edge.base_url(), Some(&pg.url()), &["demo"]);
    config["llm"]["core"]["base_url"] = json!(core.base_url());
    config["agents"]["demo"] =
        json!({"max_core_jobs": 8, "core_budget": {"steps": 100000000, "tokens": 1000000000000u64, "wall_s": 36000}});
    // `--conversations-only`: the idle run and the alternating one, nothing else.
    if std::env::args().any(|a| a == "--conversations-only") {
        let choird = Choird::start(&config, &json!({"llm_key": "k"}));
        start_demo(&choird, &edge);
        let before = cpu(&choird, &pg);
        let n = measured_turns();
        let (inb, outb, _) = turns(&choird, &edge, n, "idle");
        choir_tests::report!(
            "idle agent, {n} turns: {}; {}",
            in_out(inb, outb, &floor),
            cpu_per_turn(before, cpu(&choird, &pg), n)
        );
        alternating(&choird, &pg, &edge, &floor);
        return;
    }
    // `--breakdown-only`: skip the untraced runs.
    if !std::env::args().any(|a| a == "--breakdown-only") {
        untraced(&config, &pg, &edge, &core, &floor);
    }

    // The breakdown: the same agent, its processes marking each hop; idle,
    // then with 8 busy core jobs.
    let traced = Choird::start_logging(&config, &json!({"llm_key": "k"}), "info,choir::hop=trace");
    start_demo(&traced, &edge);
    let (inb, outb, idle) = turns(&traced, &edge, 500, "traced");
    choir_tests::report!("traced, idle, 500 turns: {}", in_out(inb, outb, &floor));
    traced.ctl_ok(&["chat", "demo", "start eight"]);
    std::thread::sleep(Duration::from_secs(2));
    let (inb, outb, busy) = turns(&traced, &edge, 500, "traced-busy");
    traced.ctl_ok(&["agent", "stop", "demo"]);
    choir_tests::report!("traced, 8 busy core jobs, 500 turns: {}", in_out(inb, outb, &floor));
    // The log manager writes in batches: let it catch up.
    std::thread::sleep(Duration::from_secs(2));
    let marks = marks(&traced, &["demo"]);
    choir_tests::report!("idle:");
    breakdown(&hops(), &idle, &marks);
    choir_tests::report!("with 8 busy core jobs:");
    breakdown(&hops(), &busy, &marks);
}

/// The untraced runs: idle, then with 8 busy core jobs.
fn untraced(config: &Value, pg: &TestPg, edge: &FakeLlm, core: &FakeLlm, floor: &Floor) {
    let choird = Choird::start(config, &json!({"llm_key": "k"}));
    start_demo(&choird, edge);

    let before = cpu(&choird, pg);
    let (inb, outb, _) = turns(&choird, edge, 1000, "idle");
    choir_tests::report!(
        "idle agent, 1000 turns: {} (in: message into choird → model request out of the relay; out: model answer → reply out of choird); {}",
        in_out(inb, outb, floor),
        cpu_per_turn(before, cpu(&choird, pg), 1000)
    );

    alternating(&choird, pg, edge, floor);

    choird.ctl_ok(&["chat", "demo", "start eight"]);
    std::thread::sleep(Duration::from_secs(2));
    let core_before = core.request_count();
    let (inb, outb, _) = turns(&choird, edge, 1000, "busy");
    let core_steps = core.request_count() - core_before;
    choir_tests::report!(
        "with 8 busy core jobs ({core_steps} core steps meanwhile), 1000 turns: {}",
        in_out(inb, outb, floor)
    );
    choird.ctl_ok(&["agent", "stop", "demo"]);
    drop(choird);
}

/// CPU used so far by choird, its agents and the cluster (the bench's own
/// fake model and client not counted), in all and by thread.
struct Cpu {
    parts: [Duration; 3],
    threads: std::collections::BTreeMap<String, choir_tests::bench::Ran>,
}

fn cpu(choird: &Choird, pg: &TestPg) -> Cpu {
    let mut pids = choir_tests::bench::process_tree(choird.pid());
    pids.extend(choir_tests::bench::process_tree(pg.postmaster_pid()));
    Cpu {
        parts: choir_tests::bench::system_cpu(choird.pid(), pg.postmaster_pid()),
        threads: choir_tests::bench::thread_cpu(&pids),
    }
}

/// Where a run's CPU went, per turn, by "process/thread" (the per-hop
/// breakdown: each hop of a turn runs on a thread of its own), largest
/// first, each with the times it was put on a CPU per turn (its wake-ups,
/// and its resumptions after preemption), and what threads that ended
/// meanwhile used.
fn cpu_by_thread(before: &Cpu, after: &Cpu, n: usize) -> String {
    let per = |d: Duration| d.as_secs_f64() * 1e3 / n as f64;
    let mut used: Vec<(String, choir_tests::bench::Ran)> = after
        .threads
        .iter()
        .map(|(k, v)| (k.clone(), v.since(before.threads.get(k).copied().unwrap_or_default())))
        .filter(|(_, r)| !r.cpu.is_zero())
        .collect();
    used.sort_by_key(|(_, r)| std::cmp::Reverse(r.cpu));
    let counted: Duration = used.iter().map(|(_, r)| r.cpu).sum();
    let total: Duration = (0..3).map(|i| after.parts[i].saturating_sub(before.parts[i])).sum();
    let runs: u64 = used.iter().map(|(_, r)| r.runs).sum();
    let mut out: Vec<String> =
        used.iter().map(|(k, r)| format!("{k} {:.3} ({:.1})", per(r.cpu), r.runs as f64 / n as f64)).collect();
    out.push(format!("threads that ended {:.3}", per(total.saturating_sub(counted))));
    format!(
        "CPU per turn by thread, ms (times on a CPU per turn): {}; {:.1} times on a CPU per turn in all",
        out.join(", "),
        runs as f64 / n as f64
    )
}

/// The CPU a run of `n` turns cost the system, per turn: whole, then
/// choird, agents and PostgreSQL; then by thread.
fn cpu_per_turn(before: Cpu, after: Cpu, n: usize) -> String {
    let by_thread = cpu_by_thread(&before, &after, n);
    let (before, after) = (before.parts, after.parts);
    let per = |i: usize| after[i].saturating_sub(before[i]).as_secs_f64() * 1e3 / n as f64;
    format!(
        "CPU per turn, whole system {:.2} ms (choird {:.2}, agent {:.2}, PostgreSQL {:.2}); {by_thread}",
        per(0) + per(1) + per(2),
        per(0),
        per(1),
        per(2)
    )
}

/// Real conversations: 1,000 turns round-robin over 50 conversations (each
/// 20 turns deep by the end, its history growing), after one round that
/// opens them all.
fn alternating(choird: &Choird, pg: &TestPg, edge: &FakeLlm, floor: &Floor) {
    const CONVERSATIONS: usize = 50;
    turns_in(choird, edge, CONVERSATIONS, "people", Some(CONVERSATIONS));
    let before = cpu(choird, pg);
    let n = measured_turns();
    let (inb, outb, _) = turns_in(choird, edge, n, "people", Some(CONVERSATIONS));
    choir_tests::report!(
        "{CONVERSATIONS} alternating conversations with history, {n} turns: {}; {}",
        in_out(inb, outb, floor),
        cpu_per_turn(before, cpu(choird, pg), n)
    );
}

/// Starts the demo agent (its workspace holding the file core jobs read) and
/// warms it up with 50 turns.
fn start_demo(choird: &Choird, edge: &FakeLlm) {
    std::fs::create_dir_all(choird.workspace("demo")).unwrap();
    std::fs::write(choird.workspace("demo").join("small.txt"), "x\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    turns(choird, edge, 50, "warmup");
}

/// p50 and p99 of both directions of a run of turns, each with its ratio to
/// the floor.
fn in_out(inb: Vec<Duration>, outb: Vec<Duration>, floor: &Floor) -> String {
    let (i50, i99, o50, o99) = (pct(inb.clone(), 0.5), pct(inb, 0.99), pct(outb.clone(), 0.5), pct(outb, 0.99));
    format!(
        "in p50 {i50:.2} ms ({:.1}× the floor) p99 {i99:.2} ms ({:.1}×); out p50 {o50:.2} ms ({:.1}×) p99 {o99:.2} ms ({:.1}×)",
        i50 / floor.p50,
        i99 / floor.p99,
        o50 / floor.p50,
        o99 / floor.p99
    )
}

/// The physical floor of one direction of a turn on this machine, measured in
/// the same run: the one durable write each direction needs (a PostgreSQL
/// commit of a one-row `INSERT`, prepared, on the cluster choird uses, so with
/// its fsync) and three one-way Unix-socket hops (in: the admin request, the
/// hand-out to the agent, the agent's request to the relay; out: the answer to
/// the agent, its HEARTBEAT, the answer to the admin client), each half of a
/// one-byte round trip. p99 is the sum of the parts' p99s.
struct Floor {
    commit: (f64, f64),
    trip: (f64, f64),
    p50: f64,
    p99: f64,
}

impl Floor {
    fn measure(pg: &TestPg) -> Floor {
        let mut c = pg.client();
        c.batch_execute("CREATE TABLE bench_floor (id bigint)").unwrap();
        let insert = c.prepare("INSERT INTO bench_floor VALUES ($1)").unwrap();
        let mut commits = Vec::new();
        for i in 0..1000i64 {
            let t = Instant::now();
            c.execute(&insert, &[&i]).unwrap();
            commits.push(t.elapsed());
        }
        c.batch_execute("DROP TABLE bench_floor").unwrap();

        use std::io::{Read, Write};
        let (mut near, mut far) = std::os::unix::net::UnixStream::pair().unwrap();
        let echo = std::thread::spawn(move || {
            let mut b = [0u8; 1];
            while far.read_exact(&mut b).is_ok() && far.write_all(&b).is_ok() {}
        });
        let mut trips = Vec::new();
        for _ in 0..2000 {
            let mut b = [0u8; 1];
            let t = Instant::now();
            near.write_all(b"x").unwrap();
            near.read_exact(&mut b).unwrap();
            trips.push(t.elapsed());
        }
        drop(near);
        echo.join().unwrap();
        let commit = (pct(commits.clone(), 0.5), pct(commits, 0.99));
        let trip = (pct(trips.clone(), 0.5), pct(trips, 0.99));
        Floor { commit, trip, p50: commit.0 + 1.5 * trip.0, p99: commit.1 + 1.5 * trip.1 }
    }

    fn describe(&self) -> String {
        format!(
            "floor of one direction (one PostgreSQL commit p50 {:.3} / p99 {:.3} ms + three socket hops, a round trip being p50 {:.3} / p99 {:.3} ms): p50 {:.2} ms, p99 {:.2} ms",
            self.commit.0, self.commit.1, self.trip.0, self.trip.1, self.p50, self.p99
        )
    }
}
