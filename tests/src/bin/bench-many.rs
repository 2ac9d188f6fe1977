//! `bench-many` (`make bench`): many agents on one choird (process
//! runtime, choird's own PostgreSQL, no workspace images: the loop mounts
//! are the kernel's, not choird's). At 10, 50 and 100 agents, each having
//! answered one turn and then idle for 20 s: choird's resident memory,
//! threads and open descriptors (and what each agent adds to them), the
//! agents' own resident memory, the whole system's idle CPU (choird, agents
//! and the cluster, utime+stime over 30 s) and the turn latency through
//! the admin API round-robin over all agents (a fake model answering at
//! once) with the whole system's CPU per turn over them (utime+stime of
//! choird, the agents and the cluster). Goal: choird's per-agent cost
//! constant, idle CPU at 100 agents ≤ 1 % of a core, a turn's latency and
//! CPU the same whatever the count. `bench-many 10 20` measures other
//! counts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::bench::{pct, postmaster_of, proc_status, process_tree, system_cpu};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::report;
use serde_json::{json, Value};

/// What one count of agents measured.
struct Row {
    n: usize,
    rss_kb: u64,
    threads: u64,
    fds: usize,
    agent_rss_kb: u64,
    idle_cpu: f64,
    /// Of it: choird, the agents, the cluster.
    idle_split: [f64; 3],
    p50: Duration,
    p99: Duration,
    /// The whole system's CPU per turn over the turns.
    turn_cpu: Duration,
}

fn measure(n: usize, llm: &FakeLlm) -> Row {
    let names: Vec<String> = (1..=n).map(|i| format!("a{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut config = test_config(&llm.base_url(), None, &refs);
    for a in &refs {
        config["agents"][a] = json!({"autostart": true, "quotas": {"workspace_mb": 0}});
    }
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    wait_for(&format!("{n} agents running"), Duration::from_secs(300), || {
        let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "list"])).unwrap_or_default();
        v["agents"].as_array().is_some_and(|a| a.iter().filter(|x| x["state"] == "running").count() == n)
    });
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let turn = |agent: &str, i: usize| {
        let t = Instant::now();
        let mut resp = admin
            .post(&format!("http://localhost/admin/v1/agents/{agent}/chat"))
            .send_json(json!({"text": format!("turn {i}"), "conversation": "c", "timeout_s": 60}))
            .unwrap();
        let body: Value = resp.body_mut().read_json().unwrap();
        assert_eq!(body["reply"], "ok", "{body}");
        t.elapsed()
    };
    for (i, a) in refs.iter().enumerate() {
        turn(a, i);
    }
    std::thread::sleep(Duration::from_secs(20));

    let pid = choird.pid();
    // CPU of choird, of its agents and of the cluster, over the window.
    let postmaster = postmaster_of(&choird);
    let before = system_cpu(pid, postmaster);
    let window = Duration::from_secs(30);
    std::thread::sleep(window);
    let after = system_cpu(pid, postmaster);
    let share = |i: usize| after[i].saturating_sub(before[i]).as_secs_f64() / window.as_secs_f64() * 100.0;
    let idle_split = [share(0), share(1), share(2)];
    let idle_cpu = idle_split.iter().sum();

    let agents: Vec<u32> = process_tree(pid).into_iter().filter(|p| *p != pid).collect();
    let agent_rss_kb = agents.iter().map(|p| proc_status(*p, "VmRSS:")).sum::<u64>() / n.max(1) as u64;
    let row = Row {
        n,
        rss_kb: proc_status(pid, "VmRSS:"),
        threads: proc_status(pid, "Threads:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0),
        agent_rss_kb,
        idle_cpu,
        idle_split,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        turn_cpu: Duration::ZERO,
    };
    const TURNS: usize = 500;
    let before = system_cpu(pid, postmaster);
    let mut latencies: Vec<Duration> = (0..TURNS).map(|i| turn(refs[i % n], i)).collect();
    let after = system_cpu(pid, postmaster);
    let spent: Duration = (0..3).map(|i| after[i].saturating_sub(before[i])).sum();
    Row { p50: pct(&mut latencies, 0.5), p99: pct(&mut latencies, 0.99), turn_cpu: spent / TURNS as u32, ..row }
}

fn main() {
    let counts: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let counts = if counts.is_empty() { vec![10, 50, 100] } else { counts };
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    llm.forget_bodies();
    let rows: Vec<Row> = counts.iter().map(|n| measure(*n, &llm)).collect();
    let first = &rows[0];
    for r in &rows {
        let per = |now: f64, then: f64| {
            if r.n == first.n {
                String::new()
            } else {
                format!(" ({:+.2} per agent from {})", (now - then) / (r.n - first.n) as f64, first.n)
            }
        };
        report!(
            "{} agents: choird {:.1} MB{}, {} threads{}, {} descriptors{}; each agent {:.1} MB; idle CPU, whole system {:.2} % of a core (choird {:.2}, agents {:.2}, PostgreSQL {:.2}); a turn p50 {:.2} ms p99 {:.2} ms, CPU {:.2} ms",
            r.n,
            r.rss_kb as f64 / 1024.0,
            per(r.rss_kb as f64 / 1024.0, first.rss_kb as f64 / 1024.0).replace("per agent", "MB per agent"),
            r.threads,
            per(r.threads as f64, first.threads as f64),
            r.fds,
            per(r.fds as f64, first.fds as f64),
            r.agent_rss_kb as f64 / 1024.0,
            r.idle_cpu,
            r.idle_split[0],
            r.idle_split[1],
            r.idle_split[2],
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.turn_cpu.as_secs_f64() * 1e3
        );
    }
}
