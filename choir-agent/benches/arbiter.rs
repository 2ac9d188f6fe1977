//! Arbiter benchmarks (`make bench`): decision latency, lock acquire/release
//! (uncontended and contended), durable commit latency against a bare
//! fdatasync of the same size, and group-commit throughput with 1, 4 and 16
//! concurrent lanes. Prints a table; DESIGN.md records the numbers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_agent::arbiter::arg_check::ArgumentPolicy;
use choir_agent::arbiter::lane_ctx::LaneCtx;
use choir_agent::arbiter::locks::{LockManager, Resource};
use choir_agent::arbiter::{Arbiter, Decision, Parts, ProposedCall};
use choir_agent::commitlog::{CommitLog, DurableLog, NewEvent};
use choir_agent::origin::{Entry, Origin};
use choir_agent::secrets::SecretStore;
use choir_agent::tools::Registry;
use choir_agent::workspace::Workspace;
use choir_common::arg_policy::{KnownTools, PolicyFile, PolicySet};
use choir_common::commit::{EventKind, Outcome};
use choir_common::lane::Lane;
use choir_common::manifest::LockMode;
use choir_common::trust::OutputTrust;
use serde_json::json;

fn percentiles(mut ns: Vec<u64>) -> (u64, u64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q) as usize];
    (at(0.50), at(0.99))
}

fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

fn event(i: u64) -> NewEvent {
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

fn main() {
    let dir = tempfile::tempdir().unwrap();
    println!(
        "choir-agent arbiter benchmarks ({} cores)\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );

    // --- Decision: schema + allowlist + path rules + lockset -------------------
    let ws_dir = dir.path().join("ws");
    std::fs::create_dir_all(&ws_dir).unwrap();
    let (log, _) = CommitLog::open(&dir.path().join("state")).unwrap();
    let durable = Arc::new(DurableLog::new(log).unwrap());
    let (tx, _rx) = crossbeam_channel::bounded(1);
    let arbiter = Arbiter::new(Parts {
        registry: Registry::builtins().unwrap(),
        workspace: Workspace::open(&ws_dir).unwrap(),
        state_dir: dir.path().join("state"),
        log: durable.clone(),
        committed: tx,
        secrets: SecretStore::default(),
        proposals: None,
        policies: Vec::new(),
        board: None,
        operator_words: String::new(),
    });
    let mut lane = LaneCtx::new("edge", Lane::Edge);
    lane.allowlist = Some(vec!["choir.fs.read".into(), "choir.fs.write".into()]);
    let call = ProposedCall {
        id: "c".into(),
        name: "choir__fs__write".into(),
        arguments: r#"{"path": "./notes//today.md", "content": "hello", "mode": "append"}"#.into(),
    };
    let mut samples = Vec::with_capacity(100_000);
    for _ in 0..100_000 {
        let t = Instant::now();
        let d = arbiter.decide(&lane, &call, &[]);
        samples.push(t.elapsed().as_nanos() as u64);
        assert!(matches!(d, Decision::Allowed { .. }));
    }
    let (p50, p99) = percentiles(samples);
    println!(
        "arbiter decision (parse + schema + allowlist + path + lockset): p50 {}  p99 {}",
        fmt_ns(p50),
        fmt_ns(p99)
    );

    // --- Decision under an argument policy, over a long history -------------
    // A rule on the call's path, traced through 50 entries of ~2 KB (a user
    // message, then mail-like untrusted tool results).
    let (log2, _) = CommitLog::open(&dir.path().join("state2")).unwrap();
    let (tx2, _rx2) = crossbeam_channel::bounded(1);
    let known: KnownTools = [("choir.fs.write".to_owned(), None)].into();
    let rule = r#"{"rules": [{"id": "path", "tool": "choir.fs.write", "argument": "/path",
        "if": {"not_from": ["user", "operator", "trusted"]}, "then": "confirm",
        "examples": {"match": [{"value": "x"}], "not_match": [{"value": "x", "from": ["user"]}]}}]}"#;
    let policy = Arc::new(ArgumentPolicy::default());
    policy.set(&PolicySet::merge([PolicyFile::parse("bench", rule, &known).unwrap()]));
    let guarded = Arbiter::new(Parts {
        registry: Registry::builtins().unwrap(),
        workspace: Workspace::open(&ws_dir).unwrap(),
        state_dir: dir.path().join("state2"),
        log: Arc::new(DurableLog::new(log2).unwrap()),
        committed: tx2,
        secrets: SecretStore::default(),
        proposals: None,
        policies: vec![policy],
        board: None,
        operator_words: String::new(),
    });
    let filler = "Dear team, the quarterly numbers are attached; reply to finance@corp.test by Friday. ".repeat(24);
    let mut history = vec![Entry::user("please write the summary to notes/today.md")];
    for i in 0..49 {
        history.push(Entry::tool_result(
            &format!("c{i}"),
            format!("From: sender{i}@corp.test\n{filler}"),
            Origin::Tool { tool: "choir.email.receive".into(), trust: OutputTrust::Untrusted },
        ));
    }
    let traced = ProposedCall {
        id: "c".into(),
        name: "choir__fs__write".into(),
        arguments: r#"{"path": "notes/today.md", "content": "hello", "mode": "append"}"#.into(),
    };
    let mut samples = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        let d = guarded.decide(&lane, &traced, &history);
        samples.push(t.elapsed().as_nanos() as u64);
        assert!(matches!(d, Decision::Allowed { .. }), "{d:?}");
    }
    let (p50, p99) = percentiles(samples);
    let bytes: usize = history.iter().filter_map(|e| e.message.content.as_ref()).map(String::len).sum();
    println!(
        "arbiter decision with an argument rule, value traced through {} entries ({} KB): p50 {}  p99 {}",
        history.len(),
        bytes / 1024,
        fmt_ns(p50),
        fmt_ns(p99)
    );

    // --- The shipped default over roles and intent, over the same history ---
    // An operator tool with roles (a destination and a payload), planned
    // before anything untrusted was read: every value traced, the intent
    // worked out, every default rule (roles and the call rule) evaluated.
    let choir_dir = dir.path().join("choir3");
    let tools = choir_dir.join("tools/agent");
    std::fs::create_dir_all(&tools).unwrap();
    let manifest = json!({
        "llm": {"name": "x.mail.send", "description": "Send a mail.",
                "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}}},
        "runtime": {"exec_path": "send", "timeout_ms": 1000, "side_effect": "external", "version": "1",
                    "roles": {"/to": "destination", "/body": "payload"}}
    });
    std::fs::write(tools.join("send.json"), manifest.to_string()).unwrap();
    std::fs::write(tools.join("send"), "#!/bin/sh\necho '{}'\n").unwrap();
    std::fs::set_permissions(tools.join("send"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let registry = Registry::load(&choir_dir, &[], Arc::new(choir_agent::tools::host::NoHost), &[], &[], None).unwrap();
    let defaults = Arc::new(ArgumentPolicy::default());
    let mut known: KnownTools = choir_common::manifest::BUILTIN_TOOLS.iter().map(|t| (t.to_string(), None)).collect();
    known.insert("x.mail.send".into(), None);
    for t in ["choir.email.send", "choir.http.post", "choir.web.browse"] {
        known.insert(t.into(), None);
    }
    defaults.set(&PolicySet::merge([PolicyFile::parse(
        choir_common::arg_policy::BUILT_IN,
        choir_common::arg_policy::DEFAULT_POLICY,
        &known,
    )
    .unwrap()]));
    let (log3, _) = CommitLog::open(&dir.path().join("state3")).unwrap();
    let (tx3, _rx3) = crossbeam_channel::bounded(1);
    let shipped = Arbiter::new(Parts {
        registry,
        workspace: Workspace::open(&ws_dir).unwrap(),
        state_dir: dir.path().join("state3"),
        log: Arc::new(DurableLog::new(log3).unwrap()),
        committed: tx3,
        secrets: SecretStore::default(),
        proposals: None,
        policies: vec![defaults],
        board: None,
        operator_words: String::new(),
    });
    let mut planned = vec![Entry::user("mail the summary to boss@corp.test")];
    let mut plan = choir_common::openai::ChatMessage::text(choir_common::openai::Role::Assistant, "");
    plan.tool_calls = vec![choir_common::openai::ToolCall {
        id: "p".into(),
        kind: "function".into(),
        function: choir_common::openai::FunctionCall {
            name: "choir__plan".into(),
            arguments: r#"{"tools": ["x.mail.send", "choir.fs.read"]}"#.into(),
        },
        extra_content: None,
    }];
    planned.push(Entry::model(plan));
    planned.push(Entry::tool_result(
        "p",
        r#"{"status": "success", "summary": "planned: x.mail.send, choir.fs.read"}"#,
        Origin::Tool { tool: "choir.plan".into(), trust: OutputTrust::Trusted },
    ));
    // The same texts as mail (no manifest here: nothing private), and as
    // workspace files (private wholly: every value is also looked for in
    // each of them as private data).
    let mut from_mail = planned.clone();
    from_mail.extend(history[1..48].iter().cloned());
    planned.extend(history[1..48].iter().cloned().map(|mut e| {
        e.origin = Origin::Tool { tool: "choir.fs.read".into(), trust: OutputTrust::Untrusted };
        e
    }));
    let send = ProposedCall {
        id: "c".into(),
        name: "x__mail__send".into(),
        arguments: r#"{"to": "boss@corp.test", "body": "The summary: numbers are attached, reply by Friday."}"#.into(),
    };
    let any_tool = LaneCtx::new("edge", Lane::Edge);
    // Timed in turns with the single-rule decision above, so the ratios
    // hold whatever else the shared machine is doing.
    let (mut samples, mut mail, mut single) =
        (Vec::with_capacity(2_000), Vec::with_capacity(2_000), Vec::with_capacity(2_000));
    for _ in 0..2_000 {
        let t = Instant::now();
        let d = shipped.decide(&any_tool, &send, &planned);
        samples.push(t.elapsed().as_nanos() as u64);
        assert!(matches!(d, Decision::Allowed { .. }), "{d:?}");
        let t = Instant::now();
        let d = shipped.decide(&any_tool, &send, &from_mail);
        mail.push(t.elapsed().as_nanos() as u64);
        assert!(matches!(d, Decision::Allowed { .. }), "{d:?}");
        let t = Instant::now();
        let d = guarded.decide(&lane, &traced, &history);
        single.push(t.elapsed().as_nanos() as u64);
        assert!(matches!(d, Decision::Allowed { .. }), "{d:?}");
    }
    let (p50, p99) = percentiles(samples);
    let (mail_p50, _) = percentiles(mail);
    let (single_p50, _) = percentiles(single);
    let bytes: usize = planned.iter().filter_map(|e| e.message.content.as_ref()).map(String::len).sum();
    println!(
        "arbiter decision under the shipped default (roles, intent, private labels), {} entries ({} KB): p50 {}  p99 {}; \
         {:.1}x the single-rule decision timed in turns with it (p50 {}); the same history read from mail (nothing \
         private): p50 {}, {:.1}x",
        planned.len(),
        bytes / 1024,
        fmt_ns(p50),
        fmt_ns(p99),
        p50 as f64 / single_p50 as f64,
        fmt_ns(single_p50),
        fmt_ns(mail_p50),
        mail_p50 as f64 / single_p50 as f64
    );

    // --- Locks -------------------------------------------------------------
    let locks: LockManager = LockManager::default();
    let set = || vec![(Resource::new("file:notes/today.md"), LockMode::X), (Resource::new("choirtmp"), LockMode::S)];
    let mut samples = Vec::with_capacity(100_000);
    for _ in 0..100_000 {
        let t = Instant::now();
        drop(locks.acquire("bench", set(), Duration::from_secs(1)).unwrap());
        samples.push(t.elapsed().as_nanos() as u64);
    }
    let (p50, p99) = percentiles(samples);
    println!("lock acquire+release, uncontended: p50 {}  p99 {}", fmt_ns(p50), fmt_ns(p99));

    let locks: Arc<LockManager> = Arc::new(LockManager::default());
    let waits: Vec<u64> = (0..4)
        .map(|i| {
            let locks = locks.clone();
            std::thread::spawn(move || {
                let mut w = Vec::with_capacity(20_000);
                for _ in 0..20_000 {
                    let mode = LockMode::X;
                    let t = Instant::now();
                    let g = locks
                        .acquire(&format!("t{i}"), vec![(Resource::new("file:shared"), mode)], Duration::from_secs(10))
                        .unwrap();
                    w.push(t.elapsed().as_nanos() as u64);
                    // Hold it briefly, as a real (fast) tool would.
                    let held = Instant::now();
                    while held.elapsed() < Duration::from_micros(2) {
                        std::hint::spin_loop();
                    }
                    drop(g);
                }
                w
            })
        })
        .flat_map(|h| h.join().unwrap())
        .collect();
    let (p50, p99) = percentiles(waits);
    println!(
        "lock acquire+release, contended (4 threads, X on one file, 2 µs held): p50 {}  p99 {}",
        fmt_ns(p50),
        fmt_ns(p99)
    );

    // --- Durable commit vs bare fdatasync ----------------------------------
    let size = serde_json::to_vec(&durable.append(event(0)).unwrap()).unwrap().len() + 1;
    let mut commit = Vec::new();
    for i in 0..2_000 {
        let t = Instant::now();
        durable.append(event(i)).unwrap();
        commit.push(t.elapsed().as_nanos() as u64);
    }
    let mut bare_file = std::fs::OpenOptions::new().create(true).append(true).open(dir.path().join("bare")).unwrap();
    let line = vec![b'x'; size];
    let mut bare = Vec::new();
    for _ in 0..2_000 {
        let t = Instant::now();
        bare_file.write_all(&line).unwrap();
        bare_file.sync_data().unwrap();
        bare.push(t.elapsed().as_nanos() as u64);
    }
    let (c50, c99) = percentiles(commit);
    let (b50, b99) = percentiles(bare);
    println!(
        "durable commit ({size} B event): p50 {}  p99 {}; bare write+fdatasync of {size} B: p50 {}  p99 {}; ratio of medians {:.2}",
        fmt_ns(c50),
        fmt_ns(c99),
        fmt_ns(b50),
        fmt_ns(b99),
        c50 as f64 / b50 as f64
    );

    // --- Group commit throughput -------------------------------------------
    for lanes in [1usize, 4, 16] {
        let sub = dir.path().join(format!("group{lanes}"));
        let (log, _) = CommitLog::open(&sub).unwrap();
        let durable = Arc::new(DurableLog::new(log).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles: Vec<_> = (0..lanes)
            .map(|_| {
                let (durable, stop, count) = (durable.clone(), stop.clone(), count.clone());
                std::thread::spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        durable.append(event(i)).unwrap();
                        count.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let secs = started.elapsed().as_secs_f64();
        let n = count.load(Ordering::Relaxed);
        println!(
            "group commit, {lanes:>2} lane(s): {:>7.0} commits/s, {:.1} commits per fsync",
            n as f64 / secs,
            n as f64 / durable.fsyncs().max(1) as f64
        );
    }
}
