//! The cost ledger: every relayed model call is recorded
//! with its estimated cost from the operator's price table, and
//! `choirctl usage` sums it by day, model, lane or agent.

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

#[test]
fn each_model_call_is_in_the_ledger_with_its_cost_and_usage_sums_it() {
    let Some(Scenario { pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "u.txt", "content": "u"})),
            Step::Text("counted".into()),
        ])
        .config(|c| c["llm"]["prices"] = json!({"fake-edge": {"prompt_per_mtok": 2.0, "completion_per_mtok": 10.0}}))
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "count"]).trim(), "counted");

    // Two edge calls of 10 prompt and 5 completion tokens (the fake's usage).
    let by_model: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "demo", "--by", "model"])).unwrap();
    let rows = by_model["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{by_model}");
    assert_eq!((&rows[0]["key"], &rows[0]["calls"]), (&json!("fake-edge"), &json!(2)));
    assert_eq!((&rows[0]["prompt_tokens"], &rows[0]["completion_tokens"]), (&json!(20), &json!(10)));
    let cost = rows[0]["cost_usd"].as_f64().unwrap();
    assert!((cost - 2.0 * (10.0 * 2.0 + 5.0 * 10.0) / 1e6).abs() < 1e-12, "{cost}");
    let by_lane: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "--by", "lane"])).unwrap();
    assert_eq!(by_lane["rows"][0]["key"], "edge");
    let table = choird.ctl_ok(&["usage", "--since", "1h"]);
    assert!(table.contains("DAY") && table.contains("total") && table.contains("$0.0001"), "{table}");
    let later: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "--since", "2999-01-01"])).unwrap();
    assert_eq!(later["rows"], json!([]));
    // The same calls are in the ledger table with their cost.
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let costed: i64 =
        db.query_one("SELECT count(*) FROM llm_calls WHERE agent_id = 'demo' AND cost_usd > 0", &[]).unwrap().get(0);
    assert_eq!(costed, 2);

    // Bad input is refused with the fix.
    assert!(choird.ctl_err(&["usage", "--by", "week"]).contains("use day, model, lane, agent or job"));
    assert!(choird.ctl_err(&["usage", "--since", "soon"]).contains("give a time"));
    assert!(choird.ctl_err(&["usage", "ghost"]).contains("no agent \"ghost\""));
}

#[test]
fn crossing_80_percent_of_a_daily_budget_tells_the_agents_admins_once() {
    use choir_tests::fake_telegram::{texts_by_chat, FakeTelegram};
    const TOKEN: &str = "111111:AAAA-secret-token-a";
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 111111, "alpha_bot");
    // 15 tokens a call: 30 of 40 is 75 %, 45 crosses 80 %.
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![
        Step::Text("one".into()),
        Step::Text("two".into()),
        Step::Text("three".into()),
        Step::Text("four".into()),
    ])
        .config(|c| c["agents"]["demo"] = json!({"token_budget": {"per_day": 40}}))
        .config(|c| { c["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 50,
        "bots": {"a": {"token_secret": "tg_a", "users": {"501": {"agent": "demo", "admin": true}, "502": {"agent": "demo"}}}}}); })
        .secrets(json!({"llm_key": "k", "tg_a": TOKEN}))
        .running()
        .build()
    else {
        return;
    };
    for answer in ["one", "two"] {
        assert_eq!(choird.ctl_ok(&["chat", "demo", "go"]).trim(), answer);
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(tg.sent("sendMessage").is_empty(), "no warning under 80 %");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "go"]).trim(), "three");
    tg.wait_calls("the warning", std::time::Duration::from_secs(20), |c| c.iter().any(|c| c.method == "sendMessage"));
    // Over the budget now: the next call is refused (the agent says so), and
    // no second warning.
    let refused = choird.ctl_err(&["chat", "demo", "go"]); // a failed turn: exit 1
    assert!(refused.contains("token budget for today"), "{refused}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let texts = texts_by_chat(&tg.sent("sendMessage"));
    let to_admin = texts.get(&501).cloned().unwrap_or_default();
    assert_eq!(to_admin.len(), 1, "{texts:?}");
    assert!(to_admin[0].contains("45 of its 40 tokens for today (112%)"), "{to_admin:?}");
    assert!(!texts.contains_key(&502), "only admins are told: {texts:?}");
    let audit = choird.ctl_ok(&["--json", "audit", "--agent", "demo", "--limit", "500"]);
    assert_eq!(audit.matches("budget.warning").count(), 1, "{audit}");
}

#[test]
fn a_core_jobs_model_calls_are_in_the_ledger_under_its_name() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::with_responder(|req, _| {
        if req["model"] == "fake-core" {
            return Some(Step::Text("tallied".into()));
        }
        let last = req["messages"].as_array()?.last()?.clone();
        Some(match last["content"].as_str() {
            Some("start the tally") => {
                Step::call("choir.core.start", json!({"name": "tally", "objective": "Count the things."}))
            }
            _ => Step::Text("ok".into()),
        })
    });
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["chat", "demo", "start the tally"]);
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    choir_tests::observe::wait_for("the job's call", std::time::Duration::from_secs(30), || {
        let n: i64 = db.query_one("SELECT count(*) FROM llm_calls WHERE job = 'tally'", &[]).unwrap().get(0);
        n >= 1
    });
    let lanes: Vec<(String, Option<String>)> = db
        .query("SELECT DISTINCT lane, job FROM llm_calls ORDER BY lane", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(lanes, [("core".to_owned(), Some("tally".to_owned())), ("edge".to_owned(), None)]);
    let by_job: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "usage", "--by", "job"])).unwrap();
    let keys: Vec<&str> = by_job["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["-", "tally"], "{by_job}");
    // The connection that relayed the job's call is served below the edge;
    // choird's other threads keep their priority.
    let threads = choir_tests::observe::thread_nices(choird.pid());
    let lowered: Vec<&(String, i32)> = threads.iter().filter(|(_, nice)| *nice == 10).collect();
    assert!(!lowered.is_empty() && lowered.iter().all(|(name, _)| name == "rpc-demo-c"), "{threads:?}");
    assert!(threads.iter().any(|(name, nice)| name == "choird" && *nice == 0), "{threads:?}");
}

#[test]
fn the_hosts_budget_bounds_all_agents_together() {
    // 15 tokens a call (the fake's usage): 30 of 40 by alpha, then beta's
    // call takes all agents past 80 %, and the next call of either is refused.
    let Some(Scenario { pg, llm: _fake, choird }) = Scenario::new()
        .responder(|_, _| Some(Step::Text("fine".into())))
        .agents(&["alpha", "beta"])
        .config(|c| c["token_budget"] = json!({"per_day": 40}))
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    for _ in 0..2 {
        assert_eq!(choird.ctl_ok(&["chat", "alpha", "go"]).trim(), "fine");
    }
    assert_eq!(choird.ctl_ok(&["chat", "beta", "go"]).trim(), "fine");
    let audit = choird.ctl_ok(&["--json", "audit", "--agent", "beta", "--limit", "500"]);
    assert!(audit.contains("all agents together have used 45 of the host's 40 tokens for today"), "{audit}");
    let refused = choird.ctl_err(&["chat", "alpha", "go"]); // a failed turn: exit 1
    assert!(refused.contains("host's token budget for today"), "the refusal names the host's budget: {refused}");
    // Each agent's own standing is its own: neither has a budget of its own.
    let calls: i64 = postgres::Client::connect(&pg.url(), postgres::NoTls)
        .unwrap()
        .query_one("SELECT count(*) FROM llm_calls WHERE status = 200", &[])
        .unwrap()
        .get(0);
    assert_eq!(calls, 3, "the refused call never went upstream");
}

/// The answer "hello" to message `id` of agent demo in conversation c1.
fn answer(store: &choird::store::Store, id: u64) -> choird::store::Recorded {
    let demo = choir_common::ids::AgentId::parse("demo").unwrap();
    let reply = choir_common::rpc::OutboundReply {
        in_reply_to: id,
        covers: vec![],
        key: String::new(),
        conversation: "c1".into(),
        text: "hello".into(),
        failed: false,
    };
    store.record_replies(&demo, &[reply], id, &choird::store::Nowhere).unwrap()
}

/// A model call of `tokens` prompt tokens for `agent` in `session`.
fn call(store: &choird::store::Store, agent: &str, session: i64, tokens: u64) {
    let agent = choir_common::ids::AgentId::parse(agent).unwrap();
    let used = choird::store::Tokens::plain(tokens, 1);
    let call = choird::store::ledger::Call::now(&agent, session, "edge", None, "m", 200, used, 3, false, Some(0.5));
    store.record_llm_call(call);
}

/// Every relayed model call wrote its ledger row in a statement and a
/// commit of its own: on a plain turn a third of PostgreSQL's work
/// (`docs/benchmarks.md`). Now the row goes with the next answer's
/// statement: the same transaction as the answer (the same `xmin`), and
/// nothing waits after it. Reads of the ledger through the store see a
/// call recorded before them (they write what waits first); past
/// `MAX_WAITING` rows the call writes them at once; a row keeps the time it
/// was recorded at.
#[test]
fn regression_a_model_calls_ledger_row_was_a_statement_and_a_commit_of_its_own() {
    use choird::store::ledger::MAX_WAITING;
    let Some(pg) = TestPg::start() else { return };
    let store = pg.store();
    let mut db = pg.client();
    let demo = choir_common::ids::AgentId::parse("demo").unwrap();
    let session = store.create_session(&demo, "process", b"t").unwrap();
    let rows =
        |db: &mut postgres::Client| -> i64 { db.query_one("SELECT count(*) FROM llm_calls", &[]).unwrap().get(0) };

    // Carried by the answer: one transaction.
    let queued = store.insert_message(&demo, "c1", "op", "hi").unwrap();
    let before = std::time::SystemTime::now();
    call(&store, "demo", session, 10);
    assert_eq!(store.ledger_waiting(), 1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let recorded = answer(&store, queued.id);
    assert_eq!(recorded.new.len(), 1, "the answer is stored");
    assert_eq!(store.ledger_waiting(), 0, "the answer took the waiting row");
    let same: bool = db
        .query_one(
            "SELECT l.xmin::text = m.xmin::text FROM llm_calls l, messages m WHERE m.id = $1",
            &[&(queued.id as i64)],
        )
        .unwrap()
        .get(0);
    assert!(same, "the row was written by the answer's own statement");
    // Its time is when it was recorded, not when it was written.
    let at: f64 = db.query_one("SELECT extract(epoch FROM at)::float8 FROM llm_calls", &[]).unwrap().get(0);
    let recorded_at = before.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!((at - recorded_at).abs() < 0.2, "recorded at {recorded_at}, stored as {at}");
    let day: i64 = db.query_one("SELECT tokens FROM token_usage WHERE agent_id = 'demo'", &[]).unwrap().get(0);
    assert_eq!(day, 11, "the day's sum moved with it");

    // A read through the store writes what waits first.
    call(&store, "demo", session, 20);
    assert_eq!(rows(&mut db), 1, "it waits for a carrier");
    assert_eq!(store.token_usage(&demo).unwrap().0, 32);
    assert_eq!(rows(&mut db), 2);
    call(&store, "demo", session, 30);
    let report = store.usage(Some("demo"), None, choird::store::usage::UsageBy::Agent).unwrap();
    assert_eq!(report.rows[0].calls, 3, "{report:?}");

    // Bounded: the call that fills the queue writes it.
    for _ in 0..MAX_WAITING {
        call(&store, "demo", session, 1);
    }
    assert_eq!(store.ledger_waiting(), 0);
    assert_eq!(rows(&mut db), 3 + MAX_WAITING as i64);
}

/// A ledger row the database refuses (here a session it does not know,
/// and token counts past `bigint` that a hostile provider reported) must
/// not cost an answer or the other rows: the carrier's statement
/// fails, the rows are written alone, the refused one is dropped, and the
/// answer is stored without them.
#[test]
fn a_ledger_row_the_database_refuses_costs_neither_the_answer_nor_the_other_rows() {
    let Some(pg) = TestPg::start() else { return };
    let store = pg.store();
    let mut db = pg.client();
    let demo = choir_common::ids::AgentId::parse("demo").unwrap();
    let session = store.create_session(&demo, "process", b"t").unwrap();
    let queued = store.insert_message(&demo, "c1", "op", "hi").unwrap();
    call(&store, "demo", session, 10);
    call(&store, "demo", session + 1_000, 20); // no such session
    call(&store, "demo", session, u64::MAX); // a provider's absurd usage: past bigint
    call(&store, "demo", session, 30);
    let recorded = answer(&store, queued.id);
    assert_eq!(recorded.new.len(), 1, "the answer is stored");
    assert_eq!(store.reply_of(&demo, queued.id).unwrap().as_deref(), Some("hello"));
    assert_eq!(store.ledger_waiting(), 0, "nothing is left to fail the next answer");
    let kept: Vec<i64> =
        db.query("SELECT prompt_tokens FROM llm_calls ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(kept, vec![10, 30], "the good rows in their order; the refused one dropped");
    // Bad input changes nothing else: the day's sum counts the stored rows only.
    let day: i64 = db.query_one("SELECT tokens FROM token_usage WHERE agent_id = 'demo'", &[]).unwrap().get(0);
    assert_eq!(day, 42);
}

/// A ledger row no answer carries is written by the signal loop's round
/// within a second. Here the model answers 429 with a Retry-After of 5 s:
/// its row is recorded and no answer follows for 5 s, yet the row is in
/// the table well before (the negative control, without the round, waited
/// the 5 s for the answer to carry it, past this test's 3 s).
#[test]
fn a_ledger_row_no_answer_carries_is_written_within_a_second() {
    let Some(Scenario { pg, llm: fake, choird }) = Scenario::new()
        .model(vec![Step::rate_limited(5), Step::Text("after the wait".into())])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let statuses = || -> Vec<i32> {
        pg.client().query("SELECT status FROM llm_calls ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    std::thread::scope(|s| {
        let chat = s.spawn(|| choird.ctl_ok(&["chat", "demo", "hi"]));
        choir_tests::observe::wait_for("the model's refusal", std::time::Duration::from_secs(10), || {
            fake.requests().len() == 1
        });
        let refused = std::time::Instant::now();
        choir_tests::observe::wait_for("its row, before any answer", std::time::Duration::from_secs(3), || {
            !statuses().is_empty()
        });
        assert!(!chat.is_finished() && refused.elapsed() < std::time::Duration::from_secs(4), "no answer carried it");
        assert_eq!(statuses(), vec![429]);
        assert_eq!(chat.join().unwrap(), "after the wait\n");
    });
}
