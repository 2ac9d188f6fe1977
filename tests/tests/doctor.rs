//! `choirctl doctor`: each thing a failing deployment trips
//! on is found and named with its fix, the exit code says whether anything
//! failed, and no secret reaches the report.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::FakeTelegram;
use choir_tests::harness::{bin, docker_config, test_config, Choird, TempHome};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const GOOD: &str = "111111:AAAA-good-token-x";
const WRONG: &str = "222222:BBBB-wrong-token-y";
const RIGHT: &str = "222222:CCCC-right-token-z";

/// The report as JSON, and whether doctor exited 0.
fn doctor(home: &std::path::Path) -> (Value, bool, String) {
    let out = Command::new(bin("choirctl")).arg("--home").arg(home).args(["--json", "doctor"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(report["ok"], json!(out.status.success()), "the exit code follows the report: {report}");
    (report, out.status.success(), text)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {report:#}"))
}

#[test]
fn doctor_names_a_stopped_postgres_and_a_refused_bot_token_with_their_fixes() {
    let Some(mut pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Text("OK".into())));
    let tg = FakeTelegram::start();
    tg.add_bot(GOOD, 111111, "good_bot");
    tg.add_bot(RIGHT, 222222, "second_bot");
    let mut config = test_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "bots": {
        "good": {"token_secret": "tg_good", "users": {"501": {"agent": "demo", "admin": true}}},
        "second": {"token_secret": "tg_second", "users": {"502": {"agent": "demo"}}}}});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "tg_good": GOOD, "tg_second": WRONG}));
    let home = choird.home.path().to_owned();

    let (report, ok, text) = doctor(&home);
    assert!(!ok, "a refused token is a failure: {report:#}");
    for name in ["config", "secrets", "disk", "sockets", "postgres", "model (edge lane)", "model (core lane)", "choird"]
    {
        assert_eq!(check(&report, name)["outcome"], "ok", "{name}: {report:#}");
    }
    assert!(check(&report, "postgres")["detail"].as_str().unwrap().contains("pgvector"), "{report:#}");
    assert!(check(&report, "telegram bot good")["detail"].as_str().unwrap().contains("@good_bot"));
    let bad = check(&report, "telegram bot second");
    assert_eq!(bad["outcome"], "fail");
    assert!(bad["detail"].as_str().unwrap().contains("refused the token"), "{bad}");
    assert!(bad["fix"].as_str().unwrap().contains("choirctl secrets set tg_second"), "{bad}");
    // The model probe asked for one token, with the lane's key.
    let probe = llm.requests().into_iter().find(|r| r.body["max_tokens"] == 1).expect("a 1-token request");
    assert_eq!(probe.body["model"], "fake-edge");
    assert_eq!(check(&report, "embeddings")["outcome"], "skip");
    for secret in [GOOD, WRONG, "AAAA", "BBBB"] {
        assert!(!text.contains(secret), "a token reached the report: {text}");
    }

    // PostgreSQL stops: doctor names it and the fix; choird's own process stays up.
    pg.stop_immediate();
    let (report, ok, text) = doctor(&home);
    assert!(!ok);
    let down = check(&report, "postgres");
    assert_eq!(down["outcome"], "fail", "{report:#}");
    assert!(down["detail"].as_str().unwrap().contains("cannot connect to database_url"), "{down}");
    assert!(down["fix"].as_str().unwrap().contains("correct database_url"), "{down}");
    assert!(!text.contains(&pg.url()), "the database URL is not repeated: {text}");

    // Both fixed as the report says: the same command passes, and its
    // human form ends with the count.
    let set = choird.ctl_with_input(&["secrets", "set", "tg_second"], RIGHT);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    pg.start_again();
    let (report, ok, _) = doctor(&home);
    assert!(ok, "{report:#}");
    assert!(check(&report, "telegram bot second")["detail"].as_str().unwrap().contains("@second_bot"));
    let human = choird.ctl_ok(&["doctor"]);
    assert!(human.contains("0 failed"), "{human}");
    assert!(human.lines().any(|l| l.starts_with("ok") && l.contains("postgres")), "{human}");
}

#[test]
fn doctor_without_choird_checks_the_engine_the_base_image_embeddings_and_secrets_offline() {
    if !choir_tests::docker::available() {
        return;
    }
    let llm = FakeLlm::with_responder(|_, _| Some(Step::Raw { status: 401, body: "{}".into(), headers: vec![] }));
    let emb = FakeEmbeddings::start(8);
    let mut config = docker_config(&llm.base_url(), Some("host=/nonexistent/socket/dir dbname=choir"), &["demo"]);
    config["docker"]["base_image"] = json!("choir-base:not-built-for-doctor");
    config["memory"] = json!({"embeddings": {"base_url": emb.base_url(), "model": "fake-embed", "dimensions": 16}});
    let home = TempHome::new(&config, &json!({"llm_key": "k"}));
    std::fs::set_permissions(home.path().join("secrets.json"), std::fs::Permissions::from_mode(0o644)).unwrap();

    let (report, ok, _) = doctor(home.path());
    assert!(!ok);
    let secrets = check(&report, "secrets");
    assert_eq!(secrets["outcome"], "fail");
    assert!(secrets["fix"].as_str().unwrap().starts_with("chmod 600"), "{secrets}");
    let engine = check(&report, "docker");
    assert_eq!(engine["outcome"], "ok", "{report:#}");
    assert!(engine["detail"].as_str().unwrap().contains("API 1."), "{engine}");
    let base = check(&report, "base image");
    assert_eq!(base["outcome"], "fail");
    assert!(base["fix"].as_str().unwrap().contains("make base-image"), "{base}");
    let embeddings = check(&report, "embeddings");
    assert_eq!(embeddings["outcome"], "fail");
    assert!(embeddings["detail"].as_str().unwrap().contains("gives 8 dimensions"), "{embeddings}");
    assert!(embeddings["fix"].as_str().unwrap().contains("dimensions to 8"), "{embeddings}");
    let model = check(&report, "model (edge lane)");
    assert!(model["detail"].as_str().unwrap().contains("refused the key"), "{model}");
    assert!(model["fix"].as_str().unwrap().contains("choirctl secrets set llm_key"), "{model}");
    assert_eq!(check(&report, "postgres")["outcome"], "fail");
    assert_eq!(check(&report, "choird")["outcome"], "warn");
    assert_eq!(check(&report, "sockets")["outcome"], "skip");
    // Nothing was changed: no socket directory, no log, the mode as it was.
    assert!(!home.path().join("socks").exists() && !home.path().join("logs").exists());
    let mode = std::fs::metadata(home.path().join("secrets.json")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
}
