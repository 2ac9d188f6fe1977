//! The Telegram gateway against a protocol-exact fake of the Bot API:
//! routing of several bots, users and agents, refusals, long answers and
//! rate limits, approvals from inline buttons, files both ways, exactly-once
//! across a SIGKILL of choird, and recovery from the Bot API's failures.

use std::thread::JoinHandle;
use std::time::Duration;

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::{texts_by_chat, FakeTelegram, Fault};
use choir_tests::harness::{assert_snapshot, test_config, Choird};
use choir_tests::observe::{rows_read_under_both_plans, system_of, wait_for};
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

/// A fake Bot API with bot `a` and choird serving agent `alpha` behind it
/// (users 501 and 502; 501 an admin if `admin`), the agent started.
fn alpha_behind_bot_a(llm: &FakeLlm, pg: &TestPg, admin: bool) -> (FakeTelegram, Choird) {
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    let choird = Choird::start(&config(llm, pg, &tg, &["alpha"], one_bot(admin)), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);
    (tg, choird)
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
    let (tg, _choird) = alpha_behind_bot_a(&llm, &pg, false);

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
    // 503 is an admin too, but of another agent on the same bot.
    let mut bots = one_bot(true);
    bots["a"]["users"]["503"] = json!({"agent": "beta", "admin": true});
    let choird = Choird::start(&config(&llm, &pg, &tg, &["alpha", "beta"], bots), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);

    tg.user_says(TOKEN_A, 502, "propose 5");
    // The admin (501), and only the admin, is asked, with three buttons.
    let calls = tg.wait_calls("the question to the admin", Duration::from_secs(30), |c| {
        c.iter().any(|c| c.method == "sendMessage" && c.status == 200 && c.params["reply_markup"].is_object())
    });
    let ask = calls.iter().find(|c| c.method == "sendMessage" && c.params["reply_markup"].is_object()).unwrap();
    assert_eq!(ask.params["chat_id"], 501);
    // What the admin reads and presses, exactly (snapshot).
    assert_snapshot("telegram_approval_question", &ask.params);
    let text = ask.params["text"].as_str().unwrap();
    assert!(text.starts_with("Proposal 1 from agent alpha: config_change config: max_steps_per_turn"), "{text}");
    // The exact change, not just a title.
    assert!(text.contains("The change:") && text.contains("+  \"max_steps_per_turn\": 5,"), "{text}");
    assert!(!calls.iter().any(|c| c.params["chat_id"] == 503), "beta's admin is not asked about alpha's proposal");
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
    // Another agent's admin cannot decide it either.
    tg.user_presses(TOKEN_A, 503, asked, &data(0));
    tg.wait_calls("the second refusal", Duration::from_secs(20), |c| {
        c.iter().filter(|c| c.method == "answerCallbackQuery").count() == 2
    });
    assert!(tg.sent("answerCallbackQuery")[1].params["text"].as_str().unwrap().contains("Only this bot's admins"));
    let pending: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list"])).unwrap();
    assert_eq!(pending["approvals"][0]["status"], "pending");

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

#[test]
fn a_document_comes_in_and_a_voice_file_goes_out() {
    let Some(pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|req, _| {
        let msgs = req["messages"].as_array()?;
        let last = msgs.last()?.clone();
        let text = last["content"].as_str().unwrap_or_default();
        if last["role"] == "user" && text.contains("[The user sent a document: ") {
            let path = text.split("document: ").nth(1)?.split(' ').next()?.to_owned();
            return Some(Step::call("choir.fs.read", json!({"path": path})));
        }
        if last["role"] == "user" && text == "say hi" {
            return Some(Step::call(
                "choir.exec",
                json!({"command": "mkdir -p .choirtmp/send && printf 'OggS fake voice' > .choirtmp/send/hi.ogg && printf 'a,b\\n' > .choirtmp/send/table.csv"}),
            ));
        }
        if last["role"] == "tool" {
            let result: Value = serde_json::from_str(last["content"].as_str()?).ok()?;
            if result["summary"].as_str().unwrap_or("").starts_with("read") {
                return Some(Step::Text(format!(
                    "The file says: {}",
                    result["content"].as_str().unwrap_or("?").trim()
                )));
            }
            return Some(Step::Text("Here you go.".into()));
        }
        Some(Step::Text("?".into()))
    });
    let (tg, choird) = alpha_behind_bot_a(&llm, &pg, false);

    // In: the document lands in .choirtmp/recv/ and the agent is told where.
    let update =
        tg.user_sends_document(TOKEN_A, 501, "notes.txt", b"the meeting is at noon\n", Some("what does it say?"));
    tg.wait_calls("the answer about the document", Duration::from_secs(30), |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| !t.is_empty())
    });
    assert_eq!(sent_to(&tg, TOKEN_A, 501), ["The file says: the meeting is at noon"]);
    let rel = format!(".choirtmp/recv/{update}_notes.txt");
    assert_eq!(std::fs::read_to_string(choird.workspace("alpha").join(&rel)).unwrap(), "the meeting is at noon\n");
    let message: String = pg.client().query_one("SELECT text FROM messages ORDER BY id LIMIT 1", &[]).unwrap().get(0);
    assert_eq!(message, format!("what does it say?\n\n[The user sent a document: {rel} (23 bytes)]"));
    assert!(tg.sent("getFile").len() == 1);

    // Out: files the agent writes to .choirtmp/send/ follow its answer, then vanish.
    tg.user_says(TOKEN_A, 501, "say hi");
    let calls = tg.wait_calls("the voice and the document", Duration::from_secs(30), |c| {
        c.iter().any(|c| c.method == "sendVoice" && c.status == 200)
            && c.iter().any(|c| c.method == "sendDocument" && c.status == 200)
    });
    let voice = calls.iter().find(|c| c.method == "sendVoice").unwrap();
    assert_eq!(voice.params["chat_id"], 501);
    assert_eq!(voice.files, [("voice".to_owned(), voice.files[0].1.clone(), b"OggS fake voice".to_vec())]);
    assert!(voice.files[0].1.ends_with("hi.ogg"), "{}", voice.files[0].1);
    let doc = calls.iter().find(|c| c.method == "sendDocument").unwrap();
    assert_eq!(doc.files[0].2, b"a,b\n");
    let order: Vec<&str> = calls
        .iter()
        .filter(|c| {
            c.params["chat_id"] == 501
                && c.status == 200
                && c.method.starts_with("send")
                && c.method != "sendChatAction"
        })
        .map(|c| c.method.as_str())
        .collect();
    assert_eq!(order, ["sendMessage", "sendMessage", "sendVoice", "sendDocument"], "the answer first, then its files");
    let send_dir = choird.workspace("alpha").join(".choirtmp/send");
    assert_eq!(std::fs::read_dir(&send_dir).unwrap().count(), 0, "sent files are removed");
    wait_for("the spool to empty", Duration::from_secs(10), || {
        std::fs::read_dir(choird.home.path().join("telegram/spool/alpha")).map(|d| d.count() == 0).unwrap_or(true)
    });
}

/// A plain text message is queued by the poller with its update (one
/// transaction), but never ahead of an earlier update the dispatcher still
/// has to act on (a file to fetch), and only for users the live config
/// binds: a user taken out of config by a reload is refused, not let
/// through by the fast path.
#[test]
fn a_plain_message_never_overtakes_an_earlier_file_and_a_user_taken_out_of_config_is_refused() {
    let Some(pg) = TestPg::start() else { return };
    let llm = echo_model();
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    let config = config(&llm, &pg, &tg, &["alpha"], one_bot(false));
    let choird = Choird::start(&config, &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);

    // One batch: a document, then text from the same user and another.
    tg.hold_updates(TOKEN_A, true);
    tg.user_sends_document(TOKEN_A, 501, "notes.txt", b"some notes", None);
    tg.user_says(TOKEN_A, 501, "after the file");
    tg.user_says(TOKEN_A, 502, "and me");
    tg.hold_updates(TOKEN_A, false);
    let texts = || -> Vec<String> {
        pg.client().query("SELECT text FROM messages ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    wait_for("the three messages", Duration::from_secs(20), || texts().len() == 3);
    let t = texts();
    assert!(t[0].contains("notes.txt"), "the document first: {t:?}");
    assert_eq!(t[1..], ["after the file", "and me"], "then the texts, in the order they were sent");
    let outcomes: Vec<Option<String>> = pg
        .client()
        .query("SELECT outcome FROM telegram_updates ORDER BY update_id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(outcomes, vec![Some("queued".to_owned()); 3]);

    // Across batches too: a text arriving while an earlier file is still
    // being fetched waits for it.
    tg.slow_downloads(Duration::from_millis(1500));
    tg.user_sends_document(TOKEN_A, 501, "slow.txt", b"slow notes", None);
    wait_for("the file's update stored", Duration::from_secs(10), || {
        pg.client()
            .query_one("SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL", &[])
            .unwrap()
            .get::<_, i64>(0)
            == 1
    });
    tg.user_says(TOKEN_A, 502, "after the slow file");
    wait_for("both messages", Duration::from_secs(20), || texts().len() == 5);
    let t = texts();
    assert!(t[3].contains("slow.txt") && t[4] == "after the slow file", "in the order sent: {t:?}");
    tg.slow_downloads(Duration::ZERO);

    // User 502 taken out of config: the next text is refused, not queued.
    let mut fewer = config.clone();
    fewer["telegram"]["bots"]["a"]["users"] = json!({"501": {"agent": "alpha"}});
    std::fs::write(choird.home.path().join("config.json"), fewer.to_string()).unwrap();
    let pid = rustix::process::Pid::from_raw(choird.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    wait_for("the reload", Duration::from_secs(10), || choird.stderr().contains("reloaded config.json"));
    tg.user_says(TOKEN_A, 502, "still there?");
    wait_for("the refusal", Duration::from_secs(20), || {
        sent_to(&tg, TOKEN_A, 502).iter().any(|t| t.starts_with("Sorry, I only talk to people"))
    });
    assert!(!texts().contains(&"still there?".to_owned()), "{:?}", texts());
    let refused: i64 =
        pg.client().query_one("SELECT count(*) FROM telegram_updates WHERE outcome = 'refused'", &[]).unwrap().get(0);
    assert_eq!(refused, 1);
    // And 501 is still heard, at once.
    tg.user_says(TOKEN_A, 501, "still here");
    wait_for("the answer", Duration::from_secs(20), || {
        sent_to(&tg, TOKEN_A, 501).iter().any(|t| t.contains("still here"))
    });
}

#[test]
fn choird_killed_between_receiving_and_replying_answers_every_update_exactly_once() {
    let Some(pg) = TestPg::start() else { return };
    // A slow model, so the answers are still being written when choird dies.
    let llm = FakeLlm::with_responder(|req, _| {
        let msgs = req["messages"].as_array()?;
        let last_answer = msgs.iter().rposition(|m| m["role"] == "assistant").map(|i| i + 1).unwrap_or(0);
        let heard: Vec<&str> =
            msgs[last_answer..].iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect();
        Some(Step::SlowText(format!("answered: {}", heard.join(", ")), Duration::from_millis(150)))
    });
    let (tg, mut choird) = alpha_behind_bot_a(&llm, &pg, false);
    let agent_pid = || -> Option<u64> {
        let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "alpha"])).ok()?;
        s["pid"].as_u64()
    };
    let old_agent = agent_pid().unwrap();
    for i in 1..=3 {
        tg.user_says(TOKEN_A, 501, &format!("m{i}"));
    }
    wait_for("the model to be asked", Duration::from_secs(20), || !llm.requests().is_empty());
    wait_for("the updates to be stored", Duration::from_secs(20), || {
        pg.client().query_one("SELECT count(*) FROM telegram_updates", &[]).unwrap().get::<_, i64>(0) == 3
    });
    assert!(sent_to(&tg, TOKEN_A, 501).is_empty(), "nothing answered yet");

    choird.kill_and_restart_with(|| {
        // While choird is down, more arrive.
        tg.user_says(TOKEN_A, 501, "m4");
        tg.user_says(TOKEN_A, 501, "m5");
    });
    // The old agent loses its lease and leaves; then a new one starts.
    wait_for("the old agent to leave", Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{old_agent}")).exists()
            || std::fs::read_to_string(format!("/proc/{old_agent}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    choird.ctl_ok(&["agent", "start", "alpha"]);
    wait_for("every message answered", Duration::from_secs(60), || {
        let unanswered: i64 =
            pg.client().query_one("SELECT count(*) FROM messages WHERE replied_at IS NULL", &[]).unwrap().get(0);
        let outbox: i64 =
            pg.client().query_one("SELECT count(*) FROM telegram_outbox WHERE sent_at IS NULL", &[]).unwrap().get(0);
        let messages: i64 = pg.client().query_one("SELECT count(*) FROM messages", &[]).unwrap().get(0);
        messages == 5 && unanswered == 0 && outbox == 0
    });
    std::thread::sleep(Duration::from_secs(1));
    let answers = sent_to(&tg, TOKEN_A, 501);
    let mut covered: Vec<String> = answers
        .iter()
        .flat_map(|a| a.trim_start_matches("answered: ").split(", ").map(str::to_owned).collect::<Vec<_>>())
        .collect();
    covered.sort();
    assert_eq!(covered, ["m1", "m2", "m3", "m4", "m5"], "each update answered exactly once: {answers:?}");
    let rows: i64 = pg.client().query_one("SELECT count(*) FROM messages", &[]).unwrap().get(0);
    assert_eq!(rows, 5, "one message per update");
    assert_eq!(tg.unconfirmed(TOKEN_A), 0);
}

#[test]
fn the_gateway_rides_out_429s_502s_garbage_and_dropped_connections_and_loses_nothing() {
    let Some(pg) = TestPg::start() else { return };
    let llm = echo_model();
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    tg.fail_next("getUpdates", vec![Fault::RetryAfter(1), Fault::Status(502), Fault::Malformed, Fault::Drop]);
    tg.fail_next("sendMessage", vec![Fault::RetryAfter(1), Fault::Status(502), Fault::Drop]);
    for i in 1..=3 {
        tg.user_says(TOKEN_A, 500 + i, &format!("message {i}"));
    }
    let bots = json!({"a": {"token_secret": "tg_a", "users": {
        "501": {"agent": "alpha"}, "502": {"agent": "alpha"}, "503": {"agent": "alpha"}}}});
    let choird = Choird::start(&config(&llm, &pg, &tg, &["alpha"], bots), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);
    let calls = tg.wait_calls("three answers", Duration::from_secs(60), |c| {
        c.iter().filter(|c| c.method == "sendMessage" && c.status == 200).count() >= 3
    });
    std::thread::sleep(Duration::from_millis(500));
    for i in 1..=3 {
        assert_eq!(sent_to(&tg, TOKEN_A, 500 + i), [format!("alpha heard: message {i}")], "exactly one answer each");
    }
    let polls: Vec<_> = calls.iter().filter(|c| c.method == "getUpdates").collect();
    let statuses: Vec<u16> = polls.iter().take(5).map(|c| c.status).collect();
    assert_eq!(statuses, [429, 502, 200, 0, 200], "the faults happened, in order (200 = the garbled one)");
    assert!(polls[1].at.duration_since(polls[0].at) >= Duration::from_millis(990), "retry_after was honoured");
    let sends: Vec<u16> = calls.iter().filter(|c| c.method == "sendMessage").map(|c| c.status).collect();
    assert_eq!(&sends[..3], [429, 502, 0]);
    assert_eq!(tg.unconfirmed(TOKEN_A), 0);
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "telegram", "status"])).unwrap();
    assert!(status["bots"][0]["errors"].as_u64().unwrap() >= 7, "{status}");
    assert_eq!(status["bots"][0]["queued_outbox"], 0);
}

#[test]
fn admins_have_status_stop_and_approvals_in_chat_and_regular_users_do_not() {
    let Some(pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        match last["content"].as_str() {
            Some("work hard") => Some(Step::call("choir.exec", json!({"command": "sleep 5"}))),
            _ => Some(Step::Text("done".into())),
        }
    });
    let (tg, choird) = alpha_behind_bot_a(&llm, &pg, true);

    tg.user_says(TOKEN_A, 502, "/status");
    tg.user_says(TOKEN_A, 501, "/status");
    tg.user_says(TOKEN_A, 501, "/approvals");
    tg.wait_calls("three answers", Duration::from_secs(20), |c| {
        texts_by_chat(c).values().map(Vec::len).sum::<usize>() >= 3
    });
    assert_eq!(sent_to(&tg, TOKEN_A, 502), ["Only this bot's admins can use /status."]);
    let admin = sent_to(&tg, TOKEN_A, 501);
    assert!(admin[0].starts_with("alpha: running (RUNNING)\nedge: IDLE"), "{admin:?}");
    assert_eq!(admin[1], "No proposals of alpha are waiting.");
    assert!(llm.requests().is_empty(), "commands never reach the model");

    // /stop cuts a long tool call's turn short at its next step.
    tg.user_says(TOKEN_A, 501, "work hard");
    wait_for("the long tool call", Duration::from_secs(20), || !llm.requests().is_empty());
    std::thread::sleep(Duration::from_millis(500));
    tg.user_says(TOKEN_A, 501, "/stop");
    tg.wait_calls("the stop and the cut turn", Duration::from_secs(40), |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| t.iter().any(|t| t == "Stopped, as asked."))
    });
    assert!(sent_to(&tg, TOKEN_A, 501).iter().any(|t| t.starts_with("Stopping what alpha is doing")));
    assert_eq!(llm.requests().len(), 1, "no model step after the stop");
    assert!(choird.ctl_ok(&["audit", "--limit", "50"]).contains("agent.cancel"));
}

#[test]
fn an_unknown_user_on_a_pairing_bot_is_let_in_by_an_admin_and_can_then_talk() {
    let Some(pg) = TestPg::start() else { return };
    let llm = echo_model();
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN_A, 111111, "alpha_bot");
    let mut bots = one_bot(true);
    bots["a"]["pairing"] = json!("alpha");
    let choird = Choird::start(&config(&llm, &pg, &tg, &["alpha"], bots), &secrets());
    choird.ctl_ok(&["agent", "start", "alpha"]);

    tg.user_says(TOKEN_A, 777, "let me in");
    tg.user_says(TOKEN_A, 777, "please?");
    tg.user_says(TOKEN_A, 888, "me too");
    let calls = tg.wait_calls("the admin asked twice", Duration::from_secs(20), |c| {
        c.iter().filter(|c| c.method == "sendMessage" && c.params["chat_id"] == 501).count() == 2
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sent_to(&tg, TOKEN_A, 777).len(), 1, "asked once, told once");
    assert!(sent_to(&tg, TOKEN_A, 777)[0].starts_with("I don't know you yet"));
    let ask = calls
        .iter()
        .find(|c| c.method == "sendMessage" && c.params["text"].as_str().unwrap_or("").contains("777"))
        .unwrap();
    assert_eq!(ask.params["text"], "User 777 (@user777) asks to talk to alpha through this bot.");
    let listed = choird.ctl_ok(&["telegram", "pairings"]);
    assert!(listed.contains("777") && listed.contains("888") && listed.contains("pending"), "{listed}");

    // A regular user cannot let anyone in; the admin can, in chat.
    let asked = sent_message_id(&tg, 501, ask.params["text"].as_str().unwrap());
    tg.user_presses(TOKEN_A, 502, asked, "pl:777");
    tg.user_presses(TOKEN_A, 501, asked, "pl:777");
    tg.wait_calls("both answers", Duration::from_secs(20), |c| {
        c.iter().filter(|c| c.method == "answerCallbackQuery").count() == 2
    });
    let answers = tg.sent("answerCallbackQuery");
    assert!(answers[0].params["text"].as_str().unwrap().contains("Only this bot's admins"));
    assert_eq!(answers[1].params["text"], "user 777 may now talk to alpha through bot a");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(choird.home.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["telegram"]["bots"]["a"]["users"]["777"], json!({"agent": "alpha"}));

    // Let in: their messages now reach the agent.
    tg.user_says(TOKEN_A, 777, "hello, finally");
    tg.wait_calls("the answer", Duration::from_secs(20), |c| {
        texts_by_chat(c).get(&777).is_some_and(|t| t.iter().any(|t| t == "alpha heard: hello, finally"))
    });
    assert_eq!(sent_to(&tg, TOKEN_A, 777)[1], "You're in: you can talk to alpha here now.");
    // And from choirctl: refused.
    assert!(choird.ctl_ok(&["telegram", "pair", "a", "888", "--refuse"]).contains("user 888 was refused"));
    assert!(choird.ctl_err(&["telegram", "pair", "a", "888"]).contains("has no pending request"));
    tg.wait_calls("the refusal", Duration::from_secs(20), |c| texts_by_chat(c).get(&888).is_some_and(|t| t.len() == 2));
    assert!(choird.ctl_ok(&["audit", "--limit", "100"]).contains("telegram.pairing"));
}

/// Regression: an update holding U+0000 (the Bot API's JSON can carry
/// `\u0000`) could not be stored — `jsonb` and `text` refuse it — so the
/// poller retried its batch forever and the bot heard nobody again. Now
/// every string of an update is stored with NUL escaped, on the fast path
/// and the dispatcher's alike, and an unknown user's NUL is refused like any
/// other message of theirs.
#[test]
fn a_nul_character_in_an_update_wedged_the_bot_and_is_now_stored_escaped() {
    let Some(pg) = TestPg::start() else { return };
    let llm = echo_model();
    let (tg, _choird) = alpha_behind_bot_a(&llm, &pg, false);

    tg.user_says(TOKEN_A, 501, "before\u{0}after");
    tg.user_sends_document(TOKEN_A, 502, "notes.txt", b"some notes", Some("cap\u{0}tion"));
    tg.user_says(TOKEN_A, 999, "who\u{0}am I");
    tg.user_says(TOKEN_A, 501, "and then");
    let texts = || -> Vec<String> {
        pg.client().query("SELECT text FROM messages ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    wait_for("the three messages of configured users", Duration::from_secs(30), || texts().len() == 3);
    let t = texts();
    assert_eq!(t[0], "before\\u0000after", "NUL stored as its escape: {t:?}");
    assert!(t[1].starts_with("cap\\u0000tion") && t[1].contains("notes.txt"), "{t:?}");
    assert_eq!(t[2], "and then");
    wait_for("the refusal of 999", Duration::from_secs(20), || {
        sent_to(&tg, TOKEN_A, 999).iter().any(|t| t.starts_with("Sorry, I only talk to people"))
    });
    wait_for("the answers", Duration::from_secs(20), || {
        sent_to(&tg, TOKEN_A, 501).iter().any(|t| t.contains("and then"))
    });
    assert!(sent_to(&tg, TOKEN_A, 501).iter().any(|t| t.contains("before\\u0000after")));
    let raw: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM telegram_updates WHERE payload::text LIKE '%u0000%'", &[])
        .unwrap()
        .get(0);
    assert_eq!(raw, 3, "the three updates with a NUL stored, escaped");
    assert_eq!(tg.unconfirmed(TOKEN_A), 0, "every update confirmed: the poller is not stuck");
}

/// Regression: the batch statement asked "was this update stored before?"
/// and "does an earlier one wait?" in ways the planner answered by reading
/// every update the bot ever had (a hashed subplan over its key range, then a
/// nested loop filtering it) — a cost growing with the bot's history, paid
/// on every message. With 2,000 updates stored, each plan the statement can
/// get (custom and generic) reads no more of `telegram_updates` than the
/// batch itself.
#[test]
fn storing_a_batch_reads_only_its_own_updates_however_many_the_bot_has() {
    let Some(pg) = TestPg::start() else { return };
    choird::db::Db::connect(&pg.url()).unwrap().migrate().unwrap();
    let mut c = pg.client();
    c.batch_execute(
        "INSERT INTO telegram_updates (bot, update_id, payload, handled_at)
             SELECT 'a', g, '{}', now() FROM generate_series(1, 2000) g;
         ANALYZE telegram_updates;",
    )
    .unwrap();
    c.batch_execute(&format!(
        "PREPARE batch(text, bigint[], jsonb[], text[], text[], text[], text[], jsonb[], bigint) AS {}",
        choird::store::telegram::STORE_BATCH
    ))
    .unwrap();
    // Each plan stores a batch of its own (a new update id).
    let scans = rows_read_under_both_plans(&mut c, "telegram_updates", |mode| {
        let id = if mode == "force_custom_plan" { 5001 } else { 5002 };
        format!(
            "EXECUTE batch('a', ARRAY[{id}]::bigint[], ARRAY['{{}}']::jsonb[],
                 ARRAY['alpha'], ARRAY['tg:a:1'], ARRAY['telegram:1'], ARRAY['hi'],
                 ARRAY['{{\"bot\": \"a\", \"update_id\": \"{id}\"}}']::jsonb[], {})",
            id + 1
        )
    });
    assert!(scans.iter().all(|(_, _, read)| *read <= 1.0), "a scan read more than the batch: {scans:?}");
    let queued: i64 = c.query_one("SELECT count(*) FROM messages WHERE text = 'hi'", &[]).unwrap().get(0);
    assert_eq!(queued, 2, "both batches' messages queued");
}

/// Agent alpha's message stored the three ways choird stores one — a
/// chat's, the dispatcher's and a poller batch's (its conversation
/// `batch_conversation`) — each on a connection and a thread of its own
/// (it may wait for another transaction's lock): the row each returns.
fn queue_for_alpha_three_ways(url: &str, batch_conversation: &'static str) -> [JoinHandle<postgres::Row>; 3] {
    let run = |statement: &'static str, params: Vec<Box<dyn postgres::types::ToSql + Sync + Send>>| {
        let url = url.to_owned();
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                params.iter().map(|p| p.as_ref() as &(dyn postgres::types::ToSql + Sync)).collect();
            c.query_one(statement, &params).unwrap()
        })
    };
    let chat =
        run(choird::store::INSERT_MESSAGE, vec![Box::new("alpha"), Box::new("c"), Box::new("u"), Box::new("chat")]);
    let dispatched = run(
        choird::store::telegram::INSERT_TELEGRAM_MESSAGE,
        vec![
            Box::new("alpha"),
            Box::new("tg:a:1"),
            Box::new("telegram:1"),
            Box::new("dispatched"),
            Box::new(json!({"bot": "a", "update_id": "7"})),
        ],
    );
    let batch = run(
        choird::store::telegram::STORE_BATCH,
        vec![
            Box::new("a"),
            Box::new(vec![8i64]),
            Box::new(vec![json!({})]),
            Box::new(vec!["alpha"]),
            Box::new(vec![batch_conversation]),
            Box::new(vec!["telegram:1"]),
            Box::new(vec!["batched"]),
            Box::new(vec![json!({"bot": "a", "update_id": "8"})]),
            Box::new(9i64),
        ],
    );
    [chat, dispatched, batch]
}

/// How many advisory locks are waited for right now.
fn lock_waiters(pg: &TestPg) -> i64 {
    pg.client()
        .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", &[])
        .unwrap()
        .get(0)
}

/// Regression: messages draw their ids from one sequence every writer
/// shares, and an agent is handed its messages past a position; a message
/// that drew its id before another of its agent and committed after it was
/// passed over for good. Now every statement that queues a message (a
/// chat's, the dispatcher's, a Telegram batch's) waits for an earlier
/// uncommitted message of the same agent, and only of the same agent.
#[test]
fn regression_a_message_committing_after_a_later_one_of_its_agent_was_passed_over() {
    let Some(pg) = TestPg::start() else { return };
    choird::db::Db::connect(&pg.url()).unwrap().migrate().unwrap();
    let mut held = pg.client();
    let mut first = held.transaction().unwrap();
    let first_id: i64 =
        first.query_one(choird::store::INSERT_MESSAGE, &[&"alpha", &"c", &"u", &"first"]).unwrap().get(0);
    // Another agent's message does not wait.
    let other: i64 =
        pg.client().query_one(choird::store::INSERT_MESSAGE, &[&"beta", &"c", &"u", &"other"]).unwrap().get(0);
    assert!(other > first_id);
    let [chat, dispatched, batch] = queue_for_alpha_three_ways(&pg.url(), "tg:a:1");
    wait_for("the three to wait for the first message's commit", Duration::from_secs(30), || lock_waiters(&pg) == 3);
    let visible: i64 =
        pg.client().query_one("SELECT count(*) FROM messages WHERE agent_id = 'alpha'", &[]).unwrap().get(0);
    assert_eq!(visible, 0, "no later message of alpha committed before the first");
    first.commit().unwrap();
    // Each stored its message (one row: its id, or the batch's arrays).
    for t in [chat, dispatched, batch] {
        t.join().unwrap();
    }
    let ids: Vec<(i64, String)> = pg
        .client()
        .query("SELECT id, text FROM messages WHERE agent_id = 'alpha' ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(ids[0], (first_id, "first".to_owned()), "the first message has the lowest id: {ids:?}");
}

/// A queued message says what came before it — the highest id of its
/// agent's messages still unanswered, and whether its conversation had
/// messages — as read once every earlier message of its agent committed,
/// not as the statement saw the table when it began and then waited: choird
/// hands the message to the agent's long-poll from memory on that word, and
/// a message it did not know of would be passed over.
#[test]
fn a_queued_message_reports_the_earlier_messages_that_committed_while_it_waited() {
    let Some(pg) = TestPg::start() else { return };
    choird::db::Db::connect(&pg.url()).unwrap().migrate().unwrap();
    let report = |r: &postgres::Row| -> (Option<i64>, bool) { (r.get(1), r.get(2)) };
    let mut held = pg.client();
    let mut first = held.transaction().unwrap();
    let row = first.query_one(choird::store::INSERT_MESSAGE, &[&"alpha", &"c", &"u", &"first"]).unwrap();
    let first_id: i64 = row.get(0);
    assert_eq!(report(&row), (None, false), "the agent's first message follows nothing");
    let [chat, dispatched, batch] = queue_for_alpha_three_ways(&pg.url(), "c");
    // All three began (their statements' snapshots taken) before the first
    // message committed, and wait for it.
    wait_for("the three to wait for the first message's commit", Duration::from_secs(30), || lock_waiters(&pg) == 3);
    first.commit().unwrap();
    let reported = |r: postgres::Row| {
        let (pending, earlier) = report(&r);
        (r.get::<_, i64>(0), pending, earlier)
    };
    let row = batch.join().unwrap();
    let (ids, pending, earlier): (Vec<i64>, Vec<Option<i64>>, Vec<bool>) = (row.get(2), row.get(8), row.get(9));
    let batch = (ids[0], pending[0], earlier[0]);
    assert!(batch.1.is_some_and(|p| p >= first_id && p < batch.0), "{batch:?} after {first_id}");
    assert!(batch.2, "the batch's conversation had the first message before it");
    let (chat, dispatched) = (reported(chat.join().unwrap()), reported(dispatched.join().unwrap()));
    // Each follows the message of its agent that took the lock before it:
    // the first, or one of the others.
    let mut order = [(first_id, None), (chat.0, chat.1), (dispatched.0, dispatched.1), (batch.0, batch.1)];
    order.sort();
    for pair in order.windows(2) {
        assert_eq!(pair[1].1, Some(pair[0].0), "each follows the one committed before it: {order:?}");
    }
    assert!(chat.2, "the chat's conversation had the first message before it");
    assert!(!dispatched.2, "a new conversation had no messages before");
    // Answered messages are not pending: what follows them follows nothing.
    pg.client().execute("UPDATE messages SET reply = 'ok', replied_at = now()", &[]).unwrap();
    let row = pg.client().query_one(choird::store::INSERT_MESSAGE, &[&"alpha", &"c", &"u", &"later"]).unwrap();
    assert_eq!(report(&row), (None, true));
    // Another agent's messages are not its.
    let row = pg.client().query_one(choird::store::INSERT_MESSAGE, &[&"beta", &"c", &"u", &"other"]).unwrap();
    assert_eq!(report(&row), (None, false));
}
