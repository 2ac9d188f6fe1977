//! The Telegram gateway (R-GW-1..4): puts agents in front of their users.
//!
//! Threads, all named and joined on shutdown:
//! * `tg-poll-<bot>` — one per bot: long-polls `getUpdates`, stores each batch
//!   of updates and the next offset in one transaction ([`poller`]); the
//!   offset reaches Telegram (and so confirms the updates) only with the
//!   *next* poll, after they are durable.
//! * `tg-dispatch` — routes stored updates in order ([`dispatch`]): a bound
//!   user's message becomes a user message of their agent (once per update),
//!   an unknown user is refused once and audited, admins' commands and
//!   approval buttons are acted on.
//! * `tg-send-<bot>` — one per bot: sends the outbox in order per chat within
//!   Telegram's rate limits, uploads files, shows "typing" while an agent
//!   works ([`sender`]).
//!
//! * `tg-events` — for the life of choird (not restarted with the rest):
//!   acts on what the daemon tells the gateway ([`crate::events::Event`]):
//!   files that follow an answer, questions to admins about proposals,
//!   edits when they are decided ([`run_events`]).
//!
//! Channels: the pollers poke the dispatcher and the senders are poked
//! through bounded(1) channels: one pending poke already means "look again".
//! The gateway reaches the control plane only through [`Control`] and the
//! [`Shared`] services (its [`Handle`]); the daemon never calls into it.
//!
//! **Invariant:** no update is lost (its offset is confirmed only after it
//! is stored) and none is answered twice (an update becomes at most one user
//! message, and an answer is queued once, with the answer itself).
//! **Invariant:** bot tokens appear in no log line and no error: every
//! message that could carry a URL is masked ([`text::mask`]).

pub mod dispatch;
pub mod files;
pub mod pairing;
pub mod poller;
pub mod sender;
pub mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use choir_common::admin::{BotStatus, TelegramStatus};
use crossbeam_channel::{bounded, Receiver, Sender};
use frankenstein::client_ureq::Bot;
use parking_lot::Mutex;
use serde_json::json;

use choir_common::admin::{AgentSummary, ApprovalDetail, ApprovalInfo, ApproveRequest};
use choir_common::ids::AgentId;

use crate::config::{BotConfig, TelegramConfig};
use crate::events::Event;
use crate::http::ApiError;
pub use crate::pace::{backoff, nap};
use crate::shared::Shared;
use crate::store::{Delivery, OutboxRow};

pub use crate::conversations::{telegram as conversation, telegram_chat as chat_of};

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
    /// Wakes the agent's long-poll: a message for it was queued.
    fn wake_agent(&self, agent: &AgentId);
    /// The agent's state (for `/status`).
    fn summary(&self, agent: &str) -> Result<AgentSummary, ApiError>;
    /// Cancels the agent's current work (for `/stop`).
    fn cancel_lane(&self, agent: &str, lane: &str, actor: &str) -> Result<(), ApiError>;
    /// Approves a proposal (an admin's button).
    fn approve(&self, id: i64, req: &ApproveRequest) -> Result<ApprovalInfo, ApiError>;
    /// Rejects a proposal (an admin's button).
    fn reject(&self, id: i64, reason: &str, by: Option<&str>) -> Result<ApprovalInfo, ApiError>;
    /// A proposal with its diff.
    fn approval(&self, id: i64) -> Result<ApprovalDetail, ApiError>;
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
    let agent = ureq::Agent::new_with_config(
        ureq::config::Config::builder().http_status_as_error(false).timeout_global(Some(timeout)).build(),
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

/// The running gateway.
pub struct Gateway {
    stop: Arc<AtomicBool>,
    pollers: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    dispatch: Sender<()>,
    senders: Vec<Sender<()>>,
}

impl Gateway {
    /// Starts the gateway's threads for every bot with a token; `None` when
    /// there is none.
    pub fn start(d: &Handle) -> std::io::Result<Option<Gateway>> {
        let specs = bots(d);
        for (name, b) in &d.config().telegram.bots {
            if !specs.iter().any(|s| &s.name == name) {
                log::warn!(
                    "telegram bot {name}: secret {:?} is not in secrets.json; the bot stays off",
                    b.token_secret
                );
            }
        }
        if specs.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let tg: TelegramConfig = d.config().telegram.clone();
        // Bounded(1): a pending poke already means "look at the queue again".
        let (dispatch_tx, dispatch_rx) = bounded::<()>(1);
        let mut pollers = Vec::new();
        let mut workers = Vec::new();
        let mut senders = Vec::new();
        for spec in specs {
            let (d2, stop2, poke, tg2, spec2) =
                (d.clone(), stop.clone(), dispatch_tx.clone(), tg.clone(), spec.clone());
            pollers.push(
                std::thread::Builder::new()
                    .name(format!("tg-poll-{}", spec.name))
                    .spawn(move || poller::run(&d2, &tg2, &spec2, &stop2, &poke))?,
            );
            let (wake_tx, wake_rx) = bounded::<()>(1);
            senders.push(wake_tx.clone());
            let (d2, stop2, tg2) = (d.clone(), stop.clone(), tg.clone());
            workers.push(
                std::thread::Builder::new()
                    .name(format!("tg-send-{}", spec.name))
                    .spawn(move || sender::run(&d2, &tg2, &spec, &stop2, &wake_rx))?,
            );
        }
        *d.link.senders.lock() = senders.clone();
        let (d2, stop2) = (d.clone(), stop.clone());
        workers.push(
            std::thread::Builder::new()
                .name("tg-dispatch".into())
                .spawn(move || dispatch::run(&d2, &stop2, &dispatch_rx))?,
        );
        // Updates stored before a restart are handled now.
        let _ = dispatch_tx.try_send(());
        log::info!("telegram gateway: {} bot(s) at {}", pollers.len(), tg.api_base);
        Ok(Some(Gateway { stop, pollers, workers, dispatch: dispatch_tx, senders }))
    }

    /// Stops every thread. Senders and the dispatcher finish their current
    /// request and are joined; a poller in a long poll is given a moment and
    /// then left to end with the process (its batch, if one arrives, is
    /// stored or not — either way nothing is lost, since only a later poll
    /// would confirm it).
    pub fn stop(self, d: &Handle) {
        self.stop.store(true, Ordering::SeqCst);
        d.link.senders.lock().clear();
        let _ = self.dispatch.try_send(());
        for s in &self.senders {
            let _ = s.try_send(());
        }
        for w in self.workers {
            let _ = w.join();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for p in self.pollers {
            while !p.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if p.is_finished() {
                let _ = p.join();
            }
        }
    }
}

/// Waits for a poke or `timeout`, whichever comes first.
pub fn wait(rx: &Receiver<()>, timeout: Duration) {
    let _ = rx.recv_timeout(timeout);
}

/// `choirctl telegram status`: every configured bot.
pub fn status(d: &Handle) -> Result<TelegramStatus, crate::http::ApiError> {
    let config = d.config();
    let counters = d.link.counters();
    let secrets = d.secrets();
    let mut bots = Vec::new();
    for (name, b) in &config.telegram.bots {
        let c = counters.get(name).cloned().unwrap_or_default();
        let depths = d.store.telegram_depths(name)?;
        bots.push(BotStatus {
            bot: name.clone(),
            enabled: secrets.get(&b.token_secret).is_some(),
            users: b.users.len(),
            admins: b.users.values().filter(|u| u.admin).count(),
            last_poll_s_ago: c.last_poll.and_then(|t| t.elapsed().ok()).map(|e| e.as_secs()),
            last_error: c.last_error,
            updates: c.updates,
            sent: c.sent,
            errors: c.errors,
            queued_updates: depths.updates,
            queued_outbox: depths.outbox,
            failed_outbox: depths.failed,
        });
    }
    Ok(TelegramStatus { api_base: config.telegram.api_base.clone(), bots })
}

/// Tells the admins of every bot that serves `agent` about pending proposal
/// `id`, with Approve / Reject / Show buttons.
pub fn announce_proposal(d: &Handle, id: i64) {
    let Ok(Some((info, _))) = d.store.approval(id) else { return };
    let diff = d.control.approval(id).map(|detail| detail.diff).unwrap_or_default();
    for spec in bots(d) {
        if !serves(&spec.config, &info.agent) {
            continue;
        }
        // The admins of this agent, not of every agent the bot serves.
        for (user, _) in spec.config.users.iter().filter(|(_, u)| u.admin && u.agent.as_str() == info.agent) {
            let Ok(chat) = user.parse::<i64>() else { continue };
            if let Err(e) = d.store.enqueue_outbox(&spec.name, chat, &[("text", proposal_message(&info, &diff))]) {
                log::error!("telegram: cannot queue proposal {id} for {}: {e}", spec.name);
            }
        }
    }
    d.link.wake_senders();
}

/// Whether a bot serves `agent` (a user or group of it is bound to it).
pub fn serves(bot: &BotConfig, agent: &str) -> bool {
    bot.users.values().any(|u| u.agent.as_str() == agent) || bot.groups.values().any(|g| g.agent.as_str() == agent)
}

/// Characters of a proposal's diff shown in Telegram before it is cut.
const DIFF_SHOWN: usize = 2500;

/// The message (with buttons) that asks an admin to decide a proposal: what
/// it is, why, and the exact change (the diff, cut at a line with a pointer
/// to `choirctl approvals show` when long).
pub fn proposal_message(info: &choir_common::admin::ApprovalInfo, diff: &str) -> serde_json::Value {
    let mut shown = String::new();
    let total = diff.lines().count();
    let mut lines = 0;
    for line in diff.lines() {
        if shown.chars().count() + line.chars().count() + 1 > DIFF_SHOWN {
            break;
        }
        shown.push_str(line);
        shown.push('\n');
        lines += 1;
    }
    if lines < total {
        shown.push_str(&format!(
            "… {} more line(s): see `choirctl approvals show {}` or press Show\n",
            total - lines,
            info.id
        ));
    }
    if diff.trim().is_empty() {
        shown = "(no change to show)\n".into();
    }
    let text = format!(
        "Proposal {} from agent {}: {} {} ({} scope)\nReason: {}\nsha256 {}…\n\nThe change:\n{}",
        info.id,
        info.agent,
        info.kind,
        crate::http::printable(&info.subject),
        info.scope,
        crate::http::printable(&info.reason),
        &info.sha256[..16.min(info.sha256.len())],
        shown
    );
    let short = &info.sha256[..32.min(info.sha256.len())];
    json!({
        "text": text,
        "approval_id": info.id,
        "buttons": [[
            {"text": "Approve", "data": format!("ap:{}:{short}", info.id)},
            {"text": "Reject", "data": format!("rj:{}", info.id)},
            {"text": "Show", "data": format!("sh:{}", info.id)}
        ]]
    })
}

/// Edits every message that asked about proposal `id` to show its outcome.
pub fn announce_decision(d: &Handle, id: i64) {
    let Ok(Some((info, _))) = d.store.approval(id) else { return };
    let Ok(sent) = d.store.approval_messages(id) else { return };
    let outcome = match info.status.as_str() {
        "approved" => format!("Approved by {}.", info.decided_by.as_deref().unwrap_or("?")),
        _ => format!(
            "Rejected by {}: {}",
            info.decided_by.as_deref().unwrap_or("?"),
            info.decision_reason.as_deref().unwrap_or("")
        ),
    };
    for (bot, chat, message_id, text) in sent {
        let body = json!({"message_id": message_id, "text": format!("{text}\n\n{outcome}")});
        if let Err(e) = d.store.enqueue_outbox(&bot, chat, &[("edit", body)]) {
            log::error!("telegram: cannot queue the outcome of proposal {id}: {e}");
        }
    }
    d.link.wake_senders();
}

/// Moves what the agent put in `.choirtmp/send/` into the outbox of `chat`.
pub fn collect_files(d: &Handle, agent: &choir_common::ids::AgentId, bot: &str, chat: i64) {
    let config = d.config();
    let workspace = config.workspace(&d.home, agent);
    let spool = d.home.spool(agent);
    let quota = config.agents.get(agent).map(|a| a.quotas.spool_mb).unwrap_or_default() * 1024 * 1024;
    let room = quota.saturating_sub(crate::home::dir_bytes(&spool));
    match files::take_outgoing(&workspace, &spool, room) {
        Ok(taken) if !taken.is_empty() => {
            let rows: Vec<(&str, serde_json::Value)> = taken
                .iter()
                .map(|f| {
                    let body = json!({"path": f.spool, "name": f.name, "method": files::method_for(&f.name)});
                    ("file", body)
                })
                .collect();
            match d.store.enqueue_outbox(bot, chat, &rows) {
                Ok(()) => d.link.wake_senders(),
                Err(e) => log::error!("telegram: cannot queue {} file(s) of agent {agent}: {e}", rows.len()),
            }
        }
        Ok(_) => {}
        Err(e) => log::warn!("telegram: cannot take the files of agent {agent} to send: {e}"),
    }
}

/// Answers become Telegram outbox rows: split at Telegram's limits, in the
/// answer's own transaction (see [`Delivery`]).
pub struct TelegramDelivery;

impl Delivery for TelegramDelivery {
    fn rows(&self, conversation: &str, text: &str) -> Vec<OutboxRow> {
        let Some((bot, chat)) = chat_of(conversation) else { return Vec::new() };
        text::split(text)
            .into_iter()
            .map(|chunk| OutboxRow { bot: bot.clone(), chat, kind: "text", body: json!({"text": chunk}) })
            .collect()
    }
}

/// `tg-events`: acts on the daemon's events until the channel closes or
/// `stop` is set.
pub fn run_events(d: &Handle, events: &Receiver<Event>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let Ok(event) = events.recv_timeout(Duration::from_millis(500)) else { continue };
        match event {
            Event::Answered { agent, conversation } => {
                if let Some((bot, chat)) = chat_of(&conversation) {
                    collect_files(d, &agent, &bot, chat);
                }
                d.link.wake_senders();
            }
            Event::ProposalPending { id } => announce_proposal(d, id),
            Event::ProposalDecided { id } => announce_decision(d, id),
        }
    }
}
