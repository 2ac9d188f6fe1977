//! choird as a systemd service runs it: stopped the way `KillMode=mixed`
//! stops it, told READY only once it answers, a port in use said at once
//! with its config field, the reason a start failed kept in its log and
//! readable with choird down, and `choirctl status` telling "starting" from
//! "not running".

use std::time::{Duration, Instant};

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird, TempHome};
use serde_json::json;

fn managed_available() -> bool {
    if choird::db::cluster::ManagedCluster::find_bin_dir(None).is_err() {
        assert!(!choir_tests::services_required(), "PostgreSQL is required");
        eprintln!("SKIPPED: no PostgreSQL server binaries");
        return false;
    }
    true
}

/// Every process under `pid` (its children, theirs, …).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // After the parenthesised name: state, then the parent's pid.
        let Some(after) = stat.rsplit_once(')').map(|(_, a)| a.to_owned()) else { continue };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|x| x.parse::<u32>().ok()) {
            parent_of.push((p, ppid));
        }
    }
    let mut out = vec![];
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for (child, _) in parent_of.iter().filter(|(_, pp)| *pp == p) {
            out.push(*child);
            frontier.push(*child);
        }
    }
    out
}

fn running_agent(fake: &FakeLlm) -> Choird {
    let config = test_config(&fake.base_url(), None, &["demo"]);
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "hello\n");
    choird
}

/// `systemctl stop` with KillMode=mixed sends SIGTERM to choird alone: it
/// stops its agent (recording the stop, closing the session) and then its
/// database, and the next start finds nothing left open. The negative
/// control takes the database down first, which the default KillMode
/// (control-group: every process signalled at once) allowed.
#[test]
fn stopped_as_systemd_stops_it_choird_records_every_stop_and_leaves_no_session_open() {
    if !managed_available() {
        return;
    }
    let fake = FakeLlm::start(vec![Step::Text("hello".into()), Step::Text("hello".into())]);
    let mut choird = running_agent(&fake);
    assert!(!descendants(choird.pid()).is_empty(), "the agent and the database run under choird");
    choird.restart();
    let said = choird.stderr();
    for lost in ["audit record lost", "cannot record the end", "left open"] {
        assert!(!said.contains(lost), "a stop of choird alone lost something ({lost}):\n{said}");
    }

    // Negative control: the database goes down under choird, as it could
    // when the whole control group got its signal at once (PostgreSQL's
    // fast shutdown, the way its own unit stops it): the checks above see
    // the loss.
    choird.wait_running("demo"); // it ran when choird stopped: started again
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "hello\n");
    let before = choird.stderr().len();
    let pidfile = std::fs::read_to_string(choird.home.path().join("pg/data/postmaster.pid")).unwrap();
    let postmaster: i32 = pidfile.lines().next().unwrap().trim().parse().unwrap();
    let pg = rustix::process::Pid::from_raw(postmaster).unwrap();
    rustix::process::kill_process(pg, rustix::process::Signal::INT).unwrap();
    while rustix::process::test_kill_process(pg).is_ok() {
        std::thread::sleep(Duration::from_millis(20));
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(choird.pid() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    choird.stop(); // waits for choird to exit (it got its SIGTERM above)
    choird.kill_and_restart(); // nothing left to kill: starts it again
    let said = choird.stderr();
    let lost = ["audit record lost", "cannot record the end", "left open"];
    assert!(
        lost.iter().any(|l| said.contains(l)),
        "with the database gone first, a record is lost; this test could not tell:\n{}",
        &said[before.min(said.len())..]
    );
}

/// Under `Type=notify`, READY=1 arrives only once the admin socket answers,
/// and STOPPING=1 when choird begins to stop.
#[test]
fn choird_tells_systemd_it_is_ready_once_its_admin_socket_answers() {
    if !managed_available() {
        return;
    }
    let fake = FakeLlm::start(vec![]);
    let home = TempHome::new(&test_config(&fake.base_url(), None, &[]), &json!({"llm_key": "k"}));
    let notify_path = home.path().join("notify.sock");
    let rx = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let mut choird = Choird::spawn_with_env(home, &[("NOTIFY_SOCKET", notify_path.as_os_str())]);
    let mut buf = [0u8; 256];
    let n = rx.recv(&mut buf).expect("READY within 90 s");
    let said = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(said.lines().any(|l| l == "READY=1"), "{said}");
    let socket = choird.home.path().join("socks/choird.sock");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok(), "READY came before the admin socket answered");
    choird.wait_ready();
    assert!(choird.stop().is_some_and(|s| s.success()));
    let n = rx.recv(&mut buf).expect("STOPPING");
    assert!(String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "STOPPING=1"));
}

/// A port in use: choird stops before any database work, naming the field;
/// the reason is in logs/choird.log and `choirctl logs` shows it with
/// choird down; no admin socket is left behind.
#[test]
fn a_listen_port_in_use_is_named_by_its_field_logged_and_readable_with_choird_down() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut config = test_config("http://127.0.0.1:9", Some("host=/nonexistent dbname=x"), &[]);
    config["metrics_listen"] = json!(addr);
    let home = TempHome::new(&config, &json!({"llm_key": "k"}));
    let started = Instant::now();
    let (status, stderr) = home.run_choird_to_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(stderr.contains("metrics_listen") && stderr.contains(&addr), "{stderr}");
    assert!(!stderr.contains("database"), "the port is checked before the database: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!home.path().join("socks/choird.sock").exists(), "no stale admin socket");

    let log = std::fs::read_to_string(home.path().join("logs/choird.log")).unwrap();
    assert!(log.contains("metrics_listen"), "the fatal error is in choird.log: {log}");
    let out = std::process::Command::new(choir_tests::harness::bin("choirctl"))
        .arg("--home")
        .arg(home.path())
        .args(["logs", "--level", "error"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("metrics_listen"), "choirctl logs reads the files with choird down: {shown}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"), "and says where it read from");
}

/// While choird holds its instance lock but does not answer yet (initdb),
/// `choirctl status` says it is starting, with its pid, not "not running".
#[test]
fn status_says_starting_while_choird_prepares_its_database() {
    if !managed_available() {
        return;
    }
    let fake = FakeLlm::start(vec![]);
    let home = TempHome::new(&test_config(&fake.base_url(), None, &[]), &json!({"llm_key": "k"}));
    let mut choird = Choird::spawn_with_env(home, &[]);
    let pid = choird.pid().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let out = choird.ctl(&["status"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            break;
        }
        if seen.last() != Some(&err) {
            seen.push(err);
        }
        assert!(Instant::now() < deadline, "{seen:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    choird.wait_ready();
    assert!(seen.iter().any(|s| s.contains("starting") && s.contains(&pid)), "while initdb ran, status said: {seen:?}");
}

/// What `systemctl`/`docker` users expect of start, stop, restart and
/// update: a stop of a stopped agent is done already (exit 0); `agent
/// restart` starts a stopped agent; `agent update` under the process
/// runtime restarts it without asking a Docker engine; a restart of choird
/// starts again the agents that were running (not the stopped ones), with
/// no `autostart` set.
#[test]
fn agents_stop_restart_update_and_come_back_after_a_choird_restart_as_operators_expect() {
    let Some(choir_tests::scenario::Scenario { pg: _pg, llm: _fake, mut choird }) =
        choir_tests::scenario::Scenario::new()
            .model(vec![Step::Text("one".into()), Step::Text("two".into())])
            .agents(&["demo", "idle"])
            .config(|c| c["docker"] = json!({"socket": "/nonexistent/docker.sock"}))
            .secrets(json!({"llm_key": "k"}))
            .running()
            .build()
    else {
        return;
    };
    choird.ctl_ok(&["agent", "stop", "idle"]);
    let out = choird.ctl(&["agent", "stop", "idle"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("was not running"), "{out:?}");

    let session = |c: &Choird, id: &str| -> Option<u64> {
        let s: serde_json::Value = serde_json::from_str(&c.ctl_ok(&["--json", "agent", "status", id])).unwrap();
        s["session_id"].as_u64().filter(|_| s["state"] != "stopped")
    };
    let before = session(&choird, "demo").expect("demo runs");
    let said = choird.ctl_ok(&["agent", "update", "demo"]);
    assert!(said.contains("no image to build"), "{said}");
    let after = session(&choird, "demo").expect("demo runs after update");
    assert!(after > before, "update restarted it: {before} -> {after}");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "one\n");

    choird.ctl_ok(&["agent", "stop", "demo"]);
    assert!(choird.ctl_ok(&["agent", "restart", "demo"]).contains("restarted"));
    assert!(session(&choird, "demo").is_some(), "restart starts a stopped agent");

    // demo runs, idle does not: after choird's restart, the same.
    choird.restart();
    choird.wait_running("demo");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "again"]), "two\n");
    assert_eq!(session(&choird, "idle"), None, "a stopped agent stays stopped");
    assert!(choird.stderr().contains("was running when choird stopped; started again"));

    // A runtime switched by SIGHUP applies at the next start; status shows
    // the runtime the agent runs in, and the configured one beside it.
    let path = choird.home.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["runtime"] = json!("docker");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let pid = rustix::process::Pid::from_raw(choird.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    choir_tests::observe::wait_for("the reload", Duration::from_secs(30), || {
        choird.stderr().contains("keep the runtime they run in until restarted")
    });
    let s: serde_json::Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!((s["runtime"].as_str(), s["configured_runtime"].as_str()), (Some("process"), Some("docker")), "{s}");
    assert!(choird.ctl_ok(&["agent", "status", "demo"]).contains("config.json now says docker"));
    config["runtime"] = json!("process");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();

    // Status fields hold for the session they describe: no previous exit on a
    // running agent; no session state or lanes on a stopped one.
    let s: serde_json::Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert!(s.get("last_exit").is_none_or(|v| v.is_null()), "{s}");
    choird.ctl_ok(&["agent", "stop", "demo"]);
    let s: serde_json::Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(s["state"], "stopped");
    assert!(s.get("session_state").is_none_or(|v| v.is_null()), "a stopped agent has no session state: {s}");
    assert!(s["lanes"].as_array().is_none_or(|l| l.is_empty()), "{s}");
    // Negative control: stopped by the operator before choird's restart, it stays stopped.
    choird.restart();
    assert_eq!(session(&choird, "demo"), None);
}

/// `choirctl reload` says what applies now, what waits for a restart, and
/// why a reload was refused (exit 1, the running configuration kept);
/// `status` says when config.json on disk is not what choird runs with.
#[test]
fn reload_reports_what_it_applied_what_waits_and_why_it_refused() {
    let Some(choir_tests::scenario::Scenario { pg: _pg, llm: _fake, choird }) =
        choir_tests::scenario::Scenario::new().secrets(json!({"llm_key": "k"})).build()
    else {
        return;
    };
    let path = choird.home.path().join("config.json");
    let original = std::fs::read_to_string(&path).unwrap();
    assert!(!choird.ctl_ok(&["status"]).contains("config:"), "nothing differs yet");
    let mut config: serde_json::Value = serde_json::from_str(&original).unwrap();
    config["agents"]["demo"]["max_steps_per_turn"] = json!(7);
    config["agents"]["demo"]["resources"] = json!({"pids": 99});
    config["metrics_listen"] = json!("127.0.0.1:0");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    assert!(choird.ctl_ok(&["status"]).contains("config.json has changed since it was loaded"));

    let said = choird.ctl_ok(&["reload"]);
    assert!(said.contains("applied now: agents.demo.max_steps_per_turn"), "{said}");
    assert!(
        said.contains("at each agent's next start (choirctl agent restart ID): agents.demo.resources.pids"),
        "{said}"
    );
    assert!(said.contains("only after choird restarts (systemctl restart choird): metrics_listen"), "{said}");
    assert!(!choird.ctl_ok(&["status"]).contains("config:"), "{}", choird.ctl_ok(&["status"]));

    // Refused: nothing changes, and the operator is told why.
    std::fs::write(&path, original.replace("\"agents\"", "\"agnets\"")).unwrap();
    let out = choird.ctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reload refused") && err.contains("agnets"), "{err}");
    assert!(choird.ctl_ok(&["status"]).contains("config.json on disk is not valid"));
    let s: serde_json::Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(s["id"], "demo", "the running configuration still has its agent");
    let audit = choird.ctl_ok(&["--json", "audit", "--limit", "20"]);
    assert!(audit.contains("config.reload") && audit.contains("refused"), "{audit}");
}

/// `admin_group`: its members use the admin socket without sudo (mode 0660
/// in a 0710 directory of the group); without it, only choird's user (the
/// negative control: the same member is refused). An unknown group stops
/// choird at start, naming the field.
#[test]
fn members_of_the_admin_group_reach_the_admin_socket_and_no_one_else() {
    let Some(pg) = choir_tests::pg::TestPg::start() else { return };
    let fake = FakeLlm::start(vec![]);
    let as_nobody = |home: &std::path::Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(choir_tests::harness::bin("choirctl"))
            .arg("--home")
            .arg(home)
            .arg("status")
            .output()
            .unwrap()
    };
    let traversable = |home: &std::path::Path| {
        std::fs::set_permissions(home, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    };
    let mut config = test_config(&fake.base_url(), Some(&pg.url()), &[]);
    config["admin_group"] = json!("nogroup");
    let choird = Choird::start(&config, &json!({"llm_key": "k"}));
    traversable(choird.home.path());
    let out = as_nobody(choird.home.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let socks = std::fs::metadata(choird.home.path().join("socks")).unwrap();
    let sock = std::fs::metadata(choird.home.path().join("socks/choird.sock")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((socks.mode() & 0o777, sock.mode() & 0o777, sock.gid()), (0o710, 0o660, 65534));
    drop(choird);

    let choird = Choird::start(&test_config(&fake.base_url(), Some(&pg.url()), &[]), &json!({"llm_key": "k"}));
    traversable(choird.home.path());
    let out = as_nobody(choird.home.path());
    assert!(!out.status.success(), "without admin_group, another user is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ermission denied"), "{out:?}");
    drop(choird);

    config["admin_group"] = json!("no-such-group-here");
    let home = TempHome::new(&config, &json!({"llm_key": "k"}));
    let (status, stderr) = home.run_choird_to_exit(Duration::from_secs(30));
    assert!(!status.success() && stderr.contains("admin_group") && stderr.contains("no-such-group-here"), "{stderr}");
}
