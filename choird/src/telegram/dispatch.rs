//! `tg-dispatch`: acts on stored updates, oldest first (R-GW-2, -3).
//!
//! * a private message from a user bound to an agent (or a message in a
//!   configured group) becomes a user message of that agent, in the
//!   conversation of that chat — once per update, in the transaction that
//!   marks the update handled; files attached are received into the agent's
//!   `.choirtmp/recv/` first and the agent is told their paths;
//! * a user the bot does not know is refused politely once, and every such
//!   message is audited; other groups and other kinds of update are ignored;
//! * an admin's `/status`, `/stop` and `/approvals` are answered here, and
//!   their Approve / Reject / Show buttons act through the same daemon calls
//!   as `choirctl approvals` (bound to the content hash, recorded as
//!   `telegram:<user id>`); anyone else's button press is refused and audited.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use choir_common::admin::ApproveRequest;
use choir_common::ids::AgentId;
use crossbeam_channel::Receiver;
use frankenstein::methods::{AnswerCallbackQueryParams, GetFileParams};
use frankenstein::types::{CallbackQuery, ChatType, MaybeInaccessibleMessage, Message};
use frankenstein::updates::{Update, UpdateContent};
use frankenstein::TelegramApi;
use serde_json::{json, Value};

use super::approvals::proposal_message;
use super::bots::Handle;
use super::bots::{bots, client, wait, BotSpec};
use super::text;
use crate::config::BotConfig;
use crate::conversations::telegram as conversation;
use crate::db::DbError;
use crate::pace::{backoff, nap};
use crate::store::telegram::Plain;

/// Runs until `stop`.
pub fn run(d: &Handle, stop: &AtomicBool, poke: &Receiver<()>) {
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let batch = match d.store.pending_updates(100) {
            Ok(b) => b,
            Err(e) => {
                failures += 1;
                log::warn!("telegram: cannot read queued updates ({e}); retrying");
                nap(backoff(failures), stop);
                continue;
            }
        };
        if batch.is_empty() {
            wait(poke, Duration::from_secs(5));
            continue;
        }
        for (bot, update_id, payload) in batch {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = handle(d, &bot, update_id, &payload) {
                // The update stays queued and is handled again: every step is idempotent.
                failures += 1;
                log::warn!("telegram {bot}: update {update_id} not handled yet ({e}); retrying");
                nap(backoff(failures), stop);
                break;
            }
            failures = 0;
        }
    }
}

fn handle(d: &Handle, bot: &str, update_id: i64, payload: &Value) -> Result<(), DbError> {
    let Some(spec) = bots(d).into_iter().find(|b| b.name == bot) else {
        return d.store.mark_update(bot, update_id, "no_bot");
    };
    let update: Update = match serde_json::from_value(payload.clone()) {
        Ok(u) => u,
        Err(e) => {
            log::warn!("telegram {bot}: update {update_id} is not one this gateway reads ({e}); skipped");
            return d.store.mark_update(bot, update_id, "unreadable");
        }
    };
    match update.content {
        UpdateContent::Message(m) => message(d, &spec, update_id, &m),
        UpdateContent::CallbackQuery(q) => callback(d, &spec, update_id, &q),
        _ => d.store.mark_update(bot, update_id, "ignored"),
    }
}

/// Queues a plain reply to `chat`.
fn reply(d: &Handle, bot: &str, chat: i64, text: &str) -> Result<(), DbError> {
    let rows: Vec<(&str, Value)> = text::split(text).into_iter().map(|t| ("text", json!({"text": t}))).collect();
    d.store.enqueue_outbox(bot, chat, &rows)?;
    d.link.wake_senders();
    Ok(())
}

fn message(d: &Handle, spec: &BotSpec, update_id: i64, m: &Message) -> Result<(), DbError> {
    choir_common::hop::mark("tg.dispatch");
    let bot = spec.name.as_str();
    let chat = m.chat.id;
    let user = m.from.as_ref().map(|u| u.id as i64).unwrap_or_default();
    let bound = spec.config.users.get(&user.to_string());
    let agent = match route(&spec.config, m) {
        Some(agent) => agent,
        None if m.chat.type_field == ChatType::Private => {
            let username = m.from.as_ref().and_then(|u| u.username.clone());
            d.audit(
                "telegram",
                None,
                "telegram.unknown_user",
                "refused",
                json!({"bot": bot, "user": user, "username": username, "update": update_id}),
            );
            if spec.config.pairing.is_some() {
                super::pairing::request(d, spec, user, username.as_deref(), chat)?;
                return d.store.mark_update(bot, update_id, "pairing");
            }
            if d.store.refuse_once(bot, user)? {
                reply(
                    d,
                    bot,
                    chat,
                    &format!(
                        "Sorry, I only talk to people I have been introduced to, so I cannot pass your message on. \
                             If you should have access, ask the operator to add your Telegram id ({user})."
                    ),
                )?;
            }
            return d.store.mark_update(bot, update_id, "refused");
        }
        None => return d.store.mark_update(bot, update_id, "ignored"),
    };
    let admin = bound.is_some_and(|u| u.admin && u.agent == agent);
    let said = m.text.clone().or_else(|| m.caption.clone()).unwrap_or_default();

    if let Some(command) = said.strip_prefix('/') {
        let name = command.split_whitespace().next().unwrap_or("").split('@').next().unwrap_or("");
        let handled = match name {
            "start" | "help" => Some(format!(
                "Hello! You are talking to {agent}. Write as you would to a person; files and voice messages are \
                 welcome too.{}",
                if admin { " As an admin you can also use /status, /stop and /approvals." } else { "" }
            )),
            "status" | "stop" | "approvals" if !admin => Some(format!("Only this bot's admins can use /{name}.")),
            "status" => Some(status_text(d, &agent)),
            "stop" => Some(match d.control.cancel_lane(agent.as_str(), "all", &format!("telegram:{user}")) {
                Ok(()) => format!("Stopping what {agent} is doing; it stops at its next step."),
                Err(e) => format!("Cannot stop {agent}: {e}"),
            }),
            "approvals" => Some(pending_for(d, bot, chat, &agent)?),
            _ => None,
        };
        if let Some(answer) = handled {
            reply(d, bot, chat, &answer)?;
            return d.store.mark_update(bot, update_id, "command");
        }
    }

    // Before its files are written: a nearly full disk takes nothing new.
    if let Some(why) = d.disk_refusal(&agent, crate::disk::Look::Recent) {
        log::warn!("telegram: a message for {agent} refused: {why}");
        reply(d, bot, chat, "Sorry, I cannot take new messages right now: the disk I work on is nearly full. The operator can see why in `choirctl status`; please try again later.")?;
        return d.store.mark_update(bot, update_id, "refused_disk_full");
    }
    let mut text = said;
    let mut unheard = false;
    for note in receive_files(d, spec, &agent, update_id, m) {
        let note = match note {
            Note::Text(t) => t,
            Note::Unheard(t) => {
                unheard = true;
                t
            }
        };
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&note);
    }
    if unheard && m.text.is_none() && m.caption.is_none() && m.document.is_none() && m.photo.is_none() {
        // A voice note alone that could not be understood: never an empty
        // turn, never silence — the user is asked for text.
        reply(d, bot, chat, "Sorry, I could not make out your voice message. Could you send it as text?")?;
        return d.store.mark_update(bot, update_id, "voice_not_transcribed");
    }
    if text.trim().is_empty() {
        reply(d, bot, chat, "I can read text, photos, documents and voice messages; this kind of message I cannot.")?;
        return d.store.mark_update(bot, update_id, "unsupported");
    }
    let origin = origin(bot, update_id, chat, user, m.message_id);
    let sender = format!("telegram:{user}");
    let conversation = conversation(bot, chat);
    let stored = d
        .store
        .telegram_message(bot, update_id, &agent, &conversation, &sender, &text, &origin)
        // It may have been stored all the same (the commit's answer lost): the agent looks.
        .inspect_err(|_| d.control.wake_agent(&agent))?;
    if let Some(queued) = stored {
        choir_common::hop::mark("message.stored");
        d.control.message_stored(&agent, queued, &conversation, &sender, &text);
    }
    Ok(())
}

/// Where a message came from, as its `origin` is stored (unique per bot
/// and update).
fn origin(bot: &str, update_id: i64, chat: i64, user: i64, message_id: i32) -> Value {
    json!({"bot": bot, "update_id": update_id.to_string(), "chat_id": chat, "user_id": user, "message_id": message_id})
}

/// The agent a message goes to under the bot's config: a private chat's
/// by its user, a group's by the group; `None` for anyone else (a private
/// chat's user is then refused or asked to pair) and any other chat. The
/// one place this is decided, for the poller's fast path and the
/// dispatcher alike.
fn route(config: &BotConfig, m: &Message) -> Option<AgentId> {
    match m.chat.type_field {
        ChatType::Private => {
            let user = m.from.as_ref()?.id;
            Some(config.users.get(&user.to_string())?.agent.clone())
        }
        ChatType::Group | ChatType::Supergroup => Some(config.groups.get(&m.chat.id.to_string())?.agent.clone()),
        _ => None,
    }
}

/// The message update `update_id` of `bot` becomes with nothing to do but
/// store it, if it is one: text (not a command, no caption, no file) from
/// a user `config` binds to an agent, in a private chat, or in a group it
/// routes. Exactly what [`run`] would queue for it; anything else (unknown
/// users, commands, files, pairing) is left to [`run`]. `config` must be
/// the live one: a user taken out of config is not let through.
pub fn plain(bot: &str, config: &BotConfig, update_id: i64, m: &Message) -> Option<Plain> {
    let text = m.text.as_ref()?;
    let attached = m.caption.is_some() || m.document.is_some() || m.voice.is_some() || m.audio.is_some();
    if attached || m.photo.is_some() || text.trim().is_empty() || text.starts_with('/') {
        return None;
    }
    let chat = m.chat.id;
    let user = m.from.as_ref().map(|u| u.id as i64).unwrap_or_default();
    Some(Plain {
        update_id,
        agent: route(config, m)?,
        conversation: conversation(bot, chat),
        sender: format!("telegram:{user}"),
        text: choir_common::text::nul_escaped(text).into_owned(),
        origin: origin(bot, update_id, chat, user, m.message_id),
    })
}

/// The agent's state in a few lines, for `/status`.
fn status_text(d: &Handle, agent: &AgentId) -> String {
    match d.control.summary(agent.as_str()) {
        Ok(s) => {
            let mut t = format!("{}: {}", s.id, s.state);
            if let Some(state) = &s.session_state {
                t.push_str(&format!(" ({state})"));
            }
            for l in &s.lanes {
                t.push_str(&format!("\n{}: {}, {} steps", l.lane, l.state, l.steps));
                if let Some(skill) = &l.skill {
                    t.push_str(&format!(", skill {} in {}", skill.name, skill.state));
                }
            }
            t
        }
        Err(e) => format!("Cannot read {agent}'s state: {e}"),
    }
}

/// Queues each pending proposal of `agent`, with its buttons; says how many.
fn pending_for(d: &Handle, bot: &str, chat: i64, agent: &AgentId) -> Result<String, DbError> {
    let pending = d.store.approvals(Some("pending"), Some(agent), 20)?;
    for (info, _) in &pending {
        let diff = d.control.approval(info.id).map(|detail| detail.diff).unwrap_or_default();
        d.store.enqueue_outbox(bot, chat, &[("text", proposal_message(info, &diff))])?;
    }
    Ok(match pending.len() {
        0 => format!("No proposals of {agent} are waiting."),
        n => format!("{n} proposal(s) of {agent} are waiting:"),
    })
}

/// What the agent is told of one file a user sent.
enum Note {
    /// A note (and, for a voice message, its transcript).
    Text(String),
    /// A voice message or audio file that could not be transcribed.
    Unheard(String),
}

/// Transcribes a stored voice message or audio file; the note the agent gets.
fn heard(d: &Handle, spec: &BotSpec, kind: &str, rel: &str, data: &[u8], name: &str) -> Note {
    let config = d.config();
    let Some(tr) = &config.telegram.transcription else {
        return Note::Unheard(format!(
            "[The user sent a {kind}: {rel} ({} bytes); it could not be transcribed (no transcription service is configured)]",
            data.len()
        ));
    };
    match crate::telegram::transcribe::transcribe(tr, &d.secrets(), data, name) {
        Ok(t) => Note::Text(format!(
            "[The user sent a {kind} ({rel}); what follows is its automatic transcription, which may contain errors]\n{t}"
        )),
        Err(why) => {
            log::warn!("telegram {}: transcription of {rel}: {why}", spec.name);
            d.link.count(&spec.name, |c| {
                c.errors += 1;
                c.last_error = Some(format!("transcription: {why}"));
            });
            Note::Unheard(format!("[The user sent a {kind}: {rel} ({} bytes); it could not be transcribed]", data.len()))
        }
    }
}

/// Receives the files of a message into the agent's workspace (voice
/// messages and audio files transcribed when a service is configured);
/// returns a note per file for the agent.
fn receive_files(d: &Handle, spec: &BotSpec, agent: &AgentId, update_id: i64, m: &Message) -> Vec<Note> {
    let mut wanted: Vec<(String, String, Option<u64>, &str)> = Vec::new();
    if let Some(doc) = &m.document {
        let name = doc.file_name.clone().unwrap_or_else(|| "document".into());
        wanted.push((doc.file_id.clone(), name, doc.file_size, "document"));
    }
    if let Some(v) = &m.voice {
        wanted.push((v.file_id.clone(), "voice.ogg".into(), v.file_size, "voice message"));
    }
    if let Some(a) = &m.audio {
        let name = a.file_name.clone().unwrap_or_else(|| "audio".into());
        wanted.push((a.file_id.clone(), name, a.file_size, "audio file"));
    }
    if let Some(largest) = m.photo.as_ref().and_then(|p| p.iter().max_by_key(|s| s.width * s.height)) {
        wanted.push((largest.file_id.clone(), "photo.jpg".into(), largest.file_size, "photo"));
    }
    let tg = d.config().telegram.clone();
    let cap = tg.max_file_mb * 1024 * 1024;
    let workspace = d.config().workspace(&d.home, agent);
    wanted
        .into_iter()
        .map(|(file_id, name, size, kind)| {
            let audio = matches!(kind, "voice message" | "audio file");
            let note = |t: String| if audio { Note::Unheard(t) } else { Note::Text(t) };
            if size.is_some_and(|s| s > cap) {
                return note(format!(
                    "[The user sent a {kind} ({name}) of {} bytes, over the {} MiB limit; it was not received]",
                    size.unwrap_or(0),
                    tg.max_file_mb
                ));
            }
            match fetch(&spec.api_base, &spec.token, &file_id, cap) {
                Ok(data) => {
                    match crate::workspace_files::store_incoming(&workspace, &format!("{update_id}_{name}"), &data) {
                        Ok(rel) if audio => heard(d, spec, kind, &rel, &data, &name),
                        Ok(rel) => Note::Text(format!("[The user sent a {kind}: {rel} ({} bytes)]", data.len())),
                        Err(e) => note(format!("[The user sent a {kind} ({name}), but it could not be stored: {e}]")),
                    }
                }
                Err(e) => {
                    log::warn!("telegram {}: file of update {update_id}: {e}", spec.name);
                    note(format!("[The user sent a {kind} ({name}), but it could not be received: {e}]"))
                }
            }
        })
        .collect()
}

/// `getFile`, then the download of at most `cap` bytes.
fn fetch(api_base: &str, token: &str, file_id: &str, cap: u64) -> Result<Vec<u8>, String> {
    let bot = client(api_base, token, Duration::from_secs(60));
    let file = bot
        .get_file(&GetFileParams::builder().file_id(file_id).build())
        .map_err(|e| text::mask(&e.to_string(), token))?
        .result;
    if file.file_size.is_some_and(|s| s > cap) {
        return Err(format!("{} bytes is over the limit", file.file_size.unwrap_or(0)));
    }
    let path = file.file_path.ok_or("Telegram gave no file path")?;
    let url = format!("{}/file/bot{token}/{path}", api_base.trim_end_matches('/'));
    let agent = crate::resolver::agent(
        ureq::config::Config::builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))),
    );
    let mut resp = agent.get(&url).call().map_err(|e| text::mask(&e.to_string(), token))?;
    if resp.status() != 200 {
        return Err(format!("download answered {}", resp.status()));
    }
    resp.body_mut().with_config().limit(cap).read_to_vec().map_err(|e| text::mask(&e.to_string(), token))
}

fn answer(spec: &BotSpec, query: &CallbackQuery, text: &str, alert: bool) {
    let bot = client(&spec.api_base, &spec.token, Duration::from_secs(15));
    let params =
        AnswerCallbackQueryParams::builder().callback_query_id(query.id.clone()).text(text).show_alert(alert).build();
    if let Err(e) = bot.answer_callback_query(&params) {
        log::warn!("telegram {}: answerCallbackQuery: {}", spec.name, text::mask(&e.to_string(), &spec.token));
    }
}

fn callback(d: &Handle, spec: &BotSpec, update_id: i64, q: &CallbackQuery) -> Result<(), DbError> {
    let bot = spec.name.as_str();
    let user = q.from.id as i64;
    let data = q.data.clone().unwrap_or_default();
    if let Some((kind, who)) = data.split_once(':').filter(|(k, _)| matches!(*k, "pl" | "pn")) {
        let admin = spec.config.users.get(&user.to_string()).is_some_and(|u| u.admin);
        if !admin {
            d.audit(&format!("telegram:{user}"), None, "telegram.pairing", "refused_not_admin", json!({"bot": bot}));
            answer(spec, q, "Only this bot's admins can let people in.", true);
            return d.store.mark_update(bot, update_id, "callback_refused");
        }
        let outcome = who.parse::<i64>().map_err(|_| "that button names no user".to_owned()).and_then(|u| {
            super::pairing::decide(d, bot, u, kind == "pl", &format!("telegram:{user}")).map_err(|e| e.to_string())
        });
        match outcome {
            Ok(done) => answer(spec, q, &done, false),
            Err(e) => answer(spec, q, &e, true),
        }
        return d.store.mark_update(bot, update_id, "callback");
    }
    let mut parts = data.splitn(3, ':');
    let (action, id) = (parts.next().unwrap_or(""), parts.next().and_then(|i| i.parse::<i64>().ok()));
    let sha = parts.next().map(str::to_owned);
    let (Some(id), true) = (id, matches!(action, "ap" | "rj" | "sh")) else {
        answer(spec, q, "This button is not one I know.", false);
        return d.store.mark_update(bot, update_id, "callback_unknown");
    };
    let Some((info, _)) = d.store.approval(id)? else {
        answer(spec, q, &format!("There is no proposal {id}."), true);
        return d.store.mark_update(bot, update_id, "callback_unknown");
    };
    // Per agent, as /status and /stop: an admin decides the proposals of the
    // agent they are an admin of, not of every agent the bot serves.
    let admin = spec.config.users.get(&user.to_string()).is_some_and(|u| u.admin && u.agent.as_str() == info.agent);
    if !admin {
        d.audit(
            &format!("telegram:{user}"),
            AgentId::parse(&info.agent).ok().as_ref(),
            "approval.callback",
            "refused_not_admin",
            json!({"bot": bot, "approval": id, "action": action}),
        );
        answer(spec, q, "Only this bot's admins can decide proposals.", true);
        return d.store.mark_update(bot, update_id, "callback_refused");
    }
    let by = format!("telegram:{user}");
    let chat = match &q.message {
        Some(MaybeInaccessibleMessage::Message(m)) => m.chat.id,
        Some(MaybeInaccessibleMessage::InaccessibleMessage(m)) => m.chat.id,
        None => user,
    };
    match action {
        "ap" => match d.control.approve(id, &ApproveRequest { sha256: sha, by: Some(by), ..Default::default() }) {
            Ok(_) => answer(spec, q, &format!("Proposal {id} approved."), false),
            Err(e) => answer(spec, q, &e.to_string(), true),
        },
        "rj" => match d.control.reject(id, &format!("rejected in Telegram by {user}"), Some(&by)) {
            Ok(_) => answer(spec, q, &format!("Proposal {id} rejected."), false),
            Err(e) => answer(spec, q, &e.to_string(), true),
        },
        _ => match d.control.approval(id) {
            Ok(detail) => {
                let shown = format!(
                    "Proposal {id}: {} {}\n\n{}\n\nChanges:\n{}",
                    detail.info.kind,
                    detail.info.subject,
                    serde_json::to_string_pretty(&detail.content).unwrap_or_default(),
                    if detail.diff.is_empty() { "(none)" } else { &detail.diff }
                );
                reply(d, bot, chat, &shown)?;
                answer(spec, q, "Sent below.", false);
            }
            Err(e) => answer(spec, q, &e.to_string(), true),
        },
    }
    d.store.mark_update(bot, update_id, "callback")
}
