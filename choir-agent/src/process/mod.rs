//! Processes the agent starts for tools: [`spawn`] starts one with a clean
//! environment in a process group of its own; [`reaper`] makes the agent the
//! subreaper of everything below it and kills what a call leaves behind.
//!
//! **Invariant:** when a tool call's result is committed, no process it
//! started is alive (see [`reaper`]).

pub mod reaper;
pub mod spawn;
