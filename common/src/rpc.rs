//! The agent ↔ choird RPC (R-RPC-1..5): eight verbs, each a `POST
//! /rpc/v1/<verb>` with a JSON body and `Authorization: Bearer <lease token>`,
//! on a Unix socket or loopback TCP. The agent always initiates; what choird has
//! for the agent (user messages, stop requests, config changes) comes back in
//! replies, mostly to a long-polling HEARTBEAT.
//!
//! Beside the verbs, the LLM relay is an OpenAI-compatible base URL per lane:
//! `POST /llm/<lane>/v1/chat/completions`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::commit::{ChainHead, CommitEvent};

/// Header carrying the lease token.
pub const AUTH_HEADER: &str = "Authorization";

/// The eight verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Identity handshake → bindings and recovery snapshot.
    InitHello,
    /// Values of secrets bound to this agent.
    GetSecrets,
    /// Replicate commit events and replies; long-poll for messages.
    Heartbeat,
    /// Submit a proposal for a human to decide.
    RequestApproval,
    /// Lane states, skill progress, budgets.
    ReportStatus,
    /// The agent is exiting on its own.
    TerminateSelf,
    /// Hot-reloadable configuration.
    FetchDynamicConfig,
    /// Run a host-side tool (memory, web, ...).
    ExecuteHostTool,
}

impl Verb {
    /// Every verb, in protocol order.
    pub const ALL: [Verb; 8] = [
        Verb::InitHello,
        Verb::GetSecrets,
        Verb::Heartbeat,
        Verb::RequestApproval,
        Verb::ReportStatus,
        Verb::TerminateSelf,
        Verb::FetchDynamicConfig,
        Verb::ExecuteHostTool,
    ];

    /// The protocol name, e.g. `INIT_HELLO`.
    pub fn name(self) -> &'static str {
        match self {
            Verb::InitHello => "INIT_HELLO",
            Verb::GetSecrets => "GET_SECRETS",
            Verb::Heartbeat => "HEARTBEAT",
            Verb::RequestApproval => "REQUEST_APPROVAL",
            Verb::ReportStatus => "REPORT_STATUS",
            Verb::TerminateSelf => "TERMINATE_SELF",
            Verb::FetchDynamicConfig => "FETCH_DYNAMIC_CONFIG",
            Verb::ExecuteHostTool => "EXECUTE_HOST_TOOL",
        }
    }

    /// The HTTP path, e.g. `/rpc/v1/INIT_HELLO`.
    pub fn path(self) -> String {
        format!("/rpc/v1/{}", self.name())
    }

    /// Parses the verb from a request path.
    pub fn from_path(path: &str) -> Option<Verb> {
        let name = path.strip_prefix("/rpc/v1/")?;
        Verb::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// Error body of every non-2xx reply (RPC and admin API alike).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorInfo,
}

/// A structured error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// Stable machine-readable code (`unauthorized`, `rate_limited`, ...).
    pub code: String,
    /// Human-readable explanation, meant to be shown as is.
    pub message: String,
    /// Whether the same request may succeed if retried later.
    pub retryable: bool,
    /// For `event_refused`: the sequence number of the replicated event
    /// choird cannot store (the agent stores a placeholder instead, see
    /// `CommitEvent::quarantined`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_seq: Option<u64>,
}

/// INIT_HELLO request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitHelloRequest {
    /// The id the agent believes it has; must match the lease.
    pub agent_id: String,
    /// [`crate::PROTOCOL_VERSION`] of the agent.
    pub protocol_version: u32,
    /// The agent binary's version.
    pub agent_version: String,
    /// Head of the agent's local commit log.
    pub local_head: ChainHead,
}

/// Which model serves each lane (the relay enforces it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneModels {
    /// Model of the edge lane.
    pub edge: String,
    /// Model of core jobs.
    pub core: String,
}

/// Resources bound to this agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bindings {
    /// Names of secrets the agent may fetch with GET_SECRETS.
    pub secrets: Vec<String>,
    /// Models per lane.
    pub models: LaneModels,
    /// Host tools (run by choird through EXECUTE_HOST_TOOL) served to this
    /// agent; the others are registered but not offered.
    #[serde(default)]
    pub host_tools: Vec<String>,
    /// The manifests of the served host tools that have one (the host
    /// halves of an agent's built-ins have none), so an agent can offer a
    /// host tool it was not built knowing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_tool_manifests: Vec<HostToolBinding>,
}

/// A served host tool's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostToolBinding {
    /// Its manifest (LLM view and runtime view).
    pub manifest: crate::manifest::ToolManifest,
}

/// What a (re)started agent needs to resume: choird's replicated position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverySnapshot {
    /// Highest commit event choird holds for this agent.
    pub replicated_head: ChainHead,
    /// The position below the agent's first unanswered message (at most the
    /// highest it answered): messages above it that are not answered are
    /// handed out again, and the agent resumes the turns its commit log
    /// holds above it. Answered messages above it are never handed out again.
    pub processed_upto: u64,
    /// The latest answered exchanges of each conversation, oldest first, so a
    /// restarted agent keeps talking where it left off.
    #[serde(default)]
    pub conversations: Vec<ConversationTail>,
}

/// The end of one conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationTail {
    /// Conversation key.
    pub conversation: String,
    /// The latest compaction summary of what came before `turns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Exchanges, oldest first.
    pub turns: Vec<Exchange>,
}

/// One user message and the agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    /// What the user said.
    pub user: String,
    /// What the agent answered.
    pub assistant: String,
    /// The user message's id (so a compaction after a recall or a restart
    /// records how far it folded; 0 from a choird that did not send it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub id: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// INIT_HELLO response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InitHelloResponse {
    /// Session id (one per lease).
    pub session_id: i64,
    /// The agent's id.
    pub agent_id: String,
    /// Resource bindings.
    pub bindings: Bindings,
    /// Recovery snapshot.
    pub recovery: RecoverySnapshot,
    /// Current hot-reloadable config.
    pub config: DynamicConfig,
    /// The lease expires if no HEARTBEAT arrives for this long.
    pub lease_ttl_ms: u64,
}

/// GET_SECRETS request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetSecretsRequest {
    /// Names to fetch; each must be bound to the agent.
    pub names: Vec<String>,
}

/// GET_SECRETS response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetSecretsResponse {
    /// Name → value.
    pub secrets: BTreeMap<String, String>,
}

/// A user message for the edge lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundMessage {
    /// Per-agent, strictly increasing message id.
    pub id: u64,
    /// Conversation key (one history per conversation, e.g. `cli`, `tg:<bot>:<user>`).
    pub conversation: String,
    /// Who sent it (for the model and the audit trail).
    pub sender: String,
    /// The text.
    pub text: String,
    /// Whether the conversation had messages before this one (answered or
    /// not: the one before may still be on its way when this is handed out): an agent that
    /// no longer holds the conversation in memory recalls its tail
    /// ([`HeartbeatRequest::recall`]) before answering; one that never had it
    /// starts fresh without a round trip.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier: bool,
}

/// How many conversations an agent holds in memory at most (the least
/// recently used is dropped and recalled from choird when it speaks again):
/// enough that a household's or a team's conversations, alternating, are
/// answered from memory rather than recalled each turn. Their size is
/// bounded too ([`HELD_TOKENS`]).
pub const HELD_CONVERSATIONS: usize = 256;

/// The most history, in estimated tokens (4 characters each), the held
/// conversations keep together (about 2 MiB of text): past it, the least
/// recently used are dropped as past [`HELD_CONVERSATIONS`].
pub const HELD_TOKENS: u64 = 512 * 1024;

/// How many of its most recent conversations a restarted agent gets back
/// in its recovery snapshot (the others are recalled when they speak).
pub const RECOVERED_CONVERSATIONS: usize = 32;

/// The longest conversation key: an admin client's longer key is refused
/// when the message is sent, a longer recall refused too (the keys choird
/// makes are far shorter: `cli`, `tg:<bot>:<chat>`).
pub const MAX_CONVERSATION_KEY: usize = 256;

/// Inbound messages one reply answers at most (`OutboundReply::covers`):
/// the agent's edge answers messages beyond it in a turn of their own, and
/// choird refuses a HEARTBEAT with a reply that covers more (each covered
/// message is a row choird updates).
pub const MAX_COVERS: usize = 256;

/// Something the edge lane says: the answer to inbound messages, or (with
/// `in_reply_to` 0) a message of its own, e.g. a core job's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundReply {
    /// The (last) inbound message this answers; 0 for a message of its own.
    pub in_reply_to: u64,
    /// Every inbound message this text answers (messages injected into one
    /// turn share its answer); empty means just `in_reply_to`. At most
    /// [`MAX_COVERS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<u64>,
    /// For a message of its own: a key unique per agent, so a resend is
    /// stored once.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Conversation key.
    pub conversation: String,
    /// The answer.
    pub text: String,
    /// The turn failed (its model could not be reached, kept proposing
    /// invalid calls, or ran out of steps): `text` tells the user so, and a
    /// client waiting for the answer (`choirctl chat`) reports a failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
}

impl OutboundReply {
    /// The inbound messages this text answers: `covers`, else
    /// `in_reply_to` alone; none for a message of its own.
    pub fn answers(&self) -> &[u64] {
        match (self.in_reply_to, self.covers.is_empty()) {
            (0, _) => &[],
            (_, true) => std::slice::from_ref(&self.in_reply_to),
            (_, false) => &self.covers,
        }
    }
}

/// An answer still being written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialReply {
    /// The inbound message being answered.
    pub in_reply_to: u64,
    /// The text so far (of the current model step).
    pub text: String,
}

/// HEARTBEAT request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// Committed events not yet acknowledged, in order.
    #[serde(default)]
    pub events: Vec<CommitEvent>,
    /// Finished answers.
    #[serde(default)]
    pub replies: Vec<OutboundReply>,
    /// Answers still being written (the text so far of the current model step).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partials: Vec<PartialReply>,
    /// Highest inbound message id fully processed (answered), sent with the
    /// replies that answer it; 0 reports no position (a long-poll, a
    /// recall, a HEARTBEAT of events alone), and choird stores nothing for it.
    pub processed_upto: u64,
    /// Config version the agent runs with.
    pub config_version: u64,
    /// How long choird may hold the request waiting for messages (capped).
    #[serde(default)]
    pub wait_ms: u64,
    /// Whether this HEARTBEAT takes delivery of messages. An agent that sends
    /// HEARTBEATs from several threads lets only its poller receive, so a
    /// message is never handed to a thread that does not forward it.
    #[serde(default = "yes")]
    pub receive: bool,
    /// With `receive`: the highest message id the agent has taken delivery
    /// of. Below what choird handed out, an answer to an earlier poll was
    /// lost on the way, and choird hands those messages out again (the agent
    /// drops any it already has). `None`: not said (choird goes by what it
    /// handed out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_upto: Option<u64>,
    /// What the agent says of scheduled firings: asks to start them, or
    /// reports their outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub firings: Vec<FiringReport>,
    /// A conversation the agent no longer holds in memory and must answer
    /// in: choird returns its tail (latest compaction summary, then the last
    /// answered exchanges) in [`HeartbeatResponse::recalled`]. Only the
    /// agent's own conversations; a key longer than
    /// [`MAX_CONVERSATION_KEY`] is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<String>,
    /// The agent's session state and lanes, in answer to
    /// [`HeartbeatResponse::report_status`] (the poll after the one that
    /// asked carries it). Lanes change many times a turn and nobody reads
    /// them but someone asking, so they are sent when asked, not when they
    /// change. At most [`MAX_STATUS_BYTES`] serialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ReportStatusRequest>,
}

fn yes() -> bool {
    true
}

/// HEARTBEAT response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Highest commit sequence choird has durably stored.
    pub acked_seq: u64,
    /// New user messages, in id order.
    pub messages: Vec<InboundMessage>,
    /// Current config version (fetch if it differs).
    pub config_version: u64,
    /// Whether choird asks the agent to stop.
    pub stop: bool,
    /// Human decisions on this agent's proposals, each handed out once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<ApprovalDecision>,
    /// Lanes the operator (or a user) asked to cancel: `edge` (its current
    /// turn or skill) or `core:<job>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancel: Vec<String>,
    /// Scheduled firings to run as core jobs, each only once choird has
    /// accepted its start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub firings: Vec<FiringOffer>,
    /// Firings whose start (a `starting` report) choird accepted: the agent
    /// starts these and no others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted: Vec<i64>,
    /// The tail of the conversation the request asked to recall (empty
    /// `turns` and no summary: nothing answered there yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recalled: Option<ConversationTail>,
    /// Someone (an operator's `agent status`, the console, a rollout
    /// waiting for idle lanes) asks what the agent's lanes are doing: the
    /// agent's next HEARTBEAT carries [`HeartbeatRequest::status`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub report_status: bool,
}

/// A firing handed to the agent (in a HEARTBEAT reply): run it as core job
/// `job` — but only after choird accepted its start (a `starting` report
/// answered with the id in `accepted`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiringOffer {
    /// The firing's id (unique per choird).
    pub id: i64,
    /// The core job's name (the job's name).
    pub job: String,
    /// Its objective.
    pub prompt: String,
    /// A skill to run, with its input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// See `skill`.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub input: serde_json::Value,
    /// The job's allowlist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// The budget, complete.
    pub budget: CoreBudget,
}

/// What an agent says of a firing (in a HEARTBEAT request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiringReport {
    /// The firing.
    pub id: i64,
    /// `starting` (asks choird to accept the start; the job starts only if
    /// the reply lists the id in `accepted`), `refused` (could not start:
    /// `detail` says why), `done` or `failed` (with the job's report).
    pub state: String,
    /// The report's text, or why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// State of one lane, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneStatus {
    /// `edge` or the core job's name.
    pub lane: String,
    /// Lane state (IDLE, REASONING, ...).
    pub state: String,
    /// Model steps taken in the current turn.
    pub steps: u64,
    /// Tokens used so far by this lane.
    pub tokens: u64,
    /// Step budget, if the lane has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Token budget, if the lane has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Time since the lane (or core job) started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
    /// A core job's objective, or what the lane is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The skill the lane runs, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<SkillProgress>,
}

/// Where a running skill is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillProgress {
    /// The skill.
    pub name: String,
    /// Its current state.
    pub state: String,
    /// Model steps taken by this run.
    pub steps: u64,
    /// The skill's `max_steps`.
    pub max_steps: u64,
}

/// What a proposal asks a human to approve (R-TOOL-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalKind {
    /// A new or changed external tool: `{"manifest": {...}, "executable": "..."}`.
    Tool,
    /// A new or changed skill: `{"skill": {...}}`.
    Skill,
    /// A change of this agent's settings: `{"changes": {"key": value, ...}}`.
    ConfigChange,
    /// A human's confirmation of one exact tool call before it runs:
    /// `{"tool": "...", "input": {...}, "call_id": "...", "timeout_s": N}`.
    Call,
    /// A scheduled job for this agent: `{"job": JobSpec}`.
    Schedule,
    /// An MCP server's tools to pin: what an agent found it lists
    /// (`{"server": NAME, "catalog": [entry, ...]}`), or a new server from
    /// the operator (`{"spec": ServerSpec}`).
    Mcp,
}

impl ProposalKind {
    /// The protocol spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalKind::Tool => "tool",
            ProposalKind::Skill => "skill",
            ProposalKind::ConfigChange => "config_change",
            ProposalKind::Call => "call",
            ProposalKind::Schedule => "schedule",
            ProposalKind::Mcp => "mcp",
        }
    }
}

/// Where an approved tool or skill goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalScope {
    /// This agent's repository (`repos/agents/<id>/`).
    #[default]
    Agent,
    /// The global repository (`repos/global/`), shared by every agent.
    Global,
}

impl ProposalScope {
    /// The protocol spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalScope::Agent => "agent",
            ProposalScope::Global => "global",
        }
    }
}

/// REQUEST_APPROVAL request: a proposal, as the agent's meta-tool received it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// What is proposed.
    pub kind: ProposalKind,
    /// Where it would go (tools and skills).
    #[serde(default)]
    pub scope: ProposalScope,
    /// The proposal itself; its sha256 (of canonical JSON) binds the approval.
    pub content: serde_json::Value,
    /// Why, in the model's words (shown to the human).
    pub reason: String,
    /// The proposing lane.
    pub lane: String,
    /// The skill and state it was proposed from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// See `skill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The user conversation the work belongs to (where a decision is told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
}

/// Most calls one confirmation holds (the calls of one model turn that each
/// need a human, decided together).
pub const MAX_CALLS_CONFIRMED: usize = 16;

/// The calls a confirmation (a proposal of kind `call`) names, each an
/// object `{"tool", "input", "call_id"}`: the content itself for one call,
/// or each element of its `calls` for several decided together (as they
/// are, unchecked: choird checks them when the proposal arrives).
pub fn confirmed_calls(content: &serde_json::Value) -> Vec<&serde_json::Value> {
    match content.get("calls").and_then(serde_json::Value::as_array) {
        Some(calls) => calls.iter().collect(),
        None => vec![content],
    }
}

/// REQUEST_APPROVAL response: the proposal is stored, pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalResponse {
    /// Its id (`choirctl approvals show ID`).
    pub approval_id: i64,
    /// sha256 of its canonical content, hex.
    pub sha256: String,
    /// `pending` (or the status of an identical earlier proposal).
    pub status: String,
    /// One line for the model.
    pub summary: String,
}

/// A human's decision on a proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    /// The proposal.
    pub approval_id: i64,
    /// `approved` or `rejected`.
    pub status: String,
    /// What was proposed (`tool`, `skill`, `config_change`) and its name.
    pub subject: String,
    /// Who decided (`admin`, or `telegram:<user id>`).
    pub decided_by: String,
    /// The rejection reason, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The conversation the proposal came from, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// sha256 of the content decided (a confirmed call runs only if it is
    /// that call's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The largest status report choird takes, serialised (REPORT_STATUS's
/// body, or [`HeartbeatRequest::status`]).
pub const MAX_STATUS_BYTES: usize = 256 * 1024;

/// How many bytes `value` takes serialised as JSON, counted without
/// building them (`usize::MAX` if it cannot be serialised).
pub fn json_len(value: &impl Serialize) -> usize {
    /// A writer that keeps nothing but the count.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// REPORT_STATUS request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportStatusRequest {
    /// Session state (STARTING, RUNNING, ...).
    pub session_state: String,
    /// Every lane.
    pub lanes: Vec<LaneStatus>,
}

/// TERMINATE_SELF request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminateSelfRequest {
    /// Why the agent is leaving.
    pub reason: String,
}

/// Empty acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ack {
    /// Always true.
    pub ok: bool,
}

/// FETCH_DYNAMIC_CONFIG request.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FetchDynamicConfigRequest {}

/// Hot-reloadable configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicConfig {
    /// Bumped on every change.
    pub version: u64,
    /// When on, the arbiter executes no tool at all.
    pub kill_switch: bool,
    /// Maximum model steps the edge lane takes for one message.
    pub max_steps_per_turn: u32,
    /// Invalid proposals (bad arguments, unknown tools, text posing as a tool
    /// call, empty answers) tolerated in a row before a turn fails.
    #[serde(default = "default_retry_budget")]
    pub retry_budget: u32,
    /// Context size (estimated tokens) at which a lane compacts its history.
    #[serde(default = "default_context_tokens")]
    pub context_tokens: u64,
    /// Core jobs that may run at once.
    #[serde(default = "default_max_core_jobs")]
    pub max_core_jobs: u32,
    /// Budget of each core job.
    #[serde(default)]
    pub core_budget: CoreBudget,
    /// `all`: every offered tool is listed to the model; `find`: Choir's own
    /// tools and `choir.tools.find` are, and other tools once found.
    #[serde(default = "default_exposure")]
    pub tool_exposure: String,
    /// Seconds replication to choird may fail before the agent refuses tool
    /// calls (fail closed) until it recovers.
    #[serde(default = "default_fail_closed_s")]
    pub fail_closed_s: u64,
    /// The argument policy (built-in default, global and agent layers
    /// merged by choird; see `arg_policy`).
    #[serde(default)]
    pub argument_policy: crate::arg_policy::PolicySet,
    /// The operator's tool policy for this agent (`agents.<id>.tools`).
    #[serde(default)]
    pub tool_policy: crate::tool_policy::ToolPolicy,
}

fn default_fail_closed_s() -> u64 {
    30
}

fn default_exposure() -> String {
    "all".to_owned()
}

/// The budget of one core job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreBudget {
    /// Model steps.
    pub steps: u64,
    /// Tokens (as reported by the provider).
    pub tokens: u64,
    /// Wall-clock seconds.
    pub wall_s: u64,
}

impl Default for CoreBudget {
    fn default() -> Self {
        CoreBudget { steps: 32, tokens: 200_000, wall_s: 1800 }
    }
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

/// EXECUTE_HOST_TOOL request: a call the agent's arbiter already validated
/// and committed to running; choird re-validates it against the same manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteHostToolRequest {
    /// Canonical tool name (one of [`crate::host_tools::HOST_TOOLS`]).
    pub tool: String,
    /// The validated input.
    pub input: serde_json::Value,
    /// The calling lane.
    pub lane: String,
    /// The model's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// EXECUTE_HOST_TOOL response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteHostToolResponse {
    /// The tool's result object (with a `summary`).
    pub result: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_len_counts_what_serialising_would_write() {
        let report = ReportStatusRequest {
            session_state: "RUNNING".into(),
            lanes: vec![LaneStatus {
                lane: "edge".into(),
                state: "REASONING".into(),
                steps: 1,
                tokens: 2,
                max_steps: None,
                max_tokens: Some(9),
                elapsed_ms: None,
                detail: Some("é \u{0} \"x\"".into()),
                skill: None,
            }],
        };
        assert_eq!(json_len(&report), serde_json::to_vec(&report).unwrap().len());
        assert_eq!(json_len(&"ab\n"), 6);
        // What cannot be serialised counts as too large for any bound.
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert_eq!(json_len(&bad), usize::MAX);
    }

    #[test]
    fn a_reply_answers_what_it_covers_or_its_message_and_a_notice_nothing() {
        let reply = |in_reply_to, covers: Vec<u64>| OutboundReply {
            in_reply_to,
            covers,
            key: String::new(),
            conversation: "c".into(),
            text: "t".into(),
            failed: false,
        };
        assert_eq!(reply(7, vec![]).answers(), &[7]);
        assert_eq!(reply(7, vec![5, 6, 7]).answers(), &[5, 6, 7]);
        assert!(reply(0, vec![]).answers().is_empty());
        assert!(reply(0, vec![5]).answers().is_empty(), "a notice answers nothing, whatever it claims to cover");
    }
}
