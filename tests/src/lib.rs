//! Test support for Choir: RAII handles for a disposable PostgreSQL cluster and
//! a running choird, the protocol-exact fakes of services that cannot be
//! reached offline (an OpenAI-compatible chat-completions server, the Telegram
//! Bot API), and the
//! end-to-end tests under `tests/`.
//!
//! Services a test needs are *required* when `CHOIR_TEST_REQUIRE_SERVICES=1`
//! (set by `make test`): a missing one fails the test. Under plain
//! `cargo test` such a test prints why it is skipped and returns.
//! `CHOIR_TEST_KEEP=1` keeps temporary homes and clusters for inspection.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

pub mod agentdojo;
pub mod bench;
pub mod browser;
pub mod console;
pub mod docker;
pub mod fake_anthropic;
pub mod fake_embeddings;
pub mod fake_llm;
pub mod fake_notion;
pub mod fake_telegram;
pub mod fake_transcription;
pub mod fake_web;
pub mod firefox;
pub mod harness;
pub mod hops;
pub mod loopback;
pub mod mail_servers;
pub mod mcp;
pub mod observe;
pub mod page;
pub mod pg;
pub mod ports;
pub mod scenario;
pub mod tool_calls;

/// Whether missing services must fail tests instead of skipping them.
pub fn services_required() -> bool {
    std::env::var("CHOIR_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Whether this test runs as root, which `what` needs (mounting a
/// workspace image); when not, it says so and the test skips — unless every
/// service is required (`make test` runs as root), then it fails.
pub fn root_for(what: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(!services_required(), "{what} needs root (make test runs as root)");
    eprintln!("skipping: {what} needs root");
    false
}

/// Whether to keep temporary state after a test.
pub fn keep() -> bool {
    std::env::var("CHOIR_TEST_KEEP").is_ok_and(|v| v == "1")
}
