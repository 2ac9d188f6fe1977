//! `bench-telegram` (`make bench`): the gateway's own overhead, with a fake
//! Bot API and a fake model that answers instantly — from an update being
//! returned by `getUpdates` to the edge lane's model request (the edge has
//! the message), and from the model's answer to the `sendMessage` request
//! reaching the Bot API; p50/p99 over 1,000 messages, one at a time, each
//! from a different user (so Telegram's per-chat limit of one message a
//! second is not what is measured; the per-bot limit is raised for the same
//! reason).
//!
//! Then the breakdown per hop, as in `bench-turns`: a second choird whose
//! processes log turn marks, 300 messages, the p50/p99 of each step.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::FakeTelegram;
use choir_tests::harness::{test_config, Choird};
use choir_tests::hops::{breakdown, marks, wall_us};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const TOKEN: &str = "123456:bench-token";
const N: i64 = 1000;
/// The traced run's messages, from users after the untraced run's.
const TRACED: i64 = 300;
const TRACED_FROM: i64 = N + 100;

fn pct(mut v: Vec<Duration>, q: f64) -> f64 {
    choir_tests::bench::pct(&mut v, q).as_secs_f64() * 1e3
}

/// The marks an update passes on its way to the model and its answer back
/// out (choird's poller, HEARTBEAT, relay and sender, and the agent's; a
/// plain text message is queued by the poller, not the dispatcher).
fn hops() -> Vec<&'static str> {
    choir_tests::hops::path(&["tg.polled", "tg.stored"], &["tg.send"])
}

/// Per message: update returned → model request, model answer →
/// sendMessage, and the message's wall-clock window (for the marks).
type Run = (Vec<Duration>, Vec<Duration>, Vec<(u128, u128)>);

/// `n` messages from users `first..`, one at a time.
fn run(tg: &FakeTelegram, llm: &FakeLlm, first: i64, n: i64) -> Run {
    let (mut inbound, mut outbound, mut windows) = (Vec::new(), Vec::new(), Vec::new());
    for i in first..first + n {
        let user = 10_000 + i;
        let text = format!("message {i}");
        // One message at a time: its model request is the next one, and
        // the calls so far are dropped, so the bench copies one message's
        // worth of records, not an ever longer history, between turns.
        tg.clear_calls();
        let before = llm.request_count();
        let w0 = wall_us();
        let update = tg.user_says(TOKEN, user, &text);
        let reply = format!("re: {text}");
        let calls = tg.wait_calls("the reply", Duration::from_secs(30), |c| {
            c.iter().rev().take(8).any(|c| c.method == "sendMessage" && c.params["text"] == reply.as_str())
        });
        windows.push((w0, wall_us()));
        let sent =
            calls.iter().rev().find(|c| c.method == "sendMessage" && c.params["text"] == reply.as_str()).unwrap();
        let delivered = tg.delivered(TOKEN).into_iter().find(|(id, _)| *id == update).unwrap().1;
        let mut asked = llm.requests_since(before);
        assert_eq!(asked.len(), 1, "one model request per message");
        let asked = asked.swap_remove(0);
        inbound.push(asked.at.duration_since(delivered));
        outbound.push(sent.at.duration_since(asked.answered_at.unwrap()));
    }
    (inbound, outbound, windows)
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.iter().rev().find(|m| m["role"] == "user")?.clone();
        Some(Step::Text(format!("re: {}", last["content"].as_str().unwrap_or(""))))
    });
    // The responder still sees each body; the record keeps none (the bench
    // copies the record after every message).
    llm.forget_bodies();
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 123456, "bench_bot");
    let users: serde_json::Map<String, Value> =
        (0..TRACED_FROM + TRACED + 20).map(|i| ((10_000 + i).to_string(), json!({"agent": "demo"}))).collect();
    let mut config = test_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "per_bot_per_s": 10000,
                                "bots": {"bench": {"token_secret": "tg", "users": users}}});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "tg": TOKEN}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let started = Instant::now();
    run(&tg, &llm, N, 50); // warm-up
    let (inb, outb, _) = run(&tg, &llm, 0, N);
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
    drop(choird);

    // The breakdown: new users (a user's first message is what is measured).
    let traced = Choird::start_logging(&config, &json!({"llm_key": "k", "tg": TOKEN}), "info,choir::hop=trace");
    traced.ctl_ok(&["agent", "start", "demo"]);
    run(&tg, &llm, TRACED_FROM + TRACED, 20); // warm-up
    let (inb, outb, windows) = run(&tg, &llm, TRACED_FROM, TRACED);
    traced.ctl_ok(&["agent", "stop", "demo"]);
    choir_tests::report!(
        "traced, {TRACED} messages: in p50 {:.2} ms p99 {:.2} ms; out p50 {:.2} ms p99 {:.2} ms",
        pct(inb.clone(), 0.5),
        pct(inb, 0.99),
        pct(outb.clone(), 0.5),
        pct(outb, 0.99)
    );
    // The log manager writes in batches: let it catch up.
    std::thread::sleep(Duration::from_secs(2));
    breakdown(&hops(), &windows, &marks(&traced, &["demo"]));
}
