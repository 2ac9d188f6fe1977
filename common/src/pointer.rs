//! JSON pointers with wildcards, the one way a policy rule, a manifest's
//! argument roles and its trusted output fields name values inside a JSON
//! document. A pointer is RFC 6901's (`/to/0`, `~1` for `/`, `~0` for `~`,
//! `""` for the whole document) plus two wildcard segments:
//!
//! - `*` — every element of an array or value of an object, one level;
//! - `**` — any number of levels, zero included (`/**` is every value
//!   anywhere; `/items/**/address` is an `address` key at any depth under
//!   `items`), so a rule need not guess how deep a value is nested.
//!
//! **The values a pointer names** ([`values_at`]) are its leaves as strings
//! (numbers and booleans in their JSON form); an array or object where the
//! pointer ends stands for every leaf inside it, at any depth. At most
//! [`MAX_VALUES`] are collected: a caller that gets exactly that many must
//! treat the rest as unchecked.

use serde_json::Value;

/// Most values one pointer expansion collects.
pub const MAX_VALUES: usize = 256;

/// Most segments a pointer may have.
const MAX_SEGMENTS: usize = 32;

/// The segments of a pointer (`""` is the whole document, no segment).
pub fn split(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("{p:?} is not a JSON pointer (it starts with '/')"));
    };
    let segments: Vec<String> = rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(format!("{p:?} has more than {MAX_SEGMENTS} segments"));
    }
    Ok(segments)
}

/// Escapes one key for a concrete pointer.
fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// Whether a JSON Schema can hold a value at `segments` (a `**` can hold
/// anything below an object or array schema).
pub fn schema_has(schema: &Value, segments: &[String]) -> bool {
    let Some((first, rest)) = segments.split_first() else { return true };
    if first == "**" {
        return schema_has(schema, rest) || container(schema);
    }
    if let Some(items) = schema.get("items") {
        if first == "*" || first.parse::<usize>().is_ok() {
            return schema_has(items, rest);
        }
    }
    match schema.get("properties").and_then(Value::as_object) {
        Some(props) if first == "*" => props.values().any(|p| schema_has(p, rest)),
        Some(props) => match props.get(first) {
            Some(p) => schema_has(p, rest),
            // Keys beyond the named ones, if the schema takes them.
            None => schema.get("additionalProperties").is_some_and(|a| a.is_object() || a == &Value::Bool(true)),
        },
        // A schema without named properties takes what it takes.
        None => {
            !matches!(schema.get("type").and_then(Value::as_str), Some("string" | "number" | "integer" | "boolean"))
        }
    }
}

fn container(schema: &Value) -> bool {
    schema.get("properties").is_some()
        || schema.get("items").is_some()
        || !matches!(schema.get("type").and_then(Value::as_str), Some("string" | "number" | "integer" | "boolean"))
}

/// Appends the leaves at `segments` under `v` (whose concrete pointer is
/// `at`) to `out` as (concrete pointer, value); see the module's rule.
pub fn values_at(v: &Value, at: &str, segments: &[String], out: &mut Vec<(String, String)>) {
    if out.len() >= MAX_VALUES {
        return;
    }
    match segments.split_first() {
        None => leaves(v, at, out),
        Some((first, rest)) if first == "**" => {
            // Zero levels, then one level more with `**` kept.
            values_at(v, at, rest, out);
            match v {
                Value::Array(items) => {
                    for (i, x) in items.iter().enumerate() {
                        values_at(x, &format!("{at}/{i}"), segments, out);
                    }
                }
                Value::Object(map) => {
                    for (k, x) in map {
                        values_at(x, &format!("{at}/{}", escape(k)), segments, out);
                    }
                }
                _ => {}
            }
        }
        Some((first, rest)) => match v {
            Value::Array(items) if first == "*" => {
                for (i, x) in items.iter().enumerate() {
                    values_at(x, &format!("{at}/{i}"), rest, out);
                }
            }
            Value::Object(map) if first == "*" => {
                for (k, x) in map {
                    values_at(x, &format!("{at}/{}", escape(k)), rest, out);
                }
            }
            Value::Array(items) => {
                if let Some(x) = first.parse::<usize>().ok().and_then(|i| items.get(i)) {
                    values_at(x, &format!("{at}/{first}"), rest, out);
                }
            }
            Value::Object(map) => {
                if let Some(x) = map.get(first.as_str()) {
                    values_at(x, &format!("{at}/{}", escape(first)), rest, out);
                }
            }
            _ => {}
        },
    }
}

/// Every leaf of `v`, at any depth.
fn leaves(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    if out.len() >= MAX_VALUES {
        return;
    }
    match v {
        Value::String(s) => push(out, at, s.clone()),
        Value::Number(_) | Value::Bool(_) => push(out, at, v.to_string()),
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                leaves(x, &format!("{at}/{i}"), out);
            }
        }
        Value::Object(map) => {
            for (k, x) in map {
                leaves(x, &format!("{at}/{}", escape(k)), out);
            }
        }
        Value::Null => {}
    }
}

/// Adds a value once (`**` can reach one leaf by several paths).
fn push(out: &mut Vec<(String, String)>, at: &str, value: String) {
    if !out.iter().any(|(p, _)| p == at) {
        out.push((at.to_owned(), value));
    }
}

/// The leaves at pointer `p` (already split) in `v`.
pub fn collect(v: &Value, segments: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    values_at(v, "", segments, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(v: &Value, p: &str) -> Vec<(String, String)> {
        collect(v, &split(p).unwrap())
    }

    #[test]
    fn a_recursive_wildcard_finds_a_value_at_any_depth() {
        let v = json!({"order": {"ship": {"to": {"address": "x@evil.test"}}, "note": "hi"}, "n": 3});
        assert_eq!(at(&v, "/**/address"), vec![("/order/ship/to/address".into(), "x@evil.test".into())]);
        assert_eq!(at(&v, "/order/**/address").len(), 1);
        let all = at(&v, "/**");
        assert_eq!(all.len(), 3, "every leaf once: {all:?}");
        assert!(all.contains(&("/n".into(), "3".into())));
        // The negative control: one level of `*` does not reach it.
        assert!(at(&v, "/*/address").is_empty());
        assert!(at(&v, "/order/*/address").is_empty());
    }

    #[test]
    fn a_container_at_the_end_stands_for_its_leaves_and_wildcards_expand() {
        let v = json!({"to": ["a@x.test", ["b@x.test"]], "m": {"k/1": "v"}});
        assert_eq!(at(&v, "/to").len(), 2);
        assert_eq!(at(&v, "/to/*"), vec![("/to/0".into(), "a@x.test".into()), ("/to/1/0".into(), "b@x.test".into())]);
        assert_eq!(at(&v, "/m/k~11"), vec![("/m/k~11".into(), "v".into())]);
        assert!(split("to").is_err());
        assert!(split(&"/a".repeat(40)).is_err());
    }

    #[test]
    fn a_schema_is_asked_whether_it_can_hold_a_pointer() {
        let s = json!({"type": "object", "properties": {"to": {"type": "array", "items": {"type": "string"}},
            "order": {"type": "object"}}});
        let has = |p: &str| schema_has(&s, &split(p).unwrap());
        assert!(has("/to/*") && has("/to/0") && has("/order/x/y") && has("/**") && has("/**/address"));
        assert!(!has("/recipient") && !has("/to/*/x"));
    }

    #[test]
    fn expansion_is_bounded() {
        let v = json!({"a": (0..1000).map(|i| json!({"b": i})).collect::<Vec<_>>()});
        assert_eq!(at(&v, "/**").len(), MAX_VALUES);
    }
}
