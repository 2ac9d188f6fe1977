//! `bench-hostile` (`make bench`): choird's footprint while a hostile client
//! on an agent socket holds 1,100 idle connections, then floods it with
//! requests of 200 header lines and with bad tokens; choird's resident memory
//! and thread count (sampled), and how fast the operator's `status` answers
//! meanwhile. The footprint must stay flat; DESIGN.md records the numbers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_tests::bench::proc_status;
use choir_tests::harness::{bin, test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::json;

/// Samples choird's (max RSS kB, max threads) and `status` latencies while
/// `during` runs.
fn sample(choird: &Choird, during: impl FnOnce() + Send) -> (u64, u64, Vec<Duration>) {
    let pid = choird.pid();
    let done = AtomicBool::new(false);
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let (mut rss, mut threads, mut lat) = (0, 0, Vec::new());
            while !done.load(Ordering::SeqCst) {
                rss = rss.max(proc_status(pid, "VmRSS:"));
                threads = threads.max(proc_status(pid, "Threads:"));
                let t = Instant::now();
                let ok = admin.get("http://localhost/admin/v1/status").call().is_ok_and(|r| r.status() == 200);
                assert!(ok, "status failed under attack");
                lat.push(t.elapsed());
                std::thread::sleep(Duration::from_millis(50));
            }
            (rss, threads, lat)
        });
        during();
        done.store(true, Ordering::SeqCst);
        sampler.join().unwrap()
    })
}

fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * q) as usize]
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let mut config = test_config("http://127.0.0.1:9", Some(&pg.url()), &["evil"]);
    config["agent_binary"] = json!(bin("hostile-agent"));
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "evil"]);
    let socket = choird.home.path().join("socks/agents/evil/choird.sock");
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let max = limit.maximum.unwrap_or(4096);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit { current: Some(max), maximum: Some(max) },
    );
    std::thread::sleep(Duration::from_secs(1));
    let pid = choird.pid();
    let (rss0, threads0) = (proc_status(pid, "VmRSS:"), proc_status(pid, "Threads:"));
    choir_tests::report!("choird under a hostile agent-socket client ({} cores)\n", num_cores());
    choir_tests::report!("{:<44} {:>10} {:>8} {:>14} {:>14}", "phase", "RSS kB", "threads", "status p50", "status p99");
    choir_tests::report!("{:<44} {:>10} {:>8} {:>14} {:>14}", "idle", rss0, threads0, "-", "-");

    let (rss, threads, mut lat) = sample(&choird, || {
        let idle: Vec<UnixStream> = (0..1100).filter_map(|_| UnixStream::connect(&socket).ok()).collect();
        assert!(idle.len() >= 1000);
        std::thread::sleep(Duration::from_secs(5));
    });
    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    choir_tests::report!(
        "{:<44} {:>10} {:>8} {:>14.2?} {:>14.2?}",
        "1,100 idle connections held 5 s",
        rss,
        threads,
        p50,
        p99
    );

    let sent = Arc::new(AtomicU64::new(0));
    let (rss, threads, mut lat) = sample(&choird, || {
        let stop = Arc::new(AtomicBool::new(false));
        let mut head = b"GET /rpc/v1/HEARTBEAT HTTP/1.1\r\n".to_vec();
        for i in 0..200 {
            head.extend_from_slice(format!("X-Flood-{i}: {}\r\n", "y".repeat(40)).as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let floods: Vec<_> = (0..8)
            .map(|i| {
                let (stop, sent, socket, head) = (stop.clone(), sent.clone(), socket.clone(), head.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let Ok(mut s) = UnixStream::connect(&socket) else { continue };
                        let bad = format!(
                            "POST /rpc/v1/HEARTBEAT HTTP/1.1\r\nAuthorization: Bearer bad-{i}\r\nContent-Length: 99999999\r\n\r\n"
                        );
                        let payload = if sent.load(Ordering::Relaxed) % 2 == 0 { head.as_slice() } else { bad.as_bytes() };
                        let _ = s.write_all(payload);
                        let mut buf = [0u8; 256];
                        let _ = s.read(&mut buf);
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, Ordering::SeqCst);
        for f in floods {
            f.join().unwrap();
        }
    });
    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    choir_tests::report!(
        "{:<44} {:>10} {:>8} {:>14.2?} {:>14.2?}",
        format!("header + bad-token flood, {}/s, 5 s", sent.load(Ordering::Relaxed) / 5),
        rss,
        threads,
        p50,
        p99
    );
    std::thread::sleep(Duration::from_secs(2));
    choir_tests::report!(
        "{:<44} {:>10} {:>8} {:>14} {:>14}",
        "afterwards",
        proc_status(pid, "VmRSS:"),
        proc_status(pid, "Threads:"),
        "-",
        "-"
    );
    let unauth: i64 =
        pg.client().query_one("SELECT count(*) FROM audit WHERE outcome = 'unauthorized'", &[]).unwrap().get(0);
    choir_tests::report!("\naudit records of the bad-token flood: {unauth} (paced: 20 a minute per listener)");
}

fn num_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
