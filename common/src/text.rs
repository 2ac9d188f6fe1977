//! Text from a possibly hostile source, made safe to show: on an operator's
//! terminal (choirctl), in a log line (choird, choir-agent) or in an audit
//! record. One definition of what is escaped, for every place that shows it.
//!
//! **Invariant:** the output of [`clean`] holds no control character but
//! newline and tab, no C1 control and no bidi or invisible formatting
//! character; the output of [`one_line`] holds no newline or tab either, so
//! it cannot start a line that looks like the program's own.

/// Whether `c` must never be shown as is.
fn hostile(c: char, keep_lines: bool) -> bool {
    (c.is_control() && !(keep_lines && (c == '\n' || c == '\t')))
        || matches!(c,
            '\u{200b}'..='\u{200f}' // zero-width, LRM, RLM
            | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{061c}' | '\u{feff}')
}

fn escape(text: &str, keep_lines: bool, max_chars: Option<usize>) -> String {
    let mut out = String::with_capacity(text.len().min(4096) + 16);
    for (i, c) in text.chars().enumerate() {
        if max_chars == Some(i) {
            out.push('…');
            break;
        }
        if !hostile(c, keep_lines) {
            out.push(c);
        } else if c == '\n' {
            out.push_str("\\n");
        } else if c == '\t' {
            out.push_str("\\t");
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    out
}

/// Whether `c` is a character a reader would not see (an invisible or
/// direction-changing one, or a control but newline and tab).
pub fn hidden(c: char) -> bool {
    hostile(c, true)
}

/// `text` with every hostile character escaped; newlines and tabs kept.
pub fn clean(text: &str) -> String {
    if !text.chars().any(|c| hostile(c, true)) {
        return text.to_owned();
    }
    escape(text, true, None)
}

/// `text` for a place inside one line: [`clean`], and newlines and tabs
/// escaped too.
pub fn one_line(text: &str) -> String {
    if !text.chars().any(|c| hostile(c, false)) {
        return text.to_owned();
    }
    escape(text, false, None)
}

/// Serialized JSON made safe to show, still JSON: each hostile character
/// written as a `\uXXXX` escape. serde_json escapes C0 controls itself but
/// writes C1 controls, DEL and bidi or invisible characters as they are;
/// those can only stand inside a string, where the escape means the same
/// character, so the text parses to the same value. ([`clean`] would write
/// `\u{202e}`, which no JSON parser reads.) Every hostile character is in
/// the Basic Multilingual Plane, so one escape each is enough.
pub fn clean_json(json: &str) -> String {
    if !json.chars().any(|c| hostile(c, true)) {
        return json.to_owned();
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if hostile(c, true) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// [`one_line`], at most `max` characters (then `…`): for a string a
/// client chose, quoted in a message, a log line or an audit record.
pub fn clipped(text: &str, max: usize) -> String {
    escape(text, false, Some(max))
}

/// An error and its causes in one line, each said once: a cause whose
/// text the message before it already holds (an error that prints its
/// source, then the source again) is left out.
pub fn causes_once<'a>(chain: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut out = String::new();
    for cause in chain {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// `2d 3h`-style durations: the two largest units that are not zero (`45s`,
/// `3m 20s`, `5h 2m`, `12d 4h`).
pub fn human_duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    let parts = [(s / 86_400, "d"), (s / 3600 % 24, "h"), (s / 60 % 60, "m"), (s % 60, "s")];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut out = format!("{}{}", parts[first].0, parts[first].1);
    if let Some((n, unit)) = parts.get(first + 1).filter(|(n, _)| *n > 0) {
        out.push_str(&format!(" {n}{unit}"));
    }
    out
}

/// `1.5 GiB`-style sizes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `text` cut to at most `max_chars` characters (on a character boundary),
/// with a note saying where when it was cut; and whether it was.
pub fn cap_with_note(text: &str, max_chars: usize) -> (String, bool) {
    match text.char_indices().nth(max_chars) {
        Some((i, _)) => (format!("{}\n[… cut at {max_chars} characters]", &text[..i]), true),
        None => (text.to_owned(), false),
    }
}

/// `text` with each U+0000 written as the six characters `\u0000`.
/// PostgreSQL's `text` and `jsonb` cannot hold U+0000, so text from outside
/// (a Telegram update, an agent's reply) is stored this way or not at all;
/// refusing it instead would let one character stall whatever stores it.
pub fn nul_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\\u0000"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Every string of `value`, object keys included, [`nul_escaped`]: the
/// value can then be stored as `jsonb`. Recursion is bounded by the depth
/// the value was parsed with (serde_json's limit of 128).
pub fn escape_nul_in(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\0') => *s = nul_escaped(s).into_owned(),
        Value::Array(items) => items.iter_mut().for_each(escape_nul_in),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                *map = std::mem::take(map).into_iter().map(|(k, v)| (nul_escaped(&k).into_owned(), v)).collect();
            }
            map.values_mut().for_each(escape_nul_in);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_os_error_a_message_already_holds_is_said_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "/x/config.json: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::from_raw_os_error(2));
        let chain: Vec<&(dyn std::error::Error + 'static)> = vec![&e, &e.0];
        let said = causes_once(chain);
        assert_eq!(said.matches("No such file").count(), 1, "{said}");
    }

    #[test]
    fn durations_read_as_their_two_largest_units() {
        let d = |s| human_duration(std::time::Duration::from_secs(s));
        assert_eq!(
            [d(0), d(45), d(200), d(3 * 3600 + 120), d(2 * 86_400 + 3 * 3600 + 59)],
            ["0s", "45s", "3m 20s", "3h 2m", "2d 3h"]
        );
        assert_eq!(d(86_400 + 5), "1d", "a zero second unit is left out");
    }

    #[test]
    fn nul_is_escaped_in_text_and_in_every_string_and_key_of_a_json_value() {
        assert_eq!(nul_escaped("a\0b\0"), "a\\u0000b\\u0000");
        assert!(matches!(nul_escaped("plain"), std::borrow::Cow::Borrowed("plain")));
        let mut v = serde_json::json!({"k\0": ["x\0", {"deep": "y\0z"}, 1, null], "ok": "fine"});
        escape_nul_in(&mut v);
        assert_eq!(v, serde_json::json!({"k\\u0000": ["x\\u0000", {"deep": "y\\u0000z"}, 1, null], "ok": "fine"}));
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(human_bytes(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }

    #[test]
    fn text_is_cut_on_a_character_boundary_and_says_so() {
        assert_eq!(cap_with_note("héllo", 10), ("héllo".to_owned(), false));
        let (t, cut) = cap_with_note("héllo wörld", 4);
        assert!(cut && t.starts_with("héll\n[… cut at 4"), "{t}");
    }

    #[test]
    fn escapes_bidi_and_terminal_controls_but_keeps_lines_where_asked() {
        assert_eq!(clean("a\u{1b}[2Jb\u{202e}c\nd\te"), "a\\u{1b}[2Jb\\u{202e}c\nd\te");
        assert_eq!(one_line("reason\nAPPROVED by admin"), "reason\\nAPPROVED by admin");
        assert_eq!(clean("\u{9b}31m plain"), "\\u{9b}31m plain");
        assert_eq!(clean("naïve 日本"), "naïve 日本");
        assert_eq!(clipped("abcdef", 3), "abc…");
    }

    #[test]
    fn json_is_cleaned_into_json_that_means_the_same() {
        let v = serde_json::json!({"text": "a\u{202e}b\u{9b}c\u{7f}d\u{feff}\u{1b}[2J\nnaïve", "n": 1});
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let shown = clean_json(&pretty);
        assert!(!shown.chars().any(|c| hostile(c, true)), "{shown}");
        assert!(shown.contains(r"a\u202eb\u009bc\u007fd\ufeff\u001b[2J\nnaïve"), "{shown}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).unwrap(), v);
        assert!(serde_json::from_str::<serde_json::Value>(&clean(&pretty)).is_err(), "why clean_json exists");
        assert_eq!(clean_json("{\n  \"plain\": true\n}"), "{\n  \"plain\": true\n}");
    }
}
