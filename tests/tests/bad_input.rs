//! Bad input gets a clear error and changes nothing.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use choir_common::commit::Outcome;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird, TempHome};
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

/// Runs one chat whose first model step proposes `calls`; returns the tool
/// results the model got back, in order.
fn tool_results_for(calls: Vec<(String, String)>, setup: impl FnOnce(&Choird)) -> (Vec<Value>, Choird, TestPg) {
    let pg = TestPg::start().expect("PostgreSQL");
    let n = calls.len();
    let fake = FakeLlm::start(vec![Step::ToolCalls(calls), Step::Text("ok".into())]);
    let choird = Choird::start(&test_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    std::fs::create_dir_all(choird.workspace("demo")).unwrap();
    setup(&choird);
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "go"]), "ok\n");
    let reqs = fake.requests();
    let msgs = reqs[1].body["messages"].as_array().unwrap().clone();
    let results: Vec<Value> =
        msgs[msgs.len() - n..].iter().map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap()).collect();
    (results, choird, pg)
}

fn available() -> bool {
    // Probe once so tests that need PostgreSQL skip (cargo test) or fail (make test) alike.
    TestPg::start().is_some()
}

#[test]
fn invalid_tool_arguments_get_a_structured_error_and_write_nothing() {
    if !available() {
        return;
    }
    let (results, choird, pg) = tool_results_for(
        vec![
            ("choir.fs.write".into(), r#"{"path": 5, "content": "x"}"#.into()),
            ("choir.fs.write".into(), "{not json".into()),
        ],
        |_| {},
    );
    for r in &results {
        assert_eq!(r["status"], "rejected", "{r}");
        assert_eq!(r["error"]["code"], "invalid_arguments", "{r}");
        assert_eq!(r["error"]["allowed_tools"], json!(choir_common::manifest::BUILTIN_TOOLS));
    }
    assert!(results[0]["error"]["message"].as_str().unwrap().contains("/path"), "{}", results[0]);
    let entries: Vec<_> =
        std::fs::read_dir(choird.workspace("demo")).unwrap().map(|e| e.unwrap().file_name()).collect();
    let mut entries: Vec<String> = entries.into_iter().map(|e| e.to_string_lossy().into_owned()).collect();
    entries.sort();
    assert_eq!(entries, [".choir", ".choirtmp"], "nothing but the agent's own directories was written");
    let events = replicated_events(&pg, "demo", 2);
    assert!(events.iter().all(|e| e.outcome == Outcome::Rejected && e.duration_us == 0));
}

#[test]
fn an_unknown_tool_is_rejected_with_the_list_of_tools() {
    if !available() {
        return;
    }
    let (results, _choird, _pg) =
        tool_results_for(vec![("choir__fs__delete".into(), r#"{"path": "a"}"#.into())], |_| {});
    assert_eq!(results[0]["status"], "rejected");
    assert_eq!(results[0]["error"]["code"], "unknown_tool");
    let msg = results[0]["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("choir__fs__delete") && msg.contains(&choir_common::manifest::BUILTIN_TOOLS.join(", ")),
        "{msg}"
    );
}

#[test]
fn paths_outside_the_workspace_are_refused() {
    if !available() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let outside_path = outside.path().to_owned();
    let w = |p: &str| ("choir.fs.write".to_owned(), json!({"path": p, "content": "pwned"}).to_string());
    let r = |p: &str| ("choir.fs.read".to_owned(), json!({"path": p}).to_string());
    let calls = vec![
        w("../x"),
        w("notes/../../x"),
        w(&format!("{}/x", outside_path.display())),
        w("/etc/choir-pwned"),
        w("link/x"),
        r("passwd-link"),
        w(".choir/commit.log"),
    ];
    let (results, choird, _pg) = tool_results_for(calls, |c| {
        let ws = c.workspace("demo");
        std::os::unix::fs::symlink(&outside_path, ws.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join("passwd-link")).unwrap();
    });
    for (i, res) in results.iter().enumerate() {
        assert_ne!(res["status"], "success", "call {i} succeeded: {res}");
        let code = res["error"]["code"].as_str().unwrap();
        assert_eq!(code, "path_forbidden", "call {i}: {res}");
    }
    // The lexical refusals happen before execution; the symlink escapes are
    // caught by the kernel at open time.
    assert_eq!(results[0]["status"], "rejected");
    assert_eq!(results[4]["status"], "error");
    assert!(results[4]["error"]["message"].as_str().unwrap().contains("symbolic link"), "{}", results[4]);
    assert_eq!(std::fs::read_dir(&outside_path).unwrap().count(), 0, "nothing was written outside");
    assert!(!std::path::Path::new("/etc/choir-pwned").exists());
    assert!(!choird.home.path().join("workspaces/x").exists());
    assert!(!results[5].to_string().contains("root:"), "no byte of /etc/passwd reached the model");
}

#[test]
fn an_rpc_with_a_wrong_token_gets_401_and_is_audited() {
    let Some(pg) = TestPg::start() else { return };
    let port = choir_tests::ports::unused_port();
    let mut config = test_config("http://127.0.0.1:9/v1", Some(&pg.url()), &["demo"]);
    config["http_listen"] = json!(format!("127.0.0.1:{port}"));
    let choird = Choird::start(&config, &json!({}));
    for socket in ["socks/choird.sock", "socks/agents/demo/choird.sock"] {
        let agent =
            choir_common::unix_http::agent_for_socket(&choird.home.path().join(socket), Some(Duration::from_secs(10)));
        let mut resp = agent
            .post("http://localhost/rpc/v1/HEARTBEAT")
            .header("Authorization", "Bearer not-a-lease")
            .send_json(json!({"processed_upto": 0, "config_version": 0}))
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{socket}");
        let body: Value = resp.body_mut().read_json().unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
        // The relay needs a lease too.
        let resp =
            agent.post("http://localhost/llm/edge/v1/chat/completions").send_json(json!({"messages": []})).unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{socket}");
    }
    // The same over loopback TCP (http_listen).
    let tcp = ureq::Agent::new_with_config(ureq::config::Config::builder().http_status_as_error(false).build());
    let resp = tcp
        .post(&format!("http://127.0.0.1:{port}/rpc/v1/INIT_HELLO"))
        .header("Authorization", "Bearer not-a-lease")
        .send_json(json!({}))
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // The admin API is neither on an agent's socket nor on TCP.
    let agent =
        choir_common::unix_http::agent_for_socket(&choird.home.path().join("socks/agents/demo/choird.sock"), None);
    assert_eq!(agent.get("http://localhost/admin/v1/status").call().unwrap().status().as_u16(), 404);
    assert_eq!(tcp.get(&format!("http://127.0.0.1:{port}/admin/v1/status")).call().unwrap().status().as_u16(), 404);

    let rows =
        pg.client().query("SELECT action, detail FROM audit WHERE outcome = 'unauthorized' ORDER BY id", &[]).unwrap();
    let seen: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, Value>(1)["listener"].as_str().unwrap().to_owned()))
        .collect();
    let expected = [
        ("HEARTBEAT", "choird.sock"),
        ("LLM", "choird.sock"),
        ("HEARTBEAT", "agents/demo"),
        ("LLM", "agents/demo"),
        ("INIT_HELLO", "tcp"),
    ];
    assert_eq!(seen, expected.map(|(a, l)| (a.to_owned(), l.to_owned())));
}

#[test]
fn secrets_readable_by_others_refuse_start() {
    let home = TempHome::new(&test_config("http://127.0.0.1:9/v1", None, &[]), &json!({}));
    let secrets = home.path().join("secrets.json");
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (status, stderr) = home.run_choird_to_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        stderr.contains(&secrets.display().to_string()) && stderr.contains(&format!("chmod 600 {}", secrets.display())),
        "{stderr}"
    );
    assert!(!home.path().join("pg").exists(), "nothing started");
}

/// Every problem at once, in plain words: a value of the wrong kind, a
/// mistyped field with its "did you mean", a mistyped agent setting.
#[test]
fn a_config_with_a_wrong_type_names_the_field() {
    let mut config = test_config("http://127.0.0.1:9/v1", None, &["demo"]);
    config["agents"]["demo"]["max_steps_per_turn"] = json!("lots");
    config["agents"]["demo"]["retry_budgte"] = json!(2);
    config["metrics_listne"] = json!("127.0.0.1:9100");
    let home = TempHome::new(&config, &json!({}));
    let (status, stderr) = home.run_choird_to_exit(Duration::from_secs(30));
    assert!(!status.success());
    for said in [
        "config.json: agents.demo.max_steps_per_turn: expected a whole number (0 or more), found the string \"lots\"",
        "config.json: agents.demo.retry_budgte: unknown field `retry_budgte`; did you mean `retry_budget`?",
        "config.json: metrics_listne: unknown field `metrics_listne`; did you mean `metrics_listen`?",
    ] {
        assert!(stderr.contains(said), "{said}\n{stderr}");
    }
    assert!(!stderr.contains("?:") && !stderr.contains(" .:"), "no pseudo-paths: {stderr}");
    assert!(!home.path().join("pg").exists(), "nothing started");
}

#[test]
fn a_second_choird_on_the_same_home_refuses() {
    let Some(pg) = TestPg::start() else { return };
    let choird = Choird::start(&test_config("http://127.0.0.1:9/v1", Some(&pg.url()), &[]), &json!({}));
    let (status, stderr) = choird.home.run_choird_to_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        stderr.contains("another choird is already running") && stderr.contains(&format!("pid {}", choird.pid())),
        "{stderr}"
    );
    // The first one still serves.
    assert!(choird.ctl_ok(&["status"]).contains("database: external"));
}

#[test]
fn choirctl_explains_when_choird_is_not_running() {
    let home = TempHome::new(&test_config("http://127.0.0.1:9/v1", None, &[]), &json!({}));
    let out = std::process::Command::new(choir_tests::harness::bin("choirctl"))
        .arg("--home")
        .arg(home.path())
        .arg("status")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("choird is not running") && err.contains("choird --home"), "{err}");
}

#[test]
fn chatting_with_a_stopped_or_unknown_agent_says_what_to_do() {
    let Some(pg) = TestPg::start() else { return };
    let choird = Choird::start(&test_config("http://127.0.0.1:9/v1", Some(&pg.url()), &["demo"]), &json!({}));
    let out = choird.ctl(&["chat", "demo", "hi"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("choirctl agent start demo"));
    let out = choird.ctl(&["agent", "start", "nobody"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no agent \"nobody\" in config.json (configured: demo)"), "{err}");
    let count: i64 = pg.client().query_one("SELECT count(*) FROM messages", &[]).unwrap().get(0);
    assert_eq!(count, 0, "no message was queued");
}

#[test]
fn a_second_start_of_a_running_agent_is_refused() {
    let Some(Scenario { pg, llm: _fake, choird }) = Scenario::new().secrets(json!({"llm_key": "k"})).running().build()
    else {
        return;
    };
    let out = choird.ctl(&["agent", "start", "demo"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agent demo is already") && err.contains("stop it first"), "{err}");
    let sessions: i64 = pg.client().query_one("SELECT count(*) FROM sessions", &[]).unwrap().get(0);
    assert_eq!(sessions, 1);
}
