//! The operator's per-agent tool policy:
//! `choirctl policy tools AGENT --deny choir.exec` rewrites config.json and
//! reaches the running agent without a restart: the tool is no longer
//! offered to the model, a call to it anyway is refused, and `tools list`
//! says it is off and why.

use std::time::Duration;

use choir_tests::fake_llm::Step;
use choir_tests::harness::Choird;
use choir_tests::observe::{last_tool_result, tool_names, wait_for};
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

fn config_version(choird: &Choird) -> u64 {
    let s: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    s["config_version"].as_u64().unwrap_or(0)
}

fn config_file(choird: &Choird) -> Value {
    serde_json::from_str(&std::fs::read_to_string(choird.home.path().join("config.json")).unwrap()).unwrap()
}

#[test]
fn a_denied_tool_is_neither_offered_nor_run_once_the_operator_says_so_without_a_restart() {
    let Some(Scenario { pg: _pg, llm: fake, choird }) = Scenario::new()
        .model(vec![
            Step::call("choir.exec", json!({"command": "echo first"})),
            Step::Text("ran".into()),
            Step::call("choir.exec", json!({"command": "echo second > second.txt"})),
            Step::Text("refused".into()),
        ])
        .secrets(json!({"llm_key": "k"}))
        .running()
        .build()
    else {
        return;
    };
    assert_eq!(choird.ctl_ok(&["chat", "demo", "run it"]).trim(), "ran");
    assert!(tool_names(&fake.requests()[0].body).contains(&"choir__exec".to_owned()));
    let pid_before: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();

    // Refused input changes nothing.
    let before = std::fs::read_to_string(choird.home.path().join("config.json")).unwrap();
    let err = choird.ctl_err(&["policy", "tools", "demo", "--deny", "Bad Name"]);
    assert!(err.contains("not a tool name or a `prefix.*` pattern"), "{err}");
    assert_eq!(std::fs::read_to_string(choird.home.path().join("config.json")).unwrap(), before);
    // A typo in a deny rule (it would have left choir.exec allowed) is
    // refused with the nearest name; --force keeps a rule for a tool not
    // installed yet.
    let err = choird.ctl_err(&["policy", "tools", "demo", "--deny", "choir.exc"]);
    assert!(err.contains("matches none of the agent's tools") && err.contains("did you mean \"choir.exec\""), "{err}");
    assert_eq!(std::fs::read_to_string(choird.home.path().join("config.json")).unwrap(), before);
    choird.ctl_ok(&["policy", "tools", "demo", "--deny", "weather.today", "--force"]);
    assert_eq!(config_file(&choird)["agents"]["demo"]["tools"], json!({"deny": ["weather.today"]}));
    // Kept from before, it is not asked about again.
    choird.ctl_ok(&["policy", "tools", "demo", "--remove", "weather.today"]);

    // The operator's layout (keys in their own order, not sorted) is kept:
    // only the changed value is written; the text before is config.json.prev.
    let path = choird.home.path().join("config.json");
    let mut doc: serde_json::Map<String, Value> = serde_json::from_str(&before).unwrap();
    let runtime = doc.remove("runtime").unwrap();
    let layout = format!(
        "{{\n  \"runtime\": {runtime},\n{}",
        serde_json::to_string_pretty(&doc).unwrap().strip_prefix("{\n").unwrap()
    );
    std::fs::write(&path, &layout).unwrap();

    let version = config_version(&choird);
    let shown = choird.ctl_ok(&["policy", "tools", "demo", "--deny", "choir.exec"]);
    let after = std::fs::read_to_string(&path).unwrap();
    assert!(after.starts_with("{\n  \"runtime\": \"process\",\n"), "the layout was rewritten:\n{after}");
    assert_eq!(std::fs::read_to_string(path.with_extension("json.prev")).unwrap(), layout);
    assert!(shown.contains("deny:  choir.exec") && shown.contains("allow: every tool"), "{shown}");
    assert_eq!(config_file(&choird)["agents"]["demo"]["tools"], json!({"deny": ["choir.exec"]}));
    let list: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "tools", "list", "demo"])).unwrap();
    let exec = list["tools"].as_array().unwrap().iter().find(|t| t["name"] == "choir.exec").unwrap().clone();
    assert_eq!(exec["status"], "off", "{exec}");
    assert!(exec["why"].as_str().unwrap().contains("turned choir.exec off"), "{exec}");
    assert!(choird.ctl_ok(&["tools", "list", "demo"]).contains("tool policy: allow every tool; deny choir.exec"));
    wait_for("the agent to take the new config", Duration::from_secs(30), || config_version(&choird) > version);

    // Not offered, and refused when called anyway; the agent was not restarted.
    assert_eq!(choird.ctl_ok(&["chat", "demo", "run it again"]).trim(), "refused");
    let reqs = fake.requests();
    let offered = tool_names(&reqs[2].body);
    assert!(
        !offered.contains(&"choir__exec".to_owned()) && offered.contains(&"choir__fs__read".to_owned()),
        "{offered:?}"
    );
    let refusal = last_tool_result(&reqs[3].body);
    assert_eq!(refusal["error"]["code"], "tool_not_allowed", "{refusal}");
    assert!(refusal["error"]["message"].as_str().unwrap().contains("operator"), "{refusal}");
    assert!(!choird.workspace("demo").join("second.txt").exists(), "the denied command ran");
    let pid_after: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "agent", "status", "demo"])).unwrap();
    assert_eq!(pid_before["pid"], pid_after["pid"], "no restart");

    // Allow lists with prefixes; a reset removes the key.
    let shown =
        choird.ctl_ok(&["--json", "policy", "tools", "demo", "--allow", "choir.fs.*", "--remove", "choir.exec"]);
    assert_eq!(serde_json::from_str::<Value>(&shown).unwrap(), json!({"allow": ["choir.fs.*"]}));
    let list: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "tools", "list", "demo"])).unwrap();
    let status =
        |name: &str| list["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap()["status"].clone();
    assert_eq!((status("choir.fs.read"), status("choir.exec")), (json!("system"), json!("off")));
    choird.ctl_ok(&["policy", "tools", "demo", "--reset"]);
    assert!(config_file(&choird)["agents"]["demo"].get("tools").is_none());
    let audit = choird.ctl_ok(&["--json", "audit", "--limit", "50"]);
    // --deny, --force, --remove of the forced one, --allow, --reset: each
    // applied change recorded; the refused typo is not.
    assert_eq!(audit.matches("policy.tools").count(), 5, "{audit}");
}
