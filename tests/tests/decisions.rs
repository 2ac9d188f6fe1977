//! Decisions beyond allow and forbid: a call a human must confirm (the lane
//! waits in WAITING_APPROVAL; approved, the exact call runs once; rejected
//! or unanswered, it is refused with a structured error and nothing runs),
//! and a host tool that is not idempotent, which runs at most once even when
//! the agent dies between choird running it and the outcome's commit.

use std::time::{Duration, Instant};

use choir_common::commit::{CommitEvent, EventKind, Outcome};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::{the_confirmation, tool_results, wait_for};
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

/// The edge lane's state as `choirctl agent status` reports it.
fn edge_state(choird: &Choird) -> String {
    let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    s["lanes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["lane"] == "edge")
        .map_or(String::new(), |l| l["state"].as_str().unwrap_or_default().to_owned())
}

fn calls_of<'a>(events: &'a [CommitEvent], kind: EventKind, tool: &str) -> Vec<&'a CommitEvent> {
    events.iter().filter(|e| e.kind == kind && e.tool == tool).collect()
}

/// The model writes the file a message names, then says what came of it:
/// `written`, or the refusal's code and message.
fn writer() -> FakeLlm {
    FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "tool" {
            let result: Value = serde_json::from_str(last["content"].as_str()?).ok()?;
            return Some(Step::Text(match result["status"].as_str() {
                Some("success") => "written".to_owned(),
                _ => format!("{}: {}", result["error"]["code"].as_str()?, result["error"]["message"].as_str()?),
            }));
        }
        let name = last["content"].as_str()?.strip_prefix("write ")?.to_owned();
        Some(Step::call("choir.fs.write", json!({"path": format!("{name}.txt"), "content": name.to_uppercase()})))
    })
}

#[test]
fn a_call_a_policy_wants_confirmed_waits_for_a_human_runs_once_approved_and_is_refused_otherwise() {
    let Some(pg) = TestPg::start() else { return };
    let edge = writer();
    let choird = Choird::start(&test_config(&edge.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(ws.join(".choir")).unwrap();
    // The test build's policy: every choir.fs.write needs a human, who has 4 s.
    std::fs::write(ws.join(".choir/confirm.json"), json!({"tools": ["choir.fs.write"], "wait_ms": 4000}).to_string())
        .unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);

    std::thread::scope(|s| {
        // Approved: the lane waited in WAITING_APPROVAL, nothing ran before
        // the approval, then the exact call ran.
        let chat = s.spawn(|| choird.ctl_ok(&["chat", "demo", "write a"]));
        let id = the_confirmation(&choird);
        wait_for("the edge to show it waits", Duration::from_secs(10), || edge_state(&choird) == "WAITING_APPROVAL");
        let shown = choird.ctl_ok(&["approvals", "show", &id]);
        assert!(shown.contains("choir.fs.write") && shown.contains("a.txt"), "{shown}");
        assert!(!ws.join("a.txt").exists(), "nothing runs before a human confirms it");
        choird.ctl_ok(&["approvals", "approve", &id]);
        assert_eq!(chat.join().unwrap(), "written\n");
        assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "A");

        // Rejected: refused with the human's reason; nothing ran.
        let chat = s.spawn(|| choird.ctl_ok(&["chat", "demo", "write b"]));
        let id = the_confirmation(&choird);
        choird.ctl_ok(&["approvals", "reject", &id, "--reason", "not on a Sunday"]);
        let answer = chat.join().unwrap();
        assert!(answer.starts_with("not_confirmed: ") && answer.contains("not on a Sunday"), "{answer}");
        assert!(!ws.join("b.txt").exists());

        // Nobody answers: refused once its time is up; nothing ran, and
        // choird no longer lets anyone approve it.
        let started = Instant::now();
        let chat = s.spawn(|| choird.ctl_ok(&["chat", "demo", "write c"]));
        let id = the_confirmation(&choird);
        let answer = chat.join().unwrap();
        assert!(answer.starts_with("confirmation_timeout: "), "{answer}");
        assert!(started.elapsed() >= Duration::from_secs(4), "it waited its time");
        assert!(!ws.join("c.txt").exists());
        let late = choird.ctl_err(&["approvals", "approve", &id]);
        assert!(late.contains("already rejected"), "{late}");
    });
    wait_for("the edge to be idle again", Duration::from_secs(10), || edge_state(&choird) == "IDLE");

    // The log holds one write that ran and two that were refused.
    let events = replicated_events(&pg, "demo", 3);
    let writes = calls_of(&events, EventKind::ToolCall, "choir.fs.write");
    let outcomes: Vec<Outcome> = writes.iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ok, Outcome::Rejected, Outcome::Rejected]);
    assert_eq!(writes[1].result["error"]["code"], "not_confirmed");
    assert_eq!(writes[2].result["error"]["code"], "confirmation_timeout");
}

#[test]
fn a_host_tool_that_is_not_idempotent_is_not_run_again_when_the_agent_dies_before_its_outcome_is_committed() {
    let Some(Scenario { pg, llm: edge, choird }) = Scenario::new()
        .responder(|req, _| {
            Some(match tool_results(req).last() {
                // One turn in this test: a tool result is this turn's.
                Some((_, r)) => Step::Text(format!("{} after {} run(s)", r["echo"].as_str()?, r["runs"])),
                None => Step::call("choir.test.echo_once", json!({"text": "hello"})),
            })
        })
        .secrets(json!({"llm_key": "k"}))
        .build()
    else {
        return;
    };
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(ws.join(".choir")).unwrap();
    // The test tool is served once its counter exists.
    std::fs::write(choird.home.path().join("test-echo-once.count"), "0").unwrap();
    // Dies after choird ran the call, before its outcome is committed.
    std::fs::write(ws.join(".choir/failpoint"), "after_execute").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    let err = choird.ctl_err(&["chat", "demo", "echo hello"]);
    assert!(err.contains("SIGKILL"), "{err}");
    let runs = || std::fs::read_to_string(choird.home.path().join("test-echo-once.count")).unwrap();
    assert_eq!(runs(), "1", "choird ran it once");

    // On restart the call is completed from choird's stored outcome, not
    // run again, and the model is shown that outcome.
    choird.wait_running("demo"); // restarted by choird after the crash
    wait_for("the resumed turn's answer", Duration::from_secs(30), || edge.requests().len() == 2);
    let reqs = edge.requests();
    let shown = tool_results(&reqs[1].body);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!((shown[0].1["echo"].as_str(), shown[0].1["runs"].as_u64()), (Some("hello"), Some(1)), "{shown:?}");
    assert_eq!(runs(), "1", "not run again");

    let events = replicated_events(&pg, "demo", 2);
    let intents = calls_of(&events, EventKind::Intent, "choir.test.echo_once");
    let calls = calls_of(&events, EventKind::ToolCall, "choir.test.echo_once");
    assert_eq!((intents.len(), calls.len()), (1, 1), "{events:?}");
    assert!(intents[0].seq < calls[0].seq && intents[0].call_id == calls[0].call_id);
    assert_eq!(calls[0].result, shown[0].1, "the model sees what was committed");
    // An action on the outside world: flagged, and audited by choird with its record.
    assert!(calls[0].external);
    let audit: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "audit", "--agent", "demo"])).unwrap();
    let rows = audit["records"].as_array().cloned().unwrap_or_default();
    let external: Vec<&Value> = rows.iter().filter(|r| r["action"] == "tool.external").collect();
    assert_eq!(external.len(), 1, "{rows:?}");
    assert_eq!(external[0]["detail"]["seq"], calls[0].seq);
    assert_eq!(external[0]["detail"]["tool"], "choir.test.echo_once");
    // choird was asked twice and ran it once.
    let asked = rows.iter().filter(|r| r["action"] == "EXECUTE_HOST_TOOL").count();
    assert_eq!(asked, 2, "{rows:?}");
}
