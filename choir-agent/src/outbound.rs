//! What the agent hands to the link for choird (`link-push` ships it): the
//! edge lane's answers and partial answers, its recalls of conversations it
//! dropped, and the core pool's outcomes of scheduled firings. A leaf: the
//! edge, the core pool and the link all use it, and it uses none of them.

use choir_common::rpc::{ConversationTail, FiringReport, OutboundReply, PartialReply};
use crossbeam_channel::Sender;

/// Something for choird.
#[derive(Debug)]
pub enum Outbound {
    /// An answer (or a message of its own).
    Reply(OutboundReply),
    /// The answer so far, while the model is still writing it.
    Partial(PartialReply),
    /// A scheduled firing's outcome (from the core pool).
    Firing(FiringReport),
    /// The edge asks for a dropped conversation's tail. It goes through the
    /// same queue as the answers, so link-push asks choird only once every
    /// answer queued before it is stored: a recall never misses an answer
    /// still on its way (the conversation may have been dropped meanwhile).
    Recall(RecallAsk),
}

/// A recall for link-push to make, and where its answer goes.
#[derive(Debug)]
pub struct RecallAsk {
    /// The conversation.
    pub conversation: String,
    /// When the asker stops waiting: an ask still queued then is dropped,
    /// not made (no round trip for nobody).
    pub deadline: std::time::Instant,
    /// The tail, or why not (the asker may have stopped waiting).
    pub answer: Sender<Result<ConversationTail, String>>,
}
