//! `tg-poll-<bot>`: long-polls `getUpdates` for one bot (R-GW-1, -4).
//!
//! Each batch is stored, with the offset past it, in one transaction before
//! anything else happens; the offset is sent to Telegram only with the next
//! poll, which is what confirms the batch. A crash anywhere loses nothing:
//! unconfirmed updates are sent again and stored once. A plain user message
//! (text from a user the live config binds to an agent) is queued for its
//! agent in that same transaction, unless an earlier update still waits for
//! the dispatcher; everything else is the dispatcher's. Text is stored with
//! U+0000 escaped (`text::nul_escaped`), so no update can stall the batch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use crossbeam_channel::Sender;
use frankenstein::methods::GetUpdatesParams;
use frankenstein::types::AllowedUpdate;
use frankenstein::updates::{Update, UpdateContent};
use frankenstein::TelegramApi;

use super::bots::Handle;
use super::bots::{classify, client, BotSpec, Failure};
use crate::config::TelegramConfig;
use crate::pace::{backoff, nap};
use crate::store::telegram::Plain;

/// Updates asked for per poll.
const LIMIT: u32 = 100;

/// Runs until `stop`.
pub fn run(d: &Handle, tg: &TelegramConfig, spec: &BotSpec, stop: &AtomicBool, dispatch: &Sender<()>) {
    let bot = client(&tg.api_base, &spec.token, Duration::from_secs(tg.poll_timeout_s + 15));
    let mut failures = 0u32;
    let mut offset: Option<i64> = None;
    while !stop.load(Ordering::SeqCst) {
        let next = match offset {
            Some(o) => o,
            None => match d.store.telegram_offset(&spec.name) {
                Ok(o) => {
                    offset = Some(o);
                    o
                }
                Err(e) => {
                    failures += 1;
                    log::warn!("telegram {}: cannot read the stored offset ({e}); retrying", spec.name);
                    nap(backoff(failures), stop);
                    continue;
                }
            },
        };
        let params = GetUpdatesParams::builder()
            .offset(next)
            .limit(LIMIT)
            .timeout(tg.poll_timeout_s as u32)
            .allowed_updates(vec![AllowedUpdate::Message, AllowedUpdate::CallbackQuery])
            .build();
        match bot.get_updates(&params) {
            Ok(resp) => {
                d.link.count(&spec.name, |c| c.last_poll = Some(SystemTime::now()));
                if resp.result.is_empty() {
                    failures = 0;
                    continue;
                }
                choir_common::hop::mark("tg.polled");
                // Stored with every U+0000 escaped: PostgreSQL refuses it,
                // and a batch it refused would be retried forever.
                let batch: Vec<(i64, serde_json::Value)> = resp
                    .result
                    .iter()
                    .filter_map(|u| {
                        let mut payload = serde_json::to_value(u).ok()?;
                        choir_common::text::escape_nul_in(&mut payload);
                        Some((i64::from(u.update_id), payload))
                    })
                    .collect();
                let plain = plain_messages(d, &spec.name, &resp.result);
                // Durable first; the next poll's offset confirms them.
                match d.store.store_updates(&spec.name, &batch, &plain) {
                    Ok(stored) => {
                        choir_common::hop::mark("tg.stored");
                        failures = 0;
                        offset = Some(stored.next_offset);
                        d.link.count(&spec.name, |c| c.updates += batch.len() as u64);
                        for (i, queued) in stored.queued {
                            let p = &plain[i];
                            d.control.message_stored(&p.agent, queued, &p.conversation, &p.sender, &p.text);
                        }
                        if stored.for_dispatch > 0 {
                            let _ = dispatch.try_send(());
                        }
                    }
                    Err(e) => {
                        // Not confirmed: Telegram sends them again. They may
                        // have been stored all the same (the commit's answer
                        // lost): their agents look.
                        for p in &plain {
                            d.control.wake_agent(&p.agent);
                        }
                        failures += 1;
                        log::warn!("telegram {}: cannot store {} update(s) ({e}); retrying", spec.name, batch.len());
                        nap(backoff(failures), stop);
                    }
                }
            }
            Err(e) => {
                failures += 1;
                let (wait, why) = match classify(&e, &spec.token) {
                    Failure::RetryAfter(w) => (w, "rate limited".to_owned()),
                    Failure::Permanent(m) => (backoff(failures).max(Duration::from_secs(5)), m),
                    Failure::Transient(m) => (backoff(failures), m),
                };
                log::warn!("telegram {}: getUpdates failed: {why}; next try in {wait:?}", spec.name);
                d.link.count(&spec.name, |c| {
                    c.errors += 1;
                    c.last_error = Some(format!("getUpdates: {why}"));
                });
                nap(wait, stop);
            }
        }
    }
}

/// The updates of a batch that are plain user messages under the bot's
/// live config (see [`super::dispatch::plain`]), queued with the batch
/// itself: one transaction, no hand-over to the dispatcher.
fn plain_messages(d: &Handle, bot: &str, updates: &[Update]) -> Vec<Plain> {
    let config = d.config();
    let Some(b) = config.telegram.bots.get(bot) else { return Vec::new() };
    updates
        .iter()
        .filter_map(|u| match &u.content {
            UpdateContent::Message(m) => super::dispatch::plain(bot, b, i64::from(u.update_id), m),
            _ => None,
        })
        .collect()
}
