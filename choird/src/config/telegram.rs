//! `telegram`: the Bot API, its bots, their users and groups, and voice
//! transcription.

use super::*;

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
