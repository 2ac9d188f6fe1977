//! Wire types and shared validation for Choir: everything that crosses a process
//! boundary (agent RPC, admin API, commit events, OpenAI-compatible messages, tool
//! manifests) is defined here and only here, so the two ends cannot drift apart.
//! Besides, the few helpers the binaries need in the same form (`proc_tree`:
//! process trees from `/proc`; `text`: hostile text made safe to show;
//! `unix_http`: HTTP over a Unix socket; `nice`: background threads below
//! the edge; `code_pages`: start-up code's pages given back).

pub mod admin;
pub mod arg_policy;
pub mod code_pages;
pub mod commit;
pub mod compaction;
pub mod hop;
pub mod host_tools;
pub mod ids;
pub mod lane;
pub mod malloc;
pub mod manifest;
pub mod mcp;
pub mod mcp_result;
pub mod nice;
pub mod openai;
pub mod pointer;
pub mod proc_tree;
pub mod provenance;
pub mod roles;
pub mod rpc;
pub mod schedule;
pub mod skill;
pub mod splice;
pub mod text;
pub mod tool_layers;
pub mod tool_names;
pub mod tool_policy;
pub mod tool_status;
pub mod trust;
pub mod unix_http;

/// Protocol version spoken on the agent RPC and the admin API. Bumped on any
/// incompatible change to the types in this crate.
pub const PROTOCOL_VERSION: u32 = 1;
