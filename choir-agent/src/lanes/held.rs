//! The conversations the edge lane holds in memory: at most
//! [`HELD_CONVERSATIONS`], together at most [`HELD_TOKENS`] of history; when
//! another comes in past either bound, the least recently used are dropped. A dropped conversation that speaks again is recalled from choird
//! — its latest compaction summary and last answered exchanges, what a
//! restarted agent gets — so the agent's memory stays bounded however many
//! people talk to it. What a recall does not bring back: the tool calls and
//! results inside its last turns (they stay in the commit log, not in the
//! history), and the tools `choir.tools.find` had found there.
//!
//! **Invariant:** at most `cap` conversations are held, together at most
//! `budget` estimated tokens unless the one just opened alone is larger;
//! the one just opened (the one being answered) is never the one dropped.
//! **Invariant:** a user's message recalls its conversation only when it is
//! not held and choird said it had earlier messages, so a new conversation
//! costs no round trip (a note — a decision, a core job's report — always
//! recalls: it belongs to a conversation that spoke before).

use std::collections::HashMap;

use choir_common::openai::{ChatMessage, Role};
use choir_common::rpc::ConversationTail;

pub use choir_common::rpc::{HELD_CONVERSATIONS, HELD_TOKENS};

use crate::lanes::conversation::{self, Conversation};
use crate::origin::Entry;

/// Asks choird for the tail of a conversation the agent no longer holds
/// (the agent's: `link::RecallThroughReply`, which asks only once every
/// answer queued before it is stored).
pub trait Recall: Send + Sync {
    /// The conversation's tail, or why it could not be had (said to the model,
    /// so without secrets: choird's refusal or a transport error).
    fn recall(&self, conversation: &str) -> Result<ConversationTail, String>;
}

/// The held conversations, least recently used first out.
#[derive(Debug)]
pub struct Held {
    /// Conversation key → (history, when last used).
    map: HashMap<String, (Conversation, u64)>,
    /// Bumped on every use.
    clock: u64,
    cap: usize,
    /// The estimated tokens the held histories may take together.
    budget: u64,
}

impl Held {
    /// Holds at most `cap` (at least one) conversations, together at most
    /// `budget` estimated tokens of history.
    pub fn new(cap: usize, budget: u64) -> Held {
        Held { map: HashMap::new(), clock: 0, cap: cap.max(1), budget }
    }

    /// How many conversations are held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `name` is held.
    pub fn holds(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Makes `name` held before a turn in it: as it is if held; else from
    /// choird's tail if it had `earlier` messages (a failed recall leaves a
    /// note saying so, and the turn goes on); else empty. Returns the keys
    /// dropped to make room.
    pub fn open(&mut self, name: &str, earlier: bool, recall: &dyn Recall) -> Vec<String> {
        if self.holds(name) {
            self.touch(name);
            return Vec::new();
        }
        let conv = if earlier {
            match recall.recall(name) {
                Ok(tail) => from_tail(&tail),
                Err(why) => {
                    // The detail (a transport error may name an address)
                    // goes to the log, not to the model.
                    log::warn!("edge: conversation {name} could not be recalled: {why}");
                    let mut c = Conversation::default();
                    c.push(Entry::operator(
                        "The earlier part of this conversation could not be loaded; if the user refers to it, say \
                         that you cannot see it now.",
                    ));
                    c
                }
            }
        } else {
            Conversation::default()
        };
        self.insert(name, conv)
    }

    /// Holds `conv` as `name` (most recently used); returns the keys dropped.
    pub fn insert(&mut self, name: &str, conv: Conversation) -> Vec<String> {
        self.clock += 1;
        self.map.insert(name.to_owned(), (conv, self.clock));
        let mut dropped = Vec::new();
        // Measured when a conversation comes in (histories grow in between,
        // by a turn's worth each: the bound holds from one arrival to the next).
        let mut tokens: u64 = self.map.values().map(|(c, _)| conversation::estimate("", &c.entries)).sum();
        while self.map.len() > self.cap || (tokens > self.budget && self.map.len() > 1) {
            let Some(oldest) = self
                .map
                .iter()
                .filter(|(k, _)| k.as_str() != name)
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((c, _)) = self.map.remove(&oldest) {
                tokens -= conversation::estimate("", &c.entries);
            }
            dropped.push(oldest);
        }
        dropped
    }

    /// The history of `name`, made most recently used (held empty if it was
    /// not: a turn always [`Held::open`]s its conversation first).
    pub fn get(&mut self, name: &str) -> &mut Conversation {
        if !self.holds(name) {
            self.insert(name, Conversation::default());
        }
        self.clock += 1;
        let (conv, used) = self.map.entry(name.to_owned()).or_default();
        *used = self.clock;
        conv
    }

    fn touch(&mut self, name: &str) {
        self.clock += 1;
        if let Some((_, t)) = self.map.get_mut(name) {
            *t = self.clock;
        }
    }
}

/// A conversation rebuilt from choird's tail: the summary's entry (its
/// opening note names the untrusted tools it folded), then the exchanges.
pub fn from_tail(tail: &ConversationTail) -> Conversation {
    let mut conv = Conversation::default();
    if let Some(summary) = &tail.summary {
        conv.push(conversation::summary_entry(summary));
    }
    for ex in &tail.turns {
        conv.push_user(ex.id, &ex.user);
        conv.push(Entry::model(ChatMessage::text(Role::Assistant, ex.assistant.clone())));
    }
    conv
}

#[cfg(test)]
mod tests {
    use super::*;
    use choir_common::rpc::Exchange;
    use parking_lot::Mutex;

    /// Answers every recall with one exchange naming the conversation, and
    /// counts them.
    #[derive(Default)]
    struct Choird {
        asked: Mutex<Vec<String>>,
        down: bool,
    }

    impl Recall for Choird {
        fn recall(&self, conversation: &str) -> Result<ConversationTail, String> {
            self.asked.lock().push(conversation.to_owned());
            if self.down {
                return Err("choird did not answer".into());
            }
            Ok(ConversationTail {
                conversation: conversation.to_owned(),
                summary: Some("they spoke before".into()),
                turns: vec![Exchange { user: format!("hello from {conversation}"), assistant: "hi".into(), id: 7 }],
            })
        }
    }

    fn texts(c: &Conversation) -> Vec<String> {
        c.entries.iter().filter_map(|e| e.message.content.clone()).collect()
    }

    #[test]
    fn at_most_cap_conversations_are_held_however_many_speak() {
        let choird = Choird::default();
        let mut held = Held::new(3, u64::MAX);
        for i in 0..1000 {
            let name = format!("c{i}");
            held.open(&name, false, &choird);
            held.get(&name).push_user(i, "hi");
            assert!(held.len() <= 3, "{} held after {i}", held.len());
            assert!(held.holds(&name), "the conversation being answered is held");
        }
        assert!(choird.asked.lock().is_empty(), "new conversations never ask choird");
    }

    #[test]
    fn the_least_recently_used_is_dropped_and_comes_back_from_its_tail() {
        let choird = Choird::default();
        let mut held = Held::new(2, u64::MAX);
        assert!(held.open("a", false, &choird).is_empty());
        held.get("a").push_user(1, "my name is Ada");
        held.open("b", false, &choird);
        // a is used again, so b is the least recently used when c comes.
        held.open("a", true, &choird);
        assert_eq!(held.open("c", false, &choird), vec!["b".to_owned()]);
        assert!(held.holds("a") && held.holds("c") && !held.holds("b"));
        assert_eq!(texts(held.get("a")), vec!["my name is Ada"], "a held one is not recalled");
        assert!(choird.asked.lock().is_empty());
        // b speaks again: recalled, with its summary first.
        assert_eq!(held.open("b", true, &choird), vec!["c".to_owned()]);
        assert_eq!(*choird.asked.lock(), vec!["b".to_owned()]);
        assert_eq!(
            texts(held.get("b")),
            vec!["Summary of the earlier conversation: they spoke before", "hello from b", "hi"]
        );
        // The recalled message keeps its id, so a later compaction records how far it folded.
        assert_eq!(held.get("b").user_ids, vec![(1, 7)]);
    }

    #[test]
    fn held_histories_past_the_token_budget_drop_the_least_recently_used() {
        let choird = Choird::default();
        // Each conversation: one message of 500 characters, about 129 tokens.
        let mut held = Held::new(100, 350);
        let long = "x".repeat(500);
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            assert!(held.open(name, false, &choird).is_empty(), "{name}: three fit");
            held.get(name).push_user(i as u64, &long);
        }
        // A fourth arrives with the three over budget: the oldest goes, however many the cap allows.
        assert_eq!(held.open("d", false, &choird), vec!["a".to_owned()]);
        held.get("d").push_user(3, &long);
        assert_eq!(held.len(), 3);
        // Control: small histories under the same budget are all kept.
        let mut small = Held::new(100, 350);
        for i in 0..20 {
            let name = format!("s{i}");
            assert!(small.open(&name, false, &choird).is_empty());
            small.get(&name).push_user(i, "hi");
        }
        assert_eq!(small.len(), 20);
        // One history larger than the whole budget is still held while it is answered.
        let mut one = Held::new(100, 10);
        one.open("big", false, &choird);
        one.get("big").push_user(1, &long);
        assert!(one.open("next", false, &choird) == vec!["big".to_owned()] && one.holds("next"));
    }

    #[test]
    fn a_failed_recall_leaves_a_note_and_the_turn_goes_on() {
        let choird = Choird { down: true, ..Choird::default() };
        let mut held = Held::new(2, u64::MAX);
        held.open("a", true, &choird);
        let t = texts(held.get("a"));
        assert_eq!(t.len(), 1);
        assert!(t[0].contains("could not be loaded;"), "{t:?}");
        assert!(!t[0].contains("choird did not answer"), "the error's detail stays out of the model's view: {t:?}");
    }
}
