//! `bench-console` (`make bench`): what the console costs choird. Its idle
//! RSS with one agent running and the console never opened (the console
//! holds nothing until `choirctl console`), then with the console open, one
//! session logged in and one page streaming its live feed while the agent
//! answers turns, then after the page closed. The goal: closed unchanged,
//! one streaming page at most +2 MB.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use choir_tests::bench::{proc_status, report};
use choir_tests::console::{login, open, HOST};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::json;

/// choird's RSS (kB): the median of 9 samples a second apart.
fn rss(pid: u32) -> u64 {
    let mut v: Vec<u64> = (0..9)
        .map(|_| {
            std::thread::sleep(Duration::from_secs(1));
            proc_status(pid, "VmRSS:")
        })
        .collect();
    v.sort_unstable();
    v[4]
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL");
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    let config = test_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.wait_running("demo");
    for i in 0..20 {
        choird.ctl_ok(&["chat", "demo", &format!("warm up {i}")]);
    }
    let pid = choird.pid();
    let closed = rss(pid);

    let (socket, code) = open(&choird);
    let cookie = login(&socket, &code);
    let mut page = UnixStream::connect(&socket).unwrap();
    write!(page, "GET /events HTTP/1.1\r\nHost: {HOST}\r\nCookie: {cookie}\r\n\r\n").unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut got = 0usize;
        while let Ok(n) = page.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    });
    for i in 0..40 {
        choird.ctl_ok(&["chat", "demo", &format!("turn {i} while the page watches")]);
    }
    let streaming = rss(pid);
    choird.ctl_ok(&["console", "--revoke"]);
    drop(reader);
    let after = rss(pid);

    report(&format!("choird idle, console never opened          {}", mb(closed)));
    report(&format!(
        "choird, console open, one page streaming   {} (+{:.2} MB; goal: at most +2 MB)",
        mb(streaming),
        streaming.saturating_sub(closed) as f64 / 1024.0
    ));
    report(&format!("choird after the sessions were revoked      {}", mb(after)));
}
