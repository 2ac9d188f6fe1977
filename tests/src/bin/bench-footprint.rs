//! `bench-footprint` (`make bench`): what the whole system holds in memory
//! when idle — choird, its agents (process runtime) and the PostgreSQL
//! cluster choird manages for itself — as PSS (each shared page divided
//! among the processes sharing it, so the sum is what the system costs)
//! with RSS beside it. With 1 and with 5 agents, after each agent answered
//! a few turns and the system then sat idle long enough for choird's pool
//! to close the connections a burst opened. Goals: ≤ 25 MB PSS with one
//! agent, ≤ 30 MB with five. `CHOIR_FOOTPRINT_MINUTES=N` samples for N
//! minutes after that (to show the figure stays flat); the default is one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::bench::{postmaster_of, process_tree, smaps_rollup};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::report;
use serde_json::json;

/// PSS and RSS (kB) and process count of one part of the system.
#[derive(Default, Clone, Copy)]
struct Part {
    pss: u64,
    rss: u64,
    processes: usize,
}

impl Part {
    fn of(pids: &[u32]) -> Part {
        Part {
            pss: pids.iter().map(|p| smaps_rollup(*p, "Pss:")).sum(),
            rss: pids.iter().map(|p| smaps_rollup(*p, "Rss:")).sum(),
            processes: pids.len(),
        }
    }
}

/// choird, its agents and the managed cluster, as they are now.
struct Sample {
    choird: Part,
    agents: Part,
    postgres: Part,
}

impl Sample {
    fn total(&self) -> u64 {
        self.choird.pss + self.agents.pss + self.postgres.pss
    }
}

fn sample(choird: &Choird) -> Sample {
    let pid = choird.pid();
    let agents: Vec<u32> = process_tree(pid).into_iter().filter(|p| *p != pid).collect();
    let postmaster = postmaster_of(choird);
    assert_ne!(postmaster, 0, "the managed cluster runs");
    Sample { choird: Part::of(&[pid]), agents: Part::of(&agents), postgres: Part::of(&process_tree(postmaster)) }
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

fn measure(n: usize, minutes: u64) {
    let names: Vec<String> = (1..=n).map(|i| format!("a{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    // No database_url: choird runs its own cluster, as an operator's does.
    let config = test_config(&llm.base_url(), None, &refs);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    for a in &refs {
        choird.ctl_ok(&["agent", "start", a]);
    }
    for a in &refs {
        choird.wait_running(a);
        for i in 0..10 {
            choird.ctl_ok(&["chat", a, &format!("turn {i}")]);
        }
    }
    // Idle: a burst's extra connections close after a minute unused.
    std::thread::sleep(choird::db::IDLE_CLOSE + Duration::from_secs(10));
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut totals = Vec::new();
    while started.elapsed() < Duration::from_secs(60 * minutes) || samples.is_empty() {
        let s = sample(&choird);
        totals.push(s.total());
        samples.push(s);
        std::thread::sleep(Duration::from_secs(10));
    }
    // The first turn after the quiet and the next (a turn after a quiet
    // minute pays for whatever the quiet let go: connections, code pages).
    let timed = |text: &str| {
        let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
        let t0 = Instant::now();
        let mut resp = admin
            .post("http://localhost/admin/v1/agents/a1/chat")
            .send_json(json!({"text": text, "conversation": "after", "timeout_s": 60}))
            .unwrap();
        let body: serde_json::Value = resp.body_mut().read_json().unwrap();
        assert_eq!(body["reply"], "ok", "{body}");
        t0.elapsed().as_secs_f64() * 1e3
    };
    let (first, next) = (timed("after the quiet"), timed("and again"));
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|i| totals[*i]);
    let median = &samples[order[order.len() / 2]];
    let (low, high) = (totals.iter().min().unwrap(), totals.iter().max().unwrap());
    let goal = if n == 1 { "goal ≤ 25 MB" } else { "goal ≤ 30 MB" };
    report!(
        "idle, {n} agent(s): whole system PSS {} ({goal}; {} to {} over {} samples in {minutes} min), RSS {}",
        mb(median.total()),
        mb(*low),
        mb(*high),
        samples.len(),
        mb(median.choird.rss + median.agents.rss + median.postgres.rss)
    );
    report!("  the first turn after the quiet {first:.2} ms, the next {next:.2} ms (client included)");
    report!(
        "  choird {} PSS ({} RSS); agents {} PSS in {} process(es) ({} RSS); PostgreSQL {} PSS in {} processes ({} RSS)",
        mb(median.choird.pss),
        mb(median.choird.rss),
        mb(median.agents.pss),
        median.agents.processes,
        mb(median.agents.rss),
        mb(median.postgres.pss),
        median.postgres.processes,
        mb(median.postgres.rss)
    );
}

fn main() {
    let minutes = std::env::var("CHOIR_FOOTPRINT_MINUTES").ok().and_then(|m| m.parse().ok()).unwrap_or(1);
    for n in [1, 5] {
        measure(n, minutes);
    }
}
