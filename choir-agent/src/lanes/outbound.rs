//! What the edge lane hands to the link for choird (`link-reply` ships it):
//! its answers and partial answers, and its recalls of conversations it
//! dropped. A leaf: the edge and the link use it, and it uses neither.
//! (The core pool's firing reports go to `link-push`, as
//! [`FiringReport`](choir_common::rpc::FiringReport)s.)

use choir_common::rpc::{ConversationTail, OutboundReply, PartialReply};
use crossbeam_channel::Sender;

/// Something the edge says to choird.
#[derive(Debug)]
pub enum Outbound {
    /// An answer (or a message of its own).
    Reply(OutboundReply),
    /// The answer so far, while the model is still writing it.
    Partial(PartialReply),
    /// The edge asks for a dropped conversation's tail. It goes through the
    /// same queue as the answers, so link-reply asks choird only once every
    /// answer queued before it is stored: a recall never misses an answer
    /// still on its way (the conversation may have been dropped meanwhile).
    Recall(RecallAsk),
}

/// A recall for link-reply to make, and where its answer goes.
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
