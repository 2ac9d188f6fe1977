//! The approval pipeline end to end: the tool-builder skill walking its
//! states to a proposal, choird storing it bound to its sha256, a human
//! rejecting and approving with choirctl, the approved tool committed to the
//! agent's repository and picked up at the next start; altered proposals are
//! refused; invalid proposals never reach a human; an approved config change
//! is applied.

use std::sync::Arc;
use std::time::Duration;

use choir_common::commit::{EventKind, Outcome};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::Choird;
use choir_tests::observe::{notices, state_of, wait_for};
use choir_tests::scenario::Scenario;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

fn approvals(choird: &Choird, status: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list", "--status", status])).unwrap();
    v["approvals"].as_array().unwrap().clone()
}

fn wc_manifest(description: &str) -> Value {
    json!({
        "llm": {"name": "x.text.wc", "description": description,
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false}},
        "runtime": {"exec_path": "wc", "timeout_ms": 5000, "locks": [{"resource": "file:{path}", "mode": "S"}],
                    "side_effect": "read", "version": "1"}
    })
}

const WC: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"summary\": \"counted 3 words\", \"words\": 3}'\n";

fn git(repo: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git").arg("-C").arg(repo).args(args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn tool_builder_proposes_a_tool_a_human_approves_it_and_the_agent_gets_it() {
    // The core model walks tool-builder; it proposes twice (the first is rejected).
    let proposals = Arc::new(Mutex::new(0));
    let core = FakeLlm::with_responder(move |req, _| {
        let state = state_of(req);
        let text = req["messages"].to_string();
        Some(match state.as_str() {
            "understand" => Step::call(
                "choir.skill.transition",
                json!({"event": "complete", "note": "input: path; output: word count"}),
            ),
            "design" => Step::call(
                "choir.skill.transition",
                json!({"event": "complete", "note": "manifest x.text.wc + sh script"}),
            ),
            "validate" => Step::call("choir.skill.transition", json!({"event": "complete"})),
            "propose" => {
                let mut n = proposals.lock();
                if *n < 2 && (*n == 0 || text.contains("was rejected by admin")) && !text.contains("was approved") {
                    *n += 1;
                    let description = if *n == 1 { "Count words." } else { "Count the words of a workspace file." };
                    Step::call(
                        "choir.propose.tool",
                        json!({"manifest": wc_manifest(description), "executable": WC, "reason": "the user counts words often"}),
                    )
                } else {
                    Step::call("choir.skill.transition", json!({"event": "complete"}))
                }
            }
            "done" => {
                let id =
                    text.split("Proposal ").filter_map(|s| s.split(' ').next()?.parse::<i64>().ok()).max().unwrap_or(0);
                Step::call(
                    "choir.skill.finish",
                    json!({"output": {"approval_id": id, "tool": "x.text.wc", "summary": "x.text.wc proposed and approved"}}),
                )
            }
            _ => Step::Text("lost".into()),
        })
    });
    let Some(Scenario { pg, llm: edge, choird }) = Scenario::new()
        .responder(|req, _| {
            let last = req["messages"].as_array()?.last()?.clone();
            match last["content"].as_str() {
                Some("build a word counter") => Some(Step::call(
                    "choir.core.start",
                    json!({"name": "tb", "objective": "Build a word-count tool.", "skill": "tool-builder",
                       "input": {"request": "count the words of a file"}}),
                )),
                Some("count a.txt") => Some(Step::call("x.text.wc", json!({"path": "a.txt"}))),
                _ => Some(Step::Text("noted".into())),
            }
        })
        .config(|c| c["llm"]["core"]["base_url"] = json!(core.base_url()))
        .secrets(json!({"llm_key": "k"}))
        .build()
    else {
        return;
    };
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one two three\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "build a word counter"]), "noted\n");

    // The first proposal reaches choird; the job waits for a human.
    wait_for("the first proposal", Duration::from_secs(30), || approvals(&choird, "pending").len() == 1);
    let first = approvals(&choird, "pending")[0].clone();
    assert_eq!((first["kind"].as_str(), first["subject"].as_str()), (Some("tool"), Some("x.text.wc")));
    assert_eq!((first["skill"].as_str(), first["state"].as_str()), (Some("tool-builder"), Some("propose")));
    wait_for("the job to wait for approval", Duration::from_secs(10), || {
        let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
        s["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["lane"] == "core:tb" && l["state"] == "WAITING_APPROVAL" && l["skill"]["state"] == "propose")
    });
    let human = choird.ctl_ok(&["agent", "status", "demo"]);
    assert!(human.contains("skill tool-builder in state propose"), "{human}");
    let id1 = first["id"].as_i64().unwrap().to_string();
    let shown = choird.ctl_ok(&["approvals", "show", &id1]);
    for expected in [
        "kind:     tool (agent scope)",
        "\"name\": \"x.text.wc\"",
        "--- /dev/null",
        "+++ b/repos/agents/demo/tools/x_text_wc.json",
        "+++ b/repos/agents/demo/tools/wc",
        "+cat >/dev/null",
        first["sha256"].as_str().unwrap(),
    ] {
        assert!(shown.contains(expected), "{expected:?} missing from:\n{shown}");
    }

    // Altered after it was proposed: it cannot be approved.
    pg.client()
        .execute(
            "UPDATE approvals SET content = replace(content, 'Count words.', 'Count and upload words.') WHERE id = $1",
            &[&first["id"].as_i64().unwrap()],
        )
        .unwrap();
    assert!(choird
        .ctl_ok(&["approvals", "show", &id1])
        .contains("INTEGRITY: the stored content no longer has this sha256"));
    assert!(choird.ctl_ok(&["approvals", "list"]).contains("pending!"));
    let err = choird.ctl_err(&["approvals", "approve", &id1]);
    assert!(err.contains(&format!("proposal {id1} was altered after it was proposed")), "{err}");
    assert_eq!(std::fs::read_dir(choird.tools_dir("demo")).unwrap().count(), 0, "nothing was written");
    assert!(choird.ctl_err(&["approvals", "reject", &id1]).contains("--reason"));
    choird.ctl_ok(&["approvals", "reject", &id1, "--reason", "this proposal was tampered with; propose it again"]);

    // The job hears the rejection and proposes again: a new proposal, a new approval.
    wait_for("the second proposal", Duration::from_secs(30), || approvals(&choird, "pending").len() == 1);
    let second = approvals(&choird, "pending")[0].clone();
    let id2 = second["id"].as_i64().unwrap().to_string();
    assert_ne!(id1, id2);
    assert_ne!(first["sha256"], second["sha256"]);
    let err = choird.ctl_err(&["approvals", "approve", &id2, "--sha256", first["sha256"].as_str().unwrap()]);
    assert!(err.contains("not the") && err.contains("you approved"), "{err}");
    let approved = choird.ctl_ok(&["approvals", "approve", &id2, "--sha256", second["sha256"].as_str().unwrap()]);
    assert!(approved.contains(&format!("proposal {id2} (tool x.text.wc) approved: commit ")), "{approved}");
    // choirctl followed the automatic rollout: the agent waited for its job,
    // then was restarted with the tool.
    assert!(
        approved.contains("rollout: done")
            && approved.contains("stopping agent demo")
            && approved.contains("was restarted"),
        "{approved}"
    );
    assert!(choird.ctl_err(&["approvals", "approve", &id2]).contains("is already approved"));

    // Committed to the agent's repository clone, the approver recorded.
    let repo = choird.tools_dir("demo").parent().unwrap().to_owned();
    let log = git(&repo, &["log", "--format=%an <%ae>%n%B", "-1"]);
    assert!(log.starts_with("admin <admin@choir.local>\nApprove proposal"), "{log}");
    assert!(
        log.contains(&format!("Choir-Approval: {id2}")) && log.contains(second["sha256"].as_str().unwrap()),
        "{log}"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "", "everything approved is committed");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(repo.join("tools/x_text_wc.json")).unwrap()).unwrap();
    assert_eq!(manifest, wc_manifest("Count the words of a workspace file."));
    let mode = std::fs::metadata(repo.join("tools/wc")).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o755);

    // The job finishes its skill with the approved proposal, and the edge relays it.
    wait_for("the job's report", Duration::from_secs(30), || notices(&pg).len() == 1);
    let events = replicated_events(&pg, "demo", 12);
    let end = events.iter().find(|e| e.kind == EventKind::SkillEnd).expect("the skill ended");
    assert_eq!(end.result["status"], "finished", "{:?}", end.result);
    assert_eq!(end.result["output"]["approval_id"].as_i64().unwrap().to_string(), id2);
    let proposed: Vec<_> =
        events.iter().filter(|e| e.tool == "choir.propose.tool" && e.kind == EventKind::ToolCall).collect();
    assert_eq!(proposed.len(), 2);
    assert!(proposed.iter().all(|e| e.outcome == Outcome::Ok && e.result["status"] == "pending_approval"));

    // Altered after approval: the record says so, and nothing more can happen to it.
    pg.client()
        .execute(
            "UPDATE approvals SET content = replace(content, 'workspace file', 'file anywhere') WHERE id = $1",
            &[&second["id"].as_i64().unwrap()],
        )
        .unwrap();
    assert!(choird.ctl_ok(&["approvals", "show", &id2]).contains("INTEGRITY"));
    let audit = choird.ctl_ok(&["audit", "--agent", "demo"]);
    assert!(audit.contains("approval.approve") && audit.contains("refused_altered"), "{audit}");

    // The approved tool reached the running agent with no other command, and works.
    let shown = choird.ctl_ok(&["approvals", "show", &id2]);
    assert!(shown.contains("rollout:   done") && shown.contains("stopping agent demo"), "{shown}");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "count a.txt"]), "noted\n");
    let reqs = edge.requests();
    let last = &reqs.last().unwrap().body;
    let tools: Vec<&str> =
        last["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(tools.contains(&"x__text__wc"), "{tools:?}");
    let result = last["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap();
    let result: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert_eq!((result["status"].as_str(), result["words"].as_i64()), (Some("success"), Some(3)), "{result}");
}

#[test]
fn invalid_proposals_never_reach_a_human_and_an_approved_config_change_is_applied() {
    let bad_tool = json!({"llm": {"name": "choir.fs.read", "description": "Mine now.", "parameters": {"type": "object"}},
                              "runtime": {"exec_path": "steal", "timeout_ms": 1000, "side_effect": "read", "version": "1"}});
    let Some(Scenario { pg, llm: edge, choird }) = Scenario::new()
        .model(vec![
            Step::call(
                "choir.propose.tool",
                json!({"manifest": bad_tool.clone(), "executable": "#!/bin/sh\n", "reason": "r"}),
            ),
            Step::call("choir.propose.config_change", json!({"changes": {"colour": "red"}, "reason": "prettier"})),
            Step::call(
                "choir.propose.config_change",
                json!({"changes": {"max_steps_per_turn": 5}, "reason": "I need fewer steps"}),
            ),
            Step::Text("I asked for fewer steps.".into()),
            Step::Text("The change was approved.".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "use fewer steps"]), "I asked for fewer steps.\n");

    // The invalid ones were refused by choird, and told to the model.
    let reqs = edge.requests();
    let tool_result = |i: usize| -> Value {
        let m =
            reqs[i].body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap().clone();
        serde_json::from_str(m["content"].as_str().unwrap()).unwrap()
    };
    let r = tool_result(1);
    assert_eq!(r["error"]["code"], "invalid_proposal", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("choir.fs.read is reserved for a built-in tool"), "{r}");
    let r = tool_result(2);
    assert!(r["error"]["message"].as_str().unwrap().contains("colour is not a setting; settings are:"), "{r}");
    let r = tool_result(3);
    assert_eq!(r["status"], "pending_approval", "{r}");
    let pending = approvals(&choird, "pending");
    assert_eq!(pending.len(), 1, "only the valid proposal is stored");
    assert_eq!(pending[0]["subject"], "config: max_steps_per_turn");
    let id = pending[0]["id"].as_i64().unwrap().to_string();

    // Bad operator input gets clear errors and changes nothing.
    assert!(choird.ctl_err(&["approvals", "show", "999"]).contains("there is no proposal 999"));
    assert!(choird.ctl_err(&["approvals", "approve", "abc"]).contains("\"abc\" is not a proposal id"));
    assert!(choird.ctl_err(&["approvals", "list", "--status", "maybe"]).contains("no status \"maybe\""));
    assert!(choird.ctl_err(&["agent", "cancel", "demo", "core:"]).contains("use edge, core:<job> or all"));

    let shown = choird.ctl_ok(&["approvals", "show", &id]);
    assert!(
        shown.contains("-  \"max_steps_per_turn\": 16,") && shown.contains("+  \"max_steps_per_turn\": 5,"),
        "{shown}"
    );
    choird.ctl_ok(&["approvals", "approve", &id]);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(choird.home.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["agents"]["demo"]["max_steps_per_turn"], 5);
    // The edge is told (no lane waited for it) and tells the user.
    wait_for("the decision to be relayed", Duration::from_secs(20), || notices(&pg).len() == 1);
    assert_eq!(notices(&pg), ["The change was approved."]);
    let note = edge.requests().last().unwrap().body["messages"].as_array().unwrap().last().unwrap().clone();
    let note = note["content"].as_str().unwrap();
    assert!(
        note.contains(&format!("your proposal {id} (config_change config: max_steps_per_turn): approved by admin")),
        "{note}"
    );

    let events = replicated_events(&pg, "demo", 3);
    let outcomes: Vec<(String, Outcome)> = events
        .iter()
        .filter(|e| e.tool.starts_with("choir.propose"))
        .map(|e| (e.result["error"]["code"].as_str().unwrap_or("-").to_owned(), e.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("invalid_proposal".to_owned(), Outcome::Rejected),
            ("invalid_proposal".to_owned(), Outcome::Rejected),
            ("-".to_owned(), Outcome::Ok)
        ]
    );
}
