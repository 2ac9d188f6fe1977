//! The arbiter end to end: the tool registry and its manifests, external tools,
//! the kill switch, and durability of the commit log under `kill -9`.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use choir_common::commit::{verify_extension, ChainHead, CommitEvent, Outcome};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{install_shipped_tool, test_config, Choird};
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use choir_tests::tool_calls::write_tool;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

fn echo_manifest(name: &str, description: &str) -> Value {
    json!({
        "llm": {"name": name, "description": description,
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
        "runtime": {"exec_path": "echo_tool", "timeout_ms": 5000, "side_effect": "read", "version": "1",
                    "locks": [], "secret_resources": [], "network": false, "idempotent": true,
                    "exposure": "both", "prompt_mask": false}
    })
}

const ECHO: &str = r#"read -r input; printf '{"summary": "echoed", "echo": %s}\n' "$input""#;

#[test]
fn each_kind_of_bad_manifest_fails_the_agent_start_naming_file_and_reason() {
    let Some(pg) = TestPg::start() else { return };
    let choird = Choird::start(&test_config("http://127.0.0.1:9/v1", Some(&pg.url()), &["demo"]), &json!({}));
    let dir = choird.tools_dir("global");
    let good = echo_manifest("x.echo", "Echo text.");
    let mut bad_schema = good.clone();
    bad_schema["llm"]["parameters"]["properties"]["text"]["type"] = json!(5);
    let mut unknown_field = good.clone();
    unknown_field["runtime"]["sudo"] = json!(true);
    let mut network = good.clone();
    network["runtime"]["network"] = json!(true);
    let mut missing_exec = good.clone();
    missing_exec["runtime"]["exec_path"] = json!("nope");
    let mut escaping_exec = good.clone();
    escaping_exec["runtime"]["exec_path"] = json!("../../../bin/sh");
    let mut builtin = good.clone();
    builtin["llm"]["name"] = json!("choir.fs.write");
    let mut bad_name = good.clone();
    bad_name["llm"]["name"] = json!("Echo");
    let mut bad_lock = good.clone();
    bad_lock["runtime"]["locks"] = json!([{"resource": "file:{nothing}", "mode": "X"}]);
    let cases: Vec<(&str, Option<Value>, &str)> = vec![
        ("not JSON", None, "not a valid manifest: key must be a string"),
        ("schema", Some(bad_schema), "llm.parameters: not a valid JSON Schema"),
        ("unknown field", Some(unknown_field), "runtime.sudo: unknown field `sudo`"),
        ("network", Some(network), "runtime.network is true"),
        ("missing executable", Some(missing_exec), "runtime.exec_path"),
        ("escaping executable", Some(escaping_exec), "must be a plain path next to the manifest"),
        ("built-in name", Some(builtin), "choir.fs.write is a built-in tool and cannot be replaced"),
        ("bad name", Some(bad_name), "llm.name: invalid tool name \"Echo\""),
        ("bad lock", Some(bad_lock), "placeholder {nothing} must name a string property"),
    ];
    for (what, manifest, reason) in cases {
        let file = dir.join("echo_tool.json");
        match &manifest {
            Some(m) => write_tool(&dir, "echo_tool", m, ECHO),
            None => {
                write_tool(&dir, "echo_tool", &good, ECHO);
                std::fs::write(&file, "{ this is not json").unwrap();
            }
        }
        let err = choird.ctl_err(&["agent", "start", "demo"]);
        assert!(err.contains("failed to start"), "{what}: {err}");
        // The agent names the file as it sees it: its tool directory, here the
        // process runtime's view of repos/global/tools.
        let _ = &file;
        assert!(err.contains("choir/tools/global/echo_tool.json"), "{what}: the file is not named: {err}");
        assert!(err.contains(reason), "{what}: the reason {reason:?} is missing: {err}");
    }
    // A manifest whose executable is not executable.
    write_tool(&dir, "echo_tool", &good, ECHO);
    std::fs::set_permissions(dir.join("echo_tool"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(err.contains("is not an executable file"), "{err}");
    // Two manifests of one name in one layer.
    std::fs::set_permissions(dir.join("echo_tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("echo_copy.json"), serde_json::to_string(&good).unwrap()).unwrap();
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(err.contains("tool x.echo is also defined by"), "{err}");
    std::fs::remove_file(dir.join("echo_copy.json")).unwrap();
    // And with the file fixed, the agent starts.
    choird.ctl_ok(&["agent", "start", "demo"]);
}

#[test]
fn agent_tools_override_global_and_the_model_sees_only_offered_llm_views() {
    let Some(Scenario { pg: _pg, llm: fake, choird }) = Scenario::new()
        .model(vec![
            Step::ToolCalls(vec![
                ("x.echo".into(), r#"{"text": "hi"}"#.into()),
                ("choir.repo.status".into(), "{}".into()),
                ("x.needs_secret".into(), r#"{"text": "hi"}"#.into()),
            ]),
            Step::Text("done".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .build()
    else {
        return;
    };
    let global = choird.tools_dir("global");
    write_tool(&global, "echo_tool", &echo_manifest("x.echo", "Global echo."), ECHO);
    let mut needs_secret = echo_manifest("x.needs_secret", "Needs a secret this agent does not have.");
    needs_secret["runtime"]["secret_resources"] = json!(["github_token"]);
    needs_secret["runtime"]["exec_path"] = json!("secret_tool");
    write_tool(&global, "secret_tool", &needs_secret, ECHO);
    install_shipped_tool(&global, "repo_status");
    write_tool(&choird.tools_dir("demo"), "echo_tool", &echo_manifest("x.echo", "Agent echo."), ECHO);
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(&ws).unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git").args(args).current_dir(&ws).output().unwrap().status.success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("README.md"), "hello\n").unwrap();

    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "go"]), "done\n");
    let reqs = fake.requests();
    let tools = reqs[0].body["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    let mut expected: Vec<String> =
        choir_common::manifest::BUILTIN_TOOLS.iter().map(|t| choir_common::ids::wire_tool_name(t)).collect();
    expected.extend(["choir__repo__status".to_owned(), "x__echo".to_owned()]);
    expected.sort();
    assert_eq!(names, expected, "the tool missing a secret is not offered");
    let shipped: Value =
        serde_json::from_str(&std::fs::read_to_string(global.join("repo_status.json")).unwrap()).unwrap();
    let repo = tools.iter().find(|t| t["function"]["name"] == "choir__repo__status").unwrap();
    assert_eq!(repo["function"]["description"], shipped["llm"]["description"]);
    assert_eq!(repo["function"]["parameters"], shipped["llm"]["parameters"]);
    let echo = tools.iter().find(|t| t["function"]["name"] == "x__echo").unwrap();
    assert_eq!(echo["function"]["description"], "Agent echo.");
    // Only LLM views: exactly {type, function{name, description, parameters}}
    // per tool, and no runtime view serialised anywhere in the request (the
    // proposal meta-tools may *name* runtime fields in their descriptions, as
    // documentation of the manifest format, but never carry their values).
    for t in &tools {
        let keys: Vec<&String> = t.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["function", "type"]);
        let fkeys: Vec<&String> = t["function"].as_object().unwrap().keys().collect();
        assert_eq!(fkeys, ["description", "name", "parameters"]);
    }
    let text = reqs[0].body.to_string();
    for runtime_key in
        ["exec_path", "timeout_ms", "locks", "secret_resources", "side_effect", "prompt_mask", "exposure"]
    {
        assert!(!text.contains(&format!("\"{runtime_key}\":")), "{runtime_key} reached the model");
    }
    assert!(!text.contains("repo_status\""), "an executable path reached the model");

    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let result =
        |i: usize| -> Value { serde_json::from_str(msgs[msgs.len() - 3 + i]["content"].as_str().unwrap()).unwrap() };
    assert_eq!(result(0)["echo"], json!({"text": "hi"}));
    let status = result(1);
    assert_eq!(status["status"], "success");
    assert_eq!(status["branch"], "main");
    assert_eq!(status["changes"], json!([{"status": "??", "path": "README.md"}]));
    assert_eq!(result(2)["error"]["code"], "unknown_tool", "a tool that is only available cannot be called");
}

#[test]
fn the_kill_switch_stops_every_tool_at_once_is_audited_and_survives_a_restart() {
    let Some(pg) = TestPg::start() else { return };
    let write = |name: &str| Step::call("choir.fs.write", json!({"path": name, "content": "x"}));
    let fake = FakeLlm::start(vec![
        write("blocked.txt"),
        Step::Text("could not".into()),
        write("blocked2.txt"),
        Step::Text("still could not".into()),
        write("allowed.txt"),
        Step::Text("did".into()),
    ]);
    let mut choird =
        Choird::start(&test_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert!(choird.ctl_ok(&["policy", "kill-switch", "on"]).contains("kill switch ON"));
    assert!(choird.ctl_ok(&["status"]).contains("kill switch: ON"));
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write"]), "could not\n");
    let result = |n: usize| -> Value {
        let msgs = fake.requests()[n].body["messages"].as_array().unwrap().clone();
        serde_json::from_str(msgs.last().unwrap()["content"].as_str().unwrap()).unwrap()
    };
    assert_eq!(result(1)["error"]["code"], "kill_switch");
    assert!(!choird.workspace("demo").join("blocked.txt").exists());

    // It is persisted: a restarted choird (and its agent, started again
    // because it ran when choird stopped) keeps it on.
    choird.restart();
    choird.wait_running("demo");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write again"]), "still could not\n");
    assert_eq!(result(3)["error"]["code"], "kill_switch");

    choird.ctl_ok(&["policy", "kill-switch", "off"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "now write"]), "did\n");
    assert!(choird.workspace("demo").join("allowed.txt").exists());
    let audit: Vec<String> = pg
        .client()
        .query("SELECT outcome FROM audit WHERE action = 'policy.kill_switch' ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(audit, ["on", "off"]);
    let events = replicated_events(&pg, "demo", 3);
    let outcomes: Vec<Outcome> = events.iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, [Outcome::Rejected, Outcome::Rejected, Outcome::Ok], "refusals are in the audit trail too");
}

fn wait_reply(pg: &TestPg, message: i64) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = pg.client();
    while Instant::now() < deadline {
        let row = c.query_one("SELECT reply FROM messages WHERE id = $1", &[&message]).unwrap();
        if let Some(reply) = row.get::<_, Option<String>>(0) {
            return Some(reply);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// kill -9 of the agent at each point of a tool call: after a restart the
/// turn resumes from the log, no committed call runs again, nothing
/// acknowledged is lost, and the chain in Postgres is intact and gap-free.
#[test]
fn kill_9_at_each_point_loses_nothing_committed_and_repeats_nothing_committed() {
    if TestPg::start().is_none() {
        return;
    }
    let version =
        std::process::Command::new(choir_tests::harness::bin("choir-agent")).arg("--version").output().unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).contains("failpoints"),
        "target/debug/choir-agent was built without failpoints; build with `cargo build --workspace --all-targets` (make test does)"
    );
    // (failpoint, is the call committed when the agent dies?)
    let points = [
        ("during_tool", false),
        ("before_append", false),
        ("after_write_before_fsync", true),
        ("after_fsync_before_reply", true),
    ];
    for (point, committed) in points {
        let pg = TestPg::start().unwrap();
        let call = Step::call("choir.fs.write", json!({"path": "log.txt", "content": "x", "mode": "append"}));
        // Without a committed event the resumed turn asks the model afresh.
        let script = if committed {
            vec![call, Step::Text("ok".into())]
        } else {
            vec![call.clone(), call, Step::Text("ok".into())]
        };
        let fake = FakeLlm::start(script);
        let choird =
            Choird::start(&test_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
        let state = choird.workspace("demo").join(".choir");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("failpoint"), point).unwrap();
        choird.ctl_ok(&["agent", "start", "demo"]);
        let err = choird.ctl_err(&["chat", "demo", "append x"]);
        assert!(err.contains("stopped before answering") && err.contains("SIGKILL"), "{point}: {err}");

        choird.wait_running("demo"); // restarted by choird after the crash
        let reply = wait_reply(&pg, 1);
        assert_eq!(reply.as_deref(), Some("ok"), "{point}: the interrupted message was answered after the restart");
        let file = std::fs::read_to_string(choird.workspace("demo").join("log.txt")).unwrap();
        let events = replicated_events(&pg, "demo", 1);
        verify_extension(&ChainHead::genesis(), &events).unwrap_or_else(|e| panic!("{point}: {e}"));
        let ok: Vec<&CommitEvent> = events.iter().filter(|e| e.outcome == Outcome::Ok).collect();
        match point {
            // Died before the tool ran: it runs once, after the restart.
            "during_tool" => assert_eq!((file.as_str(), ok.len()), ("x", 1), "{point}"),
            // Ran but was never committed: not acknowledged to anyone, so it may
            // run again (at-least-once for uncommitted side effects).
            "before_append" => assert_eq!((file.as_str(), ok.len()), ("xx", 1), "{point}"),
            // Committed: the resumed turn replays it from the log instead.
            _ => assert_eq!((file.as_str(), ok.len()), ("x", 1), "{point}"),
        }
        if committed {
            let msgs = fake.requests()[1].body["messages"].as_array().unwrap().clone();
            assert_eq!(msgs[2]["tool_calls"][0]["function"]["name"], "choir__fs__write", "{point}: replayed call");
            assert_eq!(
                serde_json::from_str::<Value>(msgs[3]["content"].as_str().unwrap()).unwrap()["status"],
                "success"
            );
        }
        assert!(!state.join("failpoint").exists());
    }
}

#[test]
fn a_hand_corrupted_log_is_refused_naming_the_sequence() {
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "a.txt", "content": "1"})),
            Step::call("choir.fs.write", json!({"path": "b.txt", "content": "2"})),
            Step::Text("ok".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    choird.ctl_ok(&["chat", "demo", "two files"]);
    choird.ctl_ok(&["agent", "stop", "demo"]);
    let log = choird.workspace("demo").join(".choir/commit.log");
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::write(&log, text.replacen("b.txt", "c.txt", 1)).unwrap();
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(err.contains("is corrupt at sequence 2"), "{err}");
}

#[test]
fn choird_refuses_forked_and_gapped_chains() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, session) = store_with_session(&pg);
    let event = sealed;
    let e1 = event(1, choir_common::commit::GENESIS_HASH, "a.b");
    let e2 = event(2, &e1.hash, "a.c");
    assert_eq!(store.append_events(&agent, session, &[e1.clone(), e2.clone()]).unwrap(), 2);
    // A resend of what is stored is fine.
    assert_eq!(store.append_events(&agent, session, std::slice::from_ref(&e2)).unwrap(), 2);
    // A different event 2: fork. A jump to 4: gap. A bad hash: refused.
    let other2 = event(2, &e1.hash, "a.x");
    let err = store.append_events(&agent, session, &[other2]).unwrap_err().to_string();
    assert!(err.contains("forked"), "{err}");
    let e3 = event(3, &e2.hash, "a.d");
    let e4 = event(4, &e3.hash, "a.e");
    let err = store.append_events(&agent, session, &[e4]).unwrap_err().to_string();
    assert!(err.contains("expected sequence number 3"), "{err}");
    let mut tampered = e3.clone();
    tampered.tool = "a.z".into();
    let err = store.append_events(&agent, session, &[tampered]).unwrap_err().to_string();
    assert!(err.contains("hash does not match"), "{err}");
    // Nothing of the refused batches was stored.
    let n: i64 = pg.client().query_one("SELECT count(*) FROM commit_events", &[]).unwrap().get(0);
    assert_eq!(n, 2);
}

/// Events alone that extend the stored head are stored in one statement;
/// anything else (an agent's first events, a resend, a fork, a gap, a bad
/// hash, an action on the outside world) writes nothing there and is left
/// to the turn's transaction, which decides as it always did.
#[test]
fn events_alone_extending_the_head_are_stored_in_one_statement_and_nothing_else_is() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, session) = store_with_session(&pg);
    let count = || -> i64 { pg.client().query_one("SELECT count(*) FROM commit_events", &[]).unwrap().get(0) };
    let head = || -> (i64, String) {
        let row = pg.client().query_one("SELECT head_seq, head_hash FROM agent_state", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    let e1 = sealed(1, choir_common::commit::GENESIS_HASH, "a.b");
    let e2 = sealed(2, &e1.hash, "a.c");
    // No head row yet: the transaction makes it.
    assert_eq!(store.events_at_once(&agent, session, &[e1.clone(), e2.clone()]).unwrap(), None);
    assert_eq!(count(), 0);
    assert_eq!(store.append_events(&agent, session, &[e1.clone(), e2.clone()]).unwrap(), 2);
    // Extending the head: stored, and the head moved, in the one statement.
    let e3 = sealed(3, &e2.hash, "a.d");
    let e4 = sealed(4, &e3.hash, "a.e");
    assert_eq!(store.events_at_once(&agent, session, &[e3.clone(), e4.clone()]).unwrap(), Some(4));
    assert_eq!((count(), head()), (4, (4, e4.hash.clone())));
    // Not extending it: nothing written, whatever is wrong.
    let e5 = sealed(5, &e4.hash, "a.f");
    let mut tampered = e5.clone();
    tampered.tool = "a.z".into();
    let mut external = e5.clone();
    external.external = true;
    let external = external.seal();
    for (what, events) in [
        ("a resend", vec![e4.clone()]),
        ("a resend running on", vec![e4.clone(), e5.clone()]),
        ("a fork", vec![sealed(4, &e3.hash, "a.x")]),
        ("a gap", vec![sealed(6, &e5.hash, "a.g")]),
        ("a bad hash", vec![tampered]),
        ("an action on the outside world", vec![external.clone()]),
        // A hostile agent's numbers: none before the first, none past the
        // database's bigint (its head would wrap to a negative number).
        ("an event numbered 0", vec![sealed(0, &e4.hash, "a.f")]),
        ("a sequence number past i64", vec![sealed(u64::MAX, &e4.hash, "a.f")]),
    ] {
        assert_eq!(store.events_at_once(&agent, session, &events).unwrap(), None, "{what}");
        assert_eq!((count(), head()), (4, (4, e4.hash.clone())), "{what} wrote nothing");
    }
    // The transaction takes the resend that runs on, and audits the action.
    assert_eq!(store.append_events(&agent, session, &[e4.clone(), e5.clone()]).unwrap(), 5);
    let e6 = sealed(6, &e5.hash, "a.g");
    let mut external = e6.clone();
    external.external = true;
    assert_eq!(store.append_events(&agent, session, &[external.seal()]).unwrap(), 6);
    let audited: i64 =
        pg.client().query_one("SELECT count(*) FROM audit WHERE action = 'tool.external'", &[]).unwrap().get(0);
    assert_eq!((count(), audited), (6, 1));
}

/// A HEARTBEAT's events and replies are one transaction: when the reply
/// cannot be stored the events are not either (and the failure is not
/// blamed on an event, which the agent would quarantine); a forked chain
/// stores no reply; the resend then stores both, once.
#[test]
fn a_turns_events_and_reply_are_stored_together_or_not_at_all() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, session) = store_with_session(&pg);
    let message = store.insert_message(&agent, "c1", "admin", "hello").unwrap().id;
    let e1 = sealed(1, choir_common::commit::GENESIS_HASH, "a.b");
    let e2 = sealed(2, &e1.hash, "a.c");
    let reply = |text: &str| choir_common::rpc::OutboundReply {
        in_reply_to: message,
        covers: Vec::new(),
        key: String::new(),
        conversation: "c1".into(),
        text: text.into(),
        failed: false,
    };
    let turn = |events: &[CommitEvent], text: &str| {
        let replies = [reply(text)];
        let half = choird::store::turns::Replies {
            replies: &replies,
            processed_upto: message,
            delivery: &choird::store::Nowhere,
        };
        store.store_turn(&agent, session, events, Some(half))
    };
    let stored = |pg: &TestPg| -> (i64, Option<String>, i64) {
        let mut c = pg.client();
        let events: i64 = c.query_one("SELECT count(*) FROM commit_events", &[]).unwrap().get(0);
        let reply: Option<String> = c.query_one("SELECT reply FROM messages", &[]).unwrap().get(0);
        let upto: i64 = c
            .query_opt("SELECT processed_upto FROM agent_processed WHERE agent_id = 'demo'", &[])
            .unwrap()
            .map_or(0, |r| r.get(0));
        (events, reply, upto)
    };

    // The reply's statement fails (a trigger stands in for any failure
    // there): the whole turn rolls back.
    pg.client()
        .batch_execute(
            "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.reply = 'boom' THEN RAISE EXCEPTION 'reply refused'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER refuse_boom BEFORE UPDATE ON messages FOR EACH ROW EXECUTE FUNCTION refuse_boom();",
        )
        .unwrap();
    let err = turn(&[e1.clone(), e2.clone()], "boom").unwrap_err();
    assert!(matches!(err, choird::store::turns::TurnError::Db(_)), "not blamed on an event: {err:?}");
    assert_eq!(stored(&pg), (0, None, 0), "nothing of the failed turn is stored");

    // A forked chain: refused, and its reply is not stored either.
    let (head, _) = store.store_turn(&agent, session, std::slice::from_ref(&e1), None).unwrap();
    assert_eq!(head, Some(1));
    let fork = sealed(1, choir_common::commit::GENESIS_HASH, "a.x");
    let err = turn(&[fork], "forked").unwrap_err();
    assert!(err.to_string().contains("forked"), "{err}");
    assert_eq!(stored(&pg), (1, None, 0));

    // The resend of the whole turn (event 1 again, event 2, the reply):
    // stored once, together.
    let (head, recorded) = turn(&[e1.clone(), e2.clone()], "the answer").unwrap();
    assert_eq!(head, Some(2));
    assert_eq!(recorded.new, vec![(message, "the answer".to_owned())]);
    assert_eq!(stored(&pg), (2, Some("the answer".into()), message as i64));
    // Sent once more (its acknowledgement lost): nothing changes.
    let (head, recorded) = turn(&[e1, e2], "a second answer").unwrap();
    assert_eq!((head, recorded.new.len()), (Some(2), 0));
    assert_eq!(stored(&pg), (2, Some("the answer".into()), message as i64));
}

/// demo's processed position and its row version (`xmin/xmax`): a write
/// shows as a new version.
fn processed_row(pg: &TestPg) -> (String, i64) {
    let r = pg
        .client()
        .query_one(
            "SELECT xmin::text || '/' || xmax::text, processed_upto FROM agent_processed WHERE agent_id = 'demo'",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// Every long-poll used to write the agent's position (and so commit with
/// an fsync) while the edge worked on the message it had just handed out:
/// a HEARTBEAT whose position does not move (the one stored, or lower) now
/// writes no row version and takes no row lock; one that moves writes it.
#[test]
fn a_heartbeat_whose_position_does_not_move_writes_nothing() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, _session) = store_with_session(&pg);
    store.agent_position(&agent).unwrap();
    let row = processed_row;
    store.insert_message(&agent, "c1", "admin", "hello").unwrap();
    let m = store.insert_message(&agent, "c1", "admin", "again").unwrap().id;
    store.record_replies(&agent, &[], m, &choird::store::Nowhere).unwrap();
    let (version, upto) = row(&pg);
    assert_eq!(upto, m as i64);
    for at in [m, m - 1] {
        store.record_replies(&agent, &[], at, &choird::store::Nowhere).unwrap();
        assert_eq!(row(&pg), (version.clone(), m as i64), "position {at} rewrote the row");
    }
    let later = store.insert_message(&agent, "c1", "admin", "later").unwrap().id;
    store.record_replies(&agent, &[], later, &choird::store::Nowhere).unwrap();
    let (moved, upto) = row(&pg);
    assert_eq!(upto, later as i64);
    assert_ne!(moved, version);
}

/// Regression: the position is the agent's word, and one past every
/// message (or past i64, which wrapped) was stored as sent; a restarted
/// agent is handed messages above its position, so it would never have
/// been handed one again. Such a position is cut to the highest message.
#[test]
fn regression_a_position_past_every_message_would_have_silenced_the_agent_for_good() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, _session) = store_with_session(&pg);
    store.agent_position(&agent).unwrap();
    let m = store.insert_message(&agent, "c1", "admin", "hello").unwrap().id;
    for hostile in [m + 1_000_000, i64::MAX as u64, u64::MAX] {
        store.record_replies(&agent, &[], hostile, &choird::store::Nowhere).unwrap();
        assert_eq!(store.agent_position(&agent).unwrap().processed, m, "position {hostile}");
    }
    // The next message is handed out to a restarted agent (above its position).
    let next = store.insert_message(&agent, "c1", "admin", "still there?").unwrap().id;
    let position = store.agent_position(&agent).unwrap().processed;
    let pending = store.pending_messages(&agent, position, 32).unwrap();
    assert_eq!(pending.iter().map(|p| p.id).collect::<Vec<_>>(), vec![next]);
}

/// Regression (store level): the edge answers B1 and B2 (B2 injected into
/// B1's running turn) while A1, of another conversation, waits behind them;
/// the answer's position passes over A1. A restarted agent is handed
/// messages above its position: it must be handed A1, and only A1 (B1 and
/// B2 are answered). It used to be handed nothing, for good.
#[test]
fn regression_a_message_passed_over_by_another_conversations_answer_is_handed_out_again_after_a_restart() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, _session) = store_with_session(&pg);
    store.agent_position(&agent).unwrap();
    let b1 = store.insert_message(&agent, "b", "admin", "B1").unwrap().id;
    let a1 = store.insert_message(&agent, "a", "admin", "A1").unwrap().id;
    let b2 = store.insert_message(&agent, "b", "admin", "B2").unwrap().id;
    let answer = choir_common::rpc::OutboundReply {
        in_reply_to: b2,
        covers: vec![b1, b2],
        key: String::new(),
        conversation: "b".into(),
        text: "B1 and B2".into(),
        failed: false,
    };
    store.record_replies(&agent, &[answer], b2, &choird::store::Nowhere).unwrap();
    let position = store.agent_position(&agent).unwrap();
    assert_eq!(position.processed, b2, "the answered history reaches B2");
    assert_eq!(position.resume_from, a1 - 1, "hand-out resumes below A1");
    let ids = |after: u64| store.pending_messages(&agent, after, 32).unwrap().iter().map(|p| p.id).collect::<Vec<_>>();
    assert_eq!(ids(position.resume_from), vec![a1]);
    // Negative control: from the high-water mark, A1 is never handed out.
    assert_eq!(ids(position.processed), Vec::<u64>::new());
    // Once A1 is answered, the position is the high-water mark again.
    let answer_a = choir_common::rpc::OutboundReply {
        in_reply_to: a1,
        covers: Vec::new(),
        key: String::new(),
        conversation: "a".into(),
        text: "A1".into(),
        failed: false,
    };
    store.record_replies(&agent, &[answer_a], a1, &choird::store::Nowhere).unwrap();
    let position = store.agent_position(&agent).unwrap();
    assert_eq!((position.processed, position.resume_from), (b2, b2));
}

/// Regression: migration 0017 moved each agent's position into a row of
/// its own as it was, so a position stored past every message before
/// positions were cut (the agent's word) kept its agent from ever being
/// handed a message again. The migration cuts it too.
#[test]
fn regression_the_positions_move_to_their_own_rows_cut_to_the_highest_message() {
    let Some(pg) = TestPg::start() else { return };
    let mut c = pg.client();
    c.batch_execute(
        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                         applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .unwrap();
    for (version, name, sql) in choird::db::MIGRATIONS.iter().filter(|(v, _, _)| *v < 17) {
        c.batch_execute(sql).unwrap();
        c.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", &[version, name]).unwrap();
    }
    let top: i64 = c
        .query_one(
            "INSERT INTO messages (agent_id, conversation, sender, text) VALUES ('a', 'c', 'u', 'hi') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    for (agent, position) in [("a", top - 1), ("b", top + 1_000_000), ("c", i64::MAX)] {
        c.execute(
            "INSERT INTO agent_state (agent_id, head_hash, processed_upto) VALUES ($1, 'x', $2)",
            &[&agent, &position],
        )
        .unwrap();
    }
    let db = choird::db::Db::connect(&pg.url()).unwrap();
    let applied = db.migrate().unwrap();
    assert_eq!(applied.first().map(String::as_str), Some("0017_processed_position.sql"));
    let rows = c.query("SELECT agent_id, processed_upto FROM agent_processed ORDER BY agent_id", &[]).unwrap();
    let positions: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(positions, [("a".to_owned(), top - 1), ("b".to_owned(), top), ("c".to_owned(), top)]);
}

/// The answer used to wait for the core jobs' replication: the processed
/// position shared the chain head's row, which a HEARTBEAT of events holds
/// locked from its head lock to its commit. An answer's HEARTBEAT (the
/// agent's link-reply) now stores while that lock is held.
#[test]
fn an_answer_is_stored_while_a_heartbeat_of_events_holds_the_chain_head() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, _session) = store_with_session(&pg);
    store.agent_position(&agent).unwrap();
    let message = store.insert_message(&agent, "c1", "admin", "hello").unwrap().id;
    // A core HEARTBEAT's transaction, between its head lock and its commit.
    let mut holder = pg.client();
    let mut events = holder.transaction().unwrap();
    events.query_one("SELECT head_seq FROM agent_state WHERE agent_id = 'demo' FOR UPDATE", &[]).unwrap();
    let (done, stored) = crossbeam_channel::bounded(1);
    let answering = std::thread::spawn(move || {
        let reply = choir_common::rpc::OutboundReply {
            in_reply_to: message,
            covers: Vec::new(),
            key: String::new(),
            conversation: "c1".into(),
            text: "the answer".into(),
            failed: false,
        };
        let _ = done.send(store.record_replies(&agent, &[reply], message, &choird::store::Nowhere).map(|r| r.new));
    });
    // A hang detector, not a timing bound: before the fix this waited for
    // the holder, which only lets go after it.
    let recorded =
        stored.recv_timeout(std::time::Duration::from_secs(60)).expect("the answer waited for the head's lock");
    assert_eq!(recorded.unwrap(), vec![(message, "the answer".to_owned())]);
    events.rollback().unwrap();
    answering.join().unwrap();
    let upto: i64 = pg
        .client()
        .query_one("SELECT processed_upto FROM agent_processed WHERE agent_id = 'demo'", &[])
        .unwrap()
        .get(0);
    assert_eq!(upto, message as i64);
}

/// A HEARTBEAT of one answer to one message and nothing else is one
/// statement (its own commit): it stores what the transaction would — the
/// answer once, the position moved with it — and a failure stores
/// neither; a resend, or a position that does not move, writes nothing;
/// another agent's message, or an id past i64, is not answered.
#[test]
fn a_lone_answer_is_stored_at_once_whole_or_not_at_all_and_a_resend_changes_nothing() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, _session) = store_with_session(&pg);
    store.agent_position(&agent).unwrap();
    let other = choir_common::ids::AgentId::parse("other").unwrap();
    let theirs = store.insert_message(&other, "c1", "admin", "not yours").unwrap().id;
    let m1 = store.insert_message(&agent, "c1", "admin", "hello").unwrap().id;
    let m2 = store.insert_message(&agent, "c2", "admin", "and you?").unwrap().id;
    let answer = |covers: Vec<u64>, text: &str| choir_common::rpc::OutboundReply {
        in_reply_to: *covers.last().unwrap(),
        covers: if covers.len() > 1 { covers } else { Vec::new() },
        key: String::new(),
        conversation: "c1".into(),
        text: text.into(),
        failed: false,
    };
    let position = processed_row;
    let replies = |pg: &TestPg| -> Vec<Option<String>> {
        let rows = pg.client().query("SELECT reply FROM messages ORDER BY id", &[]).unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    };
    let nowhere = &choird::store::Nowhere;

    // A failure in the statement (a trigger stands in for any): neither
    // the answer nor the position is stored.
    pg.client()
        .batch_execute(
            "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.reply = 'boom' THEN RAISE EXCEPTION 'reply refused'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER refuse_boom BEFORE UPDATE ON messages FOR EACH ROW EXECUTE FUNCTION refuse_boom();",
        )
        .unwrap();
    let before = position(&pg);
    assert!(store.record_replies(&agent, &[answer(vec![m1], "boom")], m1, nowhere).is_err());
    assert_eq!(position(&pg), before);
    assert_eq!(replies(&pg), vec![None, None, None]);

    let recorded = store.record_replies(&agent, &[answer(vec![m1], "hi")], m1, nowhere).unwrap();
    assert_eq!(recorded.new, vec![(m1, "hi".to_owned())]);
    assert!(recorded.delivered.is_empty() && recorded.refused.is_empty());
    assert_eq!(replies(&pg), vec![None, Some("hi".into()), None]);
    let (version, upto) = position(&pg);
    assert_eq!(upto, m1 as i64);

    // The resend (its acknowledgement lost), another agent's message, an
    // id no message can have: nothing new, nothing written.
    for id in [m1, theirs, u64::MAX] {
        let recorded = store.record_replies(&agent, &[answer(vec![id], "again")], m1, nowhere).unwrap();
        assert!(recorded.new.is_empty(), "{id}");
        assert_eq!(position(&pg), (version.clone(), m1 as i64), "{id}");
        assert_eq!(replies(&pg), vec![None, Some("hi".into()), None], "{id}");
    }

    // Covers (the transaction's way), listed twice and with an answered
    // one: each message answered once, in the reply's order.
    let recorded = store.record_replies(&agent, &[answer(vec![m2, m1, m2], "both")], m2, nowhere).unwrap();
    assert_eq!(recorded.new, vec![(m2, "both".to_owned())]);
    assert_eq!(replies(&pg), vec![None, Some("hi".into()), Some("both".into())]);
    assert_eq!(position(&pg).1, m2 as i64);
}

/// Hostile: a lone answer is stored at once with the outbox rows of the
/// conversation the agent names, so those rows must never go anywhere but
/// the chat of the message answered. Named right: queued there. Named
/// `cli`, or another chat, for a Telegram message: queued to the message's
/// own chat all the same (the statement writes nothing, and the
/// transaction stores the answer). Covering a plain and a Telegram message:
/// queued once, to the chat of the first. A plain message: no row.
#[test]
fn an_answer_to_a_telegram_message_is_queued_to_its_chat_whatever_conversation_the_agent_names() {
    let Some(pg) = TestPg::start() else { return };
    let (store, agent, _session) = store_with_session(&pg);
    store.agent_position(&agent).unwrap();
    let tg = choird::conversations::telegram("main", 42);
    let delivery = &choird::telegram::TelegramDelivery;
    let outbox = |pg: &TestPg| -> Vec<(String, i64, String)> {
        let rows =
            pg.client().query("SELECT bot, chat_id, body->>'text' FROM telegram_outbox ORDER BY id", &[]).unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
    };
    let answer = |covers: Vec<u64>, conversation: &str, text: &str| choir_common::rpc::OutboundReply {
        in_reply_to: *covers.last().unwrap(),
        covers: if covers.len() > 1 { covers } else { Vec::new() },
        key: String::new(),
        conversation: conversation.into(),
        text: text.into(),
        failed: false,
    };
    let elsewhere = choird::conversations::telegram("main", 99);
    for (n, named) in [tg.as_str(), "cli", elsewhere.as_str(), "tg:other:42"].into_iter().enumerate() {
        let m = store.insert_message(&agent, &tg, "7", "hi").unwrap().id;
        let text = format!("answer {n}");
        let recorded = store.record_replies(&agent, &[answer(vec![m], named, &text)], m, delivery).unwrap();
        assert_eq!(recorded.new, vec![(m, text.clone())], "named {named}");
        assert_eq!(recorded.delivered, vec![tg.clone()], "named {named}");
        assert_eq!(outbox(&pg).len(), n + 1, "named {named}: one row");
        assert_eq!(outbox(&pg).last(), Some(&("main".to_owned(), 42, text)), "named {named}");
        assert_eq!(store.agent_position(&agent).unwrap().processed, m);
        // Resent: neither answered nor queued again.
        let recorded = store.record_replies(&agent, &[answer(vec![m], named, "again")], m, delivery).unwrap();
        assert!(recorded.new.is_empty() && recorded.delivered.is_empty(), "named {named}");
        assert_eq!(outbox(&pg).len(), n + 1, "named {named}: resent");
    }
    // A plain message and a Telegram one under one answer, the Telegram
    // one first: queued once, to its chat.
    let plain = store.insert_message(&agent, "cli", "admin", "and here").unwrap().id;
    let m = store.insert_message(&agent, &tg, "7", "there").unwrap().id;
    let recorded = store.record_replies(&agent, &[answer(vec![m, plain], "cli", "to both")], m, delivery).unwrap();
    assert_eq!(recorded.new, vec![(m, "to both".to_owned()), (plain, "to both".to_owned())]);
    assert_eq!(recorded.delivered, vec![tg.clone()]);
    assert_eq!(outbox(&pg).len(), 5);
    assert_eq!(outbox(&pg).last(), Some(&("main".to_owned(), 42, "to both".to_owned())));
    // A plain message, named right or as a Telegram chat: stored, no row.
    for named in ["cli", tg.as_str()] {
        let plain = store.insert_message(&agent, "cli", "admin", "plain").unwrap().id;
        let recorded = store.record_replies(&agent, &[answer(vec![plain], named, "plain")], plain, delivery).unwrap();
        assert_eq!(recorded.new, vec![(plain, "plain".to_owned())], "named {named}");
        assert!(recorded.delivered.is_empty(), "named {named}");
        assert_eq!(outbox(&pg).len(), 5, "named {named}");
    }
    // Another agent's Telegram message, named right: nothing answered, no row.
    let other = choir_common::ids::AgentId::parse("other").unwrap();
    let theirs = store.insert_message(&other, &tg, "7", "not yours").unwrap().id;
    let recorded = store.record_replies(&agent, &[answer(vec![theirs], &tg, "mine")], m, delivery).unwrap();
    assert!(recorded.new.is_empty() && recorded.delivered.is_empty());
    assert_eq!(outbox(&pg).len(), 5);
}

/// A migrated store on `pg` with a session of agent `demo`.
fn store_with_session(pg: &TestPg) -> (choird::store::Store, choir_common::ids::AgentId, i64) {
    let store = pg.store();
    let agent = choir_common::ids::AgentId::parse("demo").unwrap();
    let session = store.create_session(&agent, "process", b"digest").unwrap();
    (store, agent, session)
}

/// A sealed commit event `seq` after `prev`, calling `tool`.
fn sealed(seq: u64, prev: &str, tool: &str) -> CommitEvent {
    CommitEvent {
        seq,
        prev_hash: prev.to_owned(),
        ts_ms: 1,
        lane: "edge".into(),
        kind: choir_common::commit::EventKind::ToolCall,
        tool: tool.into(),
        call_id: None,
        turn: None,
        skill: None,
        state: None,
        input: json!({}),
        outcome: Outcome::Ok,
        result: json!({}),
        duration_us: 0,
        escaped: None,
        external: false,
        hash: String::new(),
    }
    .seal()
}

#[test]
fn tools_validate_checks_a_file_or_a_layer_offline_as_the_agent_does() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let validate = |path: &std::path::Path| {
        std::process::Command::new(choir_tests::harness::bin("choirctl"))
            .arg("--home")
            .arg(home.path())
            .args(["tools", "validate"])
            .arg(path)
            .output()
            .unwrap()
    };
    write_tool(dir.path(), "echo_tool", &echo_manifest("x.echo", "Echo text."), ECHO);
    let out = validate(dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("tool x.echo is valid"), "no choird is needed");
    let out = validate(&dir.path().join("echo_tool.json"));
    assert!(out.status.success());
    // A bad manifest: named with its file and field, exit non-zero.
    let mut bad = echo_manifest("x.bad", "Bad.");
    bad["runtime"]["sudo"] = json!(true);
    write_tool(dir.path(), "bad_tool", &bad, ECHO);
    let out = validate(dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad_tool.json") && err.contains("unknown field `sudo`"), "{err}");
    let out = validate(&dir.path().join("missing.json"));
    assert!(!out.status.success());
}
