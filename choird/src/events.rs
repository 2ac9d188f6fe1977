//! What the daemon tells the Telegram gateway, as one closed set of events
//! on one channel: the daemon never calls into the gateway, and the gateway
//! acts on each event on its own thread (`tg-events`).
//!
//! **Invariant:** the channel is bounded; the daemon never blocks on it. An
//! event that does not fit is dropped and counted: what it announces is in
//! the database already (outbox rows, pending proposals), and the gateway's
//! senders look at the outbox on their own timer too.

use std::sync::atomic::{AtomicU64, Ordering};

use choir_common::ids::AgentId;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

/// Events queued at most.
const CAPACITY: usize = 4096;

/// The gateway's end of the channel. Events travel boxed: a bounded
/// crossbeam channel allocates and writes every slot when it is made, so
/// unboxed (an `Event` is 56 bytes) its 4,096 slots kept 256 KiB of choird
/// resident from the start; boxed, 64 KiB.
pub type Inbox = Receiver<Box<Event>>;

/// Something the gateway should act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An answer or notice of `agent` was recorded in `conversation`: files
    /// the agent left in `.choirtmp/send/` follow it there, and the senders
    /// wake for its outbox rows.
    Answered {
        /// The agent.
        agent: AgentId,
        /// The conversation it was recorded in.
        conversation: String,
    },
    /// A proposal waits for a human: its agent's admins are asked.
    ProposalPending {
        /// The proposal.
        id: i64,
    },
    /// A proposal was decided: the questions about it are edited.
    ProposalDecided {
        /// The proposal.
        id: i64,
    },
    /// An agent's token budget reached its warning share: its admins are told.
    BudgetWarning {
        /// The agent.
        agent: AgentId,
        /// What to tell them.
        text: String,
    },
    /// The rollout of an approved tool or skill ended: the agent's admins
    /// (who approve its proposals) are told how.
    RolloutDone {
        /// The agent.
        agent: AgentId,
        /// What to tell them.
        text: String,
    },
    /// The agent was stopped for good by choird (its crash loop ended): its
    /// admins are told why.
    AgentDown {
        /// The agent.
        agent: AgentId,
        /// What to tell them.
        text: String,
    },
    /// A scheduled job of the agent needs its admins (its circuit breaker
    /// tripped and paused it).
    ScheduleNotice {
        /// The agent.
        agent: AgentId,
        /// What to tell them.
        text: String,
    },
}

/// The daemon's end of the channel.
pub struct Events {
    tx: Sender<Box<Event>>,
    dropped: AtomicU64,
}

/// A new channel: the daemon's end and the gateway's.
pub fn channel() -> (Events, Inbox) {
    let (tx, rx) = bounded(CAPACITY);
    (Events { tx, dropped: AtomicU64::new(0) }, rx)
}

impl Events {
    /// Queues `event` without blocking (see the module's invariant).
    pub fn send(&self, event: Event) {
        match self.tx.try_send(Box::new(event)) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(e)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                log::warn!("gateway events full: dropped {e:?} ({n} dropped in all)");
            }
        }
    }
}
