//! `bench-replication` (`make bench`): what replicate-before-result costs per
//! tool call. The agent's commit log with `Durability::Replicated` (an
//! append returns once choird has stored the event in PostgreSQL, reached
//! through a real choird over the agent's Unix socket, HEARTBEAT batches
//! shared by concurrent lanes) against `Durability::Local` (an append returns
//! once the local file is fsynced, the path before), in one run, with 1 and
//! 16 lanes appending the same events. Prints p50/p99 per append and their
//! ratio; DESIGN.md records the numbers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_agent::commitlog::{CommitLog, Durability, DurableLog, NewEvent};
use choir_common::commit::{EventKind, Outcome};
use choir_tests::harness::{bin, test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

fn event(i: usize) -> NewEvent {
    NewEvent {
        lane: "edge".into(),
        kind: EventKind::ToolCall,
        tool: "choir.fs.write".into(),
        call_id: Some(format!("call_{i}")),
        turn: Some(1),
        skill: None,
        state: None,
        input: json!({"path": "notes/today.md", "content": "a line of text that a model might write"}),
        outcome: Outcome::Ok,
        result: json!({"status": "success", "summary": "wrote notes/today.md (42 bytes)", "path": "notes/today.md", "bytes": 42}),
        duration_us: 150,
        external: false,
    }
}

fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * q) as usize]
}

/// `lanes` threads append `per_lane` events each; every append's latency.
fn run(log: &Arc<DurableLog>, lanes: usize, per_lane: usize) -> (Vec<Duration>, Duration) {
    let started = Instant::now();
    let handles: Vec<_> = (0..lanes)
        .map(|l| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..per_lane)
                    .map(|i| {
                        let t = Instant::now();
                        log.append(event(l * per_lane + i)).unwrap();
                        t.elapsed()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    (all, started.elapsed())
}

/// What the agent's `link-push` thread does for replication: on a poke,
/// ships the unacknowledged events in batches and records the acks.
fn replicator(
    log: Arc<DurableLog>,
    socket: std::path::PathBuf,
    token: String,
    poke: crossbeam_channel::Receiver<()>,
    stop: Arc<AtomicBool>,
) {
    let client = choir_common::unix_http::agent_for_socket(&socket, Some(Duration::from_secs(30)));
    while !stop.load(Ordering::SeqCst) {
        let _ = poke.recv_timeout(Duration::from_millis(50));
        loop {
            let events = log.unacked_batch(512, 2 * 1024 * 1024);
            if events.is_empty() {
                break;
            }
            let body = json!({"events": events, "replies": [], "processed_upto": 0, "config_version": 0,
                              "wait_ms": 0, "receive": false});
            let mut resp = client
                .post("http://localhost/rpc/v1/HEARTBEAT")
                .header("Authorization", &format!("Bearer {token}"))
                .send(body.to_string().as_bytes())
                .unwrap();
            let v: Value = resp.body_mut().read_json().unwrap();
            match v["acked_seq"].as_u64() {
                Some(seq) => log.ack(seq),
                None => {
                    // As the agent does: note the failure and try again shortly.
                    eprintln!("HEARTBEAT refused: {v}");
                    log.replication_failed(&v.to_string(), v["error"]["retryable"] == true);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed");
    let mut config = test_config("http://127.0.0.1:9", Some(&pg.url()), &["evil"]);
    config["agent_binary"] = json!(bin("hostile-agent"));
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "evil"]);
    let token_file = choird.workspace("evil").join("hostile.token");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !token_file.exists() {
        assert!(Instant::now() < deadline, "the lease holder did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let token = std::fs::read_to_string(&token_file).unwrap();
    let socket = choird.home.path().join("socks/agents/evil/choird.sock");

    let dir = tempfile::tempdir().unwrap();
    let (local_log, _) = CommitLog::open(&dir.path().join("local")).unwrap();
    let local = Arc::new(DurableLog::with_durability(local_log, Durability::Local).unwrap());
    let (repl_log, _) = CommitLog::open(&dir.path().join("replicated")).unwrap();
    let replicated = Arc::new(DurableLog::with_durability(repl_log, Durability::Replicated).unwrap());
    let (poke_tx, poke_rx) = crossbeam_channel::bounded(1);
    replicated.set_poke(poke_tx);
    let stop = Arc::new(AtomicBool::new(false));
    let pusher = {
        let (log, stop) = (replicated.clone(), stop.clone());
        std::thread::spawn(move || replicator(log, socket, token, poke_rx, stop))
    };

    choir_tests::report!(
        "replicate-before-result vs local fsync, per tool call ({} cores, a {}-byte event)\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        serde_json::to_vec(&event(0).input).unwrap().len() + serde_json::to_vec(&event(0).result).unwrap().len()
    );
    choir_tests::report!("{:<6} {:<12} {:>10} {:>10} {:>12}", "lanes", "durability", "p50", "p99", "appends/s");
    for (lanes, per_lane) in [(1usize, 2000usize), (16, 250)] {
        // Warm up both paths.
        run(&local, lanes, 20);
        run(&replicated, lanes, 20);
        let (mut l, lt) = run(&local, lanes, per_lane);
        let (mut r, rt) = run(&replicated, lanes, per_lane);
        let n = (lanes * per_lane) as f64;
        let (l50, l99, r50, r99) = (pct(&mut l, 0.5), pct(&mut l, 0.99), pct(&mut r, 0.5), pct(&mut r, 0.99));
        choir_tests::report!(
            "{lanes:<6} {:<12} {:>10.3?} {:>10.3?} {:>12.0}",
            "local fsync",
            l50,
            l99,
            n / lt.as_secs_f64()
        );
        choir_tests::report!(
            "{lanes:<6} {:<12} {:>10.3?} {:>10.3?} {:>12.0}",
            "replicated",
            r50,
            r99,
            n / rt.as_secs_f64()
        );
        choir_tests::report!(
            "{lanes:<6} ratio        p50 {:.2}×, p99 {:.2}×\n",
            r50.as_secs_f64() / l50.as_secs_f64(),
            r99.as_secs_f64() / l99.as_secs_f64()
        );
    }
    stop.store(true, Ordering::SeqCst);
    pusher.join().unwrap();
    let stored: i64 =
        pg.client().query_one("SELECT count(*) FROM commit_events WHERE agent_id = 'evil'", &[]).unwrap().get(0);
    assert_eq!(stored as u64, replicated.head().seq, "choird stored every replicated event");
}
