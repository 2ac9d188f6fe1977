//! `config.json`: choird's static configuration, the source of truth for which
//! agents exist and where every external endpoint is. Parsed strictly (unknown
//! fields are errors) and validated before anything starts; every error names
//! the offending field by its dotted path.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use choir_common::ids::AgentId;
use serde::{Deserialize, Serialize};

use crate::home::Home;
use crate::secrets::Secrets;

mod accounts;
mod speech;
mod web;
pub use accounts::{EmailConfig, MailServer, NotionConfig, Security};
pub use speech::{valid_voice, AgentVoice, TranscriptionConfig};
pub use web::{AgentWeb, BraveConfig, BrowserConfig, PostSecret, WebConfig};

/// How agents are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A hardened Docker container per agent.
    Docker,
    /// A plain child process: unsandboxed, for development.
    Process,
}

impl RuntimeKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Docker => "docker",
            RuntimeKind::Process => "process",
        }
    }
}

/// An OpenAI-compatible endpoint for one lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmEndpoint {
    /// Base URL including the version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name sent upstream.
    pub model: String,
    /// Name of the API key in `secrets.json`; absent for keyless local servers.
    #[serde(default)]
    pub api_key_secret: Option<String>,
    /// Upstream timeout in seconds.
    #[serde(default = "default_llm_timeout")]
    pub timeout_s: u64,
}

fn default_llm_timeout() -> u64 {
    120
}

/// Endpoints per lane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The fast, user-facing lane.
    pub edge: LlmEndpoint,
    /// Core jobs.
    pub core: LlmEndpoint,
    /// Prices by model name, for the cost ledger (a model without one is
    /// recorded without a cost).
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
}

/// A model's price, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million prompt (input) tokens.
    pub prompt_per_mtok: f64,
    /// Per million completion (output) tokens.
    pub completion_per_mtok: f64,
}

impl LlmConfig {
    /// The estimated cost of a call to `model`, if it has a price.
    pub fn cost(&self, model: &str, prompt: u64, completion: u64) -> Option<f64> {
        let p = self.prices.get(model)?;
        Some((prompt as f64 * p.prompt_per_mtok + completion as f64 * p.completion_per_mtok) / 1_000_000.0)
    }
}

/// Per-agent model overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelOverrides {
    /// Edge model.
    #[serde(default)]
    pub edge: Option<String>,
    /// Core model.
    #[serde(default)]
    pub core: Option<String>,
}

/// Container resource limits (used by the docker runtime).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Memory limit in MiB.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// CPU share (1.0 = one core).
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    /// Maximum number of processes.
    #[serde(default = "default_pids")]
    pub pids: u64,
}

fn default_memory_mb() -> u64 {
    1024
}
fn default_cpus() -> f64 {
    1.0
}
fn default_pids() -> u64 {
    256
}

impl Default for Resources {
    fn default() -> Self {
        Resources { memory_mb: default_memory_mb(), cpus: default_cpus(), pids: default_pids() }
    }
}

/// One agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The operator's tool policy: `{allow?, deny?}`, names or `prefix.*`
    /// (enforced by the agent's arbiter; never proposable by the agent).
    #[serde(default, skip_serializing_if = "tools_unset")]
    pub tools: choir_common::tool_policy::ToolPolicy,
    /// Persistent workspace directory; default `<home>/workspaces/<id>`.
    #[serde(default)]
    pub workspace: Option<PathBuf>,
    /// Model overrides per lane.
    #[serde(default)]
    pub models: ModelOverrides,
    /// Names of secrets (in `secrets.json`) bound to this agent.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Resource limits.
    #[serde(default)]
    pub resources: Resources,
    /// Start with choird.
    #[serde(default)]
    pub autostart: bool,
    /// Model steps the edge lane may take for one message.
    #[serde(default = "default_max_steps")]
    pub max_steps_per_turn: u32,
    /// Invalid model proposals tolerated in a row before a turn fails.
    #[serde(default = "default_retry_budget")]
    pub retry_budget: u32,
    /// Estimated context tokens at which a lane compacts its history.
    #[serde(default = "default_context_tokens")]
    pub context_tokens: u64,
    /// Core jobs that may run at once.
    #[serde(default = "default_max_core_jobs")]
    pub max_core_jobs: u32,
    /// Budget of each core job (steps, tokens, wall seconds).
    #[serde(default)]
    pub core_budget: choir_common::rpc::CoreBudget,
    /// Tokens the agent's model calls may spend per UTC day and in total,
    /// across sessions (none = unlimited); then 429 `budget_exhausted`.
    #[serde(default)]
    pub token_budget: TokenBudget,
    /// `all` (default): the model is sent every tool; `find`: Choir's own
    /// tools and `choir.tools.find`, then whatever it found (for agents with
    /// many tools).
    #[serde(default)]
    pub tool_exposure: ToolExposure,
    /// Container network (docker runtime): `none` (default: the agent reaches
    /// choird only through its socket) or `bridge`.
    #[serde(default)]
    pub network: NetworkMode,
    /// How the agent reaches choird: `unix` (default) or `http` (the
    /// process runtime, with `http_listen` set).
    #[serde(default)]
    pub transport: Transport,
    /// Seconds replication of the agent's log to choird may fail before the
    /// agent refuses every tool call (fail closed) until it recovers.
    #[serde(default = "default_fail_closed_s")]
    pub fail_closed_s: u64,
    /// What the agent may make choird store (see [`Quotas`]).
    #[serde(default)]
    pub quotas: Quotas,
    /// The agent's egress policy for the web tools (none: they are not
    /// served to it).
    #[serde(default)]
    pub web: Option<AgentWeb>,
    /// The agent's voice for `choir.tts.speak` (none: the tool is not served).
    #[serde(default)]
    pub voice: Option<AgentVoice>,
    /// The agent's Notion integration (none: `choir.notion.query` is not served).
    #[serde(default)]
    pub notion: Option<NotionConfig>,
    /// The agent's mailbox (none: the mail tools are not served).
    #[serde(default)]
    pub email: Option<EmailConfig>,
}

/// An agent's token budget (`agents.<id>.token_budget`); none means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBudget {
    /// Tokens per UTC day.
    #[serde(default)]
    pub per_day: Option<u64>,
    /// Tokens in all.
    #[serde(default)]
    pub total: Option<u64>,
}

/// Bounds on what an agent (a possibly hostile client) can make choird keep.
/// Every field has a default; `choirctl status` shows usage against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Largest memory item (its content), in bytes.
    #[serde(default = "default_memory_item_bytes")]
    pub memory_item_bytes: u64,
    /// Memory items, all tiers together.
    #[serde(default = "default_memory_items")]
    pub memory_items: u64,
    /// Proposals waiting for a human at once.
    #[serde(default = "default_pending_proposals")]
    pub pending_proposals: u64,
    /// Notices (messages of its own, not answers) per hour.
    #[serde(default = "default_notices_per_hour")]
    pub notices_per_hour: u64,
    /// Files waiting in choird's Telegram spool, in MiB.
    #[serde(default = "default_spool_mb")]
    pub spool_mb: u64,
    /// Audit records of the agent's own requests per hour (past it, one
    /// record per hour says how many were not written).
    #[serde(default = "default_audit_per_hour")]
    pub audit_per_hour: u64,
}

fn default_memory_item_bytes() -> u64 {
    32 * 1024
}
fn default_memory_items() -> u64 {
    100_000
}
fn default_pending_proposals() -> u64 {
    20
}
fn default_notices_per_hour() -> u64 {
    120
}
fn default_spool_mb() -> u64 {
    256
}
fn default_audit_per_hour() -> u64 {
    20_000
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            memory_item_bytes: default_memory_item_bytes(),
            memory_items: default_memory_items(),
            pending_proposals: default_pending_proposals(),
            notices_per_hour: default_notices_per_hour(),
            spool_mb: default_spool_mb(),
            audit_per_hour: default_audit_per_hour(),
        }
    }
}

fn default_fail_closed_s() -> u64 {
    30
}

/// Which tools the model is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolExposure {
    /// Every offered tool.
    #[default]
    All,
    /// Choir's own tools and `choir.tools.find`, then the tools found.
    Find,
}

impl ToolExposure {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolExposure::All => "all",
            ToolExposure::Find => "find",
        }
    }
}

/// How a process-runtime agent reaches choird (R-RPC-1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Its own Unix socket, `socks/agents/<id>/choird.sock`.
    #[default]
    Unix,
    /// HTTP on `http_listen` (loopback; the process runtime only).
    Http,
}

/// A container's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// No network at all.
    #[default]
    None,
    /// Docker's default bridge (outbound network).
    Bridge,
}

impl NetworkMode {
    /// The engine's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Bridge => "bridge",
        }
    }
}

/// The docker runtime's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerConfig {
    /// The engine's Unix socket.
    #[serde(default = "default_docker_socket")]
    pub socket: PathBuf,
    /// The base image agent images are built `FROM` (scripts/build-base-image.sh makes it).
    #[serde(default = "default_base_image")]
    pub base_image: String,
    /// Agent images are named `<image_prefix>-agent-<id>:<input hash>`.
    #[serde(default = "default_image_prefix")]
    pub image_prefix: String,
    /// Leave agent containers running when choird stops (they reconnect with
    /// their lease when it comes back); false stops them with choird.
    #[serde(default = "default_true")]
    pub keep_agents_on_shutdown: bool,
    /// Size of each agent's `/tmp` (tmpfs), in MiB.
    #[serde(default = "default_tmp_mb")]
    pub tmp_mb: u64,
}

fn default_docker_socket() -> PathBuf {
    PathBuf::from("/var/run/docker.sock")
}
fn default_base_image() -> String {
    "choir-base:bookworm".to_owned()
}
fn default_image_prefix() -> String {
    "choir".to_owned()
}
fn default_true() -> bool {
    true
}
fn default_tmp_mb() -> u64 {
    64
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            socket: default_docker_socket(),
            base_image: default_base_image(),
            image_prefix: default_image_prefix(),
            keep_agents_on_shutdown: true,
            tmp_mb: default_tmp_mb(),
        }
    }
}

fn default_max_steps() -> u32 {
    16
}
fn default_retry_budget() -> u32 {
    2
}
fn default_context_tokens() -> u64 {
    24_000
}
fn default_max_core_jobs() -> u32 {
    4
}

fn tools_unset(p: &choir_common::tool_policy::ToolPolicy) -> bool {
    *p == choir_common::tool_policy::ToolPolicy::default()
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            tools: Default::default(),
            workspace: None,
            models: ModelOverrides::default(),
            secrets: Vec::new(),
            resources: Resources::default(),
            autostart: false,
            max_steps_per_turn: default_max_steps(),
            retry_budget: default_retry_budget(),
            context_tokens: default_context_tokens(),
            max_core_jobs: default_max_core_jobs(),
            core_budget: choir_common::rpc::CoreBudget::default(),
            token_budget: TokenBudget::default(),
            tool_exposure: ToolExposure::All,
            network: NetworkMode::None,
            transport: Transport::Unix,
            fail_closed_s: default_fail_closed_s(),
            quotas: Quotas::default(),
            web: None,
            voice: None,
            notion: None,
            email: None,
        }
    }
}

/// The Telegram gateway (R-GW): bots, who may talk to which agent, limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramConfig {
    /// The Bot API's base URL (a local Bot API server, or a fake in tests).
    #[serde(default = "default_telegram_api")]
    pub api_base: String,
    /// Long-poll timeout of `getUpdates`, in seconds.
    #[serde(default = "default_poll_timeout")]
    pub poll_timeout_s: u64,
    /// Least time between two messages to one chat (Telegram: about 1/s).
    #[serde(default = "default_chat_interval")]
    pub per_chat_interval_ms: u64,
    /// Most messages per second per bot (Telegram: about 30/s).
    #[serde(default = "default_bot_rate")]
    pub per_bot_per_s: u32,
    /// Largest file received from a user, in MiB (the cloud Bot API serves up to 20).
    #[serde(default = "default_max_file_mb")]
    pub max_file_mb: u64,
    /// Bots by name (`[a-z][a-z0-9_]{0,31}`).
    #[serde(default)]
    pub bots: BTreeMap<String, BotConfig>,
    /// Where users' voice notes are transcribed (none: they are asked for text).
    #[serde(default)]
    pub transcription: Option<TranscriptionConfig>,
}

fn default_telegram_api() -> String {
    "https://api.telegram.org".to_owned()
}
fn default_poll_timeout() -> u64 {
    25
}
fn default_chat_interval() -> u64 {
    1000
}
fn default_bot_rate() -> u32 {
    30
}
fn default_max_file_mb() -> u64 {
    20
}

impl Default for TelegramConfig {
    fn default() -> Self {
        TelegramConfig {
            api_base: default_telegram_api(),
            poll_timeout_s: default_poll_timeout(),
            per_chat_interval_ms: default_chat_interval(),
            per_bot_per_s: default_bot_rate(),
            max_file_mb: default_max_file_mb(),
            bots: BTreeMap::new(),
            transcription: None,
        }
    }
}

/// One bot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotConfig {
    /// Name of the bot token in `secrets.json`.
    pub token_secret: String,
    /// Telegram user id → what the user may do through this bot.
    #[serde(default)]
    pub users: BTreeMap<String, BotUser>,
    /// Group chat id → the agent that serves it; other groups are ignored.
    #[serde(default)]
    pub groups: BTreeMap<String, BotGroup>,
    /// When set, a user the bot does not know may ask to be let in: the bot's
    /// admins decide (in chat or with `choirctl telegram pair`), and a user let
    /// in talks to this agent. Unset: unknown users are only refused.
    #[serde(default)]
    pub pairing: Option<AgentId>,
}

/// A Telegram user bound to an agent through a bot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotUser {
    /// The agent their private messages go to.
    pub agent: AgentId,
    /// Admins decide proposals and may use /status, /stop, /approvals.
    #[serde(default)]
    pub admin: bool,
}

/// A group chat served by an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotGroup {
    /// The agent the group's messages go to.
    pub agent: AgentId,
}

/// Agent memory (R-MEM): Postgres + pgvector, with embeddings from an
/// OpenAI-compatible endpoint. Without this section the memory tools are not
/// served (agents see them as available, not connected).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// The embeddings endpoint.
    pub embeddings: EmbeddingsConfig,
    /// Most texts per embeddings request.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// How long the batcher waits to fill a batch, in milliseconds.
    #[serde(default = "default_batch_ms")]
    pub batch_ms: u64,
    /// How long an upsert waits for its embeddings before answering
    /// "pending" (they are made later either way), in milliseconds.
    #[serde(default = "default_upsert_wait_ms")]
    pub upsert_wait_ms: u64,
    /// HNSW search breadth (`hnsw.ef_search`) for semantic queries.
    #[serde(default = "default_ef_search")]
    pub ef_search: u32,
    /// IVFFlat search breadth (`ivfflat.probes`: lists read) for semantic
    /// queries once an agent's memory is large enough for its IVFFlat index.
    #[serde(default = "default_probes")]
    pub probes: u32,
    /// Most items per agent whose vectors wait outside the vector index (found
    /// by an exact scan) for the `memory-index` thread to index them; beyond
    /// it new vectors go straight into the index. 0 indexes every vector as
    /// it is stored. Bounds what a burst of upserts adds to a query.
    #[serde(default = "default_fresh_max")]
    pub fresh_max: u32,
}

fn default_batch_size() -> usize {
    64
}
fn default_batch_ms() -> u64 {
    20
}
fn default_upsert_wait_ms() -> u64 {
    5000
}
fn default_ef_search() -> u32 {
    crate::store::memory::Breadth::DEFAULT.ef_search
}
fn default_probes() -> u32 {
    crate::store::memory::Breadth::DEFAULT.probes
}
fn default_fresh_max() -> u32 {
    DEFAULT_FRESH_MAX
}

/// `memory.fresh_max` when unset: an exact scan costs a query about 0.7-2 µs
/// per waiting vector (`bench-memory`), so a full set adds 1.5-4 ms to a
/// query that takes 4-8 ms through the index.
pub const DEFAULT_FRESH_MAX: u32 = 2_000;

/// An OpenAI-compatible `/v1/embeddings` endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// Base URL including the version; choird posts to `<base_url>/embeddings`.
    pub base_url: String,
    /// The embedding model.
    pub model: String,
    /// Name of the API key in `secrets.json` (none for keyless servers).
    #[serde(default)]
    pub api_key_secret: Option<String>,
    /// The model's output dimension; the `vector(N)` of every agent schema.
    /// Checked against the endpoint at start: a mismatch is an error.
    pub dimensions: u32,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_embed_timeout")]
    pub timeout_s: u64,
}

fn default_embed_timeout() -> u64 {
    30
}

/// The whole `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How agents run.
    #[serde(default = "default_runtime")]
    pub runtime: RuntimeKind,
    /// External Postgres (`postgres://...` or key=value); none = managed cluster.
    #[serde(default)]
    pub database_url: Option<String>,
    /// Directory with `initdb`, `pg_ctl` (managed cluster); default: newest
    /// `/usr/lib/postgresql/*/bin`.
    #[serde(default)]
    pub postgres_bin_dir: Option<PathBuf>,
    /// Also serve the agent RPC on TCP at this address (loopback unless
    /// `http_allow_non_loopback`).
    #[serde(default)]
    pub http_listen: Option<String>,
    /// Allow `http_listen` on a non-loopback address.
    #[serde(default)]
    pub http_allow_non_loopback: bool,
    /// Serve Prometheus metrics (`GET /metrics`) at this address (loopback
    /// unless `metrics_allow_non_loopback`).
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Allow `metrics_listen` on a non-loopback address.
    #[serde(default)]
    pub metrics_allow_non_loopback: bool,
    /// The `choir-agent` binary for the process runtime; default: next to choird,
    /// then `PATH`.
    #[serde(default)]
    pub agent_binary: Option<PathBuf>,
    /// The docker runtime's settings.
    #[serde(default)]
    pub docker: DockerConfig,
    /// LLM endpoints.
    pub llm: LlmConfig,
    /// Agents by id.
    #[serde(default)]
    pub agents: BTreeMap<AgentId, AgentConfig>,
    /// The Telegram gateway (no bots: off).
    #[serde(default)]
    pub telegram: TelegramConfig,
    /// Agent memory (none: memory tools are not served).
    #[serde(default)]
    pub memory: Option<MemoryConfig>,
    /// The web tools' services (search, browser).
    #[serde(default)]
    pub web: WebConfig,
    /// Log rotation and retention.
    #[serde(default)]
    pub logs: LogsConfig,
    /// What follows an approval.
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    /// Tokens all agents together may spend (per UTC day, in total), next
    /// to each agent's own `token_budget`.
    #[serde(default)]
    pub token_budget: TokenBudget,
}

/// What follows an approval (R-CTL-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// An approved tool or skill is rolled out to its running agent at
    /// once: the image rebuilt (docker) and the agent restarted on it when
    /// it is between messages; its new session resumes from the recovery
    /// snapshot. Off: `choirctl agent update` does it.
    #[serde(default = "default_true")]
    pub auto_update: bool,
    /// How long a rollout waits for the agent to finish its current work
    /// before it restarts the agent anyway, in seconds.
    #[serde(default = "default_idle_wait")]
    pub idle_wait_s: u64,
}

fn default_idle_wait() -> u64 {
    300
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig { auto_update: true, idle_wait_s: default_idle_wait() }
    }
}

/// Log rotation and retention (R-CTL-3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsConfig {
    /// A log file is archived (and compressed) when it reaches this size.
    #[serde(default = "default_log_file_mb")]
    pub max_file_mb: f64,
    /// Live logs and archives together stay under this; the oldest archives
    /// of the stream using the most go first.
    #[serde(default = "default_log_total_mb")]
    pub max_total_mb: f64,
    /// Archives older than this are deleted.
    #[serde(default = "default_log_age_days")]
    pub max_age_days: u32,
}

fn default_log_file_mb() -> f64 {
    16.0
}
fn default_log_total_mb() -> f64 {
    512.0
}
fn default_log_age_days() -> u32 {
    14
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig {
            max_file_mb: default_log_file_mb(),
            max_total_mb: default_log_total_mb(),
            max_age_days: default_log_age_days(),
        }
    }
}

impl LogsConfig {
    /// The limits the log manager applies.
    pub fn limits(&self) -> crate::logs::Limits {
        crate::logs::Limits {
            max_file_bytes: (self.max_file_mb * 1024.0 * 1024.0) as u64,
            max_total_bytes: (self.max_total_mb * 1024.0 * 1024.0) as u64,
            max_age: std::time::Duration::from_secs(u64::from(self.max_age_days) * 24 * 3600),
        }
    }
}

fn default_runtime() -> RuntimeKind {
    RuntimeKind::Docker
}

/// A configuration problem, naming the file and field.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: {reason}")]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// Dotted path of the field (`.` for the whole document).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

impl Config {
    /// Reads, parses and validates `config.json`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            field: ".".into(),
            reason: e.to_string(),
        })?;
        Config::parse(&text).map_err(|(field, reason)| ConfigError { file, field, reason })
    }

    /// Parses and validates a document; the error is (field, reason).
    pub fn parse(text: &str) -> Result<Config, (String, String)> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            (field, e.into_inner().to_string())
        })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let e = |field: &str, reason: &str| Err((field.to_owned(), reason.to_owned()));
        for (lane, ep) in [("edge", &self.llm.edge), ("core", &self.llm.core)] {
            if !(ep.base_url.starts_with("http://") || ep.base_url.starts_with("https://")) {
                return e(&format!("llm.{lane}.base_url"), "must start with http:// or https://");
            }
            if ep.model.trim().is_empty() {
                return e(&format!("llm.{lane}.model"), "must not be empty");
            }
            if ep.timeout_s == 0 {
                return e(&format!("llm.{lane}.timeout_s"), "must be at least 1");
            }
        }
        if let Some(listen) = &self.http_listen {
            match listen.parse::<SocketAddr>() {
                Err(_) => return e("http_listen", "must be an address like 127.0.0.1:9400"),
                Ok(addr) if !addr.ip().is_loopback() && !self.http_allow_non_loopback => {
                    return e(
                        "http_listen",
                        "is not a loopback address; set http_allow_non_loopback to true if you really mean it",
                    )
                }
                Ok(_) => {}
            }
        }
        if let Some(listen) = &self.metrics_listen {
            match listen.parse::<SocketAddr>() {
                Err(_) => return e("metrics_listen", "must be an address like 127.0.0.1:9464"),
                Ok(addr) if !addr.ip().is_loopback() && !self.metrics_allow_non_loopback => {
                    return e(
                        "metrics_listen",
                        "is not a loopback address; set metrics_allow_non_loopback to true if you really mean it",
                    )
                }
                Ok(_) => {}
            }
        }
        for (model, p) in &self.llm.prices {
            let ok = |v: f64| v.is_finite() && (0.0..=10_000.0).contains(&v);
            if !ok(p.prompt_per_mtok) || !ok(p.completion_per_mtok) {
                return e(&format!("llm.prices.{model}"), "prices must be dollars per million tokens, 0 to 10000");
            }
        }
        let logs = &self.logs;
        if !logs.max_file_mb.is_finite() || logs.max_file_mb < 0.01 {
            return e("logs.max_file_mb", "must be at least 0.01 (10 KB)");
        }
        if !logs.max_total_mb.is_finite() || logs.max_total_mb < 4.0 * logs.max_file_mb {
            return e("logs.max_total_mb", "must be at least four times logs.max_file_mb");
        }
        if logs.max_age_days == 0 {
            return e("logs.max_age_days", "must be at least 1");
        }
        for (id, agent) in &self.agents {
            if let Err(why) = agent.tools.check() {
                return Err((format!("agents.{id}.tools"), why));
            }
            if agent.transport == Transport::Http {
                if self.http_listen.is_none() {
                    return e(&format!("agents.{id}.transport"), "is http, but http_listen is not set");
                }
                if self.runtime == RuntimeKind::Docker {
                    return e(
                        &format!("agents.{id}.transport"),
                        "is http, but a container reaches choird only through its own socket; use unix",
                    );
                }
            }
        }
        if self.agents.keys().any(|a| a.as_str() == crate::logs::CHOIRD) {
            return e("agents.choird", "is reserved: it is the name of choird's own log");
        }
        let prefix = &self.docker.image_prefix;
        if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
            return e("docker.image_prefix", "must be lowercase letters, digits and '-'");
        }
        if self.docker.tmp_mb < 8 {
            return e("docker.tmp_mb", "must be at least 8");
        }
        if self.database_url.as_deref().is_some_and(|u| u.trim().is_empty()) {
            return e("database_url", "must not be empty (remove it to use the managed cluster)");
        }
        for (id, agent) in &self.agents {
            let at = |f: &str| format!("agents.{id}.{f}");
            if let Some(ws) = &agent.workspace {
                if !ws.is_absolute() {
                    return e(&at("workspace"), "must be an absolute path");
                }
            }
            if agent.max_steps_per_turn == 0 || agent.max_steps_per_turn > 256 {
                return e(&at("max_steps_per_turn"), "must be between 1 and 256");
            }
            if agent.retry_budget > 16 {
                return e(&at("retry_budget"), "must be at most 16");
            }
            if agent.context_tokens < 1000 {
                return e(&at("context_tokens"), "must be at least 1000");
            }
            if agent.max_core_jobs > 64 {
                return e(&at("max_core_jobs"), "must be at most 64");
            }
            let b = &agent.core_budget;
            if b.steps == 0 || b.tokens == 0 || b.wall_s == 0 {
                return e(&at("core_budget"), "steps, tokens and wall_s must all be above 0");
            }
            let r = &agent.resources;
            if r.memory_mb < 64 {
                return e(&at("resources.memory_mb"), "must be at least 64");
            }
            if !(r.cpus > 0.0 && r.cpus <= 1024.0) {
                return e(&at("resources.cpus"), "must be greater than 0");
            }
            if r.pids < 16 {
                return e(&at("resources.pids"), "must be at least 16");
            }
            for (i, s) in agent.secrets.iter().enumerate() {
                if s.is_empty() {
                    return e(&at(&format!("secrets[{i}]")), "must not be empty");
                }
            }
            if let Some(w) = &agent.web {
                web::validate_agent(&at("web"), w, &agent.secrets)?;
            }
            if let Some(v) = &agent.voice {
                speech::validate_voice(&at("voice"), v)?;
            }
            accounts::validate(&format!("agents.{id}"), agent.notion.as_ref(), agent.email.as_ref(), &agent.secrets)?;
        }
        web::validate(&self.web)?;
        if let Some(m) = &self.memory {
            let em = &m.embeddings;
            if !(em.base_url.starts_with("http://") || em.base_url.starts_with("https://")) {
                return e("memory.embeddings.base_url", "must start with http:// or https://");
            }
            if em.model.trim().is_empty() {
                return e("memory.embeddings.model", "must not be empty");
            }
            if em.dimensions == 0 || em.dimensions > 2000 {
                return e("memory.embeddings.dimensions", "must be between 1 and 2000 (pgvector's HNSW limit)");
            }
            if m.batch_size == 0 || m.batch_size > 2048 {
                return e("memory.batch_size", "must be between 1 and 2048");
            }
            if m.ef_search == 0 || m.ef_search > 1000 {
                return e("memory.ef_search", "must be between 1 and 1000");
            }
            if m.probes == 0 || m.probes > 1000 {
                return e("memory.probes", "must be between 1 and 1000");
            }
            if m.fresh_max > 100_000 {
                return e("memory.fresh_max", "must be at most 100000 (each query scans that many vectors exactly)");
            }
        }
        self.validate_telegram()
    }

    fn validate_telegram(&self) -> Result<(), (String, String)> {
        let e = |field: &str, reason: &str| Err((field.to_owned(), reason.to_owned()));
        let t = &self.telegram;
        if let Some(tr) = &t.transcription {
            speech::validate_transcription(tr)?;
        }
        if !(t.api_base.starts_with("http://") || t.api_base.starts_with("https://")) {
            return e("telegram.api_base", "must start with http:// or https://");
        }
        if t.poll_timeout_s == 0 || t.poll_timeout_s > 50 {
            return e("telegram.poll_timeout_s", "must be between 1 and 50");
        }
        if t.per_bot_per_s == 0 {
            return e("telegram.per_bot_per_s", "must be at least 1");
        }
        if t.max_file_mb == 0 || t.max_file_mb > 2000 {
            return e("telegram.max_file_mb", "must be between 1 and 2000");
        }
        for (name, bot) in &t.bots {
            let at = |f: &str| format!("telegram.bots.{name}.{f}");
            if AgentId::parse(name).is_err() {
                return e(
                    &format!("telegram.bots.{name}"),
                    "bot names use 1-32 characters: a lowercase letter, then lowercase letters, digits or '_'",
                );
            }
            if bot.token_secret.is_empty() {
                return e(&at("token_secret"), "must name a secret in secrets.json");
            }
            for (user, u) in &bot.users {
                if user.parse::<i64>().map_or(true, |id| id <= 0) {
                    return e(&at(&format!("users.{user}")), "must be a Telegram user id (a positive number)");
                }
                if !self.agents.contains_key(&u.agent) {
                    return e(&at(&format!("users.{user}.agent")), &format!("no agent {} in agents", u.agent));
                }
            }
            if let Some(agent) = &bot.pairing {
                if !self.agents.contains_key(agent) {
                    return e(&at("pairing"), &format!("no agent {agent} in agents"));
                }
            }
            for (group, g) in &bot.groups {
                if group.parse::<i64>().map_or(true, |id| id >= 0) {
                    return e(&at(&format!("groups.{group}")), "must be a Telegram group chat id (a negative number)");
                }
                if !self.agents.contains_key(&g.agent) {
                    return e(&at(&format!("groups.{group}.agent")), &format!("no agent {} in agents", g.agent));
                }
            }
        }
        Ok(())
    }

    /// Cross-checks against `secrets.json`: names referenced but missing are
    /// reported as warnings (a secret can be added later; the tool or lane that
    /// needs it reports the gap when used).
    pub fn missing_secrets(&self, secrets: &Secrets) -> Vec<String> {
        let mut out = Vec::new();
        for (lane, ep) in [("edge", &self.llm.edge), ("core", &self.llm.core)] {
            if let Some(name) = &ep.api_key_secret {
                if !secrets.contains(name) {
                    out.push(format!("llm.{lane}.api_key_secret: secret {name:?} is not in secrets.json"));
                }
            }
        }
        for (id, agent) in &self.agents {
            for (i, name) in agent.secrets.iter().enumerate() {
                if !secrets.contains(name) {
                    out.push(format!("agents.{id}.secrets[{i}]: secret {name:?} is not in secrets.json"));
                }
            }
        }
        if let Some(name) = self.memory.as_ref().and_then(|m| m.embeddings.api_key_secret.as_ref()) {
            if !secrets.contains(name) {
                out.push(format!("memory.embeddings.api_key_secret: secret {name:?} is not in secrets.json"));
            }
        }
        for (name, bot) in &self.telegram.bots {
            if !secrets.contains(&bot.token_secret) {
                out.push(format!(
                    "telegram.bots.{name}.token_secret: secret {:?} is not in secrets.json; the bot stays off",
                    bot.token_secret
                ));
            }
        }
        out
    }

    /// Whether `agent` may send to `chat` through Telegram bot `bot`: the
    /// chat is a private chat of a user bound to this agent on that bot, or
    /// a group the bot routes to this agent.
    pub fn serves_chat(&self, bot: &str, chat: i64, agent: &AgentId) -> bool {
        let Some(b) = self.telegram.bots.get(bot) else { return false };
        let key = chat.to_string();
        b.users.get(&key).is_some_and(|u| &u.agent == agent) || b.groups.get(&key).is_some_and(|g| &g.agent == agent)
    }

    /// The workspace directory of an agent.
    pub fn workspace(&self, home: &Home, id: &AgentId) -> PathBuf {
        self.agents.get(id).and_then(|a| a.workspace.clone()).unwrap_or_else(|| home.default_workspace(id))
    }

    /// The model for an agent's lane, with overrides applied.
    pub fn model(&self, id: &AgentId, lane: Lane) -> String {
        let over = self.agents.get(id).map(|a| &a.models);
        match lane {
            Lane::Edge => over.and_then(|o| o.edge.clone()).unwrap_or_else(|| self.llm.edge.model.clone()),
            Lane::Core => over.and_then(|o| o.core.clone()).unwrap_or_else(|| self.llm.core.model.clone()),
        }
    }

    /// The endpoint of a lane.
    pub fn endpoint(&self, lane: Lane) -> &LlmEndpoint {
        match lane {
            Lane::Edge => &self.llm.edge,
            Lane::Core => &self.llm.core,
        }
    }
}

pub use choir_common::lane::Lane;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_starter_config_is_valid() {
        let c = Config::parse(crate::home::STARTER_CONFIG).unwrap();
        assert_eq!(c.runtime, RuntimeKind::Docker);
        assert!(c.agents.is_empty());
    }

    fn field_of(text: &str) -> String {
        Config::parse(text).unwrap_err().0
    }

    #[test]
    fn fresh_max_and_probes_are_bounded_and_default_to_the_measured_values() {
        let llm = r#""llm": {"edge": {"base_url": "http://x/v1", "model": "m"}, "core": {"base_url": "http://x/v1", "model": "m"}}"#;
        let memory = |extra: &str| {
            format!(
                r#"{{{llm}, "memory": {{"embeddings": {{"base_url": "http://e/v1", "model": "m", "dimensions": 3}}{extra}}}}}"#
            )
        };
        let c = Config::parse(&memory("")).unwrap();
        assert_eq!(c.memory.map(|m| m.fresh_max), Some(DEFAULT_FRESH_MAX));
        let (field, why) = Config::parse(&memory(r#", "fresh_max": 100001"#)).unwrap_err();
        assert_eq!(field, "memory.fresh_max");
        assert!(why.contains("at most 100000"), "{why}");
        assert_eq!(field_of(&memory(r#", "fresh_max": -1"#)), "memory.fresh_max");
        assert_eq!(Config::parse(&memory(r#", "fresh_max": 0"#)).unwrap().memory.map(|m| m.fresh_max), Some(0));
        let defaults = Config::parse(&memory("")).unwrap().memory.map(|m| (m.ef_search, m.probes));
        let breadth = crate::store::memory::Breadth::DEFAULT;
        assert_eq!(defaults, Some((breadth.ef_search, breadth.probes)), "Breadth::DEFAULT is the config's");
        for bad in ["0", "1001", "-1"] {
            assert_eq!(field_of(&memory(&format!(r#", "probes": {bad}"#))), "memory.probes", "{bad}");
        }
        for good in [1, 1000] {
            let c = Config::parse(&memory(&format!(r#", "probes": {good}"#))).unwrap();
            assert_eq!(c.memory.map(|m| m.probes), Some(good));
        }
    }

    #[test]
    fn errors_name_the_field() {
        let llm = r#""llm": {"edge": {"base_url": "http://x/v1", "model": "m"}, "core": {"base_url": "http://x/v1", "model": "m"}}"#;
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "agents": {{"demo": {{"max_steps_per_turn": "many"}}}}}}"#)),
            "agents.demo.max_steps_per_turn"
        );
        assert_eq!(field_of(&format!(r#"{{{llm}, "runtime": "vm"}}"#)), "runtime");
        assert_eq!(field_of(&format!(r#"{{{llm}, "bogus": 1}}"#)), "bogus");
        assert_eq!(field_of(&format!(r#"{{{llm}, "http_listen": "0.0.0.0:9400"}}"#)), "http_listen");
        assert_eq!(field_of(&format!(r#"{{{llm}, "agents": {{"Bad Id": {{}}}}}}"#)), "agents.Bad Id");
        assert_eq!(field_of(&format!(r#"{{{llm}, "agents": {{"a": {{"workspace": "rel"}}}}}}"#)), "agents.a.workspace");
        assert_eq!(
            field_of(
                r#"{"llm": {"edge": {"base_url": "ftp://x", "model": "m"}, "core": {"base_url": "http://x", "model": "m"}}}"#
            ),
            "llm.edge.base_url"
        );
        assert_eq!(field_of(r#"{"llm": {"edge": {"base_url": "http://x", "model": 5}}}"#), "llm.edge.model");
        assert_eq!(field_of(&format!(r#"{{{llm}, "logs": {{"max_file_mb": 0}}}}"#)), "logs.max_file_mb");
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "logs": {{"max_file_mb": 10, "max_total_mb": 20}}}}"#)),
            "logs.max_total_mb"
        );
        assert_eq!(field_of(&format!(r#"{{{llm}, "agents": {{"choird": {{}}}}}}"#)), "agents.choird");
        let priced = r#""llm": {"edge": {"base_url": "http://x/v1", "model": "m"}, "core": {"base_url": "http://x/v1", "model": "m"},
                        "prices": {"m": {"prompt_per_mtok": -1, "completion_per_mtok": 1}}}"#;
        assert_eq!(field_of(&format!("{{{priced}}}")), "llm.prices.m");
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "runtime": "process", "agents": {{"a": {{"transport": "http"}}}}}}"#)),
            "agents.a.transport"
        );
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "agents": {{"a": {{"tools": {{"deny": ["*"]}}}}}}}}"#)),
            "agents.a.tools"
        );
    }

    #[test]
    fn unknown_field_message_lists_it() {
        let err = Config::parse(r#"{"llm": {"edge": {"base_url": "http://x", "model": "m", "key": 1}, "core": {"base_url": "http://x", "model": "m"}}}"#).unwrap_err();
        assert_eq!(err.0, "llm.edge.key");
        assert!(err.1.contains("unknown field `key`"), "{}", err.1);
    }

    #[test]
    fn missing_secrets_are_listed() {
        let c = Config::parse(crate::home::STARTER_CONFIG).unwrap();
        assert_eq!(c.missing_secrets(&Secrets::from_pairs(&[("openai_api_key", "k")])), Vec::<String>::new());
        assert_eq!(c.missing_secrets(&Secrets::default()).len(), 2);
    }
}
