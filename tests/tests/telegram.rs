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

fn one_bot(user_admin: bool) -> Value {
    json!({"a": {"token_secret": "tg_a", "users": {"501": {"agent": "alpha", "admin": user_admin}, "502": {"agent": "alpha"}}}})
}

#[test]
fn a_long_answer_is_split_in_order_and_a_burst_to_one_chat_keeps_the_per_chat_rate() {
    let Some(pg) = TestPg::start() else { return };
    let paragraph = |i: usize| format!("Paragraph {i}: {}", "lorem ipsum ".repeat(40));
    let long: String = (0..21).map(paragraph).collect::<Vec<_>>().join("\n\n");
    assert!(long.len() >= 10_000);
    let burst: String = (0..100).map(|i| format!("Part {i}: {}", "x".repeat(4000))).collect::<Vec<_>>().join("\n\n");
    let (long2, burst2) = (long.clone(), burst.clone());
    let llm = FakeLlm::with_responder(move |req, _| {
        let last = req["messages"].as_array()?.last()?["content"].as_str()?.to_owned();
        Some(match last.as_str() {
            "long" => Step::Text(long2.clone()),
            "burst" => Step::Text(burst2.clone()),
            _ => Step::SlowText("Let me think about that for a while.".into(), Duration::from_millis(1200)),
        })
    });
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    let choird = Choird::start(&config(&llm, &pg, &tg, &["alpha"], one_bot(false)), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);

    // A slow answer: the chat shows "typing" meanwhile.
    tg.user_says(TOKEN_A, 502, "think");
    tg.wait_calls("the slow answer", Duration::from_secs(30), |c| texts_by_chat(c).contains_key(&502));
    let typing = tg.sent("sendChatAction");
    assert!(typing.iter().any(|c| c.params["chat_id"] == 502 && c.params["action"] == "typing"), "no typing shown");

    tg.user_says(TOKEN_A, 501, "long");
    let calls = tg.wait_calls("the long answer", Duration::from_secs(30), |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| t.len() >= 3)
    });
    let parts = texts_by_chat(&calls).remove(&501).unwrap();
    assert_eq!(parts.len(), 3, "21 paragraphs of ~500 characters fit in three messages");
    assert!(parts.iter().all(|p| p.encode_utf16().count() <= 4096));
    assert!(parts[0].starts_with("Paragraph 0:") && parts[1].starts_with("Paragraph "), "cut at paragraphs");
    let words = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(words(&parts.join("\n")), words(&long), "nothing lost, nothing reordered");

    // 100 messages for one chat: all sent, in order, at most one per 50 ms.
    let before = tg.sent("sendMessage").len();
    tg.user_says(TOKEN_A, 501, "burst");
    let calls = tg.wait_calls("the burst", Duration::from_secs(60), |c| {
        c.iter().filter(|c| c.method == "sendMessage" && c.status == 200).count() >= before + 100
    });
    let burst_calls: Vec<_> =
        calls.iter().filter(|c| c.method == "sendMessage" && c.status == 200).skip(before).collect();
    assert_eq!(burst_calls.len(), 100);
    for (i, c) in burst_calls.iter().enumerate() {
        assert!(c.params["text"].as_str().unwrap().starts_with(&format!("Part {i}: ")), "message {i} out of order");
    }
    let min_gap = burst_calls.windows(2).map(|w| w[1].at.duration_since(w[0].at)).min().unwrap();
    assert!(min_gap >= Duration::from_millis(49), "two messages to one chat {min_gap:?} apart");
    assert!(calls.iter().all(|c| c.status != 429), "never rate limited by Telegram");
}

#[test]
fn admins_approve_and_reject_from_inline_buttons_and_others_cannot() {
    let Some(pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        match last["content"].as_str() {
            Some(t @ ("propose 5" | "propose 7")) => Some(Step::call(
                "choir.propose.config_change",
                json!({"changes": {"max_steps_per_turn": t[8..].parse::<u32>().unwrap()}, "reason": "fewer steps"}),
            )),
            _ if last["role"] == "tool" => Some(Step::Text("Proposed; an admin will decide.".into())),
            _ => Some(Step::Text("noted".into())),
        }
    });
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    let choird = Choird::start(&config(&llm, &pg, &tg, &["alpha"], one_bot(true)), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);

    tg.user_says(TOKEN_A, 502, "propose 5");
    // The admin (501), and only the admin, is asked, with three buttons.
    let calls = tg.wait_calls("the question to the admin", Duration::from_secs(30), |c| {
        c.iter().any(|c| c.method == "sendMessage" && c.status == 200 && c.params["reply_markup"].is_object())
    });
    let ask = calls.iter().find(|c| c.method == "sendMessage" && c.params["reply_markup"].is_object()).unwrap();
    assert_eq!(ask.params["chat_id"], 501);
    let text = ask.params["text"].as_str().unwrap();
    assert!(text.starts_with("Proposal 1 from agent alpha: config_change config: max_steps_per_turn"), "{text}");
    let buttons = &ask.params["reply_markup"]["inline_keyboard"][0];
    let labels: Vec<&str> = buttons.as_array().unwrap().iter().map(|b| b["text"].as_str().unwrap()).collect();
    assert_eq!(labels, ["Approve", "Reject", "Show"]);
    let data = |i: usize| buttons[i]["callback_data"].as_str().unwrap().to_owned();
    assert!(data(0).starts_with("ap:1:") && data(0).len() <= 64, "{}", data(0));
    let asked = sent_message_id(&tg, 501, text);

    // A regular user pressing Approve is refused and audited; nothing is decided.
    tg.user_presses(TOKEN_A, 502, asked, &data(0));
    tg.wait_calls("the refusal", Duration::from_secs(20), |c| c.iter().any(|c| c.method == "answerCallbackQuery"));
    let refusal = tg.sent("answerCallbackQuery").remove(0);
    assert_eq!(refusal.params["show_alert"], true);
    assert!(refusal.params["text"].as_str().unwrap().contains("Only this bot's admins"), "{:?}", refusal.params);
    let pending: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list"])).unwrap();
    assert_eq!(pending["approvals"].as_array().unwrap().len(), 1);
    assert!(choird.ctl_ok(&["audit", "--limit", "100"]).contains("refused_not_admin"));

    // Show, then Approve: the decision is recorded as the admin's and the question edited.
    tg.user_presses(TOKEN_A, 501, asked, &data(2));
    tg.wait_calls("the shown proposal", Duration::from_secs(20), |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| t.iter().any(|t| t.contains("+  \"max_steps_per_turn\": 5,")))
    });
    tg.user_presses(TOKEN_A, 501, asked, &data(0));
    let calls = tg.wait_calls("the edited question", Duration::from_secs(20), |c| {
        c.iter().any(|c| c.method == "editMessageText" && c.status == 200)
    });
    let edit = calls.iter().find(|c| c.method == "editMessageText" && c.status == 200).unwrap();
    assert_eq!((edit.params["chat_id"].as_i64(), edit.params["message_id"].as_i64()), (Some(501), Some(asked)));
    assert!(edit.params["text"].as_str().unwrap().ends_with("Approved by telegram:501."), "{:?}", edit.params);
    let info: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "show", "1"])).unwrap();
    assert_eq!(
        (info["info"]["status"].as_str(), info["info"]["decided_by"].as_str()),
        (Some("approved"), Some("telegram:501"))
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(choird.home.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["agents"]["alpha"]["max_steps_per_turn"], 5);

    // A second proposal, rejected from its button.
    tg.user_says(TOKEN_A, 502, "propose 7");
    let calls = tg.wait_calls("the second question", Duration::from_secs(30), |c| {
        c.iter().filter(|c| c.method == "sendMessage" && c.params["reply_markup"].is_object()).count() == 2
    });
    let ask2 =
        calls.iter().filter(|c| c.method == "sendMessage" && c.params["reply_markup"].is_object()).nth(1).unwrap();
    let asked2 = sent_message_id(&tg, 501, ask2.params["text"].as_str().unwrap());
    let reject = ask2.params["reply_markup"]["inline_keyboard"][0][1]["callback_data"].as_str().unwrap().to_owned();
    tg.user_presses(TOKEN_A, 501, asked2, &reject);
    tg.wait_calls("the second edit", Duration::from_secs(20), |c| {
        c.iter().any(|c| c.method == "editMessageText" && c.params["message_id"] == asked2)
    });
    let info: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "show", "2"])).unwrap();
    assert_eq!(info["info"]["status"], "rejected");
    assert_eq!(info["info"]["decided_by"], "telegram:501");
}

/// The message id the fake gave the bot's message with `text` in `chat`.
fn sent_message_id(tg: &FakeTelegram, chat: i64, text: &str) -> i64 {
    tg.message_id_of(chat, text).expect("the fake knows the message")
}
