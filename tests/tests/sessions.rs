//! `choirctl sessions` and `choirctl agent events --follow`: every session with how it ended, what it ran in, its commits and
//! tokens; new commits printed as they are replicated.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use choir_tests::fake_llm::Step;
use choir_tests::harness::bin;
use choir_tests::observe::wait_for;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

#[test]
fn sessions_show_how_each_ended_with_commits_and_tokens_and_events_follow_new_commits() {
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "a.txt", "content": "a"})),
            Step::Text("wrote a".into()),
            Step::call("choir.fs.write", json!({"path": "b.txt", "content": "b"})),
            Step::Text("wrote b".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write a"]).trim(), "wrote a");
    choird.ctl_ok(&["agent", "stop", "demo"]);
    choird.ctl_ok(&["agent", "start", "demo"]);

    let list: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "sessions", "demo"])).unwrap();
    let s = list["sessions"].as_array().unwrap();
    assert_eq!(s.len(), 2, "{list}");
    let (now, first) = (&s[0], &s[1]);
    assert!(now["ended_at"].is_null() && first["ended_at"].is_string(), "{list}");
    assert!(first["end_reason"].as_str().is_some_and(|r| !r.is_empty()), "{list}");
    assert!(first["commits"].as_u64() >= Some(1), "the write was committed in the first session: {list}");
    assert_eq!(first["tokens"], 30, "two model calls of 15 tokens: {list}");
    assert!(first["instance"].as_str().is_some_and(|i| i.starts_with("pid ")), "{list}");
    assert_eq!(now["commits"], 0);
    let table = choird.ctl_ok(&["sessions"]);
    assert!(table.contains("SESSION") && table.contains("running") && table.contains("demo"), "{table}");
    let err = choird.ctl_err(&["sessions", "Not An Id"]);
    assert!(err.contains("agent id"), "{err}");

    // --follow prints a commit made after it started.
    let mut follow = Command::new(bin("choirctl"))
        .arg("--home")
        .arg(choird.home.path())
        .args(["agent", "events", "demo", "--follow"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let reader = {
        let (out, lines) = (follow.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().push(line);
            }
        })
    };
    wait_for("the first session's write to be printed", Duration::from_secs(20), || {
        lines.lock().iter().any(|l| l.contains("a.txt"))
    });
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write b"]).trim(), "wrote b");
    wait_for("the new write to be printed", Duration::from_secs(20), || {
        lines.lock().iter().any(|l| l.contains("b.txt"))
    });
    let _ = follow.kill();
    let _ = follow.wait();
    let _ = reader.join();
    let printed = lines.lock().clone();
    assert_eq!(printed.iter().filter(|l| l.contains("a.txt")).count(), 1, "each event once: {printed:?}");
}
