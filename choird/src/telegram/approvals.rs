//! Proposals in chat: the question (with the exact change and its buttons)
//! to the admins of the proposing agent, and its edit once decided.

use serde_json::json;

use super::bots::{bots, Handle};
use crate::config::BotConfig;

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

/// Sends `text` to every admin of `agent` on every bot that serves it.
pub fn tell_admins(d: &Handle, agent: &choir_common::ids::AgentId, text: &str) {
    for spec in bots(d) {
        if !serves(&spec.config, agent.as_str()) {
            continue;
        }
        for (user, _) in spec.config.users.iter().filter(|(_, u)| u.admin && u.agent == *agent) {
            let Ok(chat) = user.parse::<i64>() else { continue };
            if let Err(e) = d.store.enqueue_outbox(&spec.name, chat, &[("text", serde_json::json!({"text": text}))]) {
                log::error!("telegram: cannot queue a notice for {}: {e}", spec.name);
            }
        }
    }
    d.link.wake_senders();
}

/// Sends `text` at once to every admin on every bot, through the Bot API
/// itself, not the outbox: for what must reach them while the database
/// (where the outbox lives) is down. Each admin once, however many agents
/// they administer; a failure is logged (its text without the token).
pub fn alert_admins_directly(d: &Handle, text: &str) {
    use frankenstein::TelegramApi;
    for spec in bots(d) {
        let admins: std::collections::BTreeSet<i64> =
            spec.config.users.iter().filter(|(_, u)| u.admin).filter_map(|(user, _)| user.parse().ok()).collect();
        if admins.is_empty() {
            continue;
        }
        let bot = super::bots::client(&spec.api_base, &spec.token, std::time::Duration::from_secs(10));
        for chat in admins {
            let p = frankenstein::methods::SendMessageParams::builder().chat_id(chat).text(text).build();
            if let Err(e) = bot.send_message(&p) {
                log::error!(
                    "telegram: cannot alert an admin of bot {}: {:?}",
                    spec.name,
                    super::bots::classify(&e, &spec.token)
                );
            }
        }
    }
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
        info.reason.lines().map(|l| choir_common::text::clipped(l, 600)).collect::<Vec<_>>().join("\n"),
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
