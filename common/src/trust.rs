//! Output trust (R-ARB-5): whether what a tool returns can carry text from
//! outside Choir (a file, a command's output, a web page, a memory someone
//! stored) — text that may try to instruct the model. Each manifest declares
//! it in its runtime view (`output_trust`, default `untrusted`, the safe
//! default); nothing decides on it yet, but every tool result carries it so a
//! later argument policy can trace where a value came from.
//!
//! **Invariant:** a tool result a model sees (and its commit record) carries
//! `"output_trust": "untrusted"` at its top level exactly when its content
//! came from a tool whose output is untrusted; trusted results carry no such
//! key, and a tool cannot set it itself (the key is reserved).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether a tool's output can hold text from outside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputTrust {
    /// Choir's or choird's own words about its own state (a job started, a
    /// proposal stored, tools found among approved manifests).
    Trusted,
    /// May carry text from outside: workspace files, command output,
    /// memory, anything external. The default.
    #[default]
    Untrusted,
}

/// The top-level key of a tool result that marks its content untrusted.
pub const TRUST_KEY: &str = "output_trust";

impl OutputTrust {
    /// `trusted` or `untrusted`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputTrust::Trusted => "trusted",
            OutputTrust::Untrusted => "untrusted",
        }
    }

    /// The trust of a tool result as a model saw it (and as it is
    /// committed): untrusted when it carries the marker.
    pub fn of_result(result: &Value) -> OutputTrust {
        if result.get(TRUST_KEY).and_then(Value::as_str) == Some(OutputTrust::Untrusted.as_str()) {
            OutputTrust::Untrusted
        } else {
            OutputTrust::Trusted
        }
    }

    /// Whether this is the default (`untrusted`), for skipping it when a
    /// manifest is written out.
    pub fn is_default(&self) -> bool {
        *self == OutputTrust::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn untrusted_is_the_default_and_the_marker_reads_back() {
        assert_eq!(OutputTrust::default(), OutputTrust::Untrusted);
        assert_eq!(serde_json::to_value(OutputTrust::Trusted).unwrap(), json!("trusted"));
        assert_eq!(
            OutputTrust::of_result(&json!({"status": "success", "output_trust": "untrusted"})),
            OutputTrust::Untrusted
        );
        assert_eq!(OutputTrust::of_result(&json!({"status": "success"})), OutputTrust::Trusted);
        // Only the top level counts: content cannot speak for the result.
        assert_eq!(OutputTrust::of_result(&json!({"content": {"output_trust": "untrusted"}})), OutputTrust::Trusted);
    }
}
