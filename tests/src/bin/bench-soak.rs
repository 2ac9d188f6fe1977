//! `bench-soak` (`make bench`): resident memory and threads
//! of choird and of each agent over time, under ordinary use — two agents,
//! turns through the admin API and through Telegram (fake Bot API), every
//! tenth turn storing a memory item (fake embeddings), fifty conversations
//! per agent. Prints one row per sample. Short mode (default): 2,000 turns,
//! sampled at 100, 200, 500, 1,000 and 2,000. Long mode: `bench-soak
//! --minutes N`, a sample every minute for N minutes (the one-hour
//! soak is `--minutes 60`). Release build, process runtime, fake model
//! answering at once. Reports; never asserts a number.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::FakeTelegram;
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const TOKEN: &str = "123456:soak-token";
const USERS: i64 = 50;

/// A process's resident memory and threads, from /proc.
struct Footprint {
    /// VmRSS, MB.
    rss: f64,
    /// RssAnon (heap, stacks: what the process itself holds), MB.
    anon: f64,
    /// RssFile + RssShmem (pages of the binary and libraries mapped in), MB.
    file: f64,
    threads: u64,
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:>5.1} MB (anon {:>4.1}, file {:>4.1}) {:>3} threads", self.rss, self.anon, self.file, self.threads)
    }
}

fn footprint(pid: u32) -> Footprint {
    let field = |name: &str| choir_tests::bench::proc_status(pid, name);
    let mb = |name: &str| field(name) as f64 / 1024.0;
    Footprint {
        rss: mb("VmRSS:"),
        anon: mb("RssAnon:"),
        file: mb("RssFile:") + mb("RssShmem:"),
        threads: field("Threads:"),
    }
}

fn agent_pid(choird: &Choird, agent: &str) -> u32 {
    let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", agent])).unwrap();
    s["pid"].as_u64().unwrap() as u32
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let minutes: Option<u64> =
        args.iter().position(|a| a == "--minutes").and_then(|i| args.get(i + 1)).and_then(|m| m.parse().ok());
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let emb = FakeEmbeddings::start(8);
    let llm = FakeLlm::with_responder(|req, _| {
        let msgs = req["messages"].as_array()?;
        let last = msgs.last()?;
        if last["role"] == "tool" {
            return Some(Step::Text("stored".into()));
        }
        let text = msgs.iter().rev().find(|m| m["role"] == "user")?["content"].as_str().unwrap_or("").to_owned();
        if text.ends_with('0') {
            return Some(Step::call(
                "choir.memory.upsert",
                json!({"tier": "working", "content": format!("note about {text}")}),
            ));
        }
        Some(Step::Text(format!("re: {text}")))
    });
    llm.forget_bodies();
    let tg = FakeTelegram::start();
    // Counted, not kept: an hour's calls would slow the bench itself.
    tg.forget_calls();
    tg.add_bot(TOKEN, 123456, "soak_bot");
    let users: serde_json::Map<String, Value> =
        (0..USERS).map(|i| ((20_000 + i).to_string(), json!({"agent": "b"}))).collect();
    let mut config = test_config(&llm.base_url(), Some(&pg.url()), &["a", "b"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "per_bot_per_s": 10000, "per_chat_interval_ms": 1,
                                "bots": {"soak": {"token_secret": "tg", "users": users}}});
    config["memory"] = json!({"embeddings": {"base_url": emb.base_url(), "model": "fake-embed", "dimensions": emb.dims(),
                                             "timeout_s": 5}, "batch_ms": 20, "upsert_wait_ms": 500});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "tg": TOKEN}));
    choird.ctl_ok(&["agent", "start", "a"]);
    choird.ctl_ok(&["agent", "start", "b"]);
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let (pid_a, pid_b) = (agent_pid(&choird, "a"), agent_pid(&choird, "b"));
    let sample = |turns: u64, started: Instant| {
        choir_tests::report!(
            "{:>7} turns {:>6.0} s   choird {}   agent a {}   agent b {}",
            turns,
            started.elapsed().as_secs_f64(),
            footprint(choird.pid()),
            footprint(pid_a),
            footprint(pid_b)
        );
    };
    let mut sent_tg = 0u64;
    // One turn on each agent: a through the admin API, b through Telegram.
    let mut turn = |i: u64| {
        let text = format!("turn {i}");
        let mut resp = admin
            .post("http://localhost/admin/v1/agents/a/chat")
            .send_json(json!({"text": text, "conversation": format!("c{}", i % USERS as u64), "timeout_s": 60}))
            .unwrap();
        let body: Value = resp.body_mut().read_json().unwrap();
        assert!(body["reply"].is_string(), "{body}");
        tg.user_says(TOKEN, 20_000 + (i as i64 % USERS), &text);
        sent_tg += 1;
        tg.wait_count("sendMessage", sent_tg, Duration::from_secs(60));
    };
    let started = Instant::now();
    sample(0, started);
    match minutes {
        None => {
            let marks = [100u64, 200, 500, 1000, 2000];
            let mut done = 0;
            for mark in marks {
                while done < mark {
                    turn(done);
                    done += 1;
                }
                sample(done * 2, started);
            }
        }
        Some(m) => {
            let mut done = 0u64;
            for minute in 1..=m {
                let until = started + Duration::from_secs(60 * minute);
                while Instant::now() < until {
                    turn(done);
                    done += 1;
                }
                sample(done * 2, started);
            }
        }
    }
    choird.ctl_ok(&["agent", "stop", "a"]);
    choird.ctl_ok(&["agent", "stop", "b"]);
}
