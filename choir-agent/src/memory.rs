//! Working memory (R-LANE-4): a lane's conversation, its size estimate, and
//! compaction — folding older turns into a reference summary made by a model
//! call, keeping the system prompt (with the objective), and the recent turns.
//!
//! **Invariant:** history is only appended to, except by compaction, which
//! replaces a prefix of whole turns with one summary message and is itself a
//! committed event. Tool calls and their results are never separated.

use choir_common::openai::{ChatMessage, ChatRequest, Role};

/// Turns kept verbatim when compacting.
pub const KEEP_TURNS: usize = 2;

/// One conversation's messages, with the inbound message ids that started
/// each user turn (for recording how far a compaction reached).
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The messages (without the system prompt).
    pub messages: Vec<ChatMessage>,
    /// (index in `messages`, inbound message id) of user messages.
    pub user_ids: Vec<(usize, u64)>,
}

impl Conversation {
    /// Appends a user message that came in as inbound message `id`.
    pub fn push_user(&mut self, id: u64, text: &str) {
        self.user_ids.push((self.messages.len(), id));
        self.messages.push(ChatMessage::text(Role::User, text));
    }

    /// Appends any other message.
    pub fn push(&mut self, m: ChatMessage) {
        self.messages.push(m);
    }
}

/// A rough token estimate (4 characters per token, plus framing).
pub fn estimate(system: &str, messages: &[ChatMessage]) -> u64 {
    let mut chars = system.len() as u64;
    for m in messages {
        chars += 16 + m.content.as_ref().map(|c| c.len() as u64).unwrap_or(0);
        for c in &m.tool_calls {
            chars += 16 + c.function.name.len() as u64 + c.function.arguments.len() as u64;
        }
    }
    chars / 4
}

/// Where to cut: the start of the `KEEP_TURNS`-th last turn, if there is
/// anything before it. Turns start at user messages (the edge lane) or at
/// assistant messages (a core job's steps), so a tool call is never separated
/// from its results.
pub fn fold_point(conv: &Conversation, turn_starts_at: Role) -> Option<usize> {
    let starts: Vec<usize> =
        conv.messages.iter().enumerate().filter(|(_, m)| m.role == turn_starts_at).map(|(i, _)| i).collect();
    let cut = *starts.iter().rev().nth(KEEP_TURNS - 1)?;
    (cut > 0).then_some(cut)
}

/// Renders messages as plain text for the summarising model.
pub fn render(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        let who = match m.role {
            Role::System => "note",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool result",
        };
        if let Some(c) = &m.content {
            out.push_str(&format!("[{who}] {c}\n"));
        }
        for c in &m.tool_calls {
            out.push_str(&format!("[assistant calls {}] {}\n", c.function.name, c.function.arguments));
        }
    }
    out
}

/// The request that asks for a summary of `old`.
pub fn summary_request(model: &str, old: &[ChatMessage]) -> ChatRequest {
    ChatRequest {
        model: model.to_owned(),
        messages: vec![
            ChatMessage::text(
                Role::System,
                "Summarise the conversation below for your own later reference: facts, decisions, open tasks and \
                 file paths. Plain text, at most 200 words.",
            ),
            ChatMessage::text(Role::User, render(old)),
        ],
        tools: Vec::new(),
        tool_choice: None,
        stream: None,
        stream_options: None,
    }
}

/// Replaces messages before `cut` with the summary; returns the highest
/// inbound message id folded.
pub fn fold(conv: &mut Conversation, cut: usize, summary: &str) -> u64 {
    let upto = conv.user_ids.iter().filter(|(i, _)| *i < cut).map(|(_, id)| *id).max().unwrap_or(0);
    let rest = conv.messages.split_off(cut);
    conv.messages = vec![summary_message(summary)];
    conv.messages.extend(rest);
    conv.user_ids = conv.user_ids.iter().filter(|(i, _)| *i >= cut).map(|(i, id)| (i - cut + 1, *id)).collect();
    upto
}

/// The message that stands for folded turns.
pub fn summary_message(summary: &str) -> ChatMessage {
    ChatMessage::text(Role::System, format!("Summary of the earlier conversation: {summary}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_keeps_the_recent_turns_and_whole_tool_exchanges() {
        let mut c = Conversation::default();
        for i in 1..=4 {
            c.push_user(i, &format!("question {i}"));
            c.push(ChatMessage::text(Role::Assistant, format!("answer {i}")));
        }
        let cut = fold_point(&c, Role::User).unwrap();
        assert_eq!(cut, 4, "the last two turns start at index 4");
        let before = estimate("sys", &c.messages);
        let upto = fold(&mut c, cut, "they asked twice");
        assert_eq!(upto, 2);
        assert_eq!(c.messages.len(), 5);
        assert_eq!(c.messages[0].content.as_deref(), Some("Summary of the earlier conversation: they asked twice"));
        assert_eq!(c.messages[1].content.as_deref(), Some("question 3"));
        assert_eq!(c.user_ids, vec![(1, 3), (3, 4)]);
        assert!(estimate("sys", &c.messages) < before);
        // Too short to fold.
        let mut short = Conversation::default();
        short.push_user(1, "hi");
        assert_eq!(fold_point(&short, Role::User), None);
    }
}
