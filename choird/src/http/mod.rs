//! choird's HTTP: what handlers see ([`api`], re-exported here) and the
//! server that serves them ([`server`]).

mod api;
pub mod server;

pub use api::*;
