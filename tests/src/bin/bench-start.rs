//! `bench-start` (`make bench`): from starting choird to the first answer
//! of an agent that starts with it (`autostart`), on an empty home (the
//! managed PostgreSQL cluster initialised, migrations run) and on an
//! existing one (a restart: the cluster started again, the agent recovered).
//! The clock starts when choird is spawned and stops when the first chat
//! message sent to it has its reply — the client retries every 2 ms until
//! the admin socket answers and the agent is there. Median, min and max of
//! five each. Goal: a restart answers within 100 ms.
//!
//! Restarts are timed twice: with choird keeping the cluster itself (it
//! stops it at exit and starts it again), and with the cluster kept by
//! `choird cluster` (the `choir-db` unit), which a restart of choird leaves
//! running.
//!
//! `CHOIR_BENCH_SHOW_LOG=1` prints each restart's moment and choird's
//! debug log after it: where a restart's time goes (each line is stamped).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird, ClusterKeeper, TempHome};
use choir_tests::report;
use serde_json::{json, Value};

/// Sends one chat message until it is answered; the time from `t0`.
fn first_answer(choird: &Choird, t0: Instant) -> Duration {
    let socket = choird.home.path().join("socks/choird.sock");
    let deadline = t0 + Duration::from_secs(120);
    loop {
        if socket.exists() {
            let admin = choir_common::unix_http::agent_for_socket(&socket, Some(Duration::from_secs(30)));
            let sent = admin
                .post("http://localhost/admin/v1/agents/a1/chat")
                .send_json(json!({"text": "are you there?", "conversation": "first", "timeout_s": 30}));
            if let Ok(mut resp) = sent {
                let body: Value = resp.body_mut().read_json().unwrap_or_default();
                if body["reply"] == "ok" {
                    return t0.elapsed();
                }
            }
        }
        assert!(Instant::now() < deadline, "no answer after 120 s:\n{}", choird.stderr());
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn summary(what: &str, mut v: Vec<Duration>, goal: &str) {
    v.sort();
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    report!(
        "{what}: median {:.0} ms (min {:.0}, max {:.0}, n={}){goal}",
        ms(&v[v.len() / 2]),
        ms(&v[0]),
        ms(&v[v.len() - 1]),
        v.len()
    );
}

/// Stops choird and starts it again on the same home; the time from the
/// start to the first answer. With `show_log`, its debug log follows.
fn restart(choird: &mut Choird, show_log: bool, what: &str) -> Duration {
    choird.stop();
    if show_log {
        choird.set_log_filters("debug");
        eprintln!("{what} at {}", jiff::Timestamp::now());
    }
    let t0 = Instant::now();
    choird.spawn_again();
    let took = first_answer(choird, t0);
    if show_log {
        eprintln!("{}", choird.stderr());
    }
    took
}

fn main() {
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    let mut config = test_config(&llm.base_url(), None, &["a1"]);
    config["agents"]["a1"]["autostart"] = json!(true);
    let secrets = json!({"llm_key": "k"});
    let show_log = std::env::var_os("CHOIR_BENCH_SHOW_LOG").is_some();
    let (mut empty, mut again) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let home = TempHome::new(&config, &secrets);
        let t0 = Instant::now();
        let mut choird = Choird::spawn_with_env(home, &[]);
        empty.push(first_answer(&choird, t0));
        again.push(restart(&mut choird, show_log, "restarting"));
    }
    // The cluster in a unit of its own: started once, kept across restarts.
    let mut kept = Vec::new();
    let home = TempHome::new(&config, &secrets);
    let keeper = ClusterKeeper::start(home.path());
    let t0 = Instant::now();
    let mut choird = Choird::spawn_with_env(home, &[]);
    first_answer(&choird, t0);
    for _ in 0..5 {
        kept.push(restart(&mut choird, show_log, "restarting (the cluster kept)"));
    }
    choird.stop();
    drop(keeper);
    summary("first start on an empty home → first answer", empty, "");
    summary("restart on an existing home → first answer (choird keeps the cluster)", again, "");
    summary(
        "restart on an existing home → first answer (the cluster kept by `choird cluster`, the choir-db unit)",
        kept,
        " (goal ≤ 100 ms)",
    );
}
