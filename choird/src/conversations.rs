//! Conversation names, and where a conversation leads. Every message of an
//! agent belongs to a conversation: `cli` and other free names for
//! `choirctl chat`, `tg:<bot>:<chat>` for a Telegram chat.

/// The conversation of a Telegram chat.
pub fn telegram(bot: &str, chat: i64) -> String {
    format!("tg:{bot}:{chat}")
}

/// The Telegram (bot, chat) a conversation leads to, if it is one.
pub fn telegram_chat(conversation: &str) -> Option<(String, i64)> {
    let rest = conversation.strip_prefix("tg:")?;
    let (bot, chat) = rest.split_once(':')?;
    Some((bot.to_owned(), chat.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telegram_conversations_round_trip() {
        assert_eq!(telegram_chat(&telegram("main", -1001)), Some(("main".into(), -1001)));
        assert_eq!(telegram_chat("cli"), None);
        assert_eq!(telegram_chat("tg:main:x"), None);
    }
}
