//! The operator's view of an agent's skills and the way in for reviewed
//! files: `skills list` with status and source, `skills
//! validate` on a directory, and `tools add` / `skills add` taking the path
//! of an approved proposal — validated as one, committed by git, rolled out
//! to the running agent — while a refused file changes nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use choir_tests::fake_llm::Step;
use choir_tests::harness::Choird;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/skills").join(name)
}

fn git_log(repo: &Path) -> Vec<String> {
    let out = Command::new("git").arg("-C").arg(repo).args(["log", "--format=%an|%s"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

fn skills(choird: &Choird) -> Vec<Value> {
    let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "skills", "list", "demo"])).unwrap();
    v["skills"].as_array().unwrap().clone()
}

#[test]
fn reviewed_skills_and_tools_are_added_like_approved_proposals_and_listed_with_their_source() {
    let Some(Scenario { pg: _pg, llm, choird }) = Scenario::new()
        .responder(|req, _| {
            let last = req["messages"].as_array()?.last()?.clone();
            Some(match last["content"].as_str() {
                Some("count a.txt") => Step::call("x.text.wc", json!({"path": "a.txt"})),
                _ => Step::Text("noted".into()),
            })
        })
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    std::fs::write(choird.workspace("demo").join("a.txt"), "one two three\n").unwrap();

    // The built-ins, each from where it comes.
    let listed = skills(&choird);
    assert!(listed.iter().any(|s| s["name"] == "tool-builder" && s["source"] == "built-in" && s["status"] == "ok"));

    // A directory is validated file by file, naming the bad one.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("good.json"), dir.path().join("good.json")).unwrap();
    std::fs::copy(fixture("dangling.json"), dir.path().join("dangling.json")).unwrap();
    let out = choird.ctl(&["skills", "validate", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("skill triage is valid"), "{stdout}");
    assert!(stderr.contains("dangling.json") && stderr.contains("1 of 2 skill file(s) invalid"), "{stderr}");

    // A refused skill changes nothing: no commit, no approval.
    let repo = choird.home.path().join("repos/agents/demo");
    let commits = git_log(&repo).len();
    let refused = choird.ctl_err(&["skills", "add", "demo", fixture("dangling.json").to_str().unwrap()]);
    assert!(refused.contains("which is not a state"), "{refused}");
    assert_eq!(git_log(&repo).len(), commits);
    let all: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list", "--all"])).unwrap();
    assert_eq!(all["approvals"], json!([]));

    // A reviewed skill: committed by the operator, rolled out, listed as the agent's.
    let added = choird.ctl_ok(&["skills", "add", "demo", fixture("good.json").to_str().unwrap()]);
    assert!(added.contains("skill triage added as approval") && added.contains("rollout: done"), "{added}");
    let log = git_log(&repo);
    assert_eq!(log.len(), commits + 1);
    assert!(log[0].starts_with("admin|"), "{log:?}");
    let triage = skills(&choird).into_iter().find(|s| s["name"] == "triage").expect("triage listed");
    assert_eq!((&triage["source"], &triage["status"]), (&json!("agent"), &json!("ok")), "{triage}");
    assert!(triage["file"].as_str().unwrap().starts_with("repos/agents/demo/skills/"), "{triage}");
    let all: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list", "--all"])).unwrap();
    assert_eq!(
        (&all["approvals"][0]["status"], &all["approvals"][0]["lane"]),
        (&json!("approved"), &json!("operator"))
    );

    // The same skill added globally: the agent's copy replaces it.
    choird.ctl_ok(&["skills", "add", "demo", fixture("good.json").to_str().unwrap(), "--global"]);
    let both: Vec<Value> = skills(&choird).into_iter().filter(|s| s["name"] == "triage").collect();
    assert!(both.iter().any(|s| s["source"] == "global" && s["status"] == "replaced"), "{both:?}");

    // A reviewed tool: usable by the running agent with no other command.
    let manifest = dir.path().join("wc.json");
    std::fs::write(
        &manifest,
        json!({"llm": {"name": "x.text.wc", "description": "Count the words of a workspace file.",
                       "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
               "runtime": {"exec_path": "wc", "timeout_ms": 5000, "side_effect": "read", "version": "1"}})
        .to_string(),
    )
    .unwrap();
    let exec = dir.path().join("wc");
    std::fs::write(&exec, "#!/bin/sh\ncat >/dev/null\necho '{\"summary\": \"3 words\", \"words\": 3}'\n").unwrap();
    let added = choird.ctl_ok(&["tools", "add", "demo", manifest.to_str().unwrap(), exec.to_str().unwrap()]);
    assert!(added.contains("tool x.text.wc added") && added.contains("rollout: done"), "{added}");
    let tools: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "tools", "list", "demo"])).unwrap();
    // The admin API's whole answer (snapshot): every tool, its kind, its
    // status for this agent and why, where it runs and where it came from.
    // (Less the host tools of the test build only, which `make test` enables.)
    let mut shown = tools.clone();
    shown["tools"].as_array_mut().unwrap().retain(|t| !t["name"].as_str().unwrap().starts_with("choir.test."));
    choir_tests::harness::assert_snapshot("admin_tools_list", &shown);
    let wc = tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == "x.text.wc").cloned().unwrap();
    assert_eq!((&wc["kind"], &wc["status"]), (&json!("external"), &json!("connected")), "{wc}");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "count a.txt"]).trim(), "noted");
    let last = llm.requests().last().unwrap().body["messages"].to_string();
    assert!(last.contains("3 words"), "{last}");
    // Not a script, not two files, not a kind: refused with the usage.
    std::fs::write(dir.path().join("bin"), [0xffu8, 0xfe, 0x00]).unwrap();
    let err =
        choird.ctl_err(&["tools", "add", "demo", manifest.to_str().unwrap(), dir.path().join("bin").to_str().unwrap()]);
    assert!(err.contains("not UTF-8"), "{err}");
    assert!(choird
        .ctl_err(&["tools", "add", "demo", manifest.to_str().unwrap()])
        .contains("Usage: choirctl tools add"));
    assert!(choird.ctl_err(&["skills", "add", "ghost", fixture("good.json").to_str().unwrap()]).contains("ghost"));
    let audit = choird.ctl_ok(&["audit", "--agent", "demo"]);
    assert!(audit.contains("repos.add"), "{audit}");
}
