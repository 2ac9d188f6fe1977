//! Whether a tool can be offered to an agent, by one set of rules both
//! binaries use: the agent when it builds its registry, choird when it lists
//! an agent's tools for the operator (`choirctl tools list`). The two must
//! never disagree about why a tool is not offered.
//!
//! **Invariant:** only [`ToolStatus::System`] and [`ToolStatus::Connected`]
//! tools are offered to a model; an [`ToolStatus::Available`] one says what
//! is missing. The operator's tool policy (on/off) is applied on top, by
//! [`crate::tool_policy`].

use crate::manifest::ToolManifest;

/// A tool's status for one agent (R-TOOL-6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolStatus {
    /// Built in or served to every agent; needs nothing.
    System,
    /// Known, but not usable now: what is missing (a secret not bound to
    /// the agent, configuration choird lacks, a host tool choird does not
    /// serve it).
    Available(String),
    /// Configured and ready.
    Connected,
}

impl ToolStatus {
    /// Whether models may be offered the tool.
    pub fn offered(&self) -> bool {
        matches!(self, ToolStatus::System | ToolStatus::Connected)
    }

    /// The status as the operator reads it: `system`, `available` or `connected`.
    pub fn label(&self) -> &'static str {
        match self {
            ToolStatus::System => "system",
            ToolStatus::Available(_) => "available",
            ToolStatus::Connected => "connected",
        }
    }

    /// What is missing, for an available tool.
    pub fn why(&self) -> Option<&str> {
        match self {
            ToolStatus::Available(why) => Some(why),
            _ => None,
        }
    }

    /// An external tool's status: connected when every secret its manifest
    /// declares is bound to the agent (`bound`).
    pub fn of_external(manifest: &ToolManifest, bound: &[String]) -> ToolStatus {
        let missing: Vec<&str> =
            manifest.runtime.secret_resources.iter().filter(|s| !bound.contains(s)).map(String::as_str).collect();
        if missing.is_empty() {
            ToolStatus::Connected
        } else {
            ToolStatus::Available(format!("secrets {} are not bound to this agent", missing.join(", ")))
        }
    }

    /// A host tool's status as the agent sees it: connected when choird
    /// serves it to this agent (it is among `served`).
    pub fn of_host(name: &str, served: &[String]) -> ToolStatus {
        if served.iter().any(|s| s == name) {
            ToolStatus::Connected
        } else {
            ToolStatus::Available("choird does not serve this host tool for this agent".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_secrets(secrets: &[&str]) -> ToolManifest {
        let secrets: Vec<String> = secrets.iter().map(|s| (*s).to_owned()).collect();
        serde_json::from_value(serde_json::json!({
            "llm": {"name": "acme.deploy", "description": "Deploys.", "parameters": {"type": "object"}},
            "runtime": {"exec_path": "deploy", "timeout_ms": 1000, "side_effect": "external", "version": "1",
                        "secret_resources": secrets}
        }))
        .unwrap()
    }

    #[test]
    fn an_external_tool_is_connected_only_when_every_secret_it_declares_is_bound() {
        let bound = ["deploy_key".to_owned()];
        assert_eq!(ToolStatus::of_external(&with_secrets(&[]), &[]), ToolStatus::Connected);
        assert_eq!(ToolStatus::of_external(&with_secrets(&["deploy_key"]), &bound), ToolStatus::Connected);
        let status = ToolStatus::of_external(&with_secrets(&["deploy_key", "db_password", "api"]), &bound);
        assert!(!status.offered());
        assert_eq!(status.label(), "available");
        assert_eq!(status.why(), Some("secrets db_password, api are not bound to this agent"));
    }

    #[test]
    fn a_host_tool_is_connected_only_when_choird_serves_it() {
        let served = ["choir.web.search".to_owned()];
        assert!(ToolStatus::of_host("choir.web.search", &served).offered());
        let status = ToolStatus::of_host("choir.mail.send", &served);
        assert!(!status.offered());
        assert!(status.why().unwrap().contains("does not serve"));
        assert!(ToolStatus::System.offered() && ToolStatus::System.why().is_none());
    }
}
