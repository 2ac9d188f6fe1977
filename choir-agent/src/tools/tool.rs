//! What a tool is, as the arbiter sees it: the [`Tool`] trait, the
//! [`ExecContext`] a call runs with (including the calling lane's
//! [`LaneHooks`], for the lane tools), and the [`ToolError`] a failed run
//! returns. Every tool module and the registry build on this one; it knows
//! none of them.

use std::path::Path;
use std::time::Instant;

use serde_json::Value;

use crate::origin::Entry;
use crate::secrets::SecretStore;
use crate::workspace::Workspace;

/// What a tool gets to run with.
pub struct ExecContext<'a> {
    /// The workspace, for path-confined file access.
    pub workspace: &'a Workspace,
    /// The calling lane (per-lane state such as the shell's cwd).
    pub lane: &'a str,
    /// The model's id for this call (host tools record it with what they store).
    pub call_id: &'a str,
    /// The agent's private state directory.
    pub state_dir: &'a Path,
    /// When the call must be finished (the manifest's `timeout_ms`).
    pub deadline: Instant,
    /// The secrets this tool declared (`secret_resources`), and only those.
    pub secrets: SecretStore,
    /// The calling lane's hooks, for lane tools.
    pub hooks: Option<&'a dyn LaneHooks>,
    /// The calling lane's history (a core job started now inherits it as
    /// evidence of where values came from).
    pub history: &'a [Entry],
}

/// A core job to start (`choir.core.start`).
pub struct JobRequest<'a> {
    /// Its name, unique among running jobs.
    pub name: &'a str,
    /// What it is to do (written by the starting lane's model).
    pub objective: &'a str,
    /// A skill to run, with its input.
    pub skill: Option<(&'a str, &'a Value)>,
    /// The task's allowlist (the per-task allowlist of seed 002).
    pub allowed_tools: Option<&'a [String]>,
    /// The starting lane's history, as provenance evidence (its model
    /// turns are no evidence and are left out).
    pub inherited: Vec<Entry>,
}

/// A tool failed while running (rejections happen before, in the arbiter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// Stable code, e.g. `not_found`.
    pub code: String,
    /// For the model.
    pub message: String,
}

impl ToolError {
    /// A tool error.
    pub fn new(code: &str, message: impl Into<String>) -> ToolError {
        ToolError { code: code.to_owned(), message: message.into() }
    }
}

/// A tool implementation. The result object carries a `summary`; a result with
/// `"timed_out": true` is committed with outcome `timeout`.
pub trait Tool: Send + Sync {
    /// Runs with validated input.
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError>;

    /// Why the tool cannot be offered or called right now, when its
    /// availability changes while the agent runs (an MCP tool whose server
    /// changed it since approval); `None`: its status decides.
    fn unavailable(&self) -> Option<String> {
        None
    }
}

/// What a lane offers its lane tools.
pub trait LaneHooks: Send + Sync {
    /// Starts a core job.
    fn core_start(&self, job: JobRequest<'_>) -> Result<Value, ToolError>;
    /// Runs a skill in this lane, right after the current step.
    fn skill_run(&self, skill: &str, input: &Value) -> Result<Value, ToolError>;
    /// Reports one core job, or all.
    fn core_status(&self, name: Option<&str>) -> Result<Value, ToolError>;
    /// Cancels a core job.
    fn core_cancel(&self, name: &str) -> Result<Value, ToolError>;
    /// Asks for working-memory compaction before the next model step.
    fn compact(&self) -> Result<Value, ToolError>;
    /// Tools `choir.tools.find` found (offered from now on when the agent's
    /// tools are found rather than all listed).
    fn discovered(&self, _names: &[String]) {}
}
