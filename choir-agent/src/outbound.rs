//! What the agent hands to the link for choird (`link-push` ships it): the
//! edge lane's answers and partial answers, and the core pool's outcomes of
//! scheduled firings. A leaf: the edge, the core pool and the link all use
//! it, and it uses none of them.

use choir_common::rpc::{FiringReport, OutboundReply, PartialReply};

/// Something for choird.
#[derive(Debug)]
pub enum Outbound {
    /// An answer (or a message of its own).
    Reply(OutboundReply),
    /// The answer so far, while the model is still writing it.
    Partial(PartialReply),
    /// A scheduled firing's outcome (from the core pool).
    Firing(FiringReport),
}
