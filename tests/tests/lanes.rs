//! The edge lane's behaviour at its edges: step budgets, model failures and
//! rate limits, the chat REPL, and config reload.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::FakeTelegram;
use choir_tests::harness::{bin, test_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::json;

#[test]
fn the_step_budget_ends_a_turn_that_never_stops_calling_tools() {
    let Some(pg) = TestPg::start() else { return };
    let fake =
        FakeLlm::start_on("127.0.0.1:0", vec![], Some(Step::call("choir.fs.read", json!({"path": "missing.txt"}))))
            .unwrap();
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["agents"]["demo"]["max_steps_per_turn"] = json!(3);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let answer = choird.ctl_err(&["chat", "demo", "loop forever"]);
    assert_eq!(answer, "choirctl: I stopped after 3 model steps without finishing; please narrow the request.\n");
    assert_eq!(fake.requests().len(), 3);
}

#[test]
fn a_rate_limited_model_call_is_retried_after_the_servers_delay() {
    let Some(Scenario { pg, llm: fake, choird }) = Scenario::new()
        .model(vec![Step::rate_limited(1), Step::Text("after the wait".into())])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let started = Instant::now();
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "after the wait\n");
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After was honoured");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].body, reqs[1].body, "the retry is the same request");
    let statuses = || -> Vec<i32> {
        pg.client().query("SELECT status FROM llm_calls ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    // A streamed call is recorded once its end went out to the agent.
    choir_tests::observe::wait_for("both calls recorded", Duration::from_secs(5), || statuses().len() >= 2);
    assert_eq!(statuses(), vec![429, 200], "both calls were recorded by the relay");
}

#[test]
fn a_model_that_refuses_the_request_gets_a_clear_answer_to_the_user() {
    let Some(Scenario { pg: _pg, llm: fake, choird }) = Scenario::new()
        .model(vec![Step::Raw {
        status: 401,
        body: json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}).to_string(),
        headers: vec![],
    }])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    // The user is told; `choirctl chat` exits 1 (it exited 0 on a failed turn).
    let answer = choird.ctl_err(&["chat", "demo", "hi"]);
    assert!(answer.starts_with("choirctl: Sorry, no answer from my model"), "{answer}");
    assert!(answer.contains("provider answered 401"), "{answer}");
    assert!(answer.contains("Incorrect API key provided"), "{answer}");
    assert_eq!(fake.requests().len(), 1, "a 401 is not retried");
    // The upstream 401 did not cost the agent its lease: it still answers.
    let out = choird.ctl_ok(&["--json", "agent", "status", "demo"]);
    assert!(out.contains("\"state\": \"running\""), "{out}");
}

#[test]
fn the_chat_repl_sends_one_message_per_line() {
    let Some(Scenario { pg: _pg, llm: fake, choird }) = Scenario::new()
        .model(vec![Step::Text("first answer".into()), Step::Text("second answer".into())])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let mut child = Command::new(bin("choirctl"))
        .arg("--home")
        .arg(choird.home.path())
        .args(["chat", "demo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n\nand again\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "demo> first answer\ndemo> second answer\n");
    let users: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| r.body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, vec!["hello", "and again"]);
    // One conversation: the second request carries the first exchange.
    assert_eq!(fake.requests()[1].body["messages"].as_array().unwrap().len(), 4);
}

#[test]
fn sighup_reloads_config_and_keeps_the_old_one_when_the_new_is_broken() {
    let Some(pg) = TestPg::start() else { return };
    let config = test_config("http://127.0.0.1:9/v1", Some(&pg.url()), &["demo"]);
    let choird = Choird::start(&config, &json!({}));
    let hup = || {
        let pid = rustix::process::Pid::from_raw(choird.pid() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    };
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{}", choird.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut bigger = config.clone();
    bigger["agents"]["second"] = json!({});
    std::fs::write(choird.home.path().join("config.json"), bigger.to_string()).unwrap();
    hup();
    wait_for("the new agent", &|| choird.ctl_ok(&["agent", "list"]).contains("second"));

    std::fs::write(choird.home.path().join("config.json"), r#"{"llm": 1}"#).unwrap();
    hup();
    wait_for("the refusal", &|| choird.stderr().contains("reload refused"));
    assert!(choird.stderr().contains("config.json: llm: expected an object, found 1"), "{}", choird.stderr());
    let list = choird.ctl_ok(&["agent", "list"]);
    assert!(list.contains("demo") && list.contains("second"), "{list}");
}

/// Regression: a message that arrived while the agent's replication thread was
/// in a HEARTBEAT was handed to that thread, which does not forward messages,
/// and was never answered.
#[test]
fn regression_a_message_is_never_handed_to_the_replication_heartbeat() {
    let n = 25;
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model((0..n).map(|i| Step::Text(format!("answer {i}"))).collect())
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    for i in 0..n {
        assert_eq!(choird.ctl_ok(&["chat", "demo", &format!("question {i}")]), format!("answer {i}\n"));
    }
}

/// A process agent killed when the test ends, whatever happened before.
struct Reap(i32);

impl Reap {
    /// Whether the process has exited (gone, or a zombie).
    fn gone(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0)).map_or(true, |s| s.contains(") Z "))
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(p) = rustix::process::Pid::from_raw(self.0) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

/// Regression: an agent whose choird died for good never left, even on
/// SIGTERM, because it kept trying to ship its last answer and events.
#[test]
fn regression_an_agent_whose_choird_is_gone_leaves_on_sigterm_and_keeps_its_log() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::start(vec![
        Step::call("choir.fs.write", json!({"path": "a.txt", "content": "x"})),
        Step::SlowText("a slow answer that choird will not live to see".into(), Duration::from_millis(300)),
    ]);
    let mut choird =
        Choird::start(&test_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let s: serde_json::Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    let pid = s["pid"].as_u64().unwrap() as i32;
    // Whatever happens below, the agent does not outlive the test.
    let reap = Reap(pid);
    let workspace = choird.workspace("demo");
    let home = choird.home.path().to_owned();
    let chat = std::thread::spawn(move || {
        Command::new(bin("choirctl")).arg("--home").arg(home).args(["chat", "demo", "write"]).output()
    });
    fake.wait_requests(2, Duration::from_secs(20));
    choird.kill();
    let _ = chat.join();
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), rustix::process::Signal::TERM).unwrap();
    let started = Instant::now();
    while !reap.gone() {
        assert!(started.elapsed() < Duration::from_secs(60), "the agent is still there after SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    // What it committed is still in its local log, for the next start.
    let log = std::fs::read_to_string(workspace.join(".choir/commit.log")).unwrap_or_default();
    assert!(log.contains("choir.fs.write"), "the commit log keeps the call");
}

/// choird's whole shutdown (Telegram gateway, scheduler, agents, memory
/// batcher, listeners, task threads) with the database gone under it: no
/// step may wait on PostgreSQL for long (systemd's stop would otherwise run
/// into its timeout and kill choird).
#[test]
fn choird_leaves_on_sigterm_promptly_when_its_database_is_gone() {
    const TOKEN: &str = "123456:shutdown";
    let emb = FakeEmbeddings::start(8);
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 123456, "shutdown_bot");
    let Some(Scenario { pg, llm: _fake, mut choird }) = Scenario::new()
        .responder(|req, _| {
        let msgs = req["messages"].as_array()?;
        if msgs.last()?["role"] == "tool" {
            return Some(Step::Text("stored".into()));
        }
        Some(Step::call("choir.memory.upsert", json!({"tier": "working", "content": "a note"})))
    })
        .agents(&["a", "b"])
        .config(|c| { c["telegram"] =
        json!({"api_base": tg.base_url(), "bots": {"b": {"token_secret": "tg", "users": {"20000": {"agent": "b"}}}}}); })
        .config(|c| c["memory"] = json!({"embeddings": {"base_url": emb.base_url(), "model": "fake-embed", "dimensions": 8}}))
        .secrets(json!({"llm_key": "k", "tg": TOKEN}))
        .build()
    else {
        return;
    };
    let mut agents = Vec::new();
    for agent in ["a", "b"] {
        choird.ctl_ok(&["agent", "start", agent]);
        let s: serde_json::Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", agent])).unwrap();
        agents.push(Reap(s["pid"].as_u64().unwrap() as i32));
    }
    assert_eq!(choird.ctl_ok(&["chat", "a", "hi"]), "stored\n");
    tg.user_says(TOKEN, 20000, "hi");
    tg.wait_count("sendMessage", 1, Duration::from_secs(30));
    pg.stop_immediate();
    // Traffic meets the missing database: a chat, a Telegram message, the
    // agents' HEARTBEATs.
    let home = choird.home.path().to_owned();
    let chat = std::thread::spawn(move || {
        Command::new(bin("choirctl")).arg("--home").arg(home).args(["chat", "a", "again"]).output()
    });
    tg.user_says(TOKEN, 20000, "again");
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let status = choird.stop().unwrap();
    let took = started.elapsed();
    eprintln!("choird left {took:?} after SIGTERM ({status})");
    assert!(took < Duration::from_secs(10), "choird took {took:?} to leave:\n{}", choird.stderr());
    assert!(agents.iter().all(Reap::gone), "the agents were stopped with choird");
    // The chat ended with choird, whatever it was told.
    let _ = chat.join();
}

/// Regression: a message that drew its id before a later message of its
/// agent and committed after the agent was handed the later one was never
/// answered (the agent is handed messages past a position). Here the first
/// message's transaction stays open (as a slow commit would) while a chat
/// sends the second: the second waits for the first, and both are answered.
#[test]
fn regression_a_message_committing_after_a_later_one_is_still_answered() {
    let Some(pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|req, _| {
        let msgs = req["messages"].as_array()?;
        let asked = msgs.iter().rev().find(|m| m["role"] == "user")?["content"].as_str()?.to_owned();
        Some(Step::Text(format!("done: {asked}")))
    });
    let config = test_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hello"]), "done: hello\n");
    let mut held = pg.client();
    let mut first = held.transaction().unwrap();
    let first_id: i64 =
        first.query_one(choird::store::INSERT_MESSAGE, &[&"demo", &"held", &"someone", &"first"]).unwrap().get(0);
    let home = choird.home.path().to_owned();
    let chat = std::thread::spawn(move || {
        Command::new(bin("choirctl")).arg("--home").arg(home).args(["chat", "demo", "second"]).output().unwrap()
    });
    let waiting = || -> i64 {
        pg.client()
            .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", &[])
            .unwrap()
            .get(0)
    };
    wait_for("the second message to wait for the first's commit", Duration::from_secs(30), || waiting() == 1);
    first.commit().unwrap();
    let out = chat.join().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done: second\n", "{}", String::from_utf8_lossy(&out.stderr));
    let answered = || -> Option<String> {
        pg.client().query_one("SELECT reply FROM messages WHERE id = $1", &[&first_id]).unwrap().get(0)
    };
    wait_for("the first message's answer", Duration::from_secs(30), || answered().is_some());
    assert_eq!(answered().as_deref(), Some("done: first"));
}
