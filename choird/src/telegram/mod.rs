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

pub mod approvals;
pub mod bots;
pub mod dispatch;
pub mod pairing;
pub mod poller;
pub mod sender;
pub mod text;
pub mod transcribe;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use choir_common::admin::{BotStatus, TelegramStatus};
use crossbeam_channel::{bounded, Sender};
use serde_json::json;

use crate::config::TelegramConfig;
use crate::events::Event;
pub use crate::pace::{backoff, nap};
use crate::store::{Delivery, OutboxRow};

pub use self::approvals::{
    alert_admins_directly, announce_decision, announce_proposal, proposal_message, serves, tell_admins,
};
pub use self::bots::{bots, client, wait, BotSpec, ConfigEdit, Control, Counters, Failure, Handle, Link};
pub use crate::conversations::{telegram as conversation, telegram_chat as chat_of};

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
        d.link.set_senders(senders.clone());
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
        d.link.set_senders(Vec::new());
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

/// `choirctl telegram status`: every configured bot.
pub fn status(d: &Handle) -> Result<TelegramStatus, crate::error::Error> {
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

/// Moves what the agent put in `.choirtmp/send/` into the outbox of `chat`.
pub fn collect_files(d: &Handle, agent: &choir_common::ids::AgentId, bot: &str, chat: i64) {
    let config = d.config();
    let workspace = config.workspace(&d.home, agent);
    let spool = d.home.spool(agent);
    let quota = config.agents.get(agent).map(|a| a.quotas.spool_mb).unwrap_or_default() * 1024 * 1024;
    let room = quota.saturating_sub(crate::home::dir_bytes(&spool));
    match crate::workspace_files::take_outgoing(&workspace, &spool, room) {
        Ok(taken) if !taken.is_empty() => {
            let rows: Vec<(&str, serde_json::Value)> = taken
                .iter()
                .map(|f| {
                    let body =
                        json!({"path": f.spool, "name": f.name, "method": crate::workspace_files::method_for(&f.name)});
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
/// `stop` does (its sender dropped); it sleeps until one of them, never
/// woken by a clock.
pub fn run_events(d: &Handle, events: &crate::events::Inbox, stop: &crossbeam_channel::Receiver<()>) {
    loop {
        let event = crossbeam_channel::select! {
            recv(events) -> e => match e {
                Ok(e) => e,
                Err(_) => return,
            },
            recv(stop) -> _ => return,
        };
        match *event {
            Event::Answered { agent, conversation } => {
                if let Some((bot, chat)) = chat_of(&conversation) {
                    collect_files(d, &agent, &bot, chat);
                }
                d.link.wake_senders();
            }
            Event::ProposalPending { id } => announce_proposal(d, id),
            Event::ProposalDecided { id } => announce_decision(d, id),
            Event::BudgetWarning { agent, text }
            | Event::RolloutDone { agent, text }
            | Event::ScheduleNotice { agent, text }
            | Event::AgentDown { agent, text } => tell_admins(d, &agent, &text),
        }
    }
}
