//! Cognition end to end: core jobs and their lifetimes, injection, corrections,
//! compaction, and streams cut short — asserted on the exact requests the
//! scripted models receive.

use std::time::{Duration, Instant};

use choir_common::commit::{EventKind, Outcome};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{bin, test_config, two_lane_config, Choird};
use choir_tests::observe::{notices, rows_read_under_both_plans, system_of, wait_for};
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

/// How many tool results a request already carries.
fn tool_results(req: &Value) -> usize {
    req["messages"].as_array().map(|m| m.iter().filter(|m| m["role"] == "tool").count()).unwrap_or(0)
}

fn agent_pid(choird: &Choird) -> u32 {
    let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    s["pid"].as_u64().unwrap() as u32
}

/// Names of the agent process's threads.
fn threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|s| s.trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_edge_starts_a_core_job_and_relays_its_summary_but_never_its_reasoning() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::start(vec![
        Step::call("choir.core.start", json!({"name": "census", "objective": "Count the files in notes/ and report."})),
        Step::Text("I started a job to count them.".into()),
        Step::Text("The count is done: 2 files in notes/.".into()),
    ]);
    let core = FakeLlm::start(vec![
        Step::Said(
            "THINKING-SECRET-42: maybe I should use ls".into(),
            vec![("choir.exec".into(), json!({"command": "ls notes | wc -l"}).to_string())],
        ),
        Step::Text("REPORT: notes/ holds 2 files.".into()),
    ]);
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    std::fs::create_dir_all(choird.workspace("demo").join("notes")).unwrap();
    for f in ["a.md", "b.md"] {
        std::fs::write(choird.workspace("demo").join("notes").join(f), "x").unwrap();
    }
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "how many notes?"]), "I started a job to count them.\n");
    wait_for("the relayed result", Duration::from_secs(30), || notices(&pg).len() == 1);
    assert_eq!(notices(&pg), ["The count is done: 2 files in notes/."]);

    // The core lane: its own model, no core tools, the objective in its prompt.
    let creqs = core.requests();
    // The whole first request of the core lane (snapshot): its prompt, the
    // objective, the tools a core job has and nothing of their runtime views.
    choir_tests::harness::assert_snapshot("core_first_request", &creqs[0].body);
    assert_eq!(creqs[0].body["model"], "fake-core");
    assert!(system_of(&creqs[0].body).contains("Objective: Count the files in notes/ and report."));
    let core_tools: Vec<&str> =
        creqs[0].body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(!core_tools.iter().any(|t| t.starts_with("choir__core__")), "{core_tools:?}");
    assert!(core_tools.contains(&"choir__exec"));

    // The edge heard the workflow summary, in one voice, and no reasoning text.
    let ereqs = edge.requests();
    assert_eq!(ereqs.len(), 3);
    for r in &ereqs {
        assert!(!r.body.to_string().contains("THINKING-SECRET-42"), "the core's reasoning reached the edge");
    }
    let note = ereqs[2].body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(note["role"], "system");
    let text = note["content"].as_str().unwrap();
    assert!(text.starts_with("Core job 'census' finished."), "{text}");
    let summary: Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(summary["status"], "done");
    assert_eq!(summary["report"], "REPORT: notes/ holds 2 files.");
    assert_eq!(summary["actions"][0]["tool"], "choir.exec");
    assert_eq!(summary["actions"][0]["status"], "success");
    assert!(summary["artifacts"][0].as_str().unwrap().starts_with(".choirtmp/exec/cmd_core_census_"), "{summary}");
    // The job's calls are committed under its own lane.
    let events = replicated_events(&pg, "demo", 2);
    assert!(events.iter().any(|e| e.lane == "core:census" && e.tool == "choir.exec" && e.outcome == Outcome::Ok));
}

#[test]
fn two_core_jobs_share_the_workspace_through_the_lock_manager() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "user" {
            return Some(Step::ToolCalls(vec![
                ("choir.core.start".into(), json!({"name": "slow", "objective": "run the slow build"}).to_string()),
                ("choir.core.start".into(), json!({"name": "fast", "objective": "read the config"}).to_string()),
            ]));
        }
        Some(Step::Text("noted".into()))
    });
    let core = FakeLlm::with_responder(|req, _| {
        let system = system_of(req);
        let done = tool_results(req) > 0;
        if done {
            return Some(Step::Text("finished".into()));
        }
        if system.contains("job 'slow'") {
            Some(Step::call("choir.exec", json!({"command": "sleep 2; echo built > build.log"})))
        } else {
            // Let the slow job take workspace:X first.
            std::thread::sleep(Duration::from_millis(700));
            Some(Step::call("choir.fs.read", json!({"path": "config.txt"})))
        }
    });
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    std::fs::create_dir_all(choird.workspace("demo")).unwrap();
    std::fs::write(choird.workspace("demo").join("config.txt"), "setting=1\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["chat", "demo", "build and read"]);
    wait_for("both reports", Duration::from_secs(60), || notices(&pg).len() == 2);
    let events = replicated_events(&pg, "demo", 4);
    let exec = events.iter().find(|e| e.tool == "choir.exec").unwrap();
    let read = events.iter().find(|e| e.tool == "choir.fs.read").unwrap();
    assert_eq!((exec.lane.as_str(), read.lane.as_str()), ("core:slow", "core:fast"));
    assert!(exec.seq < read.seq, "the read was committed after the exec that held workspace:X");
    assert!(read.ts_ms >= exec.ts_ms, "and it ran only once the exec was done");
    assert!(exec.duration_us >= 2_000_000);
    assert_eq!(read.result["content"], "setting=1\n");
}

#[test]
fn stopping_the_edge_stops_its_core_jobs_and_leaves_no_thread() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        let user = last["content"].as_str().unwrap_or_default().to_owned();
        if last["role"] == "user" && user == "start two" {
            return Some(Step::ToolCalls(vec![
                ("choir.core.start".into(), json!({"name": "alpha", "objective": "loop"}).to_string()),
                ("choir.core.start".into(), json!({"name": "beta", "objective": "loop"}).to_string()),
            ]));
        }
        if last["role"] == "user" && user == "cancel beta" {
            return Some(Step::call("choir.core.cancel", json!({"name": "beta"})));
        }
        Some(Step::Text("ok".into()))
    });
    // Core jobs that never finish on their own: one short tool call per step.
    let core = FakeLlm::with_responder(|_, _| Some(Step::call("choir.exec", json!({"command": "sleep 0.2"}))));
    let mut config = two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]);
    config["agents"]["demo"]["core_budget"] = json!({"steps": 10000, "tokens": 100000000, "wall_s": 3600});
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let pid = agent_pid(&choird);
    // RUNNING is reported before the last of the agent's own threads
    // (`signals`) is up: wait for the whole set.
    let expected = ["choir-agent", "edge", "link-poll", "link-push", "link-reply", "reaper", "signals"];
    wait_for("the agent's own threads", Duration::from_secs(10), || threads(pid) == expected);
    let baseline = threads(pid);
    assert_eq!(baseline, expected);

    choird.ctl_ok(&["chat", "demo", "start two"]);
    wait_for("two core threads", Duration::from_secs(20), || {
        threads(pid).iter().filter(|t| t.starts_with("core-")).count() == 2
    });
    // The status shows both jobs with their budgets.
    wait_for("the core lanes in the status", Duration::from_secs(10), || {
        let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
        s["lanes"]
            .as_array()
            .is_some_and(|l| l.iter().filter(|l| l["lane"].as_str().unwrap().starts_with("core:")).count() == 2)
    });
    let table = choird.ctl_ok(&["agent", "status", "demo"]);
    assert!(table.contains("core:alpha") && table.contains("/10000"), "{table}");

    // Cancelling one job ends its thread; the other keeps going.
    choird.ctl_ok(&["chat", "demo", "cancel beta"]);
    wait_for("beta's thread to end", Duration::from_secs(10), || !threads(pid).contains(&"core-beta".to_owned()));
    assert!(threads(pid).contains(&"core-alpha".to_owned()));

    // Stopping the edge stops alpha within a step and joins everything.
    let before = core.requests().len();
    let started = Instant::now();
    choird.ctl_ok(&["agent", "stop", "demo"]);
    assert!(started.elapsed() < Duration::from_secs(8), "stop took {:?}", started.elapsed());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the agent process is gone");
    assert!(core.requests().len() <= before + 1, "a cancelled core took more than one more step");
    let log_path = choird.home.path().join("logs/demo.log");
    wait_for("the agent's last words", Duration::from_secs(5), || {
        std::fs::read_to_string(&log_path).unwrap_or_default().contains("agent exiting: stopped")
    });
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("core pool: 1 running job(s) cancelled; all 2 joined"), "{log}");
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(status["last_exit"], "process exited (exit status: 0)");
}

#[test]
fn a_message_injected_during_a_long_tool_call_is_seen_at_the_next_step() {
    let Some(Scenario { pg: _pg, llm: edge, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.exec", json!({"command": "sleep 2"})),
            Step::Text("I saw both of your messages.".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let chat = |text: &'static str| {
        let home = choird.home.path().to_owned();
        std::thread::spawn(move || {
            let out = std::process::Command::new(bin("choirctl"))
                .arg("--home")
                .arg(home)
                .args(["chat", "demo", text])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        })
    };
    let first = chat("please wait a bit");
    edge.wait_requests(1, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    let second = chat("and also say hello");
    assert_eq!(first.join().unwrap(), "I saw both of your messages.\n");
    assert_eq!(second.join().unwrap(), "I saw both of your messages.\n", "the injected message shares the answer");
    let reqs = edge.requests();
    assert_eq!(reqs.len(), 2);
    let before = reqs[0].body["messages"].as_array().unwrap();
    let after = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(&after[..before.len()], &before[..], "history before the injection is byte-identical");
    let roles: Vec<&str> = after.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(after[4]["content"], "and also say hello");
}

#[test]
fn invalid_proposals_get_corrections_and_the_budget_ends_the_turn_cleanly() {
    let Some(Scenario { pg, llm: edge, choird }) = Scenario::new()
        .model(vec![
            // Recovers after one correction.
            Step::Text("".into()),
            Step::Text("fine now".into()),
            // Then three invalid proposals in a row (the budget is 2).
            Step::Text(r#"{"name": "choir.fs.write", "arguments": {"path": "posed.txt", "content": "x"}}"#.into()),
            Step::ToolCalls(vec![("choir__fs__shred".into(), "{}".into())]),
            Step::ToolCalls(vec![("choir.fs.write".into(), r#"{"path": "bad.txt", "content": 1"#.into())]),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "one"]), "fine now\n");
    let answer = choird.ctl_err(&["chat", "demo", "two"]);
    assert!(
        answer.starts_with("choirctl: Sorry, I could not complete this: my model kept making invalid proposals"),
        "{answer}"
    );
    let reqs = edge.requests();
    assert_eq!(reqs.len(), 5, "no fourth correction was asked for");
    let correction = |n: usize| -> String {
        let msgs = reqs[n].body["messages"].as_array().unwrap();
        msgs.iter().rev().find(|m| m["role"] == "system").unwrap()["content"].as_str().unwrap().to_owned()
    };
    assert!(correction(1).starts_with("Correction: your reply was empty"), "{}", correction(1));
    assert!(correction(3).contains("looks like a tool call written as text; it was not executed"), "{}", correction(3));
    let tool_result: Value =
        serde_json::from_str(reqs[4].body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap())
            .unwrap();
    assert_eq!(tool_result["error"]["code"], "unknown_tool");
    for f in ["posed.txt", "bad.txt"] {
        assert!(!choird.workspace("demo").join(f).exists(), "{f} was written");
    }
    let events = replicated_events(&pg, "demo", 4);
    let corrections = events.iter().filter(|e| e.kind == EventKind::Correction).count();
    let rejected = events.iter().filter(|e| e.kind == EventKind::ToolCall && e.outcome == Outcome::Rejected).count();
    assert_eq!((corrections, rejected), (2, 2), "every refusal is committed");
}

#[test]
fn compaction_folds_old_turns_commits_the_summary_and_survives_a_restart() {
    let Some(Scenario { pg, llm: edge, mut choird }) = Scenario::new()
        .responder(|req, _| {
            if req.get("tools").is_none() {
                return Some(Step::Text("SUMMARY-OF-EARLIER: the user sent long notes one and two.".into()));
            }
            let last = req["messages"].as_array()?.last()?.clone();
            let text = last["content"].as_str().unwrap_or_default();
            Some(Step::Text(format!("noted {}", text.split_whitespace().next().unwrap_or_default())))
        })
        .config(|c| c["agents"]["demo"]["context_tokens"] = json!(1500))
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let long = |tag: &str| format!("{tag} {}", "lorem ipsum dolor sit amet ".repeat(60));
    for tag in ["one", "two", "three"] {
        assert_eq!(choird.ctl_ok(&["chat", "demo", &long(tag)]), format!("noted {tag}\n"));
    }
    let reqs = edge.requests();
    let summary_call = reqs.iter().position(|r| r.body.get("tools").is_none()).expect("a summary call");
    let before = &reqs[summary_call - 1].body;
    let after = &reqs[summary_call + 1].body;
    assert!(after.to_string().len() < before.to_string().len() + long("three").len(), "the request shrank");
    let msgs = after["messages"].as_array().unwrap();
    assert_eq!(
        msgs[1]["content"],
        "Summary of the earlier conversation: SUMMARY-OF-EARLIER: the user sent long notes one and two."
    );
    assert!(msgs.last().unwrap()["content"].as_str().unwrap().starts_with("three "), "the current objective is kept");
    let events = replicated_events(&pg, "demo", 1);
    let compaction = events.iter().find(|e| e.kind == EventKind::Compaction).expect("a committed compaction");
    assert_eq!(compaction.input["conversation"], "cli");
    assert_eq!(compaction.input["upto_message"], 1);

    // After a restart the lane starts from the summary, not from nothing.
    choird.ctl_ok(&["agent", "stop", "demo"]);
    choird.restart();
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "four"]), "noted four\n");
    let last = edge.requests().last().unwrap().body.clone();
    let msgs = last["messages"].as_array().unwrap();
    assert!(msgs[1]["content"].as_str().unwrap().contains("SUMMARY-OF-EARLIER"), "{last}");
    assert!(
        msgs.iter().any(|m| m["content"].as_str().is_some_and(|c| c.starts_with("three "))),
        "the kept turn came back too"
    );
    assert!(
        !msgs.iter().any(|m| m["content"].as_str().is_some_and(|c| c.starts_with("one "))),
        "the folded turn did not"
    );
}

#[test]
fn a_stream_cut_in_the_middle_executes_nothing_and_is_retried() {
    let Some(Scenario { pg, llm: edge, choird }) = Scenario::new()
        .model(vec![Step::CutStream, Step::Text("after the cut".into())])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "go"]), "after the cut\n");
    assert_eq!(edge.requests().len(), 2);
    assert_eq!(edge.requests()[0].body, edge.requests()[1].body, "the same request was retried");
    assert!(!choird.workspace("demo").join("cut.txt").exists());
    let events: i64 = pg.client().query_one("SELECT count(*) FROM commit_events", &[]).unwrap().get(0);
    assert_eq!(events, 0, "nothing of the cut call was committed");
}

#[test]
fn a_streamed_answer_reaches_the_user_before_the_model_is_done() {
    let answer = "The answer is forty-two; the model took its time to write it.";
    let Some(Scenario { pg: _pg, llm: _edge, choird }) = Scenario::new()
        .model(vec![
            Step::SlowText(answer.into(), Duration::from_millis(120)),
            Step::SlowText("Quick answer ok.".into(), Duration::from_millis(5)),
            Step::SlowText("short".into(), Duration::from_millis(10)),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let started = Instant::now();
    let resp = admin
        .post("http://localhost/admin/v1/agents/demo/chat")
        .send_json(json!({"text": "what is the answer?", "stream": true}))
        .unwrap();
    let mut lines: Vec<(Duration, Value)> = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(resp.into_body().into_reader())) {
        lines.push((started.elapsed(), serde_json::from_str(&line.unwrap()).unwrap()));
    }
    let (last_at, last) = lines.last().unwrap().clone();
    assert_eq!(last["reply"], answer);
    let partials: Vec<&(Duration, Value)> = lines.iter().filter(|(_, l)| l.get("partial").is_some()).collect();
    assert!(!partials.is_empty(), "no partial answer arrived: {lines:?}");
    let (first_at, first) = partials[0];
    let text = first["partial"].as_str().unwrap();
    assert!(answer.starts_with(text) && text.len() < answer.len(), "{text:?}");
    assert!(
        last_at - *first_at >= Duration::from_millis(300),
        "the first words came {:?} before the end",
        last_at - *first_at
    );
    // An answer the model has written within the edge's PARTIAL_EVERY
    // (150 ms; here its two pieces come at about 10 and 15 ms) goes out
    // whole: no partial ahead of it, so a quick turn is one HEARTBEAT, not two.
    let resp = admin
        .post("http://localhost/admin/v1/agents/demo/chat")
        .send_json(json!({"text": "and quickly?", "stream": true}))
        .unwrap();
    let lines: Vec<Value> = std::io::BufRead::lines(std::io::BufReader::new(resp.into_body().into_reader()))
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert!(lines.iter().all(|l| l.get("partial").is_none()), "{lines:?}");
    assert_eq!(lines.last().unwrap()["reply"], "Quick answer ok.");
    // choirctl --stream shows the same final text.
    assert_eq!(choird.ctl_ok(&["chat", "--stream", "demo", "again"]), "short\n");
}

#[test]
fn a_job_started_with_allowed_tools_is_offered_and_runs_only_those() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::start(vec![
        // A tool no job may have: refused before any job starts.
        Step::call(
            "choir.core.start",
            json!({"name": "bad", "objective": "x", "allowed_tools": ["choir.fs.read", "choir.core.start"]}),
        ),
        Step::call(
            "choir.core.start",
            json!({"name": "reader", "objective": "Read notes/a.md and report.", "allowed_tools": ["choir.fs.read"]}),
        ),
        Step::Text("Started.".into()),
        Step::Text("Done.".into()),
    ]);
    let core = FakeLlm::start(vec![
        // Outside the task's allowlist: refused, nothing written.
        Step::call("choir.fs.write", json!({"path": "notes/b.md", "content": "injected"})),
        Step::call("choir.fs.read", json!({"path": "notes/a.md"})),
        Step::Text("REPORT: read it.".into()),
    ]);
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::write(ws.join("notes/a.md"), "hello").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "read my note"]), "Started.\n");
    wait_for("the job's report", Duration::from_secs(30), || notices(&pg).len() == 1);

    // The refused start said why.
    let ereqs = edge.requests();
    let first = ereqs[1].body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(first.contains("invalid_allowed_tools") && first.contains("choir.core.start"), "{first}");
    // The job was offered only its tool, and the other was refused.
    let creqs = core.requests();
    let offered: Vec<&str> =
        creqs[0].body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(offered, ["choir__fs__read"]);
    let refused = creqs[1].body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(refused.contains("not_allowed") && refused.contains("choir.fs.write is not allowed here"), "{refused}");
    assert!(!ws.join("notes/b.md").exists());
    let events = replicated_events(&pg, "demo", 4);
    let job: Vec<(&str, Outcome)> =
        events.iter().filter(|e| e.lane == "core:reader").map(|e| (e.tool.as_str(), e.outcome)).collect();
    assert_eq!(job, [("choir.fs.write", Outcome::Rejected), ("choir.fs.read", Outcome::Ok)]);
}

/// Sends `text` in `conversation` through the admin API; the answer.
fn chat_in(choird: &Choird, conversation: &str, text: &str) -> String {
    let admin = choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/choird.sock"), None);
    let mut resp = admin
        .post("http://localhost/admin/v1/agents/demo/chat")
        .send_json(json!({"text": text, "conversation": conversation, "timeout_s": 60}))
        .unwrap();
    let body: Value = resp.body_mut().read_json().unwrap();
    body["reply"].as_str().unwrap_or_default().to_owned()
}

/// The contents of a request's messages (user, assistant and tool), in order.
fn contents(req: &Value) -> Vec<String> {
    req["messages"].as_array().unwrap()[1..]
        .iter()
        .map(|m| match (m["role"].as_str().unwrap(), m["content"].as_str()) {
            ("tool", _) => "tool: a result".to_owned(),
            (role, Some(c)) => format!("{role}: {c}"),
            (role, None) => format!("{role}: calls {}", m["tool_calls"][0]["function"]["name"].as_str().unwrap()),
        })
        .collect()
}

#[test]
fn the_agent_holds_a_bounded_number_of_conversations_and_recalls_a_dropped_one_from_choird() {
    let Some(pg) = TestPg::start() else { return };
    let held = choir_common::rpc::HELD_CONVERSATIONS;
    // The first message of `a` makes the model call a tool before it answers:
    // held, the history keeps that call; recalled, only the exchange's text.
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "user" && last["content"] == "the code word is PLUM" {
            return Some(Step::call("choir.fs.write", json!({"path": "word.txt", "content": "PLUM"})));
        }
        Some(Step::Text(if last["role"] == "tool" { "noted".into() } else { "ok".into() }))
    });
    let config = test_config(&edge.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(chat_in(&choird, "a", "the code word is PLUM"), "noted");
    let first_of_new = edge.requests().len();
    // Others speak, but fewer than would push `a` out.
    for i in 0..held - 1 {
        assert_eq!(chat_in(&choird, &format!("x{i}"), "hello"), "ok");
    }
    // A new conversation's first request holds its message only: nothing recalled.
    assert_eq!(contents(&edge.requests()[first_of_new].body), vec!["user: hello"]);
    assert_eq!(chat_in(&choird, "a", "what was it?"), "ok");
    let held_view = contents(&edge.requests().last().unwrap().body);
    assert_eq!(
        held_view,
        vec![
            "user: the code word is PLUM",
            "assistant: calls choir__fs__write",
            "tool: a result",
            "assistant: noted",
            "user: what was it?"
        ],
        "held: the whole history, tool call included"
    );
    // As many others again: `a` is now the least recently used and dropped.
    for i in 0..held {
        assert_eq!(chat_in(&choird, &format!("y{i}"), "hello"), "ok");
    }
    assert_eq!(chat_in(&choird, "a", "and now?"), "ok");
    let recalled_view = contents(&edge.requests().last().unwrap().body);
    assert_eq!(
        recalled_view,
        vec![
            "user: the code word is PLUM",
            "assistant: noted",
            "user: what was it?",
            "assistant: ok",
            "user: and now?"
        ],
        "recalled from choird: the answered exchanges, without the tool call inside them"
    );
    // A dropped conversation with no earlier messages of its own is not one:
    // a recall of a key the agent never spoke in is empty, not another's.
    assert_eq!(chat_in(&choird, "fresh", "hello"), "ok");
    assert_eq!(contents(&edge.requests().last().unwrap().body), vec!["user: hello"]);
}

#[test]
fn a_conversation_of_many_short_turns_is_compacted_by_its_entry_count_not_only_its_tokens() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::with_responder(|req, _| {
        if req.get("tools").is_none() {
            return Some(Step::Text("SUMMARY: many hellos.".into()));
        }
        Some(Step::Text("ok".into()))
    });
    let config = test_config(&edge.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    // Two entries an exchange, a few tokens each: far under the default
    // token budget (24,000) when the entry bound (256) is passed.
    let turns = choir_agent::lanes::conversation::MAX_ENTRIES / 2 + 2;
    for i in 0..turns {
        assert_eq!(chat_in(&choird, "many", &format!("hello {i}")), "ok");
    }
    let reqs = edge.requests();
    let summaries: Vec<usize> =
        reqs.iter().enumerate().filter(|(_, r)| r.body.get("tools").is_none()).map(|(i, _)| i).collect();
    assert_eq!(summaries.len(), 1, "one compaction");
    let before = reqs[summaries[0] - 1].body["messages"].as_array().unwrap().len();
    let after = reqs[summaries[0] + 1].body["messages"].as_array().unwrap();
    // The request before it: the system prompt and all but the newest message.
    assert_eq!(before, choir_agent::lanes::conversation::MAX_ENTRIES, "{before} messages before");
    assert!(after.len() < 8, "{} messages after", after.len());
    assert_eq!(after[1]["content"], "Summary of the earlier conversation: SUMMARY: many hellos.");
    let events = replicated_events(&pg, "demo", 1);
    assert!(events.iter().any(|e| e.kind == EventKind::Compaction && e.input["conversation"] == "many"));
}

/// Choosing the conversations a restarted agent holds reads the last
/// `RECENT_WINDOW` message ids, not the agent's history (it read all its
/// answered messages: 0.36 s at 1,000,000), and still finds the most recent.
#[test]
fn the_conversations_a_restarted_agent_holds_are_chosen_from_a_window_not_the_whole_history() {
    let Some(pg) = TestPg::start() else { return };
    choird::db::Db::connect(&pg.url()).unwrap().migrate().unwrap();
    let mut c = pg.client();
    let window = choird::store::RECENT_WINDOW;
    let total = 2 * window + 5_000;
    c.batch_execute(&format!(
        "INSERT INTO messages (agent_id, conversation, sender, text, reply, replied_at)
             SELECT 'a', 'c' || (g % 500), 'u', 'q' || g, 'r' || g, now() FROM generate_series(1, {total}) g;
         ANALYZE messages;"
    ))
    .unwrap();
    let upto: i64 = c.query_one("SELECT max(id) FROM messages", &[]).unwrap().get(0);
    c.batch_execute(&format!(
        "PREPARE recent(text, bigint, bigint, bigint) AS {}",
        choird::store::RECENT_CONVERSATIONS
    ))
    .unwrap();
    let execute = format!("EXECUTE recent('a', {upto}, 32, {window})");
    let read = rows_read_under_both_plans(&mut c, "messages", |_| execute.clone());
    assert!(read.iter().all(|(_, _, read)| *read <= window as f64), "{read:?}");
    let got: Vec<String> = c.query(&execute, &[]).unwrap().iter().map(|r| r.get(0)).collect();
    let want: Vec<String> = (total - 31..=total).map(|g| format!("c{}", g % 500)).collect();
    assert_eq!(got, want, "the 32 most recent, least recent first");
    // A conversation last answered before the window is not held (it is
    // recalled when it speaks again); the query does not reach back for it.
    let old = format!("EXECUTE recent('a', {}, 32, {window})", upto + 2 * window);
    assert!(c.query(&old, &[]).unwrap().is_empty());
}

/// What recalling a dropped conversation and handing out a message read
/// must not grow with the agent's history: with 4,000 answered messages
/// (500 in the recalled conversation, the rest in 37 others) and 2,000 commit events (a hundred of
/// them compactions), each statement reads about what it returns, under the
/// custom and the generic plan.
#[test]
fn recalling_a_conversation_and_handing_out_a_message_read_only_their_rows_however_long_the_history() {
    let Some(pg) = TestPg::start() else { return };
    choird::db::Db::connect(&pg.url()).unwrap().migrate().unwrap();
    let mut c = pg.client();
    c.batch_execute(
        "INSERT INTO messages (agent_id, conversation, sender, text, reply, replied_at)
             SELECT 'a', CASE WHEN g % 8 = 0 THEN 'big' ELSE 'c' || (g % 37) END, 'u', 'q' || g, 'r' || g, now()
             FROM generate_series(1, 4000) g;
         INSERT INTO messages (agent_id, conversation, sender, text) VALUES ('a', 'big', 'u', 'new');
         INSERT INTO commit_events (agent_id, seq, prev_hash, hash, event)
             SELECT 'a', g, 'p', 'h', CASE WHEN g % 20 = 0
                 THEN jsonb_build_object('kind', 'compaction', 'outcome', 'ok',
                          'input', jsonb_build_object('conversation', CASE WHEN g % 40 = 0 THEN 'big' ELSE 'other' END,
                                                      'upto_message', g),
                          'result', jsonb_build_object('summary', 's' || g))
                 ELSE jsonb_build_object('kind', 'tool_call', 'outcome', 'ok', 'tool', 'choir.fs.read') END
             FROM generate_series(1, 2000) g;
         ANALYZE messages; ANALYZE commit_events;",
    )
    .unwrap();
    let prepare = |c: &mut postgres::Client, name: &str, types: &str, sql: &str| {
        c.batch_execute(&format!("PREPARE {name}({types}) AS {sql}")).unwrap();
    };
    prepare(&mut c, "tail", "text, text, bigint, bigint, bigint", choird::store::EXCHANGES_AFTER);
    prepare(&mut c, "summary", "text, text", choird::store::COMPACTION_OF);
    prepare(&mut c, "pending", "text, bigint, bigint", choird::store::PENDING_MESSAGES);
    let tail = rows_read_under_both_plans(&mut c, "messages", |_| {
        "EXECUTE tail('a', 'big', 1000, 9223372036854775807, 10)".to_owned()
    });
    // Ten answered, and the one unanswered message of the conversation skipped.
    assert!(tail.iter().all(|(_, _, read)| *read <= 11.0), "the last ten exchanges, not the conversation: {tail:?}");
    let summary = rows_read_under_both_plans(&mut c, "commit_events", |_| "EXECUTE summary('a', 'big')".to_owned());
    assert!(summary.iter().all(|(_, _, read)| *read <= 1.0), "the latest compaction, not the log: {summary:?}");
    let pending = rows_read_under_both_plans(&mut c, "messages", |_| "EXECUTE pending('a', 0, 32)".to_owned());
    assert!(pending.iter().all(|(_, _, read)| *read <= 2.0), "the message and one probe: {pending:?}");
    let row = c.query_one("EXECUTE pending('a', 0, 32)", &[]).unwrap();
    assert_eq!((row.get::<_, String>(3), row.get::<_, bool>(4)), ("new".to_owned(), true), "it had messages before");
    let summary: String = c.query_one("EXECUTE summary('a', 'big')", &[]).unwrap().get(0);
    assert_eq!(summary, "s2000", "the latest of the conversation's compactions");
}

#[test]
fn after_a_restart_the_most_recent_conversations_are_held_and_an_older_one_is_recalled() {
    let Some(pg) = TestPg::start() else { return };
    let recovered = choir_common::rpc::RECOVERED_CONVERSATIONS;
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        Some(Step::Text(format!("re: {}", last["content"].as_str().unwrap_or_default())))
    });
    let config = test_config(&edge.base_url(), Some(&pg.url()), &["demo"]);
    let mut choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    // The oldest conversation first, then as many as a restart brings back.
    for i in 0..=recovered {
        assert_eq!(chat_in(&choird, &format!("k{i}"), &format!("I am {i}")), format!("re: I am {i}"));
    }
    choird.ctl_ok(&["agent", "stop", "demo"]);
    choird.restart();
    choird.ctl_ok(&["agent", "start", "demo"]);
    // The newest came back in the recovery snapshot, the oldest by a recall:
    // both answer with their earlier exchange in the model's view.
    for i in [recovered, 0] {
        assert_eq!(chat_in(&choird, &format!("k{i}"), "who am I?"), "re: who am I?");
        let view = contents(&edge.requests().last().unwrap().body);
        assert_eq!(
            view,
            vec![format!("user: I am {i}"), format!("assistant: re: I am {i}"), "user: who am I?".to_owned()],
            "conversation k{i}"
        );
    }
}
