//! choir-agent, the per-agent runtime: the edge lane, the arbiter through which
//! every tool call passes, the commit log, the built-in tools and the client of
//! choird's RPC. See DESIGN.md; [`run::run`] is the entry point.

pub mod approvals;
pub mod arbiter;
pub mod arg_check;
pub mod commitlog;
pub mod core;
pub mod edge;
pub mod failpoints;
pub mod floor;
pub mod held;
pub mod inbox;
pub mod invocation;
pub mod lane_ctx;
pub mod lanes;
pub mod link;
pub mod llm;
pub mod locks;
pub mod memory;
pub mod origin;
pub mod outbound;
pub mod policy;
pub mod prompt;
pub mod provenance;
pub mod reaper;
pub mod reasoning;
pub mod results;
pub mod rpc;
pub mod run;
pub mod secrets;
pub mod skill_run;
pub mod skills;
pub mod spawn;
pub mod tools;
pub mod workspace;
