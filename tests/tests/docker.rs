//! The docker runtime against the real engine: hardened containers, secrets
//! that never leak, crash restarts, adoption across choird restarts, builds
//! and updates, and the operator-facing errors.

use std::time::{Duration, Instant};

use choir_common::commit::{verify_extension, ChainHead, Outcome};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{docker_config, test_config, Choird};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

const CANARY: &str = "CANARY-3f9d2a7c-do-not-leak";

fn container_of(choird: &Choird, agent: &str) -> String {
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", agent])).unwrap();
    status["container"].as_str().unwrap_or_else(|| panic!("no container in {status}")).to_owned()
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_agent_in_a_hardened_container_answers_and_never_sees_its_secrets_leak() {
    if !choir_tests::docker::available() {
        return;
    }
    // Builds share the layer cache: one at a time (held until the images are gone).
    let _one_builder = choir_tests::docker::exclusive();
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::start(vec![
        Step::call("choir.fs.write", json!({"path": "notes/hello.txt", "content": "hello from a container\n"})),
        // The shell also reaches for the container's PID 1 (the agent itself:
        // no init of the agent's uid sits outside its tree): stopping and
        // terminating it does nothing, and tracing it is refused.
        Step::call(
            "choir.exec",
            json!({"command": "id -u; touch /etc/x 2>&1; ls /run/choir; kill -STOP 1; kill -TERM 1; \
                perl -e 'my $r = syscall(101, 0x4206, 1, 0, 0); print $r == -1 ? \"ptrace refused: errno \".($!+0) : \"ptrace attached\", \"\\n\"'; \
                cat /proc/1/comm"}),
        ),
        Step::Text("Done in the container.".into()),
    ]);
    let mut config = docker_config(&fake.base_url(), Some(&pg.url()), &["demo"]);
    config["agents"]["demo"] =
        json!({"secrets": ["canary"], "resources": {"memory_mb": 256, "cpus": 0.5, "pids": 128}});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "canary": CANARY}));
    let built = choird.ctl_ok(&["agent", "build", "demo"]);
    assert!(built.contains("Successfully tagged") && built.contains("image: choirtest-"), "{built}");
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write", "a", "note"]), "Done in the container.\n");

    // The tool ran in the container, in the bind-mounted workspace.
    let file = choird.workspace("demo").join("notes/hello.txt");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello from a container\n");
    let msgs = fake.requests()[2].body["messages"].as_array().unwrap().clone();
    let exec: Value = serde_json::from_str(msgs.last().unwrap()["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        exec["output_preview"],
        "10001\ntouch: cannot touch '/etc/x': Read-only file system\nchoird.sock\nptrace refused: errno 1\nchoir-agent\n"
    );
    let events = replicated_events(&pg, "demo", 2);
    assert_eq!(events.len(), 2);
    verify_extension(&ChainHead::genesis(), &events).unwrap();

    // Posture, as the engine reports it.
    let engine = choir_tests::docker::engine();
    let cid = container_of(&choird, "demo");
    let c = engine.inspect(&cid).unwrap().unwrap();
    let h = &c["HostConfig"];
    assert_eq!(h["Privileged"], false);
    assert_eq!(h["CapDrop"], json!(["ALL"]));
    assert!(h["CapAdd"].as_array().is_none_or(|a| a.is_empty()));
    assert!(h["SecurityOpt"].to_string().contains("no-new-privileges"));
    assert_eq!(h["ReadonlyRootfs"], true);
    assert!(h["Tmpfs"]["/tmp"].as_str().unwrap().contains("size=64m"));
    assert_eq!(c["Config"]["User"], "10001:10001");
    assert_eq!(
        (h["Memory"].as_i64(), h["NanoCpus"].as_i64(), h["PidsLimit"].as_i64()),
        (Some(256 << 20), Some(500_000_000), Some(128))
    );
    assert!(!["host"].contains(&h["PidMode"].as_str().unwrap_or("")) && h["IpcMode"] == "private");
    assert_eq!(h["NetworkMode"], "none");
    assert!(h["Devices"].as_array().is_none_or(|d| d.is_empty()));
    let mounts: Vec<String> =
        c["Mounts"].as_array().unwrap().iter().map(|m| m["Destination"].as_str().unwrap().to_owned()).collect();
    let mut mounts_sorted = mounts.clone();
    mounts_sorted.sort();
    assert_eq!(mounts_sorted, ["/run/choir", "/workspace"], "exactly the workspace and the socket directory");
    let inspect = c.to_string();
    assert!(!inspect.contains("docker.sock"));

    // The canary: fetched by the agent (audited), and nowhere else.
    let fetched = pg
        .client()
        .query_one(
            "SELECT count(*) FROM audit WHERE action = 'GET_SECRETS' AND outcome = 'ok' AND detail->'names' ? 'canary'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(fetched, 1, "the agent fetched the canary into memory");
    assert!(!inspect.contains(CANARY), "docker inspect");
    let (_, environ) =
        engine.exec(&cid, &["sh", "-c", "cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"]).unwrap();
    assert!(environ.contains("RUST_LOG=info") && !environ.contains(CANARY), "process environments: {environ}");
    // As root in the container (without capabilities) and as the agent's user,
    // so every file is read by one of them.
    for user in ["0:0", ""] {
        let grep = format!("grep -rIls --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {CANARY} / ; true");
        let (_, found) = engine.exec_as(&cid, user, &["sh", "-c", &grep]).unwrap();
        assert_eq!(found, "", "files in the container that contain the canary (as {user:?})");
    }
    assert!(!engine.logs(&cid).unwrap().contains(CANARY), "container logs");
    let local_log = std::fs::read_to_string(choird.workspace("demo").join(".choir/commit.log")).unwrap();
    assert!(!local_log.contains(CANARY) && !serde_json::to_string(&events).unwrap().contains(CANARY), "commit log");

    choird.ctl_ok(&["agent", "stop", "demo"]);
    assert!(engine.inspect(&cid).unwrap().is_none(), "the stopped container was removed");
    let agent_log = std::fs::read_to_string(choird.home.path().join("logs/demo.log")).unwrap();
    assert!(
        agent_log.contains("commit 1") && !agent_log.contains(CANARY),
        "the agent's log was kept, without the canary"
    );
}

#[test]
fn a_killed_container_is_restarted_and_the_conversation_resumes_without_loss() {
    if !choir_tests::docker::available() {
        return;
    }
    // Builds share the layer cache: one at a time (held until the images are gone).
    let _one_builder = choir_tests::docker::exclusive();
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::start(vec![
        Step::call("choir.fs.write", json!({"path": "a.txt", "content": "once\n", "mode": "append"})),
        Step::call("choir.exec", json!({"command": "sleep 30"})),
        Step::Text("resumed after the crash".into()),
        Step::Text("and still here".into()),
    ]);
    let choird = Choird::start(&docker_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let first = container_of(&choird, "demo");
    let home = choird.home.path().to_owned();
    let chat = std::thread::spawn(move || {
        std::process::Command::new(choir_tests::harness::bin("choirctl"))
            .arg("--home")
            .arg(home)
            .args(["chat", "demo", "write then sleep"])
            .output()
            .unwrap()
    });
    // Kill the container while `sleep 30` runs (after the write was committed).
    wait_for("the second model request", Duration::from_secs(60), || fake.requests().len() >= 2);
    std::thread::sleep(Duration::from_millis(500));
    let engine = choir_tests::docker::engine();
    let killed_at = Instant::now();
    engine.kill(&first, "KILL").unwrap();
    let out = chat.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("container was killed") && err.contains("being restarted"), "{err}");

    // The supervisor restarts it; the interrupted message is answered once.
    let mut client = pg.client();
    wait_for("the resumed answer", Duration::from_secs(90), || {
        let r = client.query_one("SELECT reply FROM messages WHERE id = 1", &[]).unwrap();
        r.get::<_, Option<String>>(0).as_deref() == Some("resumed after the crash")
    });
    eprintln!("crash-to-answer: {:?}", killed_at.elapsed());
    let second = container_of(&choird, "demo");
    assert_ne!(first, second);
    assert_eq!(
        std::fs::read_to_string(choird.workspace("demo").join("a.txt")).unwrap(),
        "once\n",
        "the committed write did not run twice"
    );
    // The resumed request carried the committed write from the log.
    let resumed = &fake.requests()[2].body["messages"];
    assert_eq!(resumed[2]["tool_calls"][0]["function"]["name"], "choir__fs__write");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "still there?"]), "and still here\n");

    let events = replicated_events(&pg, "demo", 1);
    verify_extension(&ChainHead::genesis(), &events).unwrap();
    assert_eq!(
        events.iter().map(|e| (e.seq, e.outcome)).collect::<Vec<_>>(),
        [(1, Outcome::Ok)],
        "no gap, no duplicate"
    );
    let sessions: i64 = client.query_one("SELECT count(*) FROM sessions WHERE agent_id = 'demo'", &[]).unwrap().get(0);
    assert_eq!(sessions, 2);
    let restarts: i64 = client
        .query_one("SELECT count(*) FROM audit WHERE action = 'agent.restart' AND outcome = 'ok'", &[])
        .unwrap()
        .get(0);
    assert_eq!(restarts, 1);
}

#[test]
fn a_running_agent_survives_a_choird_restart_and_refuses_a_second_start() {
    if !choir_tests::docker::available() {
        return;
    }
    // Builds share the layer cache: one at a time (held until the images are gone).
    let _one_builder = choir_tests::docker::exclusive();
    let Some(pg) = TestPg::start() else { return };
    let fake =
        FakeLlm::start(vec![Step::Text("before".into()), Step::Text("after".into()), Step::Text("updated".into())]);
    let mut choird =
        Choird::start(&docker_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let cid = container_of(&choird, "demo");
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(err.contains("already running") && err.contains(&cid[..12]), "{err}");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "one"]), "before\n");

    choird.restart();
    assert_eq!(container_of(&choird, "demo"), cid, "the same container was adopted");
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(err.contains(&cid[..12]), "still refused after the restart: {err}");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "two"]), "after\n");
    let sessions: i64 = pg.client().query_one("SELECT count(*) FROM sessions", &[]).unwrap().get(0);
    assert_eq!(sessions, 1, "the agent kept its lease");

    // An update rolls it onto a new image when its inputs change, and nothing
    // is rebuilt when they do not.
    let before: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert!(choird.ctl_ok(&["agent", "build", "demo"]).contains("is up to date"));
    let tools = choird.tools_dir("demo");
    choir_tests::harness::install_shipped_tool(&tools, "repo_status");
    let updated = choird.ctl_ok(&["agent", "update", "demo"]);
    assert!(updated.contains("stopping agent demo") && updated.contains("agent demo runs choirtest-"), "{updated}");
    let after: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_ne!(before["image"], after["image"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "three"]), "updated\n");
    let tools_offered: Vec<String> = fake.requests()[2].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(tools_offered.contains(&"choir__repo__status".to_owned()), "the new image carries the new tool");
}

#[test]
fn a_bad_manifest_fails_the_build_before_the_engine_is_touched() {
    // The engine socket does not even exist: validation must come first.
    let mut config = test_config("http://127.0.0.1:9/v1", None, &["demo"]);
    config["runtime"] = json!("docker");
    config["docker"] = json!({"socket": "/nonexistent/docker.sock", "image_prefix": "choirtest-nosock"});
    let Some(pg) = TestPg::start() else { return };
    config["database_url"] = json!(pg.url());
    let choird = Choird::start(&config, &json!({}));
    let dir = choird.tools_dir("global");
    std::fs::write(dir.join("broken.json"), r#"{"llm": {"name": "x.broken"}}"#).unwrap();
    let err = choird.ctl_err(&["agent", "build", "demo"]);
    assert!(err.contains("broken.json") && err.contains("llm.description") || err.contains("missing field"), "{err}");
    assert!(!err.contains("Docker engine"), "{err}");
    // With valid inputs, the missing engine is named plainly.
    std::fs::remove_file(dir.join("broken.json")).unwrap();
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(err.contains("no Docker engine at /nonexistent/docker.sock"), "{err}");
    assert!(err.contains("apt install docker.io") || err.contains("docker.socket"), "{err}");
}

#[test]
fn a_missing_base_image_says_how_to_make_it() {
    if !choir_tests::docker::available() {
        return;
    }
    let Some(pg) = TestPg::start() else { return };
    let mut config = docker_config("http://127.0.0.1:9/v1", Some(&pg.url()), &["demo"]);
    config["docker"]["base_image"] = json!("choir-base:does-not-exist");
    let choird = Choird::start(&config, &json!({}));
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(
        err.contains("the base image choir-base:does-not-exist is missing") && err.contains("make base-image"),
        "{err}"
    );
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(status["state"], "stopped", "a failed start leaves nothing running");
}
