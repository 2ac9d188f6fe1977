//! Agent runtimes: how an agent's `choir-agent` is started and stopped. Only the
//! `process` runtime exists so far; the hardened Docker runtime replaces it as
//! the default in a later issue.

pub mod process;
