//! Every problem of a `config.json` at once, in plain words. serde stops at
//! the first error; here each error's value is taken out of a copy of the
//! document and the rest is read again, so one start names every unknown
//! field and every value of the wrong kind (up to [`MAX_PROBLEMS`]). Each
//! is worded for an operator — "expected a whole number, found the string
//! "lots"", "unknown field `agnets`; did you mean `agents`?" — with the
//! field's dotted path, never a `?` or `.` standing in for one.

use serde_json::Value;

/// Most problems one reading names.
pub const MAX_PROBLEMS: usize = 20;

/// One problem: the field's dotted path and what is wrong with it.
pub type Problem = (String, String);

/// Reads `doc` as a `T`, or names every problem found.
pub fn read<T: serde::de::DeserializeOwned>(mut doc: Value) -> Result<T, Vec<Problem>> {
    let mut problems: Vec<Problem> = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, T>(&doc) {
            Ok(t) if problems.is_empty() => return Ok(t),
            Ok(_) => return Err(problems),
            Err(e) => {
                let segments: Vec<Option<String>> = e
                    .path()
                    .iter()
                    .map(|s| match s {
                        serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                        serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                        serde_path_to_error::Segment::Enum { variant } => Some(variant.clone()),
                        serde_path_to_error::Segment::Unknown => None,
                    })
                    .collect();
                let message = e.into_inner().to_string();
                let field = shown(&segments);
                let removable = !message.starts_with("missing field");
                problems.push((field, plain(&message)));
                let taken = removable && take(&mut doc, &segments);
                if !taken || problems.len() >= MAX_PROBLEMS {
                    return Err(problems);
                }
            }
        }
    }
}

/// A path as the operator reads it: `agents.ops.max_steps_per_turn`, or
/// `the top level`.
fn shown(segments: &[Option<String>]) -> String {
    let known: Vec<&str> = segments.iter().flatten().map(String::as_str).collect();
    if known.is_empty() {
        "the top level".into()
    } else {
        known.join(".")
    }
}

/// Takes the value at `segments` out of `doc`; false when the path cannot
/// be followed (a segment unknown).
fn take(doc: &mut Value, segments: &[Option<String>]) -> bool {
    let Some((last, parents)) = segments.split_last() else { return false };
    let mut at = doc;
    for s in parents {
        let Some(s) = s else { return false };
        at = match at {
            Value::Object(m) => match m.get_mut(s) {
                Some(v) => v,
                None => return false,
            },
            Value::Array(a) => match s.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (at, last) {
        (Value::Object(m), Some(k)) => m.remove(k).is_some(),
        (Value::Array(a), Some(i)) => match i.parse::<usize>() {
            Ok(i) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// serde's message in an operator's words.
pub fn plain(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!("expected {}, found {}", kind(expected), found_as(found));
        }
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!("expected {}, found {}", kind(expected), found_as(found));
        }
    }
    for (prefix, what) in [("unknown field ", "field"), ("unknown variant ", "value")] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let (name, choices) = match rest.split_once(", expected ") {
                Some((n, c)) => (n.trim_matches('`'), c),
                None => (rest.split(',').next().unwrap_or(rest).trim_matches('`'), ""),
            };
            let known: Vec<&str> = choices
                .trim_start_matches("one of ")
                .split(", ")
                .flat_map(|c| c.split(" or "))
                .map(|c| c.trim_matches('`'))
                .filter(|c| !c.is_empty())
                .collect();
            return match choir_common::tool_policy::closest(name, known.iter().copied()) {
                Some(m) => format!("unknown {what} `{name}`; did you mean `{m}`?"),
                None if known.is_empty() => format!("unknown {what} `{name}`"),
                None => format!("unknown {what} `{name}` (known: {})", known.join(", ")),
            };
        }
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        return format!("the field {rest} is missing");
    }
    message.to_owned()
}

/// What serde expected, in words.
fn kind(expected: &str) -> String {
    let e = expected.trim();
    match e {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number (0 or more)".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "a list".into(),
        "a map" => "an object".into(),
        _ if e.starts_with("struct ") || e.starts_with("a map") => "an object".into(),
        _ if e.starts_with("a string") => "a string".into(),
        _ => e.to_owned(),
    }
}

/// What serde found, in words.
fn found_as(found: &str) -> String {
    let f = found.trim();
    if let Some(s) = f.strip_prefix("string ") {
        return format!("the string {s}");
    }
    for prefix in ["integer ", "floating point ", "boolean "] {
        if let Some(n) = f.strip_prefix(prefix) {
            return n.trim_matches('`').to_owned();
        }
    }
    match f {
        "map" => "an object".into(),
        "sequence" => "a list".into(),
        "null" | "unit value" => "null".into(),
        _ => f.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_read_in_plain_words() {
        assert_eq!(
            plain("invalid type: string \"lots\", expected u32"),
            "expected a whole number (0 or more), found the string \"lots\""
        );
        assert_eq!(plain("invalid type: integer `1`, expected struct LlmConfig"), "expected an object, found 1");
        assert_eq!(plain("invalid value: integer `-1`, expected u64"), "expected a whole number (0 or more), found -1");
        assert_eq!(
            plain("unknown field `agnets`, expected one of `runtime`, `agents`, `llm`"),
            "unknown field `agnets`; did you mean `agents`?"
        );
        assert_eq!(
            plain("unknown variant `vm`, expected `docker` or `process`"),
            "unknown value `vm` (known: docker, process)"
        );
        assert_eq!(
            plain("unknown variant `dockr`, expected `docker` or `process`"),
            "unknown value `dockr`; did you mean `docker`?"
        );
        assert_eq!(plain("missing field `llm`"), "the field `llm` is missing");
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Shape {
        #[serde(default)]
        steps: u32,
        #[serde(default)]
        inner: Inner,
    }

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        #[serde(default)]
        on: bool,
    }

    #[test]
    fn every_problem_is_named_at_once_with_its_path() {
        let doc = serde_json::json!({"steps": "lots", "stpes": 1, "inner": {"on": "yes", "of": 1}});
        let problems = read::<Shape>(doc).unwrap_err();
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(problems.len(), 4, "{problems:?}");
        for f in ["steps", "stpes", "inner.on", "inner.of"] {
            assert!(fields.contains(&f), "{f}: {problems:?}");
        }
        assert!(read::<Shape>(serde_json::json!({"steps": 3})).is_ok());
        // Bounded: a document of nothing but unknown fields stops at the limit.
        let many: serde_json::Map<String, Value> = (0..50).map(|i| (format!("x{i}"), Value::from(i))).collect();
        assert_eq!(read::<Shape>(Value::Object(many)).unwrap_err().len(), MAX_PROBLEMS);
    }
}
