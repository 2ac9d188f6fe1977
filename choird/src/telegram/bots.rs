//! What every thread of the gateway shares: its [`Handle`] on the rest of
//! choird (the shared services and the control plane's [`Control`]), the
//! [`Link`] of pokes and counters, the configured bots and their clients,
//! and how a Bot API failure is acted on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use choir_common::admin::{AgentSummary, ApprovalDetail, ApprovalInfo, ApproveRequest};
use choir_common::ids::AgentId;
use crossbeam_channel::{Receiver, Sender};
use frankenstein::client_ureq::Bot;
use parking_lot::Mutex;

use super::text;
use crate::config::BotConfig;
use crate::error::Error;
use crate::shared::Shared;
use crate::store::Queued;

/// What the gateway knows of one bot, for `choirctl telegram status`.
#[derive(Debug, Default, Clone)]
pub struct Counters {
    /// When the last `getUpdates` answered.
    pub last_poll: Option<SystemTime>,
    /// The last error, token masked.
    pub last_error: Option<String>,
    /// Updates received.
    pub updates: u64,
    /// Messages and files sent.
    pub sent: u64,
    /// Failed requests.
    pub errors: u64,
}

/// A rewrite of config.json's text (old → new, or why not).
pub type ConfigEdit<'a> = Box<dyn FnOnce(&str) -> Result<String, String> + 'a>;

/// What the gateway asks of the control plane. The daemon implements it
/// (see `serve.rs`); the gateway never holds the daemon itself.
pub trait Control: Send + Sync {
    /// Wakes the agent's long-poll: a message for it may have been queued.
    fn wake_agent(&self, agent: &AgentId);
    /// Wakes the agent's long-poll for a message queued as `queued` said
    /// (handed over from memory when nothing earlier is unknown).
    fn message_stored(&self, agent: &AgentId, queued: Queued, conversation: &str, sender: &str, text: &str);
    /// The agent's state (for `/status`).
    fn summary(&self, agent: &str) -> Result<AgentSummary, Error>;
    /// Cancels the agent's current work (for `/stop`).
    fn cancel_lane(&self, agent: &str, lane: &str, actor: &str) -> Result<(), Error>;
    /// Approves a proposal (an admin's button).
    fn approve(&self, id: i64, req: &ApproveRequest) -> Result<ApprovalInfo, Error>;
    /// Rejects a proposal (an admin's button).
    fn reject(&self, id: i64, reason: &str, by: Option<&str>) -> Result<ApprovalInfo, Error>;
    /// A proposal with its diff.
    fn approval(&self, id: i64) -> Result<ApprovalDetail, Error>;
    /// Rewrites config.json (a user let in by pairing) and reloads it.
    fn rewrite_config(&self, edit: ConfigEdit<'_>) -> Result<(), String>;
}

/// Everything the gateway's threads hold: the shared services, the control
/// plane's [`Control`], and the gateway's own [`Link`].
#[derive(Clone)]
pub struct Handle {
    /// Config, secrets, store, audit.
    pub shared: Arc<Shared>,
    /// What the gateway asks of the control plane.
    pub control: Arc<dyn Control>,
    /// Pokes and counters (outlives gateway restarts).
    pub link: Arc<Link>,
}

impl std::ops::Deref for Handle {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// Pokes and counters of the gateway, kept across its restarts (SIGHUP).
#[derive(Default)]
pub struct Link {
    senders: Mutex<Vec<Sender<()>>>,
    counters: Mutex<BTreeMap<String, Counters>>,
}

impl Link {
    /// The senders of the running gateway (none when it is stopped).
    pub fn set_senders(&self, senders: Vec<Sender<()>>) {
        *self.senders.lock() = senders;
    }

    /// Wakes every sender: the outbox has new rows.
    pub fn wake_senders(&self) {
        for s in self.senders.lock().iter() {
            let _ = s.try_send(());
        }
    }

    /// Changes one bot's counters.
    pub fn count(&self, bot: &str, f: impl FnOnce(&mut Counters)) {
        f(self.counters.lock().entry(bot.to_owned()).or_default());
    }

    /// The counters of every bot.
    pub fn counters(&self) -> BTreeMap<String, Counters> {
        self.counters.lock().clone()
    }
}

/// A client for one bot, with `timeout` for each request.
pub fn client(api_base: &str, token: &str, timeout: Duration) -> Bot {
    let agent = crate::resolver::agent(
        ureq::config::Config::builder().http_status_as_error(false).timeout_global(Some(timeout)),
    );
    Bot::builder().api_url(format!("{}/bot{token}", api_base.trim_end_matches('/'))).request_agent(agent).build()
}

/// Why a Bot API call failed, as the gateway acts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// 429: wait this long, then retry.
    RetryAfter(Duration),
    /// The request itself is wrong (400, 403, 404): retrying cannot help.
    Permanent(String),
    /// The network, Telegram's side (5xx) or a garbled answer: retry later.
    Transient(String),
}

/// Classifies a client error, masking `token` in its text.
pub fn classify(e: &frankenstein::Error, token: &str) -> Failure {
    match e {
        frankenstein::Error::Api(r) if r.error_code == 429 => {
            let s = r.parameters.and_then(|p| p.retry_after).unwrap_or(1);
            Failure::RetryAfter(Duration::from_secs(u64::from(s.max(1))))
        }
        frankenstein::Error::Api(r) if r.error_code >= 500 => {
            Failure::Transient(format!("{} {}", r.error_code, text::mask(&r.description, token)))
        }
        frankenstein::Error::Api(r) => {
            Failure::Permanent(format!("{} {}", r.error_code, text::mask(&r.description, token)))
        }
        other => Failure::Transient(text::mask(&other.to_string(), token)),
    }
}

/// A configured bot with its token.
#[derive(Clone)]
pub struct BotSpec {
    /// Its name in config.
    pub name: String,
    /// Its settings.
    pub config: BotConfig,
    /// Its token (from secrets.json).
    pub token: String,
    /// The Bot API's base URL.
    pub api_base: String,
}

/// The bots that can run: configured and with a token in secrets.json.
pub fn bots(d: &Handle) -> Vec<BotSpec> {
    let config = d.config();
    let secrets = d.secrets();
    config
        .telegram
        .bots
        .iter()
        .filter_map(|(name, b)| {
            let token = secrets.get(&b.token_secret)?.to_owned();
            Some(BotSpec { name: name.clone(), config: b.clone(), token, api_base: config.telegram.api_base.clone() })
        })
        .collect()
}

/// Waits for a poke or `timeout`, whichever comes first.
pub fn wait(rx: &Receiver<()>, timeout: Duration) {
    let _ = rx.recv_timeout(timeout);
}
