//! The fault matrix: what a user sees when a part fails at a bad moment.
//! Process runtime, real PostgreSQL, the scripted model. Each test kills or
//! starves a part where it hurts and asserts the user-visible outcome:
//! every stored message answered once, no side effect run twice, nothing
//! left running. (docs/faults.md lists the matrix and its results.)

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

/// The pid of the running process-runtime agent `agent`.
fn agent_pid(choird: &Choird, agent: &str) -> Option<u32> {
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", agent])).ok()?;
    status["pid"].as_u64().map(|p| p as u32)
}

/// SIGKILLs the process-runtime agent and waits until choird has started
/// another one (a new pid, running).
fn kill_agent_and_wait_restart(choird: &Choird, agent: &str) {
    let pid = agent_pid(choird, agent).expect("the agent runs");
    choir_common::proc_tree::signal(pid as i32, rustix::process::Signal::KILL);
    wait_for("the agent restarted", Duration::from_secs(60), || {
        agent_pid(choird, agent).is_some_and(|p| p != pid) && {
            let out = choird.ctl(&["--json", "agent", "status", agent]);
            serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|s| s["state"] == "running")
        }
    });
}

/// Posts `text` in `conversation` on a thread of its own (a chat waits for
/// its answer); the thread's result is the HTTP body, or the error.
fn post(choird: &Choird, conversation: &str, text: &str) -> std::thread::JoinHandle<Result<Value, String>> {
    let socket = choird.home.path().join("socks/choird.sock");
    let body = json!({"text": text, "conversation": conversation, "timeout_s": 120});
    std::thread::spawn(move || {
        let admin = choir_common::unix_http::agent_for_socket(&socket, None);
        match admin.post("http://localhost/admin/v1/agents/demo/chat").send_json(body) {
            Ok(mut r) => r.body_mut().read_json::<Value>().map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
}

/// The stored (text, reply) of every message, in id order.
fn messages(pg: &TestPg) -> Vec<(String, Option<String>)> {
    let rows = pg.client().query("SELECT text, reply FROM messages ORDER BY id", &[]).unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Waits until the message with `text` is stored.
fn wait_stored(pg: &TestPg, text: &str) {
    wait_for(&format!("message {text:?} stored"), Duration::from_secs(20), || {
        messages(pg).iter().any(|(t, _)| t == text)
    });
}

/// Regression: B1 (a slow tool) from one conversation, then A1 from another,
/// then B2, which joins B's running turn. The answer to B1 + B2 moved the
/// agent's one processed position past A1, and an agent killed while A1's
/// tool ran was never handed A1 again: stored, never answered, nobody told.
/// Now a restarted agent is handed every unanswered message, and A1 is
/// answered once; B1 and B2 are not answered again.
#[test]
fn regression_a_message_waiting_behind_another_conversations_answer_is_answered_after_the_agent_is_killed() {
    let Some(Scenario { pg, llm: fake, choird }) = Scenario::new()
        .model(vec![
            // B1's turn: a slow tool, while A1 and B2 arrive.
            Step::call("choir.exec", json!({"command": "sleep 3"})),
            // B's turn goes on with B2 injected, and answers both.
            Step::Text("answer to B".into()),
            // A1's turn: a slow tool, during which the agent is killed.
            Step::call("choir.exec", json!({"command": "sleep 30"})),
            // The restarted agent's turn for A1.
            Step::Text("answer to A".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };

    let b1 = post(&choird, "b", "B1");
    fake.wait_requests(1, Duration::from_secs(30));
    let a1 = post(&choird, "a", "A1");
    wait_stored(&pg, "A1");
    let b2 = post(&choird, "b", "B2");
    wait_stored(&pg, "B2");
    assert_eq!(b1.join().unwrap().unwrap()["reply"], "answer to B");
    assert_eq!(b2.join().unwrap().unwrap()["reply"], "answer to B", "B2 joined B1's turn");
    // A1's turn runs its slow tool: kill the agent there.
    fake.wait_requests(3, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    kill_agent_and_wait_restart(&choird, "demo");
    let _ = a1.join();

    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if messages(&pg).iter().all(|(_, reply)| reply.is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        messages(&pg),
        [
            ("B1".to_owned(), Some("answer to B".to_owned())),
            ("A1".to_owned(), Some("answer to A".to_owned())),
            ("B2".to_owned(), Some("answer to B".to_owned())),
        ],
        "every message answered, A1 after the restart"
    );
    // Four model calls: B was not asked again.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fake.request_count(), 4);
    let last = &fake.requests()[3].body["messages"];
    let users: Vec<&str> =
        last.as_array().unwrap().iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect();
    assert!(users.last().is_some_and(|u| u.contains("A1")), "the resumed turn is A1's: {users:?}");
}

/// Regression: under the process runtime, a tool whose agent was SIGKILLed
/// went on running on its own (reparented), and finished its side effect
/// beside the restarted agent's turn. Now choird ends what the dead agent
/// left running before it starts the next one.
#[test]
fn regression_a_killed_process_runtime_agents_tool_does_not_finish_on_its_own() {
    let Some(Scenario { pg, llm: fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.exec", json!({"command": "sleep 2; echo ran >> side.txt"})),
            Step::Text("done after the restart".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let chat = post(&choird, "cli", "append a line, slowly");
    fake.wait_requests(1, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    kill_agent_and_wait_restart(&choird, "demo");
    let _ = chat.join();
    wait_for("the answer after the restart", Duration::from_secs(30), || {
        messages(&pg).first().is_some_and(|(_, r)| r.as_deref() == Some("done after the restart"))
    });
    // Past the moment the orphaned tool would have written.
    std::thread::sleep(Duration::from_secs(3));
    let side = choird.workspace("demo").join("side.txt");
    assert!(!side.exists(), "the killed agent's tool ran on: {:?}", std::fs::read_to_string(&side));
}

/// Starts choird and the agent on `script`; one chat; its answer (or error).
fn one_chat(pg: &TestPg, script: Vec<Step>) -> (FakeLlm, String) {
    let fake = FakeLlm::start(script);
    let choird = Choird::start(&test_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let out = choird.ctl(&["chat", "demo", "tell me"]);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (fake, said)
}

/// Regression: a stream cut inside a chunk (half a line, then the end) was
/// taken as a malformed answer and never retried; a cut between chunks was.
/// Both are retried now, and the user gets the whole answer once.
#[test]
fn regression_a_stream_cut_inside_a_chunk_is_retried_like_a_cut_between_chunks() {
    for cut in [Step::CutInsideChunk, Step::CutStream] {
        let Some(pg) = TestPg::start() else { return };
        let (fake, said) = one_chat(&pg, vec![cut, Step::Text("the whole answer".into())]);
        assert_eq!(said, "the whole answer\n");
        assert_eq!(fake.request_count(), 2, "one retry");
    }
}

/// Regression: when every attempt's stream was cut, the user was told
/// "cannot reach choird". It is the model's failure, and says so.
#[test]
fn regression_a_model_whose_every_answer_is_cut_is_reported_as_the_models_failure() {
    let Some(pg) = TestPg::start() else { return };
    let (fake, said) =
        one_chat(&pg, vec![Step::CutInsideChunk, Step::CutStream, Step::CutInsideChunk, Step::CutStream]);
    assert!(said.starts_with("choirctl: Sorry, my model's answer was cut off"), "a failed turn: {said}");
    assert!(!said.contains("choird"), "{said}");
    assert_eq!(fake.request_count(), 4);
}

/// Regression: an answer the model ended at its length limit
/// (`finish_reason: length`) was delivered as if whole. It is marked.
#[test]
fn regression_an_answer_cut_at_the_length_limit_is_marked_for_the_user() {
    let Some(pg) = TestPg::start() else { return };
    let (_fake, said) = one_chat(&pg, vec![Step::Ended("The first half of".into(), "length".into())]);
    assert_eq!(said, format!("The first half of\n\n{}\n", choir_agent::lanes::reasoning::CUT_OFF_MARK));
    // Negative control: a `stop` ending is not marked.
    let pg = TestPg::start().unwrap();
    let (_fake, said) = one_chat(&pg, vec![Step::Ended("A whole answer.".into(), "stop".into())]);
    assert_eq!(said, "A whole answer.\n");
}

/// `choirctl status`'s database line.
fn database_line(choird: &Choird) -> String {
    choird.ctl_ok(&["status"]).lines().find(|l| l.contains("database:")).unwrap_or_default().to_owned()
}

/// choird's managed PostgreSQL, stopped crash-like (`pg_ctl stop -m
/// immediate`) while a turn's slow tool runs, then its postmaster
/// SIGKILLed: each time choird notices and starts it again, without a
/// human, within 10 s; the message in flight is answered once, and the
/// next message too. It used to stay down until a human started it.
#[test]
fn regression_the_managed_postgresql_is_started_again_by_choird_after_it_is_stopped_or_killed() {
    let Ok(bin) = choird::db::cluster::ManagedCluster::find_bin_dir(None) else {
        assert!(!choir_tests::services_required(), "PostgreSQL is required");
        eprintln!("SKIPPED: no PostgreSQL server binaries");
        return;
    };
    let fake = FakeLlm::start(vec![
        Step::call("choir.exec", json!({"command": "sleep 2; echo once >> slow.txt"})),
        Step::Text("answered after the outage".into()),
        Step::Text("and the next one".into()),
    ]);
    let choird = Choird::start(&test_config(&fake.base_url(), None, &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert!(database_line(&choird).ends_with(": up"), "{}", database_line(&choird));
    let pg = choird.home.path().join("pg");
    // A handle on the running cluster (adopted, not started).
    let cluster = choird::db::cluster::ManagedCluster::start(&pg, &bin).unwrap();
    let back_within = |what: &str| {
        let down = Instant::now();
        wait_for(&format!("PostgreSQL back after {what}"), Duration::from_secs(10), || {
            pg.join("data/postmaster.pid").exists() && database_line(&choird).contains(": up (restarted")
        });
        eprintln!("{what}: back after {:?}", down.elapsed());
    };

    let chat = post(&choird, "cli", "do the slow thing");
    fake.wait_requests(1, Duration::from_secs(30));
    cluster.stop_immediate().unwrap();
    back_within("pg_ctl stop -m immediate");
    let answer = chat.join().unwrap();
    // The chat's own wait may have broken with the database; the answer is stored once either way.
    wait_for("the answer after the outage", Duration::from_secs(30), || {
        let url = format!("host={} port=5432 user=postgres dbname=choir", pg.join("run").display());
        postgres::Client::connect(&url, postgres::NoTls)
            .and_then(|mut c| c.query("SELECT reply FROM messages WHERE reply IS NOT NULL", &[]))
            .is_ok_and(|rows| rows.len() == 1)
    });
    eprintln!("the chat in flight saw: {answer:?}");
    assert_eq!(std::fs::read_to_string(choird.workspace("demo").join("slow.txt")).unwrap(), "once\n");

    // SIGKILL of the postmaster: its pid file stays behind.
    let pid: i32 =
        std::fs::read_to_string(pg.join("data/postmaster.pid")).unwrap().lines().next().unwrap().parse().unwrap();
    choir_common::proc_tree::signal(pid, rustix::process::Signal::KILL);
    wait_for("the postmaster gone", Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z"))
    });
    let down = Instant::now();
    wait_for("PostgreSQL back after SIGKILL", Duration::from_secs(10), || {
        database_line(&choird).contains("restarted 2 time(s)")
    });
    eprintln!("SIGKILL: back after {:?}", down.elapsed());
    assert_eq!(choird.ctl_ok(&["chat", "demo", "still there?"]), "and the next one\n");
    let replies: i64 = {
        let url = format!("host={} port=5432 user=postgres dbname=choir", pg.join("run").display());
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one("SELECT count(*) FROM messages WHERE reply IS NOT NULL", &[]).unwrap().get(0)
    };
    assert_eq!(replies, 2, "each message answered once");
    assert_eq!(fake.request_count(), 3, "nothing asked twice");
}

/// Installs `x.post`, an external, non-idempotent operator tool (the kind
/// whose outcome a crash can make unknown): it reads its input line into
/// `$line`, runs `effect`, and answers "posted".
fn install_post(choird: &Choird, effect: &str) {
    let manifest = json!({
        "llm": {"name": "x.post", "description": "Posts a message (test).",
                "parameters": {"type": "object", "properties": {"body": {"type": "string"}}}},
        "runtime": {"exec_path": "post", "timeout_ms": 10000, "side_effect": "external", "idempotent": false,
                    "version": "1", "output_trust": "trusted", "roles": {"/body": "payload"}}
    });
    let script = format!("read -r line; {effect}; printf '{{\"summary\": \"posted\"}}\\n'");
    choir_tests::tool_calls::write_tool(&choird.tools_dir("global"), "post", &manifest, &script);
}

/// Regression: with the agent's workspace full, its commit log could not
/// take a call's result; the agent exited, was restarted, the resumed turn
/// ran the external call again, and failed again — one message's outside
/// effect ran 10 times, the reason only in the agent's log. Now the call's
/// intent is committed before it runs, a restart says "may have run"
/// instead of running it again, the crash loop ends after a few quick
/// crashes with the reason (ENOSPC) in `agent status` and the audit, a new
/// start is refused while the disk is nearly full, and once space is back
/// the message is answered, the call having run once.
#[test]
fn regression_a_full_disk_ends_the_crash_loop_explained_and_the_outside_call_runs_once() {
    let Some(pg) = TestPg::start() else { return };
    if !choir_tests::root_for("mounting the workspace image for the full disk") {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let posts = outside.path().join("posts.log");
    // A long body: every record of this call (its intent, its result, a
    // restart's completion of it) needs new pages of the commit log, so a
    // full disk fails each of them, whatever slack the log's last page has.
    let body = "hello ".repeat(2_000);
    let fake = FakeLlm::start(vec![
        Step::call("x.post", json!({ "body": body })),
        Step::Text("It may have been posted; I did not post it again.".into()),
    ]);
    // The workspace is its smallest quota, 16 MiB: the full disk is the
    // agent's own file system, as an operator's would be.
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["agents"]["demo"]["quotas"] = json!({"workspace_mb": 16, "workspace_inodes": 2048});
    let home = choir_tests::harness::TempHome::new(&config, &json!({"llm_key": "k"}));
    let choird = Choird::start_in(home);
    // An outside effect (a line in a file outside the workspace), then the
    // workspace filled, before the result is committed.
    install_post(
        &choird,
        &format!("echo posted >> {}; head -c 33554432 /dev/zero > big.bin 2>/dev/null", posts.display()),
    );
    choird.ctl_ok(&["agent", "start", "demo"]);
    let chat = post(&choird, "cli", "post hello");

    wait_for("choird to stop restarting the agent", Duration::from_secs(240), || {
        let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
        s["state"] == "stopped" && s["last_exit"].as_str().is_some_and(|e| e.starts_with("not restarted"))
    });
    let _ = chat.join();
    let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    let why = s["last_exit"].as_str().unwrap();
    assert!(why.contains("No space left on device"), "the reason is told: {why}");
    assert_eq!(std::fs::read_to_string(&posts).unwrap(), "posted\n", "the outside call ran once");
    let gave_up: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM audit WHERE action = 'agent.gave_up' AND agent_id = 'demo'", &[])
        .unwrap()
        .get(0);
    assert_eq!(gave_up, 1);
    // The user whose message waits is told, without the operator's details.
    let told = choir_tests::observe::notices(&pg);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("I stopped after failing several times") && !told[0].contains("/tmp"), "{told:?}");
    // While the disk is nearly full, nothing new starts, and status says why.
    let refused = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(refused.contains("nearly full"), "{refused}");
    assert!(choird.ctl_ok(&["status"]).contains("disk:     demo: the disk of the agent's workspace"));
    assert_eq!(fake.request_count(), 1, "the model was not asked again during the crash loop");

    // Space is back: the message is answered, told as "may have run".
    std::fs::remove_file(choird.workspace("demo").join("big.bin")).unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    wait_for("the answer once space is back", Duration::from_secs(30), || {
        messages(&pg).first().is_some_and(|(_, r)| r.is_some())
    });
    assert_eq!(messages(&pg)[0].1.as_deref(), Some("It may have been posted; I did not post it again."));
    let resumed = &fake.requests()[1].body;
    assert_eq!(choir_tests::observe::last_tool_result(resumed)["error"]["code"], "may_have_run");
    assert_eq!(std::fs::read_to_string(&posts).unwrap(), "posted\n", "and not again after");
}

/// A small seeded generator (xorshift64*), so a failing run can be replayed
/// with its seed (`CHOIR_FAULT_SEED`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

const BOT_TOKEN: &str = "333333:CCCC-secret-token-c";

/// The model of the random-kill run: it answers a turn with the user
/// messages it heard since its last answer ("answered: a, b"); a turn whose
/// messages ask to post first calls `x.post` with them (once per turn).
fn posting_model() -> FakeLlm {
    FakeLlm::with_responder(|req, _| {
        let msgs = req["messages"].as_array()?;
        let since = msgs
            .iter()
            .rposition(|m| m["role"] == "assistant" && m["tool_calls"].as_array().is_none_or(|c| c.is_empty()))
            .map_or(0, |i| i + 1);
        let turn = &msgs[since..];
        let heard: Vec<&str> =
            turn.iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect();
        let posted = turn.iter().any(|m| m["role"] == "tool");
        if !posted && heard.iter().any(|h| h.ends_with("post")) {
            return Some(Step::call("x.post", json!({"body": heard.join(", ")})));
        }
        Some(Step::SlowText(format!("answered: {}", heard.join(", ")), Duration::from_millis(20)))
    })
}

/// choird SIGKILLed at seeded random moments while three Telegram users
/// write and some messages make the agent post (an external, non-idempotent
/// call that takes a while): counted afterwards, no message is lost, none
/// is answered twice, no post runs twice (a post a kill interrupted is told
/// as one that may have run).
#[test]
fn choird_killed_at_random_points_under_telegram_traffic_loses_and_repeats_nothing() {
    let Some(pg) = TestPg::start() else { return };
    #[allow(clippy::disallowed_methods)] // a test's knob: the seed of a run to replay
    let seed = std::env::var("CHOIR_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_c401_u64);
    eprintln!("fault seed {seed} (CHOIR_FAULT_SEED replays it)");
    let (messages_n, kills) = (30u64, 6u32);
    let llm = posting_model();
    let tg = choir_tests::fake_telegram::FakeTelegram::start();
    tg.add_bot(BOT_TOKEN, 333333, "choir_bot");
    let mut config = test_config(&llm.base_url(), Some(&pg.url()), &["alpha"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 20,
        "per_bot_per_s": 30, "bots": {"c": {"token_secret": "tg_c", "users": {
            "501": {"agent": "alpha"}, "502": {"agent": "alpha"}, "503": {"agent": "alpha"}}}}});
    let mut choird = Choird::start(&config, &json!({"llm_key": "k", "tg_c": BOT_TOKEN}));
    let outside = tempfile::tempdir().unwrap();
    let posts = outside.path().join("posts.log");
    install_post(&choird, &format!("sleep 0.3; echo \"$line\" >> {}", posts.display()));
    choird.ctl_ok(&["agent", "start", "alpha"]);

    let mut rng = Rng(seed | 1);
    let plan: Vec<(i64, String, u64)> = (0..messages_n)
        .map(|i| {
            let user = 501 + (rng.next() % 3) as i64;
            let post = if rng.next().is_multiple_of(4) { " post" } else { "" };
            (user, format!("u{user}-m{i}{post}"), rng.between(30, 300))
        })
        .collect();
    let kill_at: Vec<u64> = (0..kills).map(|_| rng.between(300, 1500)).collect();
    std::thread::scope(|s| {
        let tg = &tg;
        let plan = &plan;
        s.spawn(move || {
            for (user, text, pause) in plan {
                tg.user_says(BOT_TOKEN, *user, text);
                std::thread::sleep(Duration::from_millis(*pause));
            }
        });
        for wait in &kill_at {
            std::thread::sleep(Duration::from_millis(*wait));
            let old = agent_pid(&choird, "alpha");
            choird.kill_and_restart();
            // The old agent loses its lease and leaves; then a new one is started.
            if let Some(old) = old {
                wait_for("the old agent to leave", Duration::from_secs(30), || {
                    std::fs::read_to_string(format!("/proc/{old}/stat")).map_or(true, |s| s.contains(") Z "))
                });
            }
            let _ = choird.ctl(&["agent", "start", "alpha"]);
            choird.wait_running("alpha");
        }
    });

    let answered = || -> (i64, i64, i64) {
        let mut c = pg.client();
        let mut n = |q: &str| c.query_one(q, &[]).unwrap().get::<_, i64>(0);
        (
            n("SELECT count(*) FROM messages"),
            n("SELECT count(*) FROM messages WHERE replied_at IS NULL"),
            n("SELECT count(*) FROM telegram_outbox WHERE sent_at IS NULL AND failed IS NULL"),
        )
    };
    let total = messages_n as i64;
    // Every message stored, answered and sent (else the counts below say
    // which were lost).
    let until = Instant::now() + Duration::from_secs(120);
    while answered() != (total, 0, 0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    // Each message is covered by exactly one answer the user got.
    let sent = choir_tests::fake_telegram::texts_by_chat(&tg.calls());
    let mut heard: Vec<String> = sent
        .values()
        .flatten()
        .filter_map(|t| t.strip_prefix("answered: "))
        .flat_map(|t| t.split(", ").map(str::to_owned).collect::<Vec<_>>())
        .collect();
    heard.sort();
    let mut expected: Vec<String> = plan.iter().map(|(_, t, _)| t.clone()).collect();
    expected.sort();
    let duplicates: Vec<&String> = heard.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
    let lost: Vec<&String> = expected.iter().filter(|t| !heard.contains(t)).collect();
    eprintln!(
        "seed {seed}: {kills} kills, {messages_n} messages: {} lost, {} answered twice",
        lost.len(),
        duplicates.len()
    );
    assert!(lost.is_empty(), "lost (seed {seed}): {lost:?}");
    assert!(duplicates.is_empty(), "answered twice (seed {seed}): {duplicates:?}");
    // No post ran twice.
    let posted = std::fs::read_to_string(&posts).unwrap_or_default();
    let mut lines: Vec<&str> = posted.lines().collect();
    lines.sort();
    let twice: Vec<&&str> = lines.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
    eprintln!("seed {seed}: {} post(s) ran, {} twice", lines.len(), twice.len());
    assert!(twice.is_empty(), "a post ran twice (seed {seed}): {twice:?}");
}
