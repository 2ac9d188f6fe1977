//! Approvals roll out: an approved tool reaches the
//! running docker agent with no other command — its image rebuilt, the agent
//! restarted on it between messages — and a failed build leaves the agent
//! running as it was, saying why, to choirctl and to the agent's admins.

use std::time::Duration;

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::{texts_by_chat, FakeTelegram};
use choir_tests::harness::{docker_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const TOKEN: &str = "333333:DDDD-rollout-token";

fn manifest(name: &str) -> Value {
    json!({
        "llm": {"name": name, "description": "Count the words of a workspace file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false}},
        "runtime": {"exec_path": name.rsplit('.').next().unwrap(), "timeout_ms": 5000, "side_effect": "read", "version": "1"}
    })
}

const WC: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"summary\": \"counted 3 words\", \"words\": 3}'\n";

fn status(choird: &Choird) -> Value {
    serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap()
}

fn pending(choird: &Choird) -> Vec<Value> {
    let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list"])).unwrap();
    v["approvals"].as_array().unwrap().clone()
}

#[test]
fn an_approved_tool_reaches_the_running_container_and_a_failed_build_leaves_it_running() {
    if !choir_tests::docker::available() {
        return;
    }
    let _one_builder = choir_tests::docker::exclusive();
    let Some(pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        Some(match last["content"].as_str() {
            Some(text) if text.starts_with("propose ") => {
                let name = text.trim_start_matches("propose ");
                Step::call(
                    "choir.propose.tool",
                    json!({"manifest": manifest(name), "executable": WC, "reason": "the user counts words"}),
                )
            }
            Some("count a.txt") => Step::call("x.text.wc", json!({"path": "a.txt"})),
            _ => Step::Text("noted".into()),
        })
    });
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 333333, "roll_bot");
    let mut config = docker_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    config["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 50,
        "bots": {"r": {"token_secret": "tg", "users": {"601": {"agent": "demo", "admin": true}}}}});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "tg": TOKEN}));
    choird.ctl_ok(&["agent", "build", "demo"]);
    choird.ctl_ok(&["agent", "start", "demo"]);
    std::fs::write(choird.workspace("demo").join("a.txt"), "one two three\n").unwrap();
    let before = status(&choird);

    // Proposed, approved with choirctl: choirctl follows the rollout to its end.
    assert_eq!(choird.ctl_ok(&["chat", "demo", "propose x.text.wc"]).trim(), "noted");
    wait_for("the proposal", Duration::from_secs(30), || pending(&choird).len() == 1);
    let id = pending(&choird)[0]["id"].as_i64().unwrap().to_string();
    let approved = choird.ctl_ok(&["approvals", "approve", &id]);
    assert!(approved.contains("rollout: done") && approved.contains("Successfully tagged"), "{approved}");
    let after = status(&choird);
    assert_eq!(after["state"], "running");
    assert_ne!(after["image"], before["image"], "a new image: {approved}");
    assert_ne!(after["container"], before["container"]);
    // The image it ran before is gone (one stays per agent); prune keeps
    // the one in use, saying why.
    let engine = choir_tests::docker::engine();
    assert!(engine.image(before["image"].as_str().unwrap()).unwrap().is_none(), "the superseded image was removed");
    let pruned = choird.ctl_ok(&["prune"]);
    assert!(
        pruned.contains(&format!("kept     {} (a container runs it)", after["image"].as_str().unwrap())),
        "{pruned}"
    );
    assert!(approved.contains(after["image"].as_str().unwrap()), "{approved}");
    // Usable at once, with no other command.
    assert_eq!(choird.ctl_ok(&["chat", "demo", "count a.txt"]).trim(), "noted");
    let reqs = llm.requests();
    let result =
        reqs.last().unwrap().body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").cloned();
    let result: Value = serde_json::from_str(result.unwrap()["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["words"], 3, "{result}");
    let shown = choird.ctl_ok(&["approvals", "show", &id]);
    assert!(shown.contains("rollout:   done") && shown.contains("rollout done"), "{shown}");
    wait_for("the admin told of the rollout", Duration::from_secs(20), || {
        texts_by_chat(&tg.calls()).get(&601).is_some_and(|t| t.iter().any(|t| t.contains("rollout done")))
    });

    // The next build cannot succeed (its base image is gone from config):
    // the approval stands, the agent keeps running as it was, and says why.
    let path = choird.home.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["docker"]["base_image"] = json!("choir-base:missing-for-rollout");
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    choir_common::proc_tree::signal(choird.pid() as i32, rustix::process::Signal::HUP);
    wait_for("the reload", Duration::from_secs(10), || choird.stderr().contains("reloaded"));
    assert_eq!(choird.ctl_ok(&["chat", "demo", "propose x.text.wc2"]).trim(), "noted");
    let said: Vec<String> = llm.requests().last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| format!("{}: {}", m["role"], m["content"]))
        .collect();
    assert!(said.last().unwrap().contains("pending_approval"), "the second proposal is pending: {said:#?}");
    wait_for("the second proposal", Duration::from_secs(30), || pending(&choird).len() == 1);
    let id2 = pending(&choird)[0]["id"].as_i64().unwrap().to_string();
    let err = choird.ctl_err(&["approvals", "approve", &id2]);
    assert!(err.contains("approved, but the rollout failed") && err.contains("keeps running as it was"), "{err}");
    assert!(err.contains("choir-base:missing-for-rollout"), "the reason is named: {err}");
    let still = status(&choird);
    assert_eq!(
        (&still["state"], &still["container"], &still["image"]),
        (&after["state"], &after["container"], &after["image"])
    );
    assert_eq!(choird.ctl_ok(&["chat", "demo", "still there?"]).trim(), "noted");
    let shown = choird.ctl_ok(&["approvals", "show", &id2]);
    assert!(shown.contains("status:   approved") || shown.contains("approved"), "{shown}");
    assert!(shown.contains("rollout:   failed"), "{shown}");
    wait_for("the admin told of the failure", Duration::from_secs(20), || {
        texts_by_chat(&tg.calls()).get(&601).is_some_and(|t| t.iter().any(|t| t.contains("rollout failed")))
    });
}
