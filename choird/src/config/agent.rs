//! `agents.<id>`: one agent's configuration: its tools, models, resources,
//! budgets, quotas, network and transport, and the host services it uses.

use super::*;

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
    /// Size of the agent's workspace, a file system of its own, in MiB (0:
    /// no quota, the workspace is a plain directory on choird's disk). The
    /// image is sparse: the host's disk holds what the agent wrote.
    #[serde(default = "default_workspace_mb")]
    pub workspace_mb: u64,
    /// Inodes (files, directories, links) of that file system (mkfs rounds it to whole inode tables, a
    /// little either way); fixed when the image is made (growing the image adds inodes in
    /// proportion).
    #[serde(default = "default_workspace_inodes")]
    pub workspace_inodes: u64,
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
fn default_workspace_mb() -> u64 {
    4096
}
fn default_workspace_inodes() -> u64 {
    262_144
}

impl Quotas {
    /// The workspace quota is one mkfs can make: at least 16 MiB (the
    /// agent's own commit log lives there too), at most 16 TiB, and at most
    /// one inode per 4 KiB (ext4's inode tables take 256 bytes each).
    pub fn check_workspace(&self) -> Result<(), (&'static str, String)> {
        if self.workspace_mb == 0 {
            return Ok(());
        }
        if !(16..=16 * 1024 * 1024).contains(&self.workspace_mb) {
            return Err(("workspace_mb", "must be 0 (no quota) or 16 to 16777216 (16 TiB)".into()));
        }
        let most = self.workspace_mb * 256;
        if !(64..=most).contains(&self.workspace_inodes) {
            return Err((
                "workspace_inodes",
                format!("must be 64 to {most} (one per 4 KiB of quotas.workspace_mb = {})", self.workspace_mb),
            ));
        }
        Ok(())
    }
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
            workspace_mb: default_workspace_mb(),
            workspace_inodes: default_workspace_inodes(),
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
