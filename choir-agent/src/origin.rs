//! Where everything in a model's context came from (R-ARB-5). A lane's
//! history is a list of [`Entry`]s: the chat message exactly as it goes on
//! the wire, and beside it its [`Origin`] — the user, the operator (Choir's
//! own notes), the model itself, a tool (with the trust its manifest
//! declares for its output), or a summary Choir made of other entries.
//!
//! The origin is carried *beside* the wire message, not inside it: the
//! chat-completions types in `choir_common::openai` stay exactly the wire
//! format (no field that a serde attribute could ever let slip into a
//! request), and a history cannot be extended without saying where the new
//! entry came from, because [`Entry`] has no constructor without an origin.
//!
//! Argument policies decide on origins: `provenance.rs` traces each value of
//! a call to the entries that hold it, counted as their origins say.
//! **Invariant:** an entry whose text holds output of an untrusted tool —
//! the result itself, a compaction summary that folded it, a core job's
//! workflow summary whose actions used it — has an origin naming that tool
//! ([`Origin::untrusted_tools`]), and its text says so to the model.

use std::collections::BTreeSet;

use choir_common::openai::{ChatMessage, Role};
use choir_common::trust::OutputTrust;

/// Where a history entry came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The user of this conversation.
    User,
    /// The operator's side: Choir's own notes (corrections, a human's
    /// decision on a proposal, a skill's end), built from config and state.
    Operator,
    /// The assistant's own turns (its text and its tool calls).
    Model,
    /// A tool's result, with the trust the tool's manifest declares for its
    /// output (`trusted` when nothing ran and Choir answered for it).
    Tool {
        /// Canonical tool name.
        tool: String,
        /// Whether its content can carry text from outside.
        trust: OutputTrust,
    },
    /// A summary Choir had made of other entries — a compaction summary, a
    /// core job's workflow summary: as trusted as the least trusted of them.
    Summary {
        /// The untrusted tools whose output went into it (empty: none).
        untrusted_tools: BTreeSet<String>,
    },
}

impl Origin {
    /// The untrusted tools whose output this entry may carry.
    pub fn untrusted_tools(&self) -> BTreeSet<String> {
        match self {
            Origin::Tool { tool, trust: OutputTrust::Untrusted } => BTreeSet::from([tool.clone()]),
            Origin::Summary { untrusted_tools } => untrusted_tools.clone(),
            _ => BTreeSet::new(),
        }
    }

    /// Whether this entry may carry text from outside.
    pub fn trust(&self) -> OutputTrust {
        if self.untrusted_tools().is_empty() {
            OutputTrust::Trusted
        } else {
            OutputTrust::Untrusted
        }
    }

    /// The origin of a summary of `entries`.
    pub fn summary_of<'a>(origins: impl IntoIterator<Item = &'a Origin>) -> Origin {
        Origin::Summary { untrusted_tools: origins.into_iter().flat_map(Origin::untrusted_tools).collect() }
    }
}

/// One entry of a lane's history: the message as sent, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The message, exactly as it goes into a chat-completions request.
    pub message: ChatMessage,
    /// Where it came from.
    pub origin: Origin,
}

impl Entry {
    /// A message with its origin.
    pub fn new(message: ChatMessage, origin: Origin) -> Entry {
        Entry { message, origin }
    }

    /// What the user said.
    pub fn user(text: impl Into<String>) -> Entry {
        Entry::new(ChatMessage::text(Role::User, text), Origin::User)
    }

    /// A note of Choir's own (a system message).
    pub fn operator(text: impl Into<String>) -> Entry {
        Entry::new(ChatMessage::text(Role::System, text), Origin::Operator)
    }

    /// A note (system message) with the given origin.
    pub fn note(text: impl Into<String>, origin: Origin) -> Entry {
        Entry::new(ChatMessage::text(Role::System, text), origin)
    }

    /// An assistant message (text, tool calls or both).
    pub fn model(message: ChatMessage) -> Entry {
        Entry::new(message, Origin::Model)
    }

    /// The result of tool call `call_id`, as the model sees it.
    pub fn tool_result(call_id: &str, content: impl Into<String>, origin: Origin) -> Entry {
        Entry::new(ChatMessage::tool_result(call_id, content), origin)
    }

    /// The role of its message.
    pub fn role(&self) -> Role {
        self.message.role
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_as_trusted_as_the_least_trusted_entry_it_folds() {
        let read = Origin::Tool { tool: "choir.fs.read".into(), trust: OutputTrust::Untrusted };
        let find = Origin::Tool { tool: "choir.tools.find".into(), trust: OutputTrust::Trusted };
        let earlier = Origin::Summary { untrusted_tools: BTreeSet::from(["choir.exec".to_owned()]) };
        let all = [Origin::User, Origin::Model, find.clone(), read, earlier];
        let summary = Origin::summary_of(&all);
        assert_eq!(summary.untrusted_tools(), BTreeSet::from(["choir.exec".to_owned(), "choir.fs.read".to_owned()]));
        assert_eq!(summary.trust(), OutputTrust::Untrusted);
        let clean = Origin::summary_of(&[Origin::User, Origin::Operator, Origin::Model, find]);
        assert_eq!(clean, Origin::Summary { untrusted_tools: BTreeSet::new() });
        assert_eq!(clean.trust(), OutputTrust::Trusted);
    }
}
