//! `choir.test.echo_once` — a host tool in the test build only (feature
//! `test-tools`): it echoes its `text` and counts its runs in
//! `<home>/test-echo-once.count`, so a test can tell whether it ran twice.
//! Served only once that file exists (a test creates it), so every other
//! test's agent is offered exactly the tools it was before. Not idempotent,
//! so the registry runs it at most once per call id.

use std::sync::Arc;

use choir_common::ids::AgentId;
use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::{HostCall, HostTool, ToolStatus};
use crate::config::Config;
use crate::error::Error;
use crate::secrets::Secrets;
use crate::shared::Shared;

/// The tool.
pub struct EchoOnce {
    /// Where it counts.
    pub shared: Arc<Shared>,
}

impl EchoOnce {
    fn counter(&self) -> std::path::PathBuf {
        self.shared.home.root().join("test-echo-once.count")
    }
}

impl HostTool for EchoOnce {
    fn name(&self) -> &str {
        "choir.test.echo_once"
    }

    fn manifest(&self) -> Option<ToolManifest> {
        serde_json::from_value(json!({
            "llm": {
                "name": "choir.test.echo_once",
                "description": "Echo a text (test build only; counts its runs).",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                               "required": ["text"], "additionalProperties": false}
            },
            "runtime": {"timeout_ms": 10000, "network": true, "side_effect": "external", "idempotent": false,
                        "version": "1"}
        }))
        .ok()
    }

    fn status(&self, _config: &Config, _secrets: &Secrets, _agent: &AgentId) -> ToolStatus {
        if self.counter().exists() {
            ToolStatus::Connected
        } else {
            ToolStatus::Available("the test has not created its counter".into())
        }
    }

    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        let path = self.counter();
        let runs: u64 = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0) + 1;
        std::fs::write(&path, runs.to_string()).map_err(|e| Error::Internal(e.to_string()))?;
        let text = call.input["text"].as_str().unwrap_or_default();
        Ok(json!({"summary": format!("echoed {text:?}"), "echo": text, "runs": runs}))
    }
}
