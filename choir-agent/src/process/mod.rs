//! Processes the agent starts for tools: [`spawn`] starts one with a clean
//! environment in a process group of its own; [`reaper`] makes the agent the
//! subreaper of everything below it and kills what a call leaves behind;
//! [`confine`] is the seccomp filter the agent and all it starts run under.
//!
//! **Invariant:** when a tool call's result is committed, no process it
//! started is alive (see [`reaper`]).

pub mod confine;
pub mod reaper;
pub mod spawn;
