//! Pairing (bots with `pairing` set): a user the bot does not know may ask to
//! be let in. The bot's admins are asked in chat (Let in / Refuse) and can
//! also decide with `choirctl telegram pair`; letting someone in adds them
//! to `config.json` as a regular user of the pairing agent (rewritten
//! atomically and reloaded). Each request is asked once; every decision is
//! audited.

use choir_common::admin::{PairingInfo, PairingList};
use serde_json::json;

use super::bots::BotSpec;
use super::bots::Handle;
use crate::db::DbError;
use crate::error::Error;

/// An unknown user wrote to a bot with pairing: asks its admins, once.
pub fn request(d: &Handle, spec: &BotSpec, user: i64, username: Option<&str>, chat: i64) -> Result<(), DbError> {
    let Some(agent) = &spec.config.pairing else { return Ok(()) };
    if !d.store.request_pairing(&spec.name, user, username)? {
        return Ok(());
    }
    let who = username.map(|u| format!("{user} (@{u})")).unwrap_or_else(|| user.to_string());
    d.store.enqueue_outbox(
        &spec.name,
        chat,
        &[(
            "text",
            json!({"text": "I don't know you yet, so I have asked an admin to let you in. I will tell you when they decide."}),
        )],
    )?;
    for (admin, _) in spec.config.users.iter().filter(|(_, u)| u.admin) {
        let Ok(admin_chat) = admin.parse::<i64>() else { continue };
        let ask = json!({
            "text": format!("User {who} asks to talk to {agent} through this bot."),
            "buttons": [[{"text": "Let in", "data": format!("pl:{user}")}, {"text": "Refuse", "data": format!("pn:{user}")}]]
        });
        d.store.enqueue_outbox(&spec.name, admin_chat, &[("text", ask)])?;
    }
    d.link.wake_senders();
    Ok(())
}

/// Lets `user` in to `bot` (or refuses them), for `by`.
pub fn decide(d: &Handle, bot: &str, user: i64, approve: bool, by: &str) -> Result<String, Error> {
    let config = d.config();
    let Some(bot_cfg) = config.telegram.bots.get(bot) else {
        return Err(Error::NotFound(format!("no bot {bot:?} in config.json")));
    };
    let Some(agent) = bot_cfg.pairing.clone() else {
        return Err(Error::Conflict(format!("bot {bot} does not pair users (set telegram.bots.{bot}.pairing)")));
    };
    if !d.store.decide_pairing(bot, user, approve, by)? {
        return Err(Error::Conflict(format!("user {user} has no pending request on bot {bot}")));
    }
    if approve {
        let added = d.control.rewrite_config(Box::new(|text| {
            let user = user.to_string();
            crate::config::edit::set(text, &["telegram", "bots", bot, "users", &user], Some(&json!({"agent": agent})))
        }));
        if let Err(e) = added {
            // Not let in after all: the request stays open.
            d.store.decide_pairing_undo(bot, user)?;
            return Err(Error::Internal(format!("user {user} could not be added to config.json: {e}")));
        }
    }
    let outcome = if approve { "approved" } else { "refused" };
    d.audit(by, Some(&agent), "telegram.pairing", outcome, json!({"bot": bot, "user": user}));
    let told = if approve {
        format!("You're in: you can talk to {agent} here now.")
    } else {
        "Sorry, an admin decided not to let you in.".to_owned()
    };
    d.store.enqueue_outbox(bot, user, &[("text", json!({"text": told}))])?;
    d.link.wake_senders();
    Ok(if approve {
        format!("user {user} may now talk to {agent} through bot {bot}")
    } else {
        format!("user {user} was refused on bot {bot}")
    })
}

/// Requests for `choirctl telegram pairings`.
pub fn list(d: &Handle, all: bool) -> Result<PairingList, Error> {
    Ok(PairingList {
        pairings: d
            .store
            .pairings(all)?
            .into_iter()
            .map(|p| PairingInfo {
                bot: p.bot,
                user_id: p.user_id,
                username: p.username,
                status: p.status,
                requested_at: p.requested_at,
                decided_by: p.decided_by,
            })
            .collect(),
    })
}
