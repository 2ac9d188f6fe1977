//! Scheduled jobs (R-SCHED-1) as they cross a boundary: the job people write
//! (`choirctl schedule add`, an approved `choir.propose.schedule`) and the
//! admin API's views. A firing handed to an agent and what the agent says of
//! it are RPC types (`rpc::FiringOffer`, `rpc::FiringReport`).
//!
//! The spec is plain data here; choird checks it (cron syntax, time zone,
//! tools, budget, destination) before anything is stored, and the same check
//! runs for a proposal, so the human approves exactly what will run.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Consecutive failures before a job's circuit breaker pauses it, unless the
/// job says otherwise.
pub const DEFAULT_BREAKER: u32 = 3;

/// A scheduled job as written by a person (or proposed by an agent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Unique per agent; also the core job's name and its name in the cost
    /// ledger (`[A-Za-z0-9_.-]{1,64}`).
    pub name: String,
    /// A cron expression of 5 fields (minute first) or 6 (seconds first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone the cron expression is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// Or: every this many seconds (at least 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_s: Option<u64>,
    /// What the job is to do (the core job's objective).
    pub prompt: String,
    /// A skill to run, with `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// The skill's input.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub input: Value,
    /// Tools the job may use (intersected with everything else that limits
    /// the agent); all a core job may use when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// The job's budget; the agent's core budget fills what is not given.
    #[serde(default)]
    pub budget: JobBudget,
    /// Where the result goes: a conversation of one of the agent's
    /// Telegram users (`tg:<bot>:<user>`), or only the log when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_to: Option<String>,
    /// What happens to firings missed while choird was down.
    #[serde(default)]
    pub missed: Missed,
    /// A check choird makes without a model call; the firing is skipped
    /// when it says nothing changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precondition: Option<Precondition>,
    /// Failures in a row after which the job is paused and the admins told.
    #[serde(default = "default_breaker")]
    pub breaker: u32,
}

fn default_breaker() -> u32 {
    DEFAULT_BREAKER
}

/// A job's budget; each absent part is the agent's `core_budget`'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobBudget {
    /// Model steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Wall-clock seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<u64>,
}

/// The missed-run policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Missed firings are recorded as missed; the next one runs on time.
    #[default]
    Skip,
    /// Missed firings are recorded; the latest of them runs once, now.
    RunOnce,
}

impl Missed {
    /// The spelling in specs and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::RunOnce => "run_once",
        }
    }
}

/// A cheap check choird makes before a firing costs a model call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Precondition {
    /// Unseen mail in the agent's mailbox (`agents.<id>.email`) that was
    /// not there at the last check.
    NewMail,
    /// A file or directory in the agent's workspace changed (size, time
    /// or name of what it holds; links are never followed).
    FileChanged {
        /// Relative to the workspace.
        path: String,
    },
    /// A URL's content changed (fetched under the agent's web egress policy).
    UrlChanged {
        /// An http(s) URL.
        url: String,
    },
    /// A memory item whose `metadata.due` (RFC 3339) has come and that no
    /// earlier firing saw.
    MemoryDue,
}

impl Precondition {
    /// One line for a table.
    pub fn describe(&self) -> String {
        match self {
            Precondition::NewMail => "new mail".into(),
            Precondition::FileChanged { path } => format!("file changed: {path}"),
            Precondition::UrlChanged { url } => format!("url changed: {url}"),
            Precondition::MemoryDue => "memory item due".into(),
        }
    }
}

/// A job as `choirctl schedule list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    /// The job's id.
    pub id: i64,
    /// Its agent.
    pub agent: String,
    /// The spec, as stored.
    pub spec: JobSpec,
    /// Whether it is paused, and why.
    pub paused: bool,
    /// See `paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
    /// Failures in a row.
    pub failures: u32,
    /// When it fires next (RFC 3339), if it is not paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due: Option<String>,
    /// Who made it (`admin`, or `approval #N`).
    pub created_by: String,
}

/// The job list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobList {
    /// Jobs, by agent and name.
    pub jobs: Vec<JobRow>,
}

/// One firing, as `choirctl schedule show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiringRow {
    /// Its id.
    pub id: i64,
    /// The time it was scheduled for (RFC 3339).
    pub scheduled_for: String,
    /// `due`, `offered`, `running`, `done`, `failed`, `interrupted`,
    /// `refused`, `missed` or `skipped` (the precondition saw nothing new).
    pub state: String,
    /// Milliseconds from start to outcome, once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    /// Tokens its model calls used (from the cost ledger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<i64>,
    /// The result or why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// `choirctl schedule show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDetail {
    /// The job.
    pub job: JobRow,
    /// Its next firings (RFC 3339, in its time zone).
    pub next: Vec<String>,
    /// Its last firings, newest first.
    pub last: Vec<FiringRow>,
}
