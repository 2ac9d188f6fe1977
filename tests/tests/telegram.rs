//! The Telegram gateway against a protocol-exact fake of the Bot API:
//! routing of several bots, users and agents, refusals, long answers and
//! rate limits, approvals from inline buttons, files both ways, exactly-once
//! across a SIGKILL of choird, and recovery from the Bot API's failures.

use std::time::Duration;

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::{texts_by_chat, FakeTelegram};
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::{system_of, wait_for};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const TOKEN_A: &str = "111111:AAAA-secret-token-a";
const TOKEN_B: &str = "222222:BBBB-secret-token-b";

/// The model: each agent says who it is and echoes the user messages of
/// the current turn.
fn echo_model() -> FakeLlm {
    FakeLlm::with_responder(|req, _| {
        let me = system_of(req).split_whitespace().nth(2).unwrap_or("?").trim_end_matches(',').to_owned();
        let msgs = req["messages"].as_array()?;
        let last_answer = msgs.iter().rposition(|m| m["role"] == "assistant").map(|i| i + 1).unwrap_or(0);
        let heard: Vec<&str> =
            msgs[last_answer..].iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect();
        Some(Step::Text(format!("{me} heard: {}", heard.join(" | "))))
    })
}

fn config(llm: &FakeLlm, pg: &TestPg, tg: &FakeTelegram, agents: &[&str], bots: Value) -> Value {
    let mut c = test_config(&llm.base_url(), Some(&pg.url()), agents);
    c["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 50,
                           "per_bot_per_s": 30, "bots": bots});
    c
}

fn secrets() -> Value {
    json!({"llm_key": "k", "tg_a": TOKEN_A, "tg_b": TOKEN_B})
}

fn sent_to(tg: &FakeTelegram, token: &str, chat: i64) -> Vec<String> {
    let calls: Vec<_> = tg.calls().into_iter().filter(|c| c.token == token).collect();
    texts_by_chat(&calls).remove(&chat).unwrap_or_default()
}

#[test]
fn two_bots_three_users_two_agents_each_message_reaches_its_agent_and_each_reply_its_chat() {
    let Some(pg) = TestPg::start() else { return };
    let llm = echo_model();
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    tg.add_bot(TOKEN_B, 222222, "beta_bot");
    let bots = json!({
        "a": {"token_secret": "tg_a", "users": {"501": {"agent": "alpha", "admin": true}, "502": {"agent": "beta"}}},
        "b": {"token_secret": "tg_b", "users": {"503": {"agent": "alpha"}}}
    });
    let choird = Choird::start(&config(&llm, &pg, &tg, &["alpha", "beta"], bots), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);
    choird.ctl_ok(&["agent", "start", "beta"]);

    tg.user_says(TOKEN_A, 501, "hello from 501");
    tg.user_says(TOKEN_A, 502, "hi from 502");
    tg.user_says(TOKEN_B, 503, "hey from 503");
    tg.user_says(TOKEN_A, 999, "who are you?");
    tg.user_says(TOKEN_A, 999, "hello??");
    tg.group_says(TOKEN_A, -100777, 501, "a group nobody configured");
    tg.wait_calls("three answers and one refusal", Duration::from_secs(30), |calls| {
        calls.iter().filter(|c| c.method == "sendMessage" && c.status == 200).count() >= 4
    });
    std::thread::sleep(Duration::from_millis(500));

    assert_eq!(sent_to(&tg, TOKEN_A, 501), ["alpha heard: hello from 501"]);
    assert_eq!(sent_to(&tg, TOKEN_A, 502), ["beta heard: hi from 502"]);
    assert_eq!(sent_to(&tg, TOKEN_B, 503), ["alpha heard: hey from 503"]);
    let refusals = sent_to(&tg, TOKEN_A, 999);
    assert_eq!(refusals.len(), 1, "one polite refusal, not one per message: {refusals:?}");
    assert!(refusals[0].contains("ask the operator to add your Telegram id (999)"), "{refusals:?}");
    assert!(sent_to(&tg, TOKEN_A, -100777).is_empty(), "an unconfigured group is ignored");
    assert!(sent_to(&tg, TOKEN_B, 501).is_empty() && sent_to(&tg, TOKEN_A, 503).is_empty());

    // Conversations are kept apart per bot and user.
    let rows = pg.client().query("SELECT agent_id, conversation, sender FROM messages ORDER BY id", &[]).unwrap();
    let mut seen: Vec<(String, String, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("alpha".to_owned(), "tg:a:501".to_owned(), "telegram:501".to_owned()),
            ("alpha".to_owned(), "tg:b:503".to_owned(), "telegram:503".to_owned()),
            ("beta".to_owned(), "tg:a:502".to_owned(), "telegram:502".to_owned()),
        ]
    );
    // The unknown user is audited for each message.
    let audit = choird.ctl_ok(&["--json", "audit", "--limit", "200"]);
    assert_eq!(audit.matches("telegram.unknown_user").count(), 2, "{audit}");
    // The offsets were confirmed: nothing is left for Telegram to send again.
    assert_eq!((tg.unconfirmed(TOKEN_A), tg.unconfirmed(TOKEN_B)), (0, 0));
    // Tokens appear in no log.
    let log =
        std::fs::read_to_string(choird.home.path().join("logs/choird.log")).unwrap_or_default() + &choird.stderr();
    assert!(!log.contains("AAAA-secret") && !log.contains("BBBB-secret"), "a bot token reached the log");

    let status = || -> Value { serde_json::from_str(&choird.ctl_ok(&["--json", "telegram", "status"])).unwrap() };
    wait_for("every update handled", Duration::from_secs(10), || {
        let s = status();
        s["bots"][0]["queued_updates"] == 0 && s["bots"][1]["queued_updates"] == 0 && s["bots"][0]["updates"] == 5
    });
    let status = status();
    let a = &status["bots"][0];
    assert_eq!((a["bot"].as_str(), a["enabled"].as_bool(), a["users"].as_u64()), (Some("a"), Some(true), Some(2)));
    assert!(a["queued_outbox"] == 0 && a["sent"].as_u64().unwrap() == 3, "{status}");
    let human = choird.ctl_ok(&["telegram", "status"]);
    assert!(human.contains("BOT") && human.contains("a ") && human.contains("b "), "{human}");
}
