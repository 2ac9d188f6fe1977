//! `tg-send-<bot>`: sends one bot's outbox (R-GW-3, -4).
//!
//! Rows go out in id order within each chat; a chat waits at least
//! `per_chat_interval_ms` between two messages and the bot sends at most
//! `per_bot_per_s` per second (a token bucket): what cannot go yet waits in
//! the queue, nothing is dropped. A 429 pauses the bot for Telegram's
//! `retry_after`; a transient failure is retried with backoff; a request
//! Telegram refuses outright (400/403) is given up and logged, so one bad
//! row never blocks a chat. Files are uploaded with `sendVoice` (OGG/Opus),
//! `sendAudio` or `sendDocument` and removed from the spool once sent. While
//! a user's message waits for its answer, the chat shows "typing".

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use frankenstein::methods::{
    EditMessageTextParams, SendAudioParams, SendChatActionParams, SendDocumentParams, SendMessageParams,
    SendVoiceParams,
};
use frankenstein::types::{ChatAction, InlineKeyboardButton, InlineKeyboardMarkup, ReplyMarkup};
use frankenstein::TelegramApi;
use serde_json::Value;

use super::bots::Handle;
use super::bots::{classify, client, wait, BotSpec, Failure};
use crate::config::TelegramConfig;
use crate::pace::{backoff, nap};
use crate::store::telegram::OutboxRow;

/// How often "typing" is shown (it lasts about 5 s on the client).
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// Transient failures of one row before it is given up.
const MAX_ATTEMPTS: i32 = 20;

/// A token bucket: `rate` per second, bursts of `rate`.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        Bucket { rate: f64::from(rate), tokens: f64::from(rate), at: Instant::now() }
    }

    /// Takes a token, or says when one will be there.
    fn take(&mut self) -> Result<(), Instant> {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(now + Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Runs until `stop`.
pub fn run(d: &Handle, tg: &TelegramConfig, spec: &BotSpec, stop: &AtomicBool, wake: &Receiver<()>) {
    // A hung connection is given up on: 30 s for a message, 120 s for an upload.
    let bot = client(&tg.api_base, &spec.token, Duration::from_secs(30));
    let uploads = client(&tg.api_base, &spec.token, Duration::from_secs(120));
    let interval = Duration::from_millis(tg.per_chat_interval_ms);
    let mut bucket = Bucket::new(tg.per_bot_per_s);
    let mut next_for_chat: HashMap<i64, Instant> = HashMap::new();
    let mut typing_at = Instant::now();
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= typing_at {
            typing_at = now + TYPING_EVERY;
            for chat in d.store.chats_waiting(&spec.name).unwrap_or_default() {
                let p = SendChatActionParams::builder().chat_id(chat).action(ChatAction::Typing).build();
                if let Err(e) = bot.send_chat_action(&p) {
                    log::debug!("telegram {}: typing: {:?}", spec.name, classify(&e, &spec.token));
                }
            }
        }
        let rows = match d.store.unsent(&spec.name, 500) {
            Ok(r) => r,
            Err(e) => {
                failures += 1;
                log::warn!("telegram {}: cannot read the outbox ({e}); retrying", spec.name);
                nap(backoff(failures), stop);
                continue;
            }
        };
        let mut blocked: HashSet<i64> = HashSet::new();
        let mut soonest: Option<Instant> = None;
        for row in rows {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            if blocked.contains(&row.chat_id) {
                continue;
            }
            if let Some(due) = next_for_chat.get(&row.chat_id).copied().filter(|t| *t > Instant::now()) {
                blocked.insert(row.chat_id);
                soonest = Some(soonest.map_or(due, |s| s.min(due)));
                continue;
            }
            if let Err(due) = bucket.take() {
                soonest = Some(soonest.map_or(due, |s| s.min(due)));
                break;
            }
            choir_common::hop::mark("tg.send");
            match send(d, if row.kind == "file" { &uploads } else { &bot }, &spec.token, &row) {
                Ok(message_id) => {
                    failures = 0;
                    next_for_chat.insert(row.chat_id, Instant::now() + interval);
                    if let Err(e) = d.store.mark_sent(row.id, message_id) {
                        log::error!("telegram {}: row {} was sent but not marked ({e})", spec.name, row.id);
                    }
                    drop_spooled(&row);
                    d.link.count(&spec.name, |c| c.sent += 1);
                }
                Err(failure) => {
                    d.link.count(&spec.name, |c| {
                        c.errors += 1;
                        c.last_error = Some(format!("{failure:?}"));
                    });
                    blocked.insert(row.chat_id);
                    match failure {
                        Failure::RetryAfter(w) => {
                            log::warn!("telegram {}: rate limited by Telegram; pausing {w:?}", spec.name);
                            let _ = d.store.mark_attempt(row.id, "429 Too Many Requests", false);
                            nap(w, stop);
                            break;
                        }
                        Failure::Permanent(why) => {
                            log::error!(
                                "telegram {}: Telegram refused row {} ({}): {why}",
                                spec.name,
                                row.id,
                                row.kind
                            );
                            let _ = d.store.mark_attempt(row.id, &why, true);
                            drop_spooled(&row);
                        }
                        Failure::Transient(why) => {
                            failures += 1;
                            let give_up = row.attempts + 1 >= MAX_ATTEMPTS;
                            log::warn!("telegram {}: sending row {} failed: {why}; retrying", spec.name, row.id);
                            let _ = d.store.mark_attempt(row.id, &why, give_up);
                            if give_up {
                                drop_spooled(&row);
                            }
                            nap(backoff(failures), stop);
                            break;
                        }
                    }
                }
            }
        }
        let until = soonest.unwrap_or(typing_at).min(typing_at);
        let pause = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(5));
        wait(wake, pause);
    }
}

/// A file row's spooled copy is removed once the row is done with: sent,
/// refused, or given up. The spool never keeps what will not be sent.
fn drop_spooled(row: &crate::store::telegram::OutboxRow) {
    if row.kind == "file" {
        if let Some(p) = row.body["path"].as_str() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn markup(buttons: &Value) -> Option<ReplyMarkup> {
    let rows = buttons.as_array()?;
    let keyboard: Vec<Vec<InlineKeyboardButton>> = rows
        .iter()
        .map(|row| {
            row.as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    InlineKeyboardButton::builder()
                        .text(b["text"].as_str().unwrap_or("?"))
                        .callback_data(b["data"].as_str().unwrap_or(""))
                        .build()
                })
                .collect()
        })
        .collect();
    Some(ReplyMarkup::InlineKeyboardMarkup(InlineKeyboardMarkup::builder().inline_keyboard(keyboard).build()))
}

/// Sends one row; the id of the message Telegram made of it, if any.
fn send(
    d: &Handle,
    bot: &frankenstein::client_ureq::Bot,
    token: &str,
    row: &OutboxRow,
) -> Result<Option<i64>, Failure> {
    let token_mask = |e: frankenstein::Error| classify(&e, token);
    let chat = row.chat_id;
    match row.kind.as_str() {
        "text" => {
            let mut text = row.body["text"].as_str().unwrap_or("").to_owned();
            let mut buttons = markup(&row.body["buttons"]);
            // A proposal decided before its question went out: no buttons, the outcome instead.
            if let Some(id) = row.body["approval_id"].as_i64() {
                if let Ok(Some((info, _))) = d.store.approval(id) {
                    if info.status != "pending" {
                        buttons = None;
                        text.push_str(&format!(
                            "\n\nAlready {} by {}.",
                            info.status,
                            info.decided_by.unwrap_or_default()
                        ));
                    }
                }
            }
            let p = SendMessageParams::builder().chat_id(chat).text(text).maybe_reply_markup(buttons).build();
            let m = bot.send_message(&p).map_err(token_mask)?;
            Ok(Some(i64::from(m.result.message_id)))
        }
        "edit" => {
            let p = EditMessageTextParams::builder()
                .chat_id(chat)
                .message_id(row.body["message_id"].as_i64().unwrap_or(0) as i32)
                .text(row.body["text"].as_str().unwrap_or(""))
                .build();
            match bot.edit_message_text(&p) {
                Ok(_) => Ok(None),
                // The same text again is not an error worth keeping.
                Err(frankenstein::Error::Api(r)) if r.description.contains("message is not modified") => Ok(None),
                Err(e) => Err(token_mask(e)),
            }
        }
        "file" => {
            let path = PathBuf::from(row.body["path"].as_str().unwrap_or(""));
            if !path.is_file() {
                return Err(Failure::Permanent(format!("the spooled file {} is gone", path.display())));
            }
            let m = match row.body["method"].as_str() {
                Some("sendVoice") => {
                    bot.send_voice(&SendVoiceParams::builder().chat_id(chat).voice(path).build()).map_err(token_mask)?
                }
                Some("sendAudio") => {
                    bot.send_audio(&SendAudioParams::builder().chat_id(chat).audio(path).build()).map_err(token_mask)?
                }
                _ => bot
                    .send_document(&SendDocumentParams::builder().chat_id(chat).document(path).build())
                    .map_err(token_mask)?,
            };
            Ok(Some(i64::from(m.result.message_id)))
        }
        other => Err(Failure::Permanent(format!("unknown outbox kind {other:?}"))),
    }
}
