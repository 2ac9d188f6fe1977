//! Scheduled jobs (R-SCHED-1) against a real choird, agent and
//! PostgreSQL, with the scheduler's clock moved by the test (a file choird
//! reads, `CHOIR_TEST_CLOCK_FILE`) instead of sleeping minutes.

use std::time::Duration;

use choir_tests::fake_llm::{FakeLlm, Recorded, Step};
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

/// The objective (first user message) of a core model request, if it is one.
fn core_objective(r: &Recorded) -> Option<String> {
    if r.body["model"] != "fake-core" {
        return None;
    }
    r.body["messages"].as_array()?.iter().find(|m| m["role"] == "user")?["content"].as_str().map(str::to_owned)
}

/// How many core jobs the fake model was asked to start for `objective`
/// (each job's first request holds only its objective as user message).
fn runs_of(fake: &FakeLlm, objective: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| core_objective(r).as_deref() == Some(objective))
        .filter(|r| r.body["messages"].as_array().is_some_and(|m| m.iter().all(|m| m["role"] != "assistant")))
        .count()
}

/// `choirctl schedule add AGENT NAME REST…`.
fn add_args<'a>(agent: &'a str, name: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    ["schedule", "add", agent, name].into_iter().chain(rest.iter().copied()).collect()
}

fn show(choird: &Choird, job: &str) -> Value {
    serde_json::from_str(&choird.ctl_ok(&["--json", "schedule", "show", job])).unwrap()
}

/// The job's firings, oldest first, as (scheduled for, state).
fn firings(choird: &Choird, job: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = show(choird, job)["last"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["scheduled_for"].as_str().unwrap().to_owned(), f["state"].as_str().unwrap().to_owned()))
        .collect();
    v.reverse();
    v
}

fn wait_state(choird: &Choird, job: &str, at: &str, state: &str) {
    wait_for(&format!("{job}'s firing at {at} to be {state}"), WAIT, || {
        firings(choird, job).iter().any(|(t, s)| t == at && s == state)
    });
}

/// A fake model whose core jobs answer at once; the edge says "ok".
fn answering_model() -> FakeLlm {
    core_answers_after(Duration::ZERO, "report: all quiet")
}

/// A fake model whose core jobs answer `text` after `delay`; the edge says "ok".
fn core_answers_after(delay: Duration, text: &'static str) -> FakeLlm {
    FakeLlm::with_responder(move |req, _| {
        if req["model"] == "fake-core" {
            std::thread::sleep(delay);
            return Some(Step::Text(text.into()));
        }
        Some(Step::Text("ok".into()))
    })
}

/// Starts the agent again after a choird restart: the old process leaves
/// once the new choird refuses its lease.
fn start_again(choird: &Choird, agent: &str) {
    wait_for("the agent to start again", Duration::from_secs(60), || {
        choird.ctl(&["agent", "start", agent]).status.success()
    });
}

#[test]
fn a_job_every_minute_fires_once_per_minute_across_a_choird_kill() {
    let Some(pg) = TestPg::start() else { return };
    let fake = answering_model();
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let mut choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-01-05T08:00:30Z");
    choird.ctl_ok(&["schedule", "add", "demo", "tick", "--cron", "* * * * *", "--prompt", "Say tick."]);
    choird.ctl_ok(&[
        "schedule",
        "add",
        "demo",
        "catch",
        "--cron",
        "* * * * *",
        "--prompt",
        "Say catch.",
        "--missed",
        "run_once",
    ]);
    let list = choird.ctl_ok(&["schedule", "list", "demo"]);
    assert!(list.contains("demo/tick") && list.contains("2026-01-05T08:01:00Z"), "{list}");
    choird.ctl_ok(&["agent", "start", "demo"]);

    for minute in ["08:01", "08:02"] {
        choird.set_clock(&format!("2026-01-05T{minute}:05Z"));
        for job in ["demo/tick", "demo/catch"] {
            wait_state(&choird, job, &format!("2026-01-05T{minute}:00Z"), "done");
        }
    }
    // The job's core job ran under its name; its tokens are in the ledger.
    let last = &show(&choird, "demo/tick")["last"][0];
    assert_eq!(last["tokens"], 15, "{last}");
    assert!(last["detail"].as_str().unwrap().contains("all quiet"), "{last}");

    // choird dies without a word; three minutes pass (each firing more than
    // the 30 s grace late when it comes back).
    choird.kill();
    choird.set_clock("2026-01-05T08:05:45Z");
    choird.kill_and_restart();
    start_again(&choird, "demo");
    wait_state(&choird, "demo/catch", "2026-01-05T08:05:00Z", "done");
    choird.set_clock("2026-01-05T08:06:05Z");
    for job in ["demo/tick", "demo/catch"] {
        wait_state(&choird, job, "2026-01-05T08:06:00Z", "done");
    }
    let t = |m: &str| format!("2026-01-05T08:0{m}:00Z");
    let pairs = |v: &[(&str, &str)]| v.iter().map(|(m, s)| (t(m), (*s).to_owned())).collect::<Vec<_>>();
    // skip: the three missed firings are recorded, none ran.
    assert_eq!(
        firings(&choird, "demo/tick"),
        pairs(&[("1", "done"), ("2", "done"), ("3", "missed"), ("4", "missed"), ("5", "missed"), ("6", "done")])
    );
    // run_once: recorded, and the latest ran once, late.
    assert_eq!(
        firings(&choird, "demo/catch"),
        pairs(&[("1", "done"), ("2", "done"), ("3", "missed"), ("4", "missed"), ("5", "done"), ("6", "done")])
    );
    let catch_up = &show(&choird, "demo/catch")["last"][1];
    assert_eq!(catch_up["scheduled_for"], t("5"));
    // The model saw each run exactly once: no double, nothing silent.
    assert_eq!(runs_of(&fake, "Say tick."), 3);
    assert_eq!(runs_of(&fake, "Say catch."), 4);
    let shown = choird.ctl_ok(&["schedule", "show", "demo/catch"]);
    assert!(shown.contains("missed") && shown.contains("run_once") && shown.contains("2026-01-05T08:07:00"), "{shown}");

    // The console's schedule page shows each job's next and last firing.
    use choir_tests::console::{login, open, send, HOST};
    let (socket, code) = open(&choird);
    let cookie = login(&socket, &code);
    let page = send(&socket, "GET", "/schedule", &[("Host", HOST), ("Cookie", &cookie)], "").body;
    assert!(page.contains("2026-01-05T08:06:00Z · done"), "the last firing: {page}");
    assert!(page.contains("2026-01-05T08:07:00Z"), "the next firing: {page}");
}

#[test]
fn a_precondition_that_sees_nothing_new_makes_no_model_call() {
    let Some(pg) = TestPg::start() else { return };
    let fake = answering_model();
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-02-01T00:00:00Z");
    let inbox = choird.workspace("demo").join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    choird.ctl_ok(&[
        "schedule",
        "add",
        "demo",
        "watch",
        "--every",
        "60s",
        "--prompt",
        "Look at the inbox.",
        "--precondition",
        "file:inbox",
    ]);
    choird.ctl_ok(&["agent", "start", "demo"]);
    let at = |m: u32| format!("2026-02-01T00:{m:02}:00Z");
    // The first look has nothing to compare with: it runs.
    choird.set_clock(&at(1));
    wait_state(&choird, "demo/watch", &at(1), "done");
    // Nothing changed: skipped, and no model request at all.
    choird.set_clock(&at(2));
    wait_state(&choird, "demo/watch", &at(2), "skipped");
    // A new file: it runs.
    std::fs::write(inbox.join("mail-1.txt"), "hello").unwrap();
    choird.set_clock(&at(3));
    wait_state(&choird, "demo/watch", &at(3), "done");
    // Hostile content: a FIFO (never opened: the look would block) and a
    // link out of the workspace (never followed) are changes like any.
    rustix::fs::mknodat(rustix::fs::CWD, inbox.join("pipe"), rustix::fs::FileType::Fifo, 0o644.into(), 0).unwrap();
    std::os::unix::fs::symlink("/etc", inbox.join("etc")).unwrap();
    choird.set_clock(&at(4));
    wait_state(&choird, "demo/watch", &at(4), "done");
    choird.set_clock(&at(5));
    wait_state(&choird, "demo/watch", &at(5), "skipped");
    assert_eq!(runs_of(&fake, "Look at the inbox."), 3);
    let skipped = &show(&choird, "demo/watch")["last"][0];
    assert!(skipped["detail"].as_str().unwrap().contains("nothing new"), "{skipped}");
    assert_eq!(skipped["tokens"], Value::Null);
}

#[test]
fn a_failing_job_trips_the_breaker_and_the_admin_is_told_on_telegram() {
    use choir_tests::fake_telegram::{texts_by_chat, FakeTelegram};
    const TOKEN: &str = "111111:AAAA-secret-token-a";
    let Some(pg) = TestPg::start() else { return };
    let core_calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = core_calls.clone();
    let fake = FakeLlm::with_responder(move |req, _| {
        if req["model"] != "fake-core" {
            return Some(Step::Text("hello there".into()));
        }
        // The first run works (a report of several lines, longer than a
        // chat message may be, with characters that must not reach a chat as
        // they are); every later one meets a broken model.
        Some(if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Step::Text(format!("the nightly report is fine\n- disk: 41% used\n\u{202e}evil\u{7}\n{}", "y".repeat(5000)))
        } else {
            Step::Raw { status: 400, body: r#"{"error": {"message": "bad request"}}"#.into(), headers: Vec::new() }
        })
    });
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 111111, "alpha_bot");
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 50,
        "bots": {"a": {"token_secret": "tg_a", "users": {"501": {"agent": "demo", "admin": true}}}}});
    let choird = Choird::start_at(&config, &json!({"llm_key": "k", "tg_a": TOKEN}), "2026-03-01T06:00:00Z");
    choird.ctl_ok(&["agent", "start", "demo"]);
    // The admin has talked to the agent: results may go to that chat.
    tg.user_says(TOKEN, 501, "hi");
    tg.wait_calls("the answer", WAIT, |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| t.iter().any(|t| t == "hello there"))
    });
    // A user of another agent's chat, or no user at all, is refused.
    let e = choird.ctl_err(&add_args(
        "demo",
        "nightly",
        &["--every", "1m", "--prompt", "Report.", "--deliver", "tg:a:999"],
    ));
    assert!(e.contains("user 999 of bot a is not a Telegram user of agent demo"), "{e}");
    let nightly = ["--every", "1m", "--prompt", "Report.", "--deliver", "tg:a:501", "--breaker", "2"];
    choird.ctl_ok(&add_args("demo", "nightly", &nightly));
    let at = |m: u32| format!("2026-03-01T06:{m:02}:00Z");
    choird.set_clock(&at(1));
    wait_state(&choird, "demo/nightly", &at(1), "done");
    let calls = tg.wait_calls("the result in the chat", WAIT, |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| t.iter().any(|t| t.starts_with("[nightly] the nightly report")))
    });
    // Delivered as lines, escaped, cut at 3,500 characters with a note.
    let texts = texts_by_chat(&calls)[&501].clone();
    let result = texts.iter().find(|t| t.starts_with("[nightly]")).unwrap();
    assert!(
        result.starts_with("[nightly] the nightly report is fine\n- disk: 41% used\n\\u{202e}evil\\u{7}\nyyy"),
        "{result}"
    );
    assert!(!result.contains('\u{202e}') && !result.contains('\u{7}'), "{result}");
    assert!(result.ends_with("y\n[… cut at 3500 characters]"), "{}", result.chars().rev().take(60).collect::<String>());
    assert_eq!(result.chars().count(), 3500 + "\n[… cut at 3500 characters]".chars().count());
    // `--json` stays JSON with such characters in it (`show` parses it), and
    // means the report as the agent sent it.
    let detail = show(&choird, "demo/nightly")["last"][0]["detail"].as_str().unwrap().to_owned();
    assert!(detail.starts_with("the nightly report is fine\n- disk: 41% used\n\u{202e}evil\u{7}\nyyy"), "{detail}");
    choird.set_clock(&at(2));
    wait_state(&choird, "demo/nightly", &at(2), "failed");
    assert!(show(&choird, "demo/nightly")["job"]["paused"] == false, "one failure does not trip a breaker of 2");
    choird.set_clock(&at(3));
    wait_state(&choird, "demo/nightly", &at(3), "failed");
    let calls = tg.wait_calls("the breaker notice", WAIT, |c| {
        texts_by_chat(c).get(&501).is_some_and(|t| t.iter().any(|t| t.contains("is paused: 2 failures in a row")))
    });
    let texts = texts_by_chat(&calls)[&501].clone();
    assert!(texts.iter().any(|t| t.contains("choirctl schedule resume demo/nightly")), "{texts:?}");
    let job = show(&choird, "demo/nightly");
    assert_eq!(job["job"]["paused"], true);
    assert!(job["job"]["paused_reason"].as_str().unwrap().contains("circuit breaker"), "{job}");
    // Paused: time passes, nothing fires.
    choird.set_clock(&at(5));
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(firings(&choird, "demo/nightly").len(), 3);
    assert_eq!(core_calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    // Resumed by the operator: failures reset, the next minute fires.
    let resumed = choird.ctl_ok(&["schedule", "resume", "demo/nightly"]);
    assert!(resumed.contains("next firing 2026-03-01T06:06:00Z"), "{resumed}");
    let audit = choird.ctl_ok(&["--json", "audit", "--agent", "demo", "--limit", "500"]);
    assert!(audit.contains("schedule.breaker") && audit.contains("schedule.resume"), "{audit}");
}

#[test]
fn an_agents_schedule_proposal_is_refused_until_approved_and_then_fires() {
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::with_responder(|req, _| {
        if req["model"] == "fake-core" {
            return Some(Step::Text("digest written".into()));
        }
        let last = req["messages"].as_array()?.last()?.clone();
        Some(match last["content"].as_str() {
            Some("schedule a digest") => Step::call(
                "choir.propose.schedule",
                json!({"job": {"name": "digest", "cron": "30 7 * * *", "tz": "Europe/Berlin", "prompt": "Write the digest."},
                       "reason": "the user wants a morning digest"}),
            ),
            Some("schedule nonsense") => Step::call(
                "choir.propose.schedule",
                json!({"job": {"name": "bad", "cron": "99 7 * * *", "prompt": "x"}, "reason": "r"}),
            ),
            _ if last["role"] == "tool" => Step::Text(format!("tool said: {}", last["content"].as_str().unwrap_or(""))),
            _ => Step::Text("ok".into()),
        })
    });
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-04-01T05:00:00Z");
    choird.ctl_ok(&["agent", "start", "demo"]);
    // A bad spec is refused at once, saying why; nothing is stored.
    let said = choird.ctl_ok(&["chat", "demo", "schedule nonsense"]);
    assert!(said.contains("minute 99 is out of range (0-59)"), "{said}");
    let said = choird.ctl_ok(&["chat", "demo", "schedule a digest"]);
    assert!(said.contains("tool said"), "{said}");
    // Proposed is not scheduled.
    assert!(choird.ctl_ok(&["schedule", "list", "demo"]).contains("no scheduled jobs"));
    let pending: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list"])).unwrap();
    let p = pending["approvals"].as_array().unwrap().iter().find(|a| a["kind"] == "schedule").cloned().unwrap();
    assert_eq!(p["subject"], "schedule: digest (cron 30 7 * * * Europe/Berlin)");
    let id = p["id"].as_i64().unwrap().to_string();
    // The human sees the exact job.
    let shown = choird.ctl_ok(&["approvals", "show", &id]);
    assert!(shown.contains("\"prompt\": \"Write the digest.\"") && shown.contains("Europe/Berlin"), "{shown}");
    choird.set_clock("2026-04-01T06:00:00Z");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(runs_of(&fake, "Write the digest."), 0);
    choird.ctl_ok(&["approvals", "approve", &id]);
    let job = show(&choird, "demo/digest");
    assert_eq!(job["job"]["created_by"], format!("approval #{id} (admin)"));
    // 07:30 in Berlin (CEST, UTC+2) is 05:30 UTC: the next is tomorrow's.
    assert_eq!(job["job"]["next_due"], "2026-04-02T05:30:00Z");
    assert!(job["next"][0].as_str().unwrap().starts_with("2026-04-02T07:30:00+02:00"), "{job}");
    choird.set_clock("2026-04-02T05:30:01Z");
    wait_state(&choird, "demo/digest", "2026-04-02T05:30:00Z", "done");
    assert_eq!(runs_of(&fake, "Write the digest."), 1);
}

#[test]
fn bad_jobs_are_clear_errors_and_change_nothing() {
    let Some(pg) = TestPg::start() else { return };
    let fake = answering_model();
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-05-01T00:00:00Z");
    let add = |extra: &[&str]| {
        let mut args = vec!["schedule", "add", "demo", "j", "--prompt", "p"];
        args.extend_from_slice(extra);
        choird.ctl_err(&args)
    };
    assert!(add(&["--cron", "61 * * * *"]).contains("cron expression \"61 * * * *\": minute 61 is out of range (0-59)"));
    assert!(add(&["--cron", "0 25 * * *"]).contains("hour 25 is out of range (0-23)"));
    assert!(add(&["--cron", "0 8 * * *", "--tz", "Mars/Olympus"]).contains("unknown time zone \"Mars/Olympus\""));
    assert!(add(&["--cron", "* * *"]).contains("has 3 fields"));
    assert!(add(&["--every", "10s"]).contains("every_s must be between 60"));
    assert!(add(&[]).contains("a job needs cron (with tz) or every_s"));
    assert!(add(&["--every", "1m", "--tools", "no.such.tool"]).contains("agent demo has no tool no.such.tool"));
    assert!(add(&["--every", "1m", "--skill", "nope"]).contains("no usable skill nope"));
    assert!(add(&["--every", "1m", "--precondition", "file:../../etc"]).contains("without .."));
    assert!(add(&["--every", "1m", "--precondition", "mail"]).contains("needs agents.demo.email"));
    assert!(add(&["--every", "1m", "--deliver", "cli"]).contains("not a Telegram conversation"));
    let e = choird.ctl_err(&["schedule", "add", "ghost", "j", "--every", "1m", "--prompt", "p"]);
    assert!(e.contains("no agent \"ghost\""), "{e}");
    assert!(choird.ctl_ok(&["schedule", "list"]).contains("no scheduled jobs"));
    choird.ctl_ok(&["schedule", "add", "demo", "j", "--every", "1m", "--prompt", "p"]);
    assert!(choird
        .ctl_err(&["schedule", "add", "demo", "j", "--every", "2m", "--prompt", "q"])
        .contains("already has a job named j"));
    assert!(choird.ctl_err(&["schedule", "show", "demo/ghost"]).contains("no scheduled job \"ghost\""));
    assert!(choird.ctl_err(&["schedule", "show", "demo-ghost"]).contains("AGENT/NAME"));
    choird.ctl_ok(&["schedule", "rm", "demo/j"]);
    assert!(choird.ctl_ok(&["schedule", "list"]).contains("no scheduled jobs"));
}

/// A raw HEARTBEAT with firing reports, sent with `client`'s token.
fn report(client: &choir_tests::bench::HostToolClient, firings: Value) -> (u16, Value) {
    let body = json!({"events": [], "replies": [], "processed_upto": 0, "config_version": 0, "receive": false,
                      "firings": firings});
    let mut resp = client
        .http
        .post("http://localhost/rpc/v1/HEARTBEAT")
        .header("Authorization", &format!("Bearer {}", client.token))
        .header("Content-Type", "application/json")
        .config()
        .http_status_as_error(false)
        .build()
        .send(body.to_string().as_bytes())
        .unwrap();
    let status = resp.status().as_u16();
    (status, serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null))
}

fn firing_row(db: &mut postgres::Client, id: i64) -> (String, String) {
    let r = db.query_one("SELECT state, detail FROM schedule_firings WHERE id = $1", &[&id]).unwrap();
    (r.get(0), r.get(1))
}

#[test]
fn a_hostile_agent_cannot_start_or_end_firings_that_are_not_its_own() {
    let Some(pg) = TestPg::start() else { return };
    // The good agent's core job waits long enough to be seen running.
    let fake = core_answers_after(Duration::from_millis(1500), "good report");
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["evil", "evil2", "good"]);
    config["agent_binary"] = json!(choir_tests::harness::bin("hostile-agent"));
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-06-01T00:00:00Z");
    choird.ctl_ok(&["agent", "start", "good"]);
    choird.ctl_ok(&["agent", "start", "evil"]);
    choird.ctl_ok(&["agent", "start", "evil2"]);
    let evil = choir_tests::bench::HostToolClient::of(&choird, "evil");
    // evil2 never asks to start what it is offered: its firing stays offered.
    choird.ctl_ok(&["schedule", "add", "evil2", "e2", "--every", "1m", "--prompt", "Other work."]);
    choird.ctl_ok(&["schedule", "add", "good", "g", "--every", "1m", "--prompt", "Good work."]);
    choird.ctl_ok(&["schedule", "add", "evil", "e", "--every", "1m", "--prompt", "Evil work."]);
    choird.set_clock("2026-06-01T00:01:00Z");
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let id_of = |db: &mut postgres::Client, job: &str, state: &str| -> Option<i64> {
        db.query_opt(
            "SELECT f.id FROM schedule_firings f JOIN schedule_jobs j ON j.id = f.job_id WHERE j.name = $1 AND f.state = $2",
            &[&job, &state],
        )
        .unwrap()
        .map(|r| r.get(0))
    };
    let mut good = None;
    wait_for("the good agent's firing to run", WAIT, || {
        good = id_of(&mut db, "g", "running");
        good.is_some()
    });
    let good = good.unwrap();
    let mut own = None;
    wait_for("the evil agent's firing to be offered", WAIT, || {
        own = id_of(&mut db, "e", "offered");
        own.is_some()
    });
    let own = own.unwrap();

    let mut other = None;
    wait_for("evil2's firing to be offered", WAIT, || {
        other = id_of(&mut db, "e2", "offered");
        other.is_some()
    });
    let other = other.unwrap();
    let (_, r) = report(&evil, json!([{"id": other, "state": "starting"}]));
    assert_eq!(r["accepted"], Value::Null, "another agent's offered firing is not started from here: {r}");
    assert_eq!(firing_row(&mut db, other).0, "offered");
    // Another agent's firing: neither started nor ended from here.
    let (status, r) =
        report(&evil, json!([{"id": good, "state": "starting"}, {"id": good, "state": "done", "detail": "pwned"}]));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["accepted"], Value::Null, "nothing accepted: {r}");
    assert_eq!(firing_row(&mut db, good).0, "running");
    // Its own firing, not started: an outcome is ignored.
    report(&evil, json!([{"id": own, "state": "failed", "detail": "x"}]));
    assert_eq!(firing_row(&mut db, own).0, "offered");
    // A state that does not exist, or too many reports at once: refused, nothing changes.
    let (status, r) = report(&evil, json!([{"id": own, "state": "haxx"}]));
    assert_eq!(status, 400, "{r}");
    let many: Vec<Value> = (0..1000).map(|i| json!({"id": i, "state": "done"})).collect();
    let (status, r) = report(&evil, Value::Array(many));
    assert_eq!(status, 400, "{r}");
    assert!(r.to_string().contains("at most 64"), "{r}");
    assert_eq!(firing_row(&mut db, own).0, "offered");
    // Its own: accepted once; the outcome recorded once, clipped and NUL-safe.
    let (_, r) = report(&evil, json!([{"id": own, "state": "starting"}]));
    assert_eq!(r["accepted"], json!([own]));
    // Asked again by the same session (a lost answer), the same answer;
    // the firing is still one firing with one outcome below.
    let (_, r) = report(&evil, json!([{"id": own, "state": "starting"}]));
    assert_eq!(r["accepted"], json!([own]), "{r}");
    let huge = format!("a\u{0}b{}", "x".repeat(100_000));
    report(&evil, json!([{"id": own, "state": "done", "detail": huge}]));
    report(&evil, json!([{"id": own, "state": "failed", "detail": "again"}]));
    let (state, detail) = firing_row(&mut db, own);
    assert_eq!(state, "done");
    assert!(detail.starts_with("a\\u0000b") && detail.ends_with("x\n[… cut at 4000 characters]"), "{}", detail.len());
    // The good agent's firing ends as its own agent says.
    wait_state(&choird, "good/g", "2026-06-01T00:01:00Z", "done");
    assert_eq!(firing_row(&mut db, good).1, "good report");
    let audit = choird.ctl_ok(&["--json", "audit", "--agent", "evil", "--limit", "500"]);
    assert_eq!(audit.matches("schedule.firing").count(), 1, "{audit}");
}

#[test]
fn a_firing_whose_agent_dies_while_it_runs_is_recorded_interrupted_and_not_run_again_and_keeps_its_change() {
    let Some(pg) = TestPg::start() else { return };
    let fake = core_answers_after(Duration::from_secs(3), "finished");
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-07-01T00:00:00Z");
    choird.ctl_ok(&["agent", "start", "demo"]);
    // With a precondition: the change the interrupted firing was started on
    // is not used up by it (regression: the fingerprint was stored at the look).
    std::fs::create_dir_all(choird.workspace("demo").join("inbox")).unwrap();
    choird.ctl_ok(&[
        "schedule",
        "add",
        "demo",
        "slow",
        "--every",
        "1m",
        "--prompt",
        "Take your time.",
        "--precondition",
        "file:inbox",
    ]);
    choird.set_clock("2026-07-01T00:01:00Z");
    wait_state(&choird, "demo/slow", "2026-07-01T00:01:00Z", "running");
    wait_for("the core job's model request", WAIT, || runs_of(&fake, "Take your time.") == 1);
    // The agent dies in the middle of the job (choird restarts it).
    let mut status = Value::Null;
    wait_for("the job to show in agent status under its name", WAIT, || {
        status = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
        status["lanes"].as_array().unwrap().iter().any(|l| l["lane"] == "core:slow" && l["detail"] == "Take your time.")
    });
    let pid = status["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {status}")) as i32;
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), rustix::process::Signal::KILL).unwrap();
    wait_state(&choird, "demo/slow", "2026-07-01T00:01:00Z", "interrupted");
    let f = &show(&choird, "demo/slow")["last"][0];
    assert!(f["detail"].as_str().unwrap().contains("not run again"), "{f}");
    choird.wait_running("demo");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(runs_of(&fake, "Take your time."), 1, "an interrupted firing is never started again");
    // Nothing changed in the inbox, but the interrupted firing never did its
    // work: the next minute's look runs it.
    choird.set_clock("2026-07-01T00:02:00Z");
    wait_state(&choird, "demo/slow", "2026-07-01T00:02:00Z", "done");
}

/// A firing claimed while its agent was stopped waits, due, without the
/// scheduler watching it (nothing moves); the agent starts, takes it, and
/// dies while it runs: the offer woke the scheduler, whose sweep records
/// the firing interrupted within seconds, not at its quiet backstop
/// (5 minutes; the wait below is 30 s).
#[test]
fn a_firing_taken_by_an_agent_started_after_its_claim_is_watched_and_recorded_interrupted_when_it_dies() {
    let Some(pg) = TestPg::start() else { return };
    let fake = core_answers_after(Duration::from_secs(20), "finished");
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-07-01T00:00:00Z");
    choird.ctl_ok(&["schedule", "add", "demo", "late", "--every", "1h", "--prompt", "Started late."]);
    choird.set_clock("2026-07-01T01:00:00Z");
    wait_state(&choird, "demo/late", "2026-07-01T01:00:00Z", "due");
    // Long enough for the scheduler to have settled into its quiet pace.
    std::thread::sleep(Duration::from_secs(6));
    choird.ctl_ok(&["agent", "start", "demo"]);
    wait_state(&choird, "demo/late", "2026-07-01T01:00:00Z", "running");
    wait_for("the core job's model request", WAIT, || runs_of(&fake, "Started late.") == 1);
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    let pid = status["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {status}")) as i32;
    // Killed (choird restarts it; its hello wakes no scheduler).
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), rustix::process::Signal::KILL).unwrap();
    wait_state(&choird, "demo/late", "2026-07-01T01:00:00Z", "interrupted");
}

/// Adds demo's job `name`, every minute, firing `prompt` when its
/// precondition `pre` sees something new.
fn add_looking(choird: &Choird, name: &str, pre: &str, prompt: &str) {
    choird.ctl_ok(&["schedule", "add", "demo", name, "--every", "1m", "--prompt", prompt, "--precondition", pre]);
}

/// Minute `m` of the precondition tests' day.
fn minute(m: u32) -> String {
    format!("2026-08-01T00:{m:02}:00Z")
}

/// Memory with the fake embeddings `emb`, quick batches.
fn memory_config(emb: &choir_tests::fake_embeddings::FakeEmbeddings) -> Value {
    json!({"embeddings": {"base_url": emb.base_url(), "model": "fake-embed", "dimensions": emb.dims(), "timeout_s": 5},
           "batch_ms": 20, "upsert_wait_ms": 500})
}

#[test]
fn preconditions_look_at_mail_a_url_and_memory_without_a_model_call() {
    use choir_tests::mail_servers::{MailServers, PASSWORD, USER};
    let Some(pg) = TestPg::start() else { return };
    let Some(mail) = MailServers::start() else { return };
    let emb = choir_tests::fake_embeddings::FakeEmbeddings::start(8);
    let fake = FakeLlm::with_responder(|req, _| {
        if req["model"] == "fake-core" {
            return Some(Step::Text("looked".into()));
        }
        let last = req["messages"].as_array()?.last()?.clone();
        Some(match last["content"].as_str() {
            Some("remind me") => Step::call(
                "choir.memory.upsert",
                json!({"tier": "knowledge", "content": "call the plumber", "metadata": {"due": "2026-08-01T00:01:30Z"}}),
            ),
            _ => Step::Text("noted".into()),
        })
    });
    let page = Site::start("127.0.0.1", "status: green");
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["agents"]["demo"]["email"] = json!({
        "smtp": {"host": "localhost", "port": mail.smtp_port, "security": "starttls"},
        "imap": {"host": "localhost", "port": mail.imaps_port, "security": "tls"},
        "username": USER, "password_secret": "mail_pw", "from": format!("Choir Agent <{USER}@localhost>"),
        "ca_file": mail.ca_file(),
    });
    config["agents"]["demo"]["web"] = json!({"allow_addresses": ["127.0.0.1/32"]});
    config["memory"] = memory_config(&emb);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k", "mail_pw": PASSWORD}), "2026-08-01T00:00:00Z");
    choird.ctl_ok(&["agent", "start", "demo"]);
    let url = format!("url:http://127.0.0.1:{}/status", page.port);
    for (name, pre, prompt) in [
        ("mail", "mail", "Read the new mail."),
        ("page", url.as_str(), "Read the page."),
        ("due", "memory", "Do what is due."),
    ] {
        add_looking(&choird, name, pre, prompt);
    }
    let at = minute;
    // Minute 1: no unseen mail, no memory due: nothing to do; the page's first look runs.
    choird.set_clock(&at(1));
    wait_state(&choird, "demo/mail", &at(1), "skipped");
    wait_state(&choird, "demo/due", &at(1), "skipped");
    wait_state(&choird, "demo/page", &at(1), "done");
    // Something new in each.
    mail.deliver("boss@example.org", "From: boss@example.org\r\nSubject: hi\r\n\r\nPlease call.\r\n");
    page.answer.lock().2 = "status: red".into();
    assert_eq!(choird.ctl_ok(&["chat", "demo", "remind me"]).trim(), "noted");
    choird.set_clock(&at(2));
    for job in ["demo/mail", "demo/page", "demo/due"] {
        wait_state(&choird, job, &at(2), "done");
    }
    // Nothing new since: every look says so, and no model is asked.
    choird.set_clock(&at(3));
    for job in ["demo/mail", "demo/page", "demo/due"] {
        wait_state(&choird, job, &at(3), "skipped");
    }
    assert_eq!(
        [runs_of(&fake, "Read the new mail."), runs_of(&fake, "Read the page."), runs_of(&fake, "Do what is due.")],
        [1, 2, 1]
    );
    let mail_look = &show(&choird, "demo/mail")["last"][0];
    assert!(mail_look["detail"].as_str().unwrap().contains("nothing new"), "{mail_look}");
}

/// A page on `ip` whose status, `Location` and body the test sets, counting
/// the requests it got (for `url_changed`).
struct Site {
    answer: std::sync::Arc<parking_lot::Mutex<(u16, Option<String>, String)>>,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    port: u16,
    server: std::sync::Arc<tiny_http::Server>,
}

impl Site {
    fn start(ip: &str, body: &str) -> Site {
        let server = std::sync::Arc::new(tiny_http::Server::http(format!("{ip}:0")).unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let answer = std::sync::Arc::new(parking_lot::Mutex::new((200, None, body.to_owned())));
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (s, a, h) = (server.clone(), answer.clone(), hits.clone());
        std::thread::spawn(move || {
            for req in s.incoming_requests() {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (status, location, body) = a.lock().clone();
                let mut resp = tiny_http::Response::from_string(body).with_status_code(status);
                if let Some(to) = location {
                    resp.add_header(tiny_http::Header::from_bytes("Location", to).unwrap());
                }
                let _ = req.respond(resp);
            }
        });
        Site { answer, hits, port, server }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

#[test]
fn a_url_precondition_reads_one_mebibyte_follows_no_redirect_and_reaches_no_refused_address() {
    let Some(pg) = TestPg::start() else { return };
    let fake = answering_model();
    // 127.0.0.2 is loopback too, and not in the agent's allowed addresses.
    let inside = Site::start("127.0.0.2", "internal secrets");
    let mib = "a".repeat(1024 * 1024);
    let big = Site::start("127.0.0.1", &format!("{mib}tail one"));
    let hop = Site::start("127.0.0.1", "");
    *hop.answer.lock() = (302, Some(format!("http://127.0.0.2:{}/secret", inside.port)), String::new());
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["agents"]["demo"]["web"] = json!({"allow_addresses": ["127.0.0.1/32"]});
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-08-01T00:00:00Z");
    choird.ctl_ok(&["agent", "start", "demo"]);
    let jobs = [
        ("big", format!("url:http://127.0.0.1:{}/page", big.port), "Read the big page."),
        ("hop", format!("url:http://127.0.0.1:{}/moved", hop.port), "Read the moved page."),
        ("inside", format!("url:http://127.0.0.2:{}/secret", inside.port), "Read the inside page."),
    ];
    for (name, pre, prompt) in &jobs {
        add_looking(&choird, name, pre, prompt);
    }
    let at = minute;
    choird.set_clock(&at(1));
    // First looks: the big page and the redirect (its own answer, not where
    // it points) run; the internal address is refused before any connection.
    wait_state(&choird, "demo/big", &at(1), "done");
    wait_state(&choird, "demo/hop", &at(1), "done");
    wait_state(&choird, "demo/inside", &at(1), "failed");
    let refused = &show(&choird, "demo/inside")["last"][0];
    let why = refused["detail"].as_str().unwrap();
    assert!(why.contains("precondition failed") && why.contains("may not reach it"), "{refused}");
    assert_eq!(inside.hits(), 0, "the internal site was reached (directly or through the redirect)");
    // A change past the first MiB is not looked at; one within it is.
    *big.answer.lock() = (200, None, format!("{mib}tail two, megabytes more {}", "b".repeat(4 << 20)));
    choird.set_clock(&at(2));
    wait_state(&choird, "demo/big", &at(2), "skipped");
    wait_state(&choird, "demo/hop", &at(2), "skipped");
    *big.answer.lock() = (200, None, format!("b{mib}"));
    choird.set_clock(&at(3));
    wait_state(&choird, "demo/big", &at(3), "done");
    wait_state(&choird, "demo/hop", &at(3), "skipped");
    assert_eq!(inside.hits(), 0, "the internal site was reached");
    assert_eq!(hop.hits(), 3, "the redirecting page is looked at once a minute");
    assert_eq!(
        [
            runs_of(&fake, "Read the big page."),
            runs_of(&fake, "Read the moved page."),
            runs_of(&fake, "Read the inside page.")
        ],
        [2, 1, 0]
    );
}

#[test]
fn a_memory_precondition_ignores_due_dates_that_are_not_times() {
    let Some(pg) = TestPg::start() else { return };
    let emb = choir_tests::fake_embeddings::FakeEmbeddings::start(8);
    // The model (an attacker, as ever) files items whose `due` is anything
    // but a time, and one real due date.
    let dues = [
        json!("soon"),
        json!(12345),
        json!({"at": "2026-08-01T00:00:30Z"}),
        json!("2026-13-45T99:00:00Z"),
        json!("x".repeat(2000)),
        json!("2026-08-01T00:01:30Z"),
    ];
    let fake = FakeLlm::with_responder(move |req, _| {
        if req["model"] == "fake-core" {
            return Some(Step::Text("done what was due".into()));
        }
        let last = req["messages"].as_array()?.last()?.clone();
        let n: Option<usize> =
            last["content"].as_str().and_then(|t| t.strip_prefix("file item ")).and_then(|n| n.parse().ok());
        Some(match n {
            Some(n) => Step::call(
                "choir.memory.upsert",
                json!({"tier": "knowledge", "content": format!("item {n}"), "metadata": {"due": dues[n]}}),
            ),
            None => Step::Text("filed".into()),
        })
    });
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["memory"] = memory_config(&emb);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-08-01T00:00:00Z");
    choird.ctl_ok(&["agent", "start", "demo"]);
    for n in 0..6 {
        choird.ctl_ok(&["chat", "demo", &format!("file item {n}")]);
    }
    add_looking(&choird, "due", "memory", "Do what is due.");
    let at = minute;
    // Minute 1: the real due date is still ahead, the others are no dates:
    // nothing came due, and the look did not fail over them.
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let filed: i64 =
        db.query_one("SELECT count(*) FROM \"agent_demo\".items WHERE metadata ? 'due'", &[]).unwrap().get(0);
    assert_eq!(filed, 6, "every item reached the table the look reads");
    choird.set_clock(&at(1));
    wait_state(&choird, "demo/due", &at(1), "skipped");
    let look = &show(&choird, "demo/due")["last"][0];
    assert!(look["detail"].as_str().unwrap().contains("no memory item came due"), "{look}");
    // Minute 2: the real one passed; it alone counts, once.
    choird.set_clock(&at(2));
    wait_state(&choird, "demo/due", &at(2), "done");
    choird.set_clock(&at(3));
    wait_state(&choird, "demo/due", &at(3), "skipped");
    assert_eq!(runs_of(&fake, "Do what is due."), 1);
}

/// A running firing whose job names no wall time was left running for a
/// day (the sweep's fallback) though its agent runs it with its core
/// budget's (30 minutes by default): it is held to the wall time it was
/// offered with (recorded by the offer: the job's own, else the agent's
/// budget then), plus the grace; a firing within it runs on, also when the
/// agent's budget has since been lowered.
#[test]
fn a_firing_without_a_wall_time_of_its_own_is_interrupted_past_its_agents_not_after_a_day() {
    let Some(pg) = TestPg::start() else { return };
    let store = pg.store();
    let agent = choir_common::ids::AgentId::parse("demo").unwrap();
    let session = store.create_session(&agent, "process", b"digest").unwrap();
    let mut c = pg.client();
    // (job spec, seconds since its firing started, the wall time its offer
    // recorded: the agent's budget of 30 minutes, or the job's own)
    let cases =
        [(json!({}), 2_000, 1_800.0), (json!({}), 600, 1_800.0), (json!({"budget": {"wall_s": 300}}), 600, 300.0)];
    let mut ids = Vec::new();
    for (i, (spec, ago, wall)) in cases.iter().enumerate() {
        let job: i64 = c
            .query_one(
                "INSERT INTO schedule_jobs (agent_id, name, spec, created_by) VALUES ('demo', $1, $2, 'op') RETURNING id",
                &[&format!("j{i}"), spec],
            )
            .unwrap()
            .get(0);
        let id: i64 = c
            .query_one(
                "INSERT INTO schedule_firings (job_id, scheduled_for, state, session_id, started_at, wall_s)
                 VALUES ($1, now(), 'running', $2, now() - make_interval(secs => $3), $4) RETURNING id",
                &[&job, &session, &(*ago as f64), wall],
            )
            .unwrap()
            .get(0);
        ids.push(id);
    }
    // Offered under a budget of an hour, the agent's since lowered to 30
    // minutes by a reload: held to the hour it was given.
    c.execute(
        "UPDATE schedule_firings SET wall_s = 3600, started_at = now() - interval '2000 s' WHERE id = $1",
        &[&ids[1]],
    )
    .unwrap();
    let swept = store.sweep_firings().unwrap();
    assert!(swept.moving, "a firing still runs: the sweep goes on watching");
    let mut interrupted: Vec<i64> = swept.interrupted.iter().map(|e| e.id).collect();
    interrupted.sort();
    assert_eq!(interrupted, [ids[0], ids[2]], "past 1,800 + 120 s, and past the job's own 300 + 120 s");
    assert_eq!(
        firing_row(&mut c, ids[0]),
        ("interrupted".to_owned(), "no outcome within the job's wall time".to_owned())
    );
    assert_eq!(firing_row(&mut c, ids[1]).0, "running");
    // An offer records the wall time it is made with: the job's own, else
    // the agent's budget at the offer.
    c.batch_execute(
        "INSERT INTO schedule_firings (job_id, scheduled_for, state)
         SELECT id, now() - interval '1 minute', 'due' FROM schedule_jobs WHERE name IN ('j1', 'j2')",
    )
    .unwrap();
    let offered = store.offer_firings(&agent, session, 1_800).unwrap();
    let walls: Vec<(String, f64)> = c
        .query(
            "SELECT j.name, f.wall_s FROM schedule_firings f JOIN schedule_jobs j ON j.id = f.job_id
             WHERE f.state = 'offered' ORDER BY j.name",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(offered.len(), 2);
    assert_eq!(walls, [("j1".to_owned(), 1_800.0), ("j2".to_owned(), 300.0)]);
}

/// The sweep says whether it has anything to watch — a firing offered or
/// running, or due for an agent whose session is live — so an idle
/// scheduler stops touching the database and choird's connection closes;
/// a firing due for an agent that is not running waits for its hello.
#[test]
fn the_sweep_watches_on_only_while_a_firing_is_offered_running_or_due_to_a_running_agent() {
    let Some(pg) = TestPg::start() else { return };
    let store = pg.store();
    let agent = choir_common::ids::AgentId::parse("demo").unwrap();
    let mut c = pg.client();
    assert!(!store.sweep_firings().unwrap().moving, "no firing at all");
    let job: i64 = c
        .query_one(
            "INSERT INTO schedule_jobs (agent_id, name, spec, created_by) VALUES ('demo', 'j', '{}', 'op') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let firing: i64 = c
        .query_one(
            "INSERT INTO schedule_firings (job_id, scheduled_for, state) VALUES ($1, now(), 'due') RETURNING id",
            &[&job],
        )
        .unwrap()
        .get(0);
    assert!(!store.sweep_firings().unwrap().moving, "due, but its agent is not running");
    let session = store.create_session(&agent, "process", b"digest").unwrap();
    let swept = store.sweep_firings().unwrap();
    assert!(swept.moving, "due to a running agent");
    assert_eq!(swept.wake, ["demo"]);
    assert_eq!(store.offer_firings(&agent, session, 1_800).unwrap().len(), 1);
    assert!(store.sweep_firings().unwrap().moving, "offered");
    c.execute("UPDATE schedule_firings SET state = 'running', started_at = now() WHERE id = $1", &[&firing]).unwrap();
    assert!(store.sweep_firings().unwrap().moving, "running");
    // Its agent stops: the sweep ends the firing and has nothing left to watch.
    c.execute("UPDATE sessions SET ended_at = now() WHERE id = $1", &[&session]).unwrap();
    let swept = store.sweep_firings().unwrap();
    assert_eq!(swept.interrupted.len(), 1);
    assert!(!swept.moving, "nothing moves once it ended");
}

/// A job whose stored spec stops reading between the claim of its firing
/// and the offer (an upgrade reading specs more strictly, an edit in the
/// database) was marked offered but never handed to the agent, and offered
/// again every 30 s for ever — or, with a wall time that is not a number,
/// failed the offer's statement and with it every poll of the agent: now
/// the job is paused with the reason, as a claim pauses one, its firing
/// ends skipped, no model call is made, and the agent still answers.
#[test]
fn a_job_whose_spec_stops_reading_before_its_offer_is_paused_not_offered_for_ever() {
    let Some(pg) = TestPg::start() else { return };
    let fake = answering_model();
    let config = test_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    let choird = Choird::start_at(&config, &json!({"llm_key": "k"}), "2026-06-01T00:00:00Z");
    choird.ctl_ok(&["schedule", "add", "demo", "j", "--every", "1m", "--prompt", "Scheduled work."]);
    // Claimed while the agent is not running: the firing waits, due.
    choird.set_clock("2026-06-01T00:01:00Z");
    wait_state(&choird, "demo/j", "2026-06-01T00:01:00Z", "due");
    let mut db = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    // A wall time that is not a number: the offer's own statement reads
    // the job's wall time from the spec, and must not fail on it either.
    db.execute(
        "UPDATE schedule_jobs SET spec = jsonb_set(spec, '{budget}', '{\"wall_s\": \"soon\"}') WHERE name = 'j'",
        &[],
    )
    .unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    wait_state(&choird, "demo/j", "2026-06-01T00:01:00Z", "skipped");
    // The agent's polls went on: it answers.
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hello"]).trim(), "ok");
    let job = show(&choird, "demo/j");
    assert_eq!(job["job"]["paused"], true, "{job}");
    assert!(job["job"]["paused_reason"].as_str().unwrap().contains("its stored spec no longer reads"), "{job}");
    let offered: i64 = db
        .query_one("SELECT count(*) FROM schedule_firings WHERE state IN ('due', 'offered', 'running')", &[])
        .unwrap()
        .get(0);
    assert_eq!(offered, 0, "nothing is left to offer again");
    assert_eq!(runs_of(&fake, "Scheduled work."), 0);
    let audit = choird.ctl_ok(&["--json", "audit", "--agent", "demo"]);
    assert!(audit.contains("schedule.pause") && audit.contains("no longer reads"), "{audit}");
}
