//! The lanes: how the agent thinks. The edge lane ([`edge`]) holds the
//! users' conversations ([`conversation`], at most [`held::HELD_CONVERSATIONS`]
//! in memory) and answers them; core jobs ([`core`]) run longer work in the
//! background under the [`floor`] the edge keeps. Both take model steps
//! through [`reasoning`] (the model's client is [`llm`]) with prompts from
//! [`prompt`], and may run skills ([`skills`], [`skill_run`]). What reaches a
//! lane arrives in its inbox ([`inbox`]); what it says leaves through
//! [`outbound`].
//!
//! **Invariant:** a lane runs tools only through the arbiter
//! ([`crate::arbiter`]); nothing here executes a tool itself.

pub mod conversation;
pub mod core;
pub mod edge;
pub mod floor;
pub mod held;
pub mod inbox;
pub mod llm;
pub mod outbound;
pub mod prompt;
pub mod reasoning;
pub mod skill_run;
pub mod skills;
