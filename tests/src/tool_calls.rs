//! Driving one tool call through the real pipeline: a model that calls
//! exactly the tool a chat message names (`{"tool", "args"}`) and answers
//! with the tool message it was shown, so a test sees what the model saw.

use crate::fake_llm::{FakeLlm, Step};
use crate::harness::Choird;
use serde_json::{json, Value};

/// A model that calls the tool a message names (`{"tool", "args"}`) and
/// answers with the tool message it got, verbatim.
pub fn caller() -> FakeLlm {
    FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "tool" {
            return Some(Step::Text(last["content"].as_str()?.to_owned()));
        }
        let ask: Value = serde_json::from_str(last["content"].as_str()?).ok()?;
        let mut args = ask["args"].clone();
        // A body too big for a command line: the model makes it.
        if let Some(n) = ask["json_of_len"].as_u64() {
            args["json"] = json!("x".repeat(n as usize));
        }
        Some(Step::call(ask["tool"].as_str()?, args))
    })
}

/// What the model was shown for one call of `tool` with `args` by `agent`.
pub fn call(choird: &Choird, agent: &str, tool: &str, args: Value) -> Value {
    let out = choird.ctl_ok(&["chat", agent, &json!({"tool": tool, "args": args}).to_string()]);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not a tool result ({e}): {out}"))
}

pub fn ok(v: &Value) -> &Value {
    assert_eq!(v["status"], "success", "{v}");
    v
}

/// The error message of a refused or failed call.
pub fn failed(v: &Value) -> String {
    assert_ne!(v["status"], "success", "{v}");
    format!("{}: {}", v["error"]["code"].as_str().unwrap_or(""), v["error"]["message"].as_str().unwrap_or(""))
}

/// The wrapper holds the outside text; nothing inside closes or reopens it.
pub fn assert_wrapped(content: &str, source_prefix: &str) {
    assert!(content.starts_with(&format!("<untrusted source=\"{source_prefix}")), "{content}");
    assert!(content.ends_with("</untrusted>"), "{content}");
    let lower = content.to_ascii_lowercase();
    assert_eq!((lower.matches("<untrusted").count(), lower.matches("</untrusted").count()), (1, 1), "{content}");
}

/// Writes an external tool into a tools directory: `<stem>.json` and the
/// executable `<stem>` running `script` with bash.
pub fn write_tool(dir: &std::path::Path, stem: &str, manifest: &Value, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(dir.join(format!("{stem}.json")), serde_json::to_string_pretty(manifest).unwrap()).unwrap();
    let exe = dir.join(stem);
    std::fs::write(&exe, format!("#!/bin/bash\n{script}\n")).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
}
