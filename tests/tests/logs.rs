//! The log manager and process-runtime restarts
//! against a real choird: an agent flooding its output is rotated, archived
//! (gzip) and kept under the total without a gap in what is kept;
//! `choirctl logs` filters and reads archives; `--follow` sees a docker
//! agent's output while it runs; a killed process agent comes back.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{bin, docker_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use parking_lot::Mutex;
use serde_json::{json, Value};

/// Lines the wrapper writes before the agent starts, at every start.
const FLOOD: u32 = 20_000;
const TOTAL_BYTES: u64 = 512 * 1024;

fn disk_use(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for d in [dir.to_owned(), dir.join("archive")] {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            total += e.metadata().map(|m| if m.is_file() { m.len() } else { 0 }).unwrap_or(0);
        }
    }
    total
}

/// `choirctl logs ... --follow`, its printed lines collected.
struct Follower {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Follower {
    fn start(choird: &Choird, args: &[&str]) -> Follower {
        let mut child = Command::new(bin("choirctl"))
            .arg("--home")
            .arg(choird.home.path())
            .arg("logs")
            .args(args)
            .arg("--follow")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (out, sink) = (child.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().push(line);
            }
        });
        Follower { child, lines }
    }

    fn wait_for(&self, what: &str, needle: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.lines.lock().iter().any(|l| l.contains(needle)) {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; followed: {:?}",
                self.lines.lock()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn records(choird: &Choird, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--json", "logs"];
    all.extend_from_slice(args);
    let page: Value = serde_json::from_str(&choird.ctl_ok(&all)).unwrap();
    page["records"].as_array().unwrap().clone()
}

fn floods(records: &[Value]) -> Vec<u32> {
    records
        .iter()
        .filter_map(|r| r["msg"].as_str()?.strip_prefix("flood ")?.split_whitespace().next()?.parse().ok())
        .collect()
}

fn agent_pid(choird: &Choird) -> u32 {
    let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    s["pid"].as_u64().unwrap_or(0) as u32
}

#[test]
fn a_flooding_agent_is_rotated_archived_and_kept_under_the_total_and_a_killed_process_agent_comes_back() {
    let scripts = tempfile::tempdir().unwrap();
    let wrapper = scripts.path().join("flooding-agent");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ni=0\nwhile [ $i -lt {FLOOD} ]; do echo \"flood $i {pad}\" >&2; i=$((i+1)); done\nexec {} \"$@\"\n",
            bin("choir-agent").display(),
            pad = "p".repeat(100),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![Step::Text("still here".into())])
        .config(|c| c["agent_binary"] = json!(wrapper))
        .config(|c| c["logs"] = json!({"max_file_mb": 0.05, "max_total_mb": TOTAL_BYTES as f64 / 1048576.0}))
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    let logs = choird.home.path().join("logs");

    // All of it written (the agent's pipe is read while it runs: on a busy
    // machine the last lines land after the start returns).
    let last = format!("flood {} ", FLOOD - 1);
    wait_for("the last flood line", Duration::from_secs(60), || {
        !records(&choird, &["demo", "--grep", &last]).is_empty()
    });
    // Rotated, compressed, and under the total once the archiver caught up.
    wait_for("the archives to fit the total", Duration::from_secs(30), || disk_use(&logs) <= TOTAL_BYTES);
    let archived: Vec<String> = std::fs::read_dir(logs.join("archive"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(archived.iter().any(|a| a.starts_with("demo.") && a.ends_with(".log.gz")), "{archived:?}");

    // What is kept is the newest run of lines, archives included, without a
    // gap and up to the last; the agent's own records come after it.
    let all = records(&choird, &["demo", "--limit", "100000"]);
    let kept = floods(&all);
    assert!(kept.len() > 1_000, "only {} flood lines kept", kept.len());
    assert_eq!(kept.last(), Some(&(FLOOD - 1)));
    let gaps: Vec<&[u32]> = kept.windows(2).filter(|w| w[1] != w[0] + 1).collect();
    assert!(gaps.is_empty(), "gaps in what was kept: {gaps:?} (first {:?}, {} kept)", kept.first(), kept.len());
    assert!(
        all.iter().any(|r| r["component"].as_str().is_some_and(|c| c.starts_with("choir_agent"))),
        "{:?}",
        &all[all.len() - 3..]
    );
    // What choird said about the agent is part of its log.
    let said = records(&choird, &["demo", "--grep", "UNSANDBOXED"]);
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["agent"], "demo");
    assert!(said[0]["component"].as_str().unwrap().starts_with("choird"), "{said:?}");
    // Filters.
    let warnings = records(&choird, &["demo", "--level", "warn"]);
    assert!(!warnings.is_empty() && warnings.iter().all(|r| r["level"] == "WARN" || r["level"] == "ERROR"));
    assert!(records(&choird, &["demo", "--since", "1h", "--grep", "flood 19999 "]).len() == 1);
    assert!(records(&choird, &["demo", "--since", "2999-01-01"]).is_empty());
    let human = choird.ctl_ok(&["logs", "demo", "--grep", "UNSANDBOXED"]);
    assert!(human.contains(" WARN  [demo] choird") && human.contains("UNSANDBOXED"), "{human}");
    // Bad input is refused with the fix.
    assert!(choird.ctl_err(&["logs", "demo", "--level", "loud"]).contains("use error, warn, info"));
    assert!(choird.ctl_err(&["logs", "demo", "--since", "soon"]).contains("give a time"));
    assert!(choird.ctl_err(&["logs", "Not-An-Id"]).contains("agent id"));

    // A killed process agent is restarted (like a container) and answers.
    let follower = Follower::start(&choird, &["demo", "--level", "warn"]);
    let pid = agent_pid(&choird);
    assert!(pid > 0);
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), rustix::process::Signal::KILL)
        .unwrap();
    follower.wait_for("the restart, followed live", "restarting");
    wait_for("a new agent process", Duration::from_secs(30), || {
        let now = agent_pid(&choird);
        now != 0 && now != pid
    });
    assert_eq!(choird.ctl_ok(&["chat", "demo", "are you there"]).trim(), "still here");
    let sessions: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "sessions", "demo"])).unwrap();
    let s = sessions["sessions"].as_array().unwrap();
    assert_eq!(s.len(), 2, "{sessions}");
    assert!(s[1]["end_reason"].as_str().unwrap().contains("signal: 9"), "{sessions}");
    // A stopped agent stays stopped.
    choird.ctl_ok(&["agent", "stop", "demo"]);
    std::thread::sleep(Duration::from_secs(2));
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(status["state"], "stopped", "{status}");
}

#[test]
fn logs_follow_sees_a_docker_agents_output_while_it_runs() {
    if !choir_tests::docker::available() {
        return;
    }
    let _one_builder = choir_tests::docker::exclusive();
    let Some(pg) = TestPg::start() else { return };
    let fake = FakeLlm::start(vec![
        Step::call("choir.fs.write", json!({"path": "n.txt", "content": "n"})),
        Step::Text("written".into()),
    ]);
    let choird = Choird::start(&docker_config(&fake.base_url(), Some(&pg.url()), &["demo"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let follower = Follower::start(&choird, &["demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write n"]).trim(), "written");
    // The agent's commit line, from inside the running container.
    follower.wait_for("the agent's commit line", "commit 1: edge choir.fs.write");
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(status["state"], "running", "seen while it runs: {status}");
    let line = follower.lines.lock().iter().find(|l| l.contains("commit 1:")).cloned().unwrap();
    assert!(line.contains(" INFO  [demo] choir_agent"), "{line}");
    choird.ctl_ok(&["agent", "stop", "demo"]);
}

#[test]
fn a_process_agent_configured_for_http_talks_to_choird_over_http_listen() {
    let port = choir_tests::ports::unused_port();
    let Some(Scenario { pg: _pg, llm: _fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.fs.write", json!({"path": "h.txt", "content": "over http"})),
            Step::Text("done over http".into()),
        ])
        .config(|c| c["http_listen"] = json!(format!("127.0.0.1:{port}")))
        .config(|c| c["agents"]["demo"] = json!({"transport": "http"}))
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "write it"]).trim(), "done over http");
    assert_eq!(std::fs::read_to_string(choird.workspace("demo").join("h.txt")).unwrap(), "over http");
    // It was told to connect to the TCP listener.
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", agent_pid(&choird))).unwrap();
    assert!(cmdline.contains(&format!("http://127.0.0.1:{port}")), "{cmdline:?}");
}
