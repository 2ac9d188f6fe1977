//! Docker: the Engine API client and the agent image build.

pub mod build;
pub mod client;

pub use client::{Engine, EngineError};
