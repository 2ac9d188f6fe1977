//! `bench-turns` (`make bench`): the control plane's own overhead per turn,
//! with a fake model that answers instantly — from a user message entering
//! choird to the model request leaving the relay, and from the model's answer
//! to the reply leaving choird; p50/p99 over 1,000 turns, idle and with 8 busy
//! core jobs. Process runtime (the container adds nothing per turn: the agent
//! talks to choird over the same socket protocol either way).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

fn pct(mut v: Vec<Duration>, q: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e3
}

fn turns(choird: &Choird, edge: &FakeLlm, n: usize, tag: &str) -> (Vec<Duration>, Vec<Duration>) {
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let (mut inbound, mut outbound) = (Vec::new(), Vec::new());
    for i in 0..n {
        let before = edge.requests().len();
        let t0 = Instant::now();
        let mut resp = admin
            .post("http://localhost/admin/v1/agents/demo/chat")
            .send_json(json!({"text": format!("turn {i}"), "conversation": format!("{tag}-{i}"), "timeout_s": 60}))
            .unwrap();
        let body: Value = resp.body_mut().read_json().unwrap();
        let t3 = Instant::now();
        assert_eq!(body["reply"], "ok", "{body}");
        let reqs = edge.requests();
        let r = &reqs[before];
        inbound.push(r.at - t0);
        outbound.push(t3 - r.answered_at.unwrap());
    }
    (inbound, outbound)
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let edge = FakeLlm::with_responder(|req, _| {
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
        Some(Step::Text("ok".into()))
    });
    let core = FakeLlm::with_responder(|req, _| {
        // Compaction asks without tools: give it a summary, so histories stay bounded.
        if req.get("tools").is_none() {
            return Some(Step::Text("read small.txt many times".into()));
        }
        Some(Step::call("choir.fs.read", json!({"path": "small.txt"})))
    });
    core.forget_bodies();
    let mut config = test_config(&edge.base_url(), Some(&pg.url()), &["demo"]);
    config["llm"]["core"]["base_url"] = json!(core.base_url());
    config["agents"]["demo"] =
        json!({"max_core_jobs": 8, "core_budget": {"steps": 100000000, "tokens": 1000000000000u64, "wall_s": 36000}});
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    std::fs::create_dir_all(choird.workspace("demo")).unwrap();
    std::fs::write(choird.workspace("demo").join("small.txt"), "x\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    turns(&choird, &edge, 50, "warmup");

    let (inb, outb) = turns(&choird, &edge, 1000, "idle");
    println!(
        "idle agent, 1000 turns: message into choird → model request out of the relay p50 {:.2} ms p99 {:.2} ms; model answer → reply out of choird p50 {:.2} ms p99 {:.2} ms",
        pct(inb.clone(), 0.5), pct(inb, 0.99), pct(outb.clone(), 0.5), pct(outb, 0.99)
    );

    choird.ctl_ok(&["chat", "demo", "start eight"]);
    std::thread::sleep(Duration::from_secs(2));
    let core_before = core.requests().len();
    let (inb, outb) = turns(&choird, &edge, 1000, "busy");
    let core_steps = core.requests().len() - core_before;
    println!(
        "with 8 busy core jobs ({core_steps} core steps meanwhile), 1000 turns: in p50 {:.2} ms p99 {:.2} ms; out p50 {:.2} ms p99 {:.2} ms",
        pct(inb.clone(), 0.5), pct(inb, 0.99), pct(outb.clone(), 0.5), pct(outb, 0.99)
    );
    choird.ctl_ok(&["agent", "stop", "demo"]);
}
