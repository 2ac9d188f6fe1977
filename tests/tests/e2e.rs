//! The walking skeleton: one message from choirctl through choird, the agent's
//! edge lane, the LLM relay, the arbiter and a tool, back to choirctl, with the
//! commit event replicated into Postgres.

use std::time::{Duration, Instant};

use choir_common::commit::{verify_extension, ChainHead, CommitEvent, Outcome};
use choir_tests::fake_llm::Step;
use choir_tests::harness::assert_snapshot;
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

/// Events replicated to Postgres for `agent`, once at least `n` are there.
pub fn replicated_events(pg: &TestPg, agent: &str, n: usize) -> Vec<CommitEvent> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut client = pg.client();
    loop {
        let rows = client.query("SELECT event FROM commit_events WHERE agent_id = $1 ORDER BY seq", &[&agent]).unwrap();
        let events: Vec<CommitEvent> =
            rows.iter().map(|r| serde_json::from_value(r.get::<_, Value>(0)).unwrap()).collect();
        if events.len() >= n || Instant::now() > deadline {
            return events;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_message_goes_through_every_component_and_back() {
    let Some(Scenario { pg, llm: fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "notes/hello.txt", "content": "hello from choir\n"})),
            Step::Text("Done: I wrote notes/hello.txt.".into()),
        ])
        .running()
        .build()
    else {
        return;
    };
    let answer = choird.ctl_ok(&["chat", "demo", "Please", "write", "a", "hello", "note."]);
    assert_eq!(answer, "Done: I wrote notes/hello.txt.\n");

    // The model saw exactly the LLM view: no runtime field, wire-safe names.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    // The whole first request, byte for byte (snapshot): the identity prompt with
    // the tool summary, the user's message, the LLM views of the built-ins and
    // nothing of their runtime views, streamed.
    assert_snapshot("edge_first_request", &reqs[0].body);
    assert_eq!(reqs[0].body["messages"][1], json!({"role": "user", "content": "Please write a hello note."}));
    assert_eq!((reqs[0].body["stream"].as_bool(), reqs[0].body["model"].as_str()), (Some(true), Some("fake-edge")));
    for tool in reqs[0].body["tools"].as_array().unwrap() {
        let keys: Vec<&String> = tool["function"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["description", "name", "parameters"]);
    }
    // The relay added the key; the agent never had it.
    assert_eq!(reqs[0].authorization.as_deref(), Some("Bearer sk-test-relay-key"));
    let agent_log = std::fs::read_to_string(choird.home.path().join("logs/demo.log")).unwrap();
    assert!(!agent_log.contains("sk-test-relay-key"));

    // The tool ran inside the workspace.
    let file = choird.workspace("demo").join("notes/hello.txt");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello from choir\n");

    // The second request carries the tool call and its result.
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4);
    assert_eq!(msgs[2]["role"], "assistant");
    assert_eq!(msgs[2]["tool_calls"][0]["function"]["name"], "choir__fs__write");
    assert_eq!(msgs[3]["role"], "tool");
    assert_eq!(msgs[3]["tool_call_id"], msgs[2]["tool_calls"][0]["id"]);
    let result: Value = serde_json::from_str(msgs[3]["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["status"], "success");
    assert_eq!(result["path"], "notes/hello.txt");

    // The agent's state (every tool input and result) is its own: another
    // local user reads neither the directory nor the log.
    let mode = |p: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(choird.workspace("demo").join(p)).unwrap().permissions(),
        ) & 0o777
    };
    assert_eq!((mode("."), mode(".choir"), mode(".choir/commit.log")), (0o700, 0o700, 0o600));

    // The commit event is in the agent's log and, replicated, in Postgres.
    let local = std::fs::read_to_string(choird.workspace("demo").join(".choir/commit.log")).unwrap();
    let local: Vec<CommitEvent> = local.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(local.len(), 1);
    assert_eq!((local[0].seq, local[0].tool.as_str(), local[0].outcome), (1, "choir.fs.write", Outcome::Ok));
    let events = replicated_events(&pg, "demo", 1);
    assert_eq!(events, local);
    verify_extension(&ChainHead::genesis(), &events).unwrap();
    let shown = choird.ctl_ok(&["agent", "events", "demo"]);
    assert!(shown.contains("choir.fs.write") && shown.contains("chain: intact"), "{shown}");

    // choird acknowledged it: the agent's status shows the replicated sequence.
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(status["state"], "running");
    assert_eq!(status["replicated_seq"], 1);
    // Every model call went through the relay and was recorded (a streamed
    // call once its end went out to the agent).
    let calls = || -> i64 {
        pg.client().query_one("SELECT count(*) FROM llm_calls WHERE agent_id = 'demo'", &[]).unwrap().get(0)
    };
    choir_tests::observe::wait_for("both calls recorded", Duration::from_secs(5), || calls() >= 2);
    assert_eq!(calls(), 2);

    let stopped = choird.ctl_ok(&["agent", "stop", "demo"]);
    assert!(stopped.contains("stopped"), "{stopped}");
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(status["state"], "stopped");
}

#[test]
fn a_restarted_agent_continues_the_chain_without_replaying() {
    let Some(Scenario { pg, llm: fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "a.txt", "content": "one"})),
            Step::Text("first".into()),
            Step::call("choir.fs.write", json!({"path": "a.txt", "content": "two", "mode": "append"})),
            Step::Text("second".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "one"]), "first\n");
    choird.ctl_ok(&["agent", "stop", "demo"]);
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "two"]), "second\n");
    assert_eq!(std::fs::read_to_string(choird.workspace("demo").join("a.txt")).unwrap(), "onetwo");
    let events = replicated_events(&pg, "demo", 2);
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
    verify_extension(&ChainHead::genesis(), &events).unwrap();
    // The first message was answered once: the restarted agent did not get it again.
    assert_eq!(fake.requests().len(), 4);
}
