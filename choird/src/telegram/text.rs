//! Text for Telegram: splitting an answer into messages within the Bot API's
//! limit, and keeping bot tokens out of anything logged.
//!
//! Answers are sent as plain text (no `parse_mode`), so nothing the model
//! writes can break the formatting or be refused by Telegram's entity parser.

/// The Bot API's limit for one message's text, in UTF-16 code units.
pub const LIMIT: usize = 4096;

/// Splits `text` into pieces of at most [`LIMIT`] UTF-16 units, cutting at
/// the last paragraph break, else line break, else space before the limit
/// (a hard cut only when a piece has none). The separator at a cut is
/// dropped; nothing else is lost, and order is kept. Empty text gives one
/// placeholder, since Telegram refuses empty messages.
pub fn split(text: &str) -> Vec<String> {
    split_at(text, LIMIT)
}

fn split_at(text: &str, limit: usize) -> Vec<String> {
    let text = text.trim_end();
    if text.trim().is_empty() {
        return vec!["(empty answer)".to_owned()];
    }
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        // Byte index where `limit` UTF-16 units end.
        let mut units = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            if units + c.len_utf16() > limit {
                end = i;
                break;
            }
            units += c.len_utf16();
        }
        if end == rest.len() {
            out.push(rest.to_owned());
            break;
        }
        let window = &rest[..end];
        let (cut, skip) = ["\n\n", "\n", " "]
            .iter()
            .find_map(|sep| window.rfind(sep).filter(|&i| i > 0).map(|i| (i, sep.len())))
            .unwrap_or((end, 0));
        out.push(rest[..cut].to_owned());
        rest = &rest[cut + skip..];
    }
    out
}

/// `text` with every occurrence of `token` masked, for logs and errors.
pub fn mask(text: &str, token: &str) -> String {
    if token.is_empty() {
        return text.to_owned();
    }
    text.replace(token, "<token>")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<&str> {
        s.split_whitespace().collect()
    }

    #[test]
    fn long_text_is_cut_at_paragraphs_then_lines_then_spaces_and_nothing_is_lost() {
        let para = "word ".repeat(300).trim_end().to_owned(); // 1499 chars
        let text = format!("{para}\n\n{para}\n\n{para}\n{para}");
        let parts = split(&text);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= LIMIT));
        assert_eq!(parts.len(), 2);
        assert!(parts[0].ends_with("word"), "cut at the paragraph break");
        let joined = parts.join(" ");
        assert_eq!(words(&joined), words(&text));
        let no_breaks = "x".repeat(9000);
        let parts = split(&no_breaks);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [4096, 4096, 808]);
    }

    #[test]
    fn limits_count_utf16_units_and_never_split_a_character() {
        let emoji = "😀".repeat(3000); // 2 units each
        let parts = split(&emoji);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= LIMIT));
        assert_eq!(parts.concat(), emoji);
        assert_eq!(split("   "), ["(empty answer)"]);
        assert_eq!(split_at("abc def", 4), ["abc", "def"]);
    }

    #[test]
    fn tokens_are_masked() {
        assert_eq!(
            mask("GET http://x/bot123:ABC/getUpdates failed", "123:ABC"),
            "GET http://x/bot<token>/getUpdates failed"
        );
    }
}
