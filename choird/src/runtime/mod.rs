//! Agent runtimes: how an agent's `choir-agent` runs. `docker` (the default) is
//! a hardened container per agent; `process` is an unsandboxed child process
//! for development and machines without a Docker engine.

pub mod docker;
pub mod handover;
pub mod process;
pub mod workspace;
