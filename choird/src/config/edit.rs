//! Edits of `config.json` that change only what changed. choird rewrites the
//! operator's file when a setting is approved, a tool policy is set or a
//! Telegram user is let in; the value at one path is replaced, inserted or
//! removed in the text itself, so key order, indentation, spacing and every
//! other byte stay as the operator left them.
//!
//! **Invariant:** for any valid JSON text, `set(text, path, v)` parses to the
//! document of `text` with `path` set to `v` (or removed), and the bytes
//! before and after the edited member are those of `text`.

use serde_json::Value;

/// One member of an object in the text: where its key starts, where its
/// value starts and ends.
#[derive(Clone, Copy)]
struct Member {
    key_start: usize,
    value_start: usize,
    value_end: usize,
}

/// The text with the value at `path` (object keys from the root) set to
/// `value`, or removed (`None`). Objects missing on the way are made; a
/// value on the way that is not an object is an error naming the path.
pub fn set(text: &str, path: &[&str], value: Option<&Value>) -> Result<String, String> {
    serde_json::from_str::<Value>(text).map_err(|e| format!("config.json does not parse: {e}"))?;
    let b = text.as_bytes();
    let mut at = skip_ws(b, 0);
    let mut indent = String::new();
    for (depth, key) in path.iter().enumerate() {
        if b.get(at) != Some(&b'{') {
            return Err(format!("config.json: {} is not an object", path[..depth].join(".")));
        }
        let (members, close) = members(text, at)?;
        let found = members.iter().rev().find(|m| key_of(text, m).as_deref() == Some(*key)).copied();
        let member_indent = match members.last() {
            Some(m) => line_indent(text, m.key_start),
            None => format!("{indent}  "),
        };
        let Some(m) = found else {
            let Some(value) = value else { return Ok(text.to_owned()) };
            // Made from the rest of the path, inserted as the object's last member.
            let mut made = value.clone();
            for k in path[depth + 1..].iter().rev() {
                made = Value::Object([((*k).to_owned(), made)].into_iter().collect());
            }
            let member = format!("{}: {}", quoted(key), pretty(&made, &member_indent));
            return Ok(match members.last() {
                Some(last) => {
                    format!("{},\n{member_indent}{member}{}", &text[..last.value_end], &text[last.value_end..])
                }
                None => format!("{}{{\n{member_indent}{member}\n{indent}}}{}", &text[..at], &text[close + 1..]),
            });
        };
        if depth + 1 < path.len() {
            at = m.value_start;
            indent = member_indent;
            continue;
        }
        return Ok(match value {
            Some(v) => format!("{}{}{}", &text[..m.value_start], pretty(v, &member_indent), &text[m.value_end..]),
            None => remove(text, &members, m),
        });
    }
    // An empty path is the whole document.
    match value {
        Some(v) => Ok(format!("{}\n", pretty(v, ""))),
        None => Err("config.json cannot be removed".into()),
    }
}

/// The text without member `m` of an object whose members are `all`: with
/// the comma before it (or, for the first, the one after it) and the line
/// it stood on.
fn remove(text: &str, all: &[Member], m: Member) -> String {
    let i = all.iter().position(|x| x.key_start == m.key_start).unwrap_or(0);
    if i > 0 {
        // From the end of the previous value (its comma included).
        let from = all[i - 1].value_end;
        format!("{}{}", &text[..from], &text[m.value_end..])
    } else if let Some(next) = all.get(1) {
        // From this key to the next key.
        format!("{}{}", &text[..m.key_start], &text[next.key_start..])
    } else {
        // The only member: the object becomes `{}`.
        let open = text[..m.key_start].rfind('{').unwrap_or(m.key_start);
        let close = m.value_end + text[m.value_end..].find('}').unwrap_or(0);
        format!("{}{{}}{}", &text[..open], &text[close + 1..])
    }
}

/// `value` as pretty JSON whose later lines are indented by `indent`.
fn pretty(value: &Value, indent: &str) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.replace('\n', &format!("\n{indent}"))
}

fn quoted(key: &str) -> String {
    Value::String(key.to_owned()).to_string()
}

/// The spaces and tabs before `at` on its line.
fn line_indent(text: &str, at: usize) -> String {
    let start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    text[start..at].chars().take_while(|c| *c == ' ' || *c == '\t').collect()
}

fn key_of(text: &str, m: &Member) -> Option<String> {
    let end = scan_string(text.as_bytes(), m.key_start).ok()?;
    serde_json::from_str(&text[m.key_start..end]).ok()
}

/// The members of the object opening at `open`, and where it closes.
fn members(text: &str, open: usize) -> Result<(Vec<Member>, usize), String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return Ok((out, i));
    }
    loop {
        let key_start = i;
        i = skip_ws(b, scan_string(b, i)?);
        if b.get(i) != Some(&b':') {
            return Err("config.json: a key without a value".into());
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = scan_value(b, value_start)?;
        out.push(Member { key_start, value_start, value_end });
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Ok((out, i)),
            _ => return Err("config.json: an object is not closed".into()),
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The end (past the closing quote) of the string starting at `i`.
fn scan_string(b: &[u8], i: usize) -> Result<usize, String> {
    if b.get(i) != Some(&b'"') {
        return Err("config.json: a string was expected".into());
    }
    let mut j = i + 1;
    while let Some(&c) = b.get(j) {
        match c {
            b'\\' => j += 2,
            b'"' => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err("config.json: a string is not closed".into())
}

/// The end of the value starting at `i`.
fn scan_value(b: &[u8], i: usize) -> Result<usize, String> {
    match b.get(i) {
        Some(b'"') => scan_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&c) = b.get(j) {
                match c {
                    b'"' => {
                        j = scan_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err("config.json: a value is not closed".into())
        }
        Some(_) => {
            let mut j = i;
            while b.get(j).is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace()) {
                j += 1;
            }
            Ok(j)
        }
        None => Err("config.json ends where a value was expected".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The operator's layout: keys in their order, two spaces, a compact
    /// inner object, a string holding braces and quotes.
    const OPERATOR: &str = r#"{
  "runtime": "process",
  "llm": { "edge": { "model": "m", "base_url": "http://x/{v1}" } },
  "agents": {
    "zed": { "autostart": true },
    "ops": {
      "max_steps": 16,
      "note": "a \"quoted\" } brace"
    }
  }
}
"#;

    fn doc(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn regression_an_approved_setting_rewrote_the_whole_file_with_its_keys_sorted() {
        let out = set(OPERATOR, &["agents", "ops", "max_steps"], Some(&json!(20))).unwrap();
        assert_eq!(out, OPERATOR.replace("\"max_steps\": 16", "\"max_steps\": 20"), "only the value changed");
        // Negative control: what choird did before (parse, change, print) changes the layout.
        let mut d = doc(OPERATOR);
        d["agents"]["ops"]["max_steps"] = json!(20);
        assert_ne!(serde_json::to_string_pretty(&d).unwrap() + "\n", out);
        assert_eq!(doc(&out), d, "the same document");
    }

    #[test]
    fn missing_keys_are_inserted_last_with_the_siblings_indent_and_objects_made_on_the_way() {
        let out = set(OPERATOR, &["agents", "ops", "tools"], Some(&json!({"deny": ["choir.exec"]}))).unwrap();
        let mut want = doc(OPERATOR);
        want["agents"]["ops"]["tools"] = json!({"deny": ["choir.exec"]});
        assert_eq!(doc(&out), want);
        assert!(out.contains("\"a \\\"quoted\\\" } brace\",\n      \"tools\": {\n        \"deny\": ["), "{out}");
        assert!(out.starts_with("{\n  \"runtime\": \"process\",\n  \"llm\": { \"edge\""), "the rest untouched: {out}");

        let out = set(OPERATOR, &["telegram", "bots", "main", "users", "42"], Some(&json!({"agent": "ops"}))).unwrap();
        let mut want = doc(OPERATOR);
        want["telegram"] = json!({"bots": {"main": {"users": {"42": {"agent": "ops"}}}}});
        assert_eq!(doc(&out), want);

        let out = set("{\"agents\": {}}", &["agents", "a", "x"], Some(&json!(1))).unwrap();
        assert_eq!(doc(&out), json!({"agents": {"a": {"x": 1}}}));
    }

    #[test]
    fn removal_takes_the_member_and_its_comma_wherever_it_stands() {
        for (path, want) in [
            (vec!["agents", "zed"], json!({"ops": {"max_steps": 16, "note": "a \"quoted\" } brace"}})),
            (vec!["agents", "ops"], json!({"zed": {"autostart": true}})),
        ] {
            let out = set(OPERATOR, &path, None).unwrap();
            assert_eq!(doc(&out)["agents"], want, "{out}");
        }
        let out = set(OPERATOR, &["agents", "zed", "autostart"], None).unwrap();
        assert_eq!(doc(&out)["agents"]["zed"], json!({}), "{out}");
        assert_eq!(set(OPERATOR, &["agents", "nobody", "tools"], None).unwrap(), OPERATOR, "nothing to remove");
    }

    #[test]
    fn a_duplicate_key_is_edited_where_json_readers_take_it_the_last() {
        let text = "{\"a\": 1, \"a\": 2}";
        let out = set(text, &["a"], Some(&json!(3))).unwrap();
        assert_eq!(out, "{\"a\": 1, \"a\": 3}");
        assert_eq!(doc(&out)["a"], 3);
    }

    #[test]
    fn a_path_through_a_value_that_is_no_object_is_refused() {
        let e = set(OPERATOR, &["runtime", "x"], Some(&json!(1))).unwrap_err();
        assert!(e.contains("runtime is not an object"), "{e}");
        assert!(set("{", &["a"], Some(&json!(1))).unwrap_err().contains("does not parse"));
    }
}
