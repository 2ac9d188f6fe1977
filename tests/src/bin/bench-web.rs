//! `bench-web` (`make bench`): the web tools' costs, measured at choird's
//! EXECUTE_HOST_TOOL (a client holding an agent's token calls it directly,
//! as the agent does): `browse open` of the local test site with a warm
//! browser and as the first call of a cold one; the browser's memory with 1
//! and 4 agent contexts; and the overhead choird adds to a search and to a
//! post, against calling the fake service directly. DESIGN.md records the
//! numbers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_tests::bench::{compare, ms, pct, timed, HostToolClient as Client};
use choir_tests::fake_web::{FakeBrave, Receiver, TestSite};
use choir_tests::harness::{bin, test_config, Choird};
use choir_tests::observe::chromium_processes;
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const KEY: &str = "bench-brave-key";

fn browsers(choird: &Choird) -> Vec<i32> {
    chromium_processes(choird.pid())
}

/// (sum of RSS, sum of PSS) of the browser's processes, in MiB.
fn browser_memory(choird: &Choird) -> (f64, f64) {
    let mut rss = 0u64;
    let mut pss = 0u64;
    for p in browsers(choird) {
        let text = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap_or_default();
        let field = |k: &str| {
            text.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        rss += field("Rss:").unwrap_or(0);
        pss += field("Pss:").unwrap_or(0);
    }
    (rss as f64 / 1024.0, pss as f64 / 1024.0)
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed (make deps)");
    let brave = FakeBrave::start(KEY);
    let site = TestSite::start();
    let recv = Receiver::start();
    let agents = ["evil1", "evil2", "evil3", "evil4"];
    let mut config = test_config("http://127.0.0.1:9", Some(&pg.url()), &agents);
    config["agent_binary"] = json!(bin("hostile-agent"));
    for a in agents {
        config["agents"][a]["web"] = json!({"allow_addresses": ["127.0.0.1/32"], "post_origins": [recv.origin()]});
    }
    config["web"] = json!({"brave": {"base_url": brave.base_url(), "api_key_secret": "brave_key"}});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "brave_key": KEY}));
    for a in agents {
        choird.ctl_ok(&["agent", "start", a]);
    }
    let clients: Vec<Client> = agents.iter().map(|a| Client::of(&choird, a)).collect();
    let base = site.base_url();
    let mut ids = 0u64;
    let mut next_id = || {
        ids += 1;
        format!("bench-{ids}")
    };
    let open = |c: &Client, id: String, path: &str| {
        let r = c.tool("choir.web.browse", json!({"action": "open", "url": format!("{base}{path}")}), &id);
        assert!(r["content"].as_str().is_some_and(|t| t.contains("<untrusted")), "{r}");
    };

    choir_tests::report!("choir.web.browse open, through choird (EXECUTE_HOST_TOOL), local test site, real Chromium\n");
    // The first call of a cold browser: kill it, then open.
    let mut cold = Vec::new();
    for _ in 0..5 {
        for p in browsers(&choird) {
            choir_common::proc_tree::signal(p, rustix::process::Signal::KILL);
        }
        wait_for("the browser to be gone", Duration::from_secs(10), || browsers(&choird).is_empty());
        let id = next_id();
        let t = Instant::now();
        // The first call after a death may report it; the next starts a new browser.
        let _ =
            clients[0].try_tool("choir.web.browse", json!({"action": "open", "url": format!("{base}/second")}), &id);
        if browsers(&choird).is_empty() {
            open(&clients[0], next_id(), "/second");
        }
        cold.push(t.elapsed());
    }
    cold.sort();
    choir_tests::report!(
        "  first call of a cold browser (start + context + load), n=5: min {}, median {}, max {}",
        ms(cold[0]),
        ms(cold[2]),
        ms(cold[4])
    );
    let (rss1, pss1) = browser_memory(&choird);

    let mut warm = timed(200, |_| open(&clients[0], next_id(), "/second"));
    choir_tests::report!(
        "  warm, static page (/second), n=200: p50 {}, p99 {}",
        ms(pct(&mut warm, 0.5)),
        ms(pct(&mut warm, 0.99))
    );
    let mut warm_js = timed(100, |_| open(&clients[0], next_id(), "/js"));
    choir_tests::report!(
        "  warm, script-rendered page (/js, waits for its fetch), n=100: p50 {}, p99 {}",
        ms(pct(&mut warm_js, 0.5)),
        ms(pct(&mut warm_js, 0.99))
    );
    let mut first_ctx = Vec::new();
    for c in &clients[1..] {
        let t = Instant::now();
        open(c, next_id(), "/second");
        first_ctx.push(t.elapsed());
    }
    choir_tests::report!(
        "  first call of a new agent context on a warm browser, n=3: {}",
        first_ctx.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ")
    );
    for c in &clients {
        open(c, next_id(), "/");
    }
    let (rss4, pss4) = browser_memory(&choird);
    choir_tests::report!("\nbrowser memory (all its processes): 1 context RSS {rss1:.0} MiB / PSS {pss1:.0} MiB; 4 contexts RSS {rss4:.0} MiB / PSS {pss4:.0} MiB");

    // Search: choird's overhead over calling the (fake) API directly.
    let direct_http = ureq::Agent::new_with_config(ureq::config::Config::builder().http_status_as_error(false).build());
    let url = format!("{}/res/v1/web/search", brave.base_url());
    let direct = timed(500, |i| {
        let mut r = direct_http
            .get(&url)
            .query("q", format!("q{i}"))
            .query("count", "3")
            .header("X-Subscription-Token", KEY)
            .call()
            .unwrap();
        let _: Value = r.body_mut().read_json().unwrap();
    });
    let via = timed(500, |i| {
        let r = clients[0].tool("choir.web.search", json!({"query": format!("q{i}"), "count": 3}), &format!("s{i}"));
        assert_eq!(r["count"], 3);
    });
    compare("\nweb.search, 3 results", direct, via);

    // Post: the same (a post is claimed at most once in PostgreSQL, and audited).
    let post_url = format!("{}/hook", recv.origin());
    let direct = timed(500, |i| {
        direct_http
            .post(&post_url)
            .header("Content-Type", "application/json")
            .send(json!({"n": i}).to_string())
            .unwrap();
    });
    let via = timed(500, |i| {
        let r = clients[0].tool("choir.http.post", json!({"url": post_url, "json": {"n": i}}), &next_id());
        assert_eq!(r["status_code"], 200);
    });
    compare("http.post", direct, via);
}
