//! End-to-end tests: real choird, choir-agent and choirctl binaries, a real
//! PostgreSQL, and the scripted OpenAI-compatible fake in place of a model.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

mod acyclic;
mod agentdojo;
mod approvals;
mod arbiter;
mod arg_policy;
mod backup;
mod bad_input;
mod catalog;
mod cli;
mod clients;
mod code_order;
mod cognition;
mod console;
mod decisions;
mod docker;
mod doctor;
mod e2e;
mod faults;
mod hostile;
mod idle;
mod lanes;
mod logs;
mod mail;
mod managed;
mod mcp;
mod memory;
mod metrics;
mod notion;
mod origin;
mod packaging;
mod providers;
mod rollout;
mod schedule;
mod secrets;
mod service;
mod sessions;
mod skills;
mod speech;
mod telegram;
mod tidy;
mod tool_policy;
mod usage;
mod web;
