//! `bench-telegram` (`make bench`): the gateway's own overhead, with a fake
//! Bot API and a fake model that answers instantly — from an update being
//! returned by `getUpdates` to the edge lane's model request (the edge has
//! the message), and from the model's answer to the `sendMessage` request
//! reaching the Bot API; p50/p99 over 1,000 messages, one at a time, each
//! from a different user (so Telegram's per-chat limit of one message a
//! second is not what is measured; the per-bot limit is raised for the same
//! reason).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::FakeTelegram;
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const TOKEN: &str = "123456:bench-token";
const N: i64 = 1000;

fn pct(mut v: Vec<Duration>, q: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e3
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.iter().rev().find(|m| m["role"] == "user")?.clone();
        Some(Step::Text(format!("re: {}", last["content"].as_str().unwrap_or(""))))
    });
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 123456, "bench_bot");
    let users: serde_json::Map<String, Value> =
        (0..N + 50).map(|i| ((10_000 + i).to_string(), json!({"agent": "demo"}))).collect();
    let mut config = test_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "per_bot_per_s": 10000,
                                "bots": {"bench": {"token_secret": "tg", "users": users}}});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "tg": TOKEN}));
    choird.ctl_ok(&["agent", "start", "demo"]);

    let run = |first: i64, n: i64| -> (Vec<Duration>, Vec<Duration>) {
        let (mut inbound, mut outbound) = (Vec::new(), Vec::new());
        for i in first..first + n {
            let user = 10_000 + i;
            let text = format!("message {i}");
            let update = tg.user_says(TOKEN, user, &text);
            let reply = format!("re: {text}");
            let calls = tg.wait_calls("the reply", Duration::from_secs(30), |c| {
                c.iter().rev().take(8).any(|c| c.method == "sendMessage" && c.params["text"] == reply.as_str())
            });
            let sent =
                calls.iter().rev().find(|c| c.method == "sendMessage" && c.params["text"] == reply.as_str()).unwrap();
            let delivered = tg.delivered(TOKEN).into_iter().find(|(id, _)| *id == update).unwrap().1;
            let asked = llm
                .requests()
                .into_iter()
                .rev()
                .find(|r| r.body["messages"].to_string().contains(&format!("\"{text}\"")))
                .unwrap();
            inbound.push(asked.at.duration_since(delivered));
            outbound.push(sent.at.duration_since(asked.answered_at.unwrap()));
        }
        (inbound, outbound)
    };
    let started = Instant::now();
    run(N, 50); // warm-up
    let (inb, outb) = run(0, N);
    choir_tests::report!(
        "telegram gateway, {N} messages: update returned by getUpdates → edge model request p50 {:.2} ms p99 {:.2} ms; \
         model answer → sendMessage at the Bot API p50 {:.2} ms p99 {:.2} ms ({:.1} s in all)",
        pct(inb.clone(), 0.5),
        pct(inb, 0.99),
        pct(outb.clone(), 0.5),
        pct(outb, 0.99),
        started.elapsed().as_secs_f64()
    );
    choird.ctl_ok(&["agent", "stop", "demo"]);
}
