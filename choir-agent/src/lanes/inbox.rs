//! The edge lane's inbox: the one closed enum of events that reach it
//! ([`EdgeEvent`]) — user messages from the link, finished core jobs from the
//! core pool, approval decisions, and the stop. The link and the core pool
//! send, the edge lane receives; this module knows none of them.

use choir_common::rpc::{ApprovalDecision, InboundMessage};
use serde_json::Value;

use crate::origin::Origin;

/// What reaches the edge lane.
#[derive(Debug)]
pub enum EdgeEvent {
    /// A user message.
    Message(InboundMessage),
    /// A core job ended; its workflow summary.
    CoreDone {
        /// The job.
        job: String,
        /// The conversation that started it.
        conversation: String,
        /// The workflow summary.
        report: Value,
        /// Where its content came from: a summary naming the untrusted
        /// tools its actions used (their summaries are in it).
        origin: Origin,
    },
    /// A human decided on a proposal no lane waits for: tell the user.
    Decision(ApprovalDecision),
    /// Finish the current turn, then stop.
    Stop,
}
