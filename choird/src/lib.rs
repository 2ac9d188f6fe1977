//! choird, the Choir control plane: a synchronous daemon that runs agents,
//! serves their RPC and the admin API over Unix sockets, relays their model
//! calls, and keeps the system of record in Postgres. See DESIGN.md for the
//! bird's-eye view; [`run`] is the entry point.

pub mod api;
pub mod arg_policies;
pub mod backup;
pub mod budget;
pub mod cluster_unit;
pub mod config;
pub mod console;
pub mod conversations;
pub mod daemon;
pub mod db;
pub mod disk;
pub mod docker;
pub mod doctor;
pub mod egress;
pub mod error;
pub mod events;
pub mod home;
pub mod host_tools;
pub mod http;
pub mod logs;
pub mod mcp_pins;
pub mod notify;
pub mod pace;
pub mod proposals;
pub mod resolver;
pub mod rollouts;
pub mod runtime;
pub mod schedule;
pub mod secret_admin;
pub mod secrets;
pub mod sessions;
pub mod shared;
pub mod skill_list;
pub mod sockets;
pub mod spawn;
pub mod store;
pub mod tasks;
pub mod telegram;
#[cfg(test)]
mod test_gen;
pub mod tool_list;
pub mod upstream;
pub mod workspace_files;

mod serve;

pub use serve::{run, Options};
