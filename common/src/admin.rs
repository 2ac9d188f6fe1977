//! The admin API spoken by choirctl to choird, only on choird's Unix socket
//! (mode 0600, R-RPC-4). Plain JSON over HTTP under `/admin/v1/`; errors use
//! [`crate::rpc::ErrorBody`].

use serde::{Deserialize, Serialize};

/// One log record, as choird writes it to `logs/*.log` (one JSON object per
/// line) and `choirctl logs` reads it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// When choird wrote it (RFC 3339, UTC, microseconds; choird's clock,
    /// never a time an agent claimed).
    pub ts: String,
    /// `ERROR`, `WARN`, `INFO`, `DEBUG` or `TRACE`.
    pub level: String,
    /// What wrote it: a choird module path, an agent's module path, or
    /// `agent/stdout` / `agent/stderr` for output the agent did not format.
    pub component: String,
    /// The agent it is about, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The message, on one line.
    pub msg: String,
}

impl LogRecord {
    /// The human form: `2026-11-23 11:33:06.123 WARN  [agent] component: message`.
    pub fn human(&self) -> String {
        let ts = self.ts.get(..23).unwrap_or(&self.ts).replacen('T', " ", 1);
        match &self.agent {
            Some(a) => format!("{ts} {:<5} [{a}] {}: {}", self.level, self.component, self.msg),
            None => format!("{ts} {:<5} {}: {}", self.level, self.component, self.msg),
        }
    }
}

/// `GET /logs`: the newest matching records, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPage {
    /// The records, oldest first.
    pub records: Vec<LogRecord>,
    /// Whether older matching records were left out (the limit).
    pub truncated: bool,
}

/// One group of `choirctl usage`: relayed model calls summed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The day (UTC), model, lane or agent.
    pub key: String,
    /// Calls.
    pub calls: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Of the prompt tokens, those the provider read from its prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Estimated cost in US dollars (none when a call's model had no price).
    pub cost_usd: Option<f64>,
}

/// `GET /usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The groups, in order.
    pub rows: Vec<UsageRow>,
}

/// One session, for `choirctl sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    /// The session id.
    pub id: i64,
    /// Its agent.
    pub agent: String,
    /// `process` or `docker`.
    pub runtime: String,
    /// When it started.
    pub started_at: String,
    /// When it ended (none while it runs).
    pub ended_at: Option<String>,
    /// How it ended.
    pub end_reason: Option<String>,
    /// What it ran in: `container <id>` or `pid <n>`.
    pub instance: Option<String>,
    /// How long it ran (or has been running), in seconds.
    pub seconds: u64,
    /// Events it committed (as replicated to choird).
    pub commits: u64,
    /// Model tokens its calls used.
    pub tokens: u64,
}

/// `GET /sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionList {
    /// Newest first.
    pub sessions: Vec<SessionRow>,
}

/// One secret as `choirctl secrets list` shows it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRow {
    /// Its name.
    pub name: String,
    /// Whether `secrets.json` holds it.
    pub set: bool,
    /// Its length in bytes, when set.
    pub length: Option<usize>,
    /// What uses it (config fields, tools).
    pub used_by: Vec<String>,
}

/// `GET /secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretList {
    /// Every secret set or used, by name.
    pub secrets: Vec<SecretRow>,
}

/// `PUT /secrets/<name>`. No `Debug`: it holds a value.
#[derive(Clone, Serialize, Deserialize)]
pub struct SetSecret {
    /// The value.
    pub value: String,
}

/// `choirctl policy test AGENT TOOL ARGS`: a call to evaluate, with where
/// its values came from (pointer → sources; a value not named is taken as
/// made by the model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyTest {
    /// The tool.
    pub tool: String,
    /// Its input.
    pub input: serde_json::Value,
    /// Sources of values by JSON pointer.
    #[serde(default)]
    pub from: std::collections::BTreeMap<String, Vec<crate::provenance::Source>>,
    /// Whether untrusted content entered the lane since the user spoke
    /// (absent: rules about the call itself are not judged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_untrusted: Option<bool>,
    /// Whether the tool is part of the turn's trusted intent (absent: as
    /// above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_intent: Option<bool>,
}

use crate::commit::CommitEvent;
use crate::rpc::LaneStatus;

/// `GET /admin/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// choird's version.
    pub version: String,
    /// choird's process id.
    pub pid: u32,
    /// Seconds since start.
    pub uptime_s: u64,
    /// The state directory.
    pub home: String,
    /// `managed (<dir>)` or `external`.
    pub database: String,
    /// Whether the global kill switch is on.
    pub kill_switch: bool,
    /// Disks nearly full where new work is refused: one line per agent
    /// whose home or workspace file system is (empty when none is).
    #[serde(default)]
    pub disk: Vec<String>,
    /// Every configured agent.
    pub agents: Vec<AgentSummary>,
    /// What each configured agent uses of its quotas and budget.
    #[serde(default)]
    pub usage: Vec<AgentUsage>,
    /// Why config.json on disk is not the configuration choird runs with
    /// (edited since the last load, or no longer valid); none when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_on_disk: Option<String>,
    /// Why Telegram polling and the scheduler are held (a home restored
    /// from a backup, until `choirctl resume`); none when they run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// What a reload (`choirctl reload`, SIGHUP) did with config.json and
/// secrets.json: each changed field (`agents.ops.max_steps`) by when it
/// takes effect, or why the whole reload was refused (nothing changed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadReport {
    /// In force now (agents take their new dynamic config at once).
    #[serde(default)]
    pub applied: Vec<String>,
    /// Read, but in force only once choird restarts (listeners, database).
    #[serde(default)]
    pub after_choird_restart: Vec<String>,
    /// In force for an agent at its next start (`agent restart ID`).
    #[serde(default)]
    pub after_agent_restart: Vec<String>,
    /// Whether secrets.json changed (values are never shown).
    #[serde(default)]
    pub secrets_changed: bool,
    /// Why the reload was refused; the running configuration stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// One quota or budget: how much is used of how much (`None`: unlimited,
/// or not known — e.g. memory not configured).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Use {
    /// Used.
    #[serde(default)]
    pub used: Option<u64>,
    /// Allowed.
    #[serde(default)]
    pub limit: Option<u64>,
}

/// An agent's use of its quotas and token budget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentUsage {
    /// Agent id.
    pub id: String,
    /// Tokens today (UTC) against the daily budget.
    pub tokens_today: Use,
    /// Tokens in all against the total budget.
    pub tokens_total: Use,
    /// Memory items.
    pub memory_items: Use,
    /// Proposals waiting for a human.
    pub pending_proposals: Use,
    /// Notices this hour.
    pub notices_this_hour: Use,
    /// Bytes in choird's Telegram spool.
    pub spool_bytes: Use,
    /// Audit records of its requests this hour.
    pub audit_this_hour: Use,
    /// Bytes used in its workspace's file system, against its size (the
    /// configured quota while the image is not mounted; no limit when the
    /// quota is off).
    #[serde(default)]
    pub workspace_bytes: Use,
    /// Inodes used there, against the file system's count.
    #[serde(default)]
    pub workspace_inodes: Use,
}

/// One agent, as choird sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSummary {
    /// Agent id.
    pub id: String,
    /// `process` or `docker`.
    pub runtime: String,
    /// The configured runtime, when it is not the one this session runs in
    /// (switched by a reload; it applies at the agent's next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_runtime: Option<String>,
    /// `stopped`, `starting`, `running`, `exited`.
    pub state: String,
    /// Current or last session id.
    #[serde(default)]
    pub session_id: Option<i64>,
    /// Process id (process runtime) while running.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Container id (docker runtime) while running.
    #[serde(default)]
    pub container: Option<String>,
    /// Image the container runs (docker runtime).
    #[serde(default)]
    pub image: Option<String>,
    /// Milliseconds since the last HEARTBEAT, while running.
    #[serde(default)]
    pub last_heartbeat_ms: Option<u64>,
    /// Highest replicated commit sequence.
    pub replicated_seq: u64,
    /// Last reported session state.
    #[serde(default)]
    pub session_state: Option<String>,
    /// Last reported lanes.
    #[serde(default)]
    pub lanes: Vec<LaneStatus>,
    /// Why it last stopped, if it did.
    #[serde(default)]
    pub last_exit: Option<String>,
    /// The model fallbacks choird took for this agent in the last day, in
    /// words (how many; the last one's lane, model and age).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallbacks: Option<String>,
    /// The dynamic config version the running agent last said it runs with
    /// (choird's moves on with every reload; the agent follows within a
    /// heartbeat).
    #[serde(default)]
    pub config_version: Option<u64>,
}

/// `GET /admin/v1/agents`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentList {
    /// Every configured agent.
    pub agents: Vec<AgentSummary>,
}

/// `POST /admin/v1/agents/<id>/chat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The user's message.
    pub text: String,
    /// Conversation key; defaults to `cli`.
    #[serde(default)]
    pub conversation: Option<String>,
    /// How long to wait for the answer, in seconds (default 300).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Stream the answer as it is written: the reply is then JSON lines,
    /// `{"partial": "text so far"}` … then `{"message_id": N, "reply": "…"}`
    /// (or `{"error": "…"}`).
    #[serde(default)]
    pub stream: bool,
}

/// Answer to a chat request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// Id of the inbound message that was queued.
    pub message_id: u64,
    /// The agent's answer.
    pub reply: String,
}

/// `GET /admin/v1/agents/<id>/events?after=N&limit=M`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsResponse {
    /// Replicated events in sequence order.
    pub events: Vec<CommitEvent>,
    /// Whether the returned range links and hashes correctly.
    pub chain_ok: bool,
}

/// A proposal as choird keeps it (`GET /admin/v1/approvals`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalInfo {
    /// Its id.
    pub id: i64,
    /// The proposing agent.
    pub agent: String,
    /// `tool`, `skill` or `config_change`.
    pub kind: String,
    /// `agent` or `global`.
    pub scope: String,
    /// The tool or skill name, or the settings changed.
    pub subject: String,
    /// sha256 of the canonical content, fixed when it was proposed.
    pub sha256: String,
    /// Whether the stored content still hashes to `sha256`; an altered
    /// proposal is never approved or applied.
    pub intact: bool,
    /// Why the agent proposed it.
    pub reason: String,
    /// The proposing lane, and skill/state if any.
    pub lane: String,
    /// See `lane`.
    #[serde(default)]
    pub skill: Option<String>,
    /// See `lane`.
    #[serde(default)]
    pub state: Option<String>,
    /// `pending`, `approved` or `rejected`.
    pub status: String,
    /// When it was proposed.
    pub created_at: String,
    /// When it was decided.
    #[serde(default)]
    pub decided_at: Option<String>,
    /// Who decided.
    #[serde(default)]
    pub decided_by: Option<String>,
    /// The rejection reason.
    #[serde(default)]
    pub decision_reason: Option<String>,
    /// How it was applied (the repository commit, or the settings changed).
    #[serde(default)]
    pub applied: Option<String>,
    /// The automatic rollout of an approved tool or skill to the running
    /// agent (`approvals.auto_update`), while choird remembers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

/// Where the rollout of an approved tool or skill stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// `waiting` (for the agent to finish its work), `building`, `rolling`,
    /// then `done`, `failed` or `skipped`.
    pub state: String,
    /// Progress lines, oldest first (the last 200).
    pub lines: Vec<String>,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

impl Rollout {
    /// Whether it has ended.
    pub fn finished(&self) -> bool {
        matches!(self.state.as_str(), "done" | "failed" | "skipped")
    }
}

/// `GET /admin/v1/approvals?status=S&agent=ID`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalList {
    /// Newest first.
    pub approvals: Vec<ApprovalInfo>,
}

/// `GET /admin/v1/approvals/<id>`: the whole proposal and what it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDetail {
    /// Its record.
    pub info: ApprovalInfo,
    /// The content, exactly as stored (canonical JSON, parsed).
    pub content: serde_json::Value,
    /// A unified diff against what it would replace.
    pub diff: String,
}

/// `POST /admin/v1/approvals/<id>/approve`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ApproveRequest {
    /// The digest the approver saw; when given, it must match.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Who approves (default `admin`).
    #[serde(default)]
    pub by: Option<String>,
    /// For a call: remember its destinations for this agent for this many
    /// days (1–365), so the same ones need no confirmation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember_days: Option<u64>,
    /// For an MCP catalog: per tool, the approver's choices (`skip`,
    /// `side_effect`, `idempotent`, `timeout_ms`, `description`, `roles`,
    /// `locks`); a tool not named is pinned with the strictest defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pins: Option<serde_json::Value>,
}

/// `POST /admin/v1/approvals/<id>/reject`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectRequest {
    /// Why (told to the agent).
    pub reason: String,
    /// Who rejects (default `admin`).
    #[serde(default)]
    pub by: Option<String>,
}

/// `POST /admin/v1/agents/<id>/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// `edge` (its current turn or skill), `core:<job>`, or `all`.
    pub lane: String,
}

/// `GET /admin/v1/telegram`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelegramStatus {
    /// The Bot API base URL in use.
    pub api_base: String,
    /// Every configured bot.
    pub bots: Vec<BotStatus>,
}

/// One bot of the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BotStatus {
    /// Its name in config.
    pub bot: String,
    /// Whether it runs (its token is in secrets.json).
    pub enabled: bool,
    /// Users bound through it.
    pub users: usize,
    /// Of whom admins.
    pub admins: usize,
    /// Seconds since `getUpdates` last answered.
    #[serde(default)]
    pub last_poll_s_ago: Option<u64>,
    /// The last error (tokens masked).
    #[serde(default)]
    pub last_error: Option<String>,
    /// Updates received since choird started.
    pub updates: u64,
    /// Messages and files sent since choird started.
    pub sent: u64,
    /// Failed requests since choird started.
    pub errors: u64,
    /// Stored updates not yet handled.
    pub queued_updates: i64,
    /// Outbox rows not yet sent.
    pub queued_outbox: i64,
    /// Outbox rows given up on (refused by Telegram).
    pub failed_outbox: i64,
}

/// A user who asked a bot to be let in (`GET /admin/v1/telegram/pairings`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairingInfo {
    /// The bot.
    pub bot: String,
    /// The Telegram user id.
    pub user_id: i64,
    /// Their @username, if any.
    #[serde(default)]
    pub username: Option<String>,
    /// `pending`, `approved` or `refused`.
    pub status: String,
    /// When they asked.
    pub requested_at: String,
    /// Who decided.
    #[serde(default)]
    pub decided_by: Option<String>,
}

/// `GET /admin/v1/telegram/pairings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairingList {
    /// Newest first.
    pub pairings: Vec<PairingInfo>,
}

/// `POST /admin/v1/telegram/pairings/<bot>/<user id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairDecision {
    /// Let them in (true) or refuse (false).
    pub approve: bool,
}

/// One tool an agent has, as `GET /admin/v1/agents/<id>/tools` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRow {
    /// Its name.
    pub name: String,
    /// `built-in`, `host` (run by choird) or `external` (an approved tool).
    pub kind: String,
    /// `system`, `available` (known, not usable: see `why`), `connected`, or
    /// `off` (the operator's tool policy does not permit it).
    pub status: String,
    /// Why it is only available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Where it runs: `agent` (in its container) or `choird` (on the host).
    pub runs: String,
    /// Where it comes from: `built-in`, `choird`, or its manifest file under `repos/`.
    pub source: String,
}

/// One skill an agent has, as `GET /admin/v1/agents/<id>/skills` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillRow {
    /// Its name (for an unreadable file: the file's stem).
    pub name: String,
    /// `ok`, `invalid` (see `why`: the agent would refuse to start), or
    /// `replaced` (by the agent layer's skill of the same name).
    pub status: String,
    /// Why it is not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// `built-in`, `global` or `agent`.
    pub source: String,
    /// Its file (under the home), or `built-in:<file>`.
    pub file: String,
    /// What it is for.
    pub description: String,
    /// How many states it has.
    pub states: usize,
}

/// `GET /admin/v1/agents/<id>/skills`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillList {
    /// The agent.
    pub agent: String,
    /// Its skills, by name.
    pub skills: Vec<SkillRow>,
}

/// `POST /admin/v1/agents/<id>/repos`: a tool or skill the operator
/// reviewed, added the way an approved proposal is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRequest {
    /// `tool` or `skill`.
    pub kind: String,
    /// Into `repos/global` (every agent) instead of the agent's layer.
    #[serde(default)]
    pub global: bool,
    /// As a proposal's: `{"manifest", "executable"}` or `{"skill"}`.
    pub content: serde_json::Value,
}

/// `GET /admin/v1/agents/<id>/tools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolList {
    /// The agent.
    pub agent: String,
    /// Its tools, by name.
    pub tools: Vec<ToolRow>,
    /// The operator's tool policy for it (`agents.<id>.tools`).
    #[serde(default)]
    pub policy: crate::tool_policy::ToolPolicy,
}

/// How a `doctor` check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckOutcome {
    /// Fine.
    Ok,
    /// Works, but will bite (e.g. little disk left).
    Warn,
    /// Broken: the deployment fails on this.
    Fail,
    /// Not checked (nothing configured, or an earlier check failed).
    Skip,
}

impl CheckOutcome {
    /// The word shown in the first column.
    pub fn label(self) -> &'static str {
        match self {
            CheckOutcome::Ok => "ok",
            CheckOutcome::Warn => "WARN",
            CheckOutcome::Fail => "FAIL",
            CheckOutcome::Skip => "skip",
        }
    }
}

/// One `doctor` check's finding: made by `choird doctor` (offline, one JSON
/// line each) and by choirctl (what only a running choird can answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked (`postgres`, `telegram bot main`, …).
    pub name: String,
    /// How it came out.
    pub outcome: CheckOutcome,
    /// What was found.
    pub detail: String,
    /// What to do about it (for a warning or failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A passed check.
    pub fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check { name: name.to_owned(), outcome: CheckOutcome::Ok, detail: detail.into(), fix: None }
    }
    /// A warning with its fix.
    pub fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.to_owned(), outcome: CheckOutcome::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    /// A failure with its fix.
    pub fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.to_owned(), outcome: CheckOutcome::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
    /// A check not made, and why.
    pub fn skip(name: &str, detail: impl Into<String>) -> Check {
        Check { name: name.to_owned(), outcome: CheckOutcome::Skip, detail: detail.into(), fix: None }
    }
}
