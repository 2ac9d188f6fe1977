//! The admin API spoken by choirctl to choird, only on choird's Unix socket
//! (mode 0600, R-RPC-4). Plain JSON over HTTP under `/admin/v1/`; errors use
//! [`crate::rpc::ErrorBody`].

use serde::{Deserialize, Serialize};

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
    /// Every configured agent.
    pub agents: Vec<AgentSummary>,
}

/// One agent, as choird sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSummary {
    /// Agent id.
    pub id: String,
    /// `process` or `docker`.
    pub runtime: String,
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
