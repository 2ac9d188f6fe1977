//! Who waits for an agent's answer (choirctl chats), and whether replies
//! began storing since a message.

use super::*;

impl Sessions {
    /// Registers a chat waiting for the answer to `message` (its store wakes
    /// the agent, [`Sessions::stored`]). `seen` is [`Sessions::replies_begun`] read before the message
    /// was stored. Returns whether the answer may already be stored, unseen
    /// by [`Sessions::replicated`] (the caller then reads it from the store):
    /// true when a HEARTBEAT with replies began storing since `seen`, or the
    /// agent has no slot. When false, no answer to `message` had begun
    /// storing (it cannot begin before the message is stored), so the one
    /// that will be stored passes through `replicated`, which finds this
    /// waiter — the chat needs no query of its own.
    pub fn wait_for_answer(&self, id: &AgentId, message: u64, tx: Sender<ChatUpdate>, seen: Option<u64>) -> bool {
        let missed = match self.table.lock().get_mut(id) {
            Some(slot) => {
                slot.waiters.insert(message, tx);
                seen != Some(slot.replies_begun)
            }
            None => true,
        };
        missed
    }

    /// Which of `messages` chats of `id` still wait for.
    pub fn waiting_among(&self, id: &AgentId, messages: &[u64]) -> Vec<u64> {
        match self.table.lock().get(id) {
            Some(slot) => messages.iter().copied().filter(|m| slot.waiters.contains_key(m)).collect(),
            None => Vec::new(),
        }
    }

    /// Counts a HEARTBEAT about to store replies; call it before their
    /// transaction begins (see [`Sessions::wait_for_answer`]).
    pub fn storing_replies(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.replies_begun += 1;
        }
    }

    /// How many HEARTBEATs with replies began storing them (`None`: no slot);
    /// read before a chat's message is stored.
    pub fn replies_begun(&self, id: &AgentId) -> Option<u64> {
        self.table.lock().get(id).map(|slot| slot.replies_begun)
    }

    /// Forgets a chat's waiter (answered already, or given up).
    pub fn forget_waiter(&self, id: &AgentId, message: u64) {
        if let Some(s) = self.table.lock().get_mut(id) {
            s.waiters.remove(&message);
        }
    }
}
