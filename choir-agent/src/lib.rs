//! choir-agent, the per-agent runtime: the edge lane, the arbiter through which
//! every tool call passes, the commit log, the built-in tools and the client of
//! choird's RPC. See DESIGN.md; [`run::run`] is the entry point.

pub mod arbiter;
pub mod board;
pub mod cancel;
pub mod commitlog;
pub mod failpoints;
pub mod lanes;
pub mod link;
pub mod origin;
pub mod process;
pub mod rpc;
pub mod run;
pub mod secrets;
pub mod tools;
pub mod workspace;
