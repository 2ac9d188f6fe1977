//! choird's HTTP endpoints, each a thin edge over the daemon: the admin API
//! ([`admin`], choirctl's, on `socks/choird.sock` only), the agents' RPC
//! ([`rpc`], the eight verbs), the LLM relay ([`relay`], where the model API
//! key is added) and the Prometheus scrape ([`metrics`]). `serve.rs` routes
//! a request to one of them by the listener it came in on.

pub mod admin;
pub mod metrics;
pub mod relay;
pub mod rpc;
