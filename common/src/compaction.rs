//! The compaction commit event (`kind: compaction`, tool
//! `choir.memory.compact`): a lane folded the older turns of a conversation
//! into a summary (R-LANE-4). Its `input` and `result` are typed here, with
//! the keys choird reads to rebuild a restarted agent's conversations
//! (`input.conversation`, `input.upto_message`, `result.summary`).
//!
//! **Invariant:** `result.summary` is the text the lane's summary entry shows
//! the model (after `Summary of the earlier conversation: `), so a restarted
//! lane shows exactly what the running one did; when what was folded held
//! output of untrusted tools, the summary opens with a note naming them, and
//! `result.untrusted_tools` lists them.

use serde::{Deserialize, Serialize};

/// The event's tool name.
pub const TOOL: &str = "choir.memory.compact";

/// What was folded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionInput {
    /// The conversation (an edge conversation key, or a core job's lane).
    pub conversation: String,
    /// How many history entries were replaced by the summary.
    pub folded_messages: u64,
    /// The highest inbound message id folded (0: none), so a restarted lane
    /// does not repeat exchanges the summary already holds.
    pub upto_message: u64,
    /// The history's estimated size before, in tokens.
    pub estimated_tokens_before: u64,
}

/// What it was folded into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionResult {
    /// The summary as the model sees it (see the module's invariant).
    pub summary: String,
    /// The history's estimated size after, in tokens.
    pub estimated_tokens_after: u64,
    /// Untrusted tools whose output was folded into the summary, sorted;
    /// absent when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untrusted_tools: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_keys_are_the_ones_choird_reads() {
        let input = CompactionInput {
            conversation: "cli".into(),
            folded_messages: 4,
            upto_message: 2,
            estimated_tokens_before: 900,
        };
        assert_eq!(
            serde_json::to_value(&input).unwrap(),
            json!({"conversation": "cli", "folded_messages": 4, "upto_message": 2, "estimated_tokens_before": 900})
        );
        let plain = CompactionResult { summary: "s".into(), estimated_tokens_after: 10, untrusted_tools: Vec::new() };
        assert_eq!(serde_json::to_value(&plain).unwrap(), json!({"summary": "s", "estimated_tokens_after": 10}));
        let marked = CompactionResult { untrusted_tools: vec!["choir.fs.read".into()], ..plain };
        let v = serde_json::to_value(&marked).unwrap();
        assert_eq!(v["untrusted_tools"], json!(["choir.fs.read"]));
        assert_eq!(serde_json::from_value::<CompactionResult>(v).unwrap(), marked);
    }
}
