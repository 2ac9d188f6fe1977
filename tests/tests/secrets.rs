//! `choirctl secrets`: a value goes in through stdin,
//! never the command line; the list shows names, state, length and every use
//! but no value; choird uses a new value at once; a secret in use is not
//! removed; bad names and values change nothing.

use std::os::unix::fs::PermissionsExt;

use choir_tests::fake_llm::Step;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

#[test]
fn secrets_are_set_from_stdin_listed_without_values_used_at_once_and_kept_while_in_use() {
    let Some(Scenario { pg: _pg, llm: fake, choird }) = Scenario::new()
        .model(vec![Step::Text("one".into()), Step::Text("two".into())])
        .config(|c| c["agents"]["demo"] = json!({"secrets": ["gh_token"]}))
        .secrets(json!({"llm_key": "old-key-1"}))
        .build()
    else {
        return;
    };
    let file = choird.home.path().join("secrets.json");
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["chat", "demo", "hi"]);
    assert_eq!(fake.requests()[0].authorization.as_deref(), Some("Bearer old-key-1"));

    // Set from stdin (one trailing newline is not part of the value), used at once.
    let out = choird.ctl_with_input(&["secrets", "set", "llm_key"], "new-key-22\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("secret llm_key set (10 bytes)"));
    choird.ctl_ok(&["chat", "demo", "again"]);
    assert_eq!(fake.requests().last().unwrap().authorization.as_deref(), Some("Bearer new-key-22"));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(stored, json!({"llm_key": "new-key-22"}));

    // The list: names, state, length, uses — never a value.
    let list = choird.ctl_ok(&["secrets", "list"]);
    for want in ["llm_key", "set", "10", "config.json llm.edge.api_key_secret", "config.json llm.core.api_key_secret"] {
        assert!(list.contains(want), "{want:?} missing:\n{list}");
    }
    assert!(list.contains("gh_token") && list.contains("MISSING") && list.contains("config.json agents.demo.secrets"));
    let json_list = choird.ctl_ok(&["--json", "secrets", "list"]);
    for text in [&list, &json_list] {
        assert!(!text.contains("new-key-22") && !text.contains("old-key-1"), "a value is shown:\n{text}");
    }

    // In use: not removed, and told where.
    let err = choird.ctl_err(&["secrets", "rm", "llm_key"]);
    assert!(err.contains("is used by") && err.contains("config.json llm.edge.api_key_secret"), "{err}");
    assert!(std::fs::read_to_string(&file).unwrap().contains("new-key-22"));

    // Unused: removed.
    let out = choird.ctl_with_input(&["secrets", "set", "spare"], "s3cret");
    assert!(out.status.success());
    choird.ctl_ok(&["secrets", "rm", "spare"]);
    assert!(!std::fs::read_to_string(&file).unwrap().contains("spare"));
    let err = choird.ctl_err(&["secrets", "rm", "spare"]);
    assert!(err.contains("no secret \"spare\""), "{err}");

    // Bad input changes nothing.
    let before = std::fs::read(&file).unwrap();
    let err = choird.ctl_err(&["secrets", "set", "llm_key", "on-the-command-line"]);
    assert!(err.contains("never from the command line"), "{err}");
    let oversized = "x".repeat(64 * 1024 + 1);
    for (name, input, want) in [
        ("a b", "v", "must be 1–64 letters"),
        ("llm_key", "", "the value is empty"),
        ("llm_key", "a\u{0}b", "NUL"),
        ("llm_key", oversized.as_str(), "longer than 65536 bytes"),
    ] {
        let out = choird.ctl_with_input(&["secrets", "set", name], input);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{name:?} {input:?}: {err}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), before, "a refused change left the file as it was");

    // The audit names what was set, not its value.
    let audit = choird.ctl_ok(&["audit", "--limit", "50"]);
    assert!(audit.contains("secrets.set") && audit.contains("secrets.rm"), "{audit}");
    assert!(!audit.contains("new-key-22") && !audit.contains("s3cret"));
}
