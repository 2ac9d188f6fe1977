//! What an MCP tool's answer becomes, whoever called the server (the agent
//! over stdio, choird over HTTP): one result object, its text capped, every
//! part a model cannot read replaced by a note, and where it came from
//! (server, its version, the pin's sha256) recorded in the committed
//! result. The whole of it is untrusted output: the manifest says so, and
//! the arbiter wraps it wherever it enters a model's context.

use serde_json::{json, Value};

/// Most characters of text kept from one answer.
pub const MAX_TEXT: usize = 64 * 1024;

/// Most bytes of structured content kept (as JSON) from one answer.
const MAX_STRUCTURED: usize = 64 * 1024;

/// The result object of a `tools/call` answer.
pub fn shape(server: &str, tool: &str, info: &Value, pin_sha256: &str, answer: Value) -> Value {
    let mut text = String::new();
    let mut omitted = Vec::new();
    for part in answer["content"].as_array().into_iter().flatten() {
        match part["type"].as_str() {
            Some("text") => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(part["text"].as_str().unwrap_or_default());
            }
            Some(other) => omitted.push(crate::text::clipped(other, 20)),
            None => omitted.push("unknown".to_owned()),
        }
        if text.len() > MAX_TEXT * 4 {
            break;
        }
    }
    let (text, cut) = crate::text::cap_with_note(&text, MAX_TEXT);
    let is_error = answer["isError"].as_bool().unwrap_or(false);
    let mut out = json!({
        "summary": if is_error {
            format!("mcp.{server}: {tool} reported an error")
        } else {
            format!("mcp.{server}: {tool} answered")
        },
        "content": text,
        "mcp": {
            "server": server,
            "server_version": crate::text::clipped(info["version"].as_str().unwrap_or_default(), 40),
            "pin_sha256": pin_sha256,
        },
    });
    if is_error {
        out["is_error"] = json!(true);
    }
    if cut {
        out["truncated"] = json!(true);
    }
    if !omitted.is_empty() {
        out["omitted_parts"] = json!(omitted);
    }
    if let Some(s) = answer.get("structuredContent").filter(|s| s.is_object()) {
        if s.to_string().len() <= MAX_STRUCTURED {
            out["structured"] = s.clone();
        } else {
            out["structured_omitted"] = json!("larger than 64 KiB");
        }
    }
    out
}

/// The result object of what a grant adds (`resources/list`,
/// `resources/read`, `prompts/list`, `prompts/get`): the server's answer as
/// JSON text, binary (`blob`) fields replaced by a note, capped like a
/// tool's text. Untrusted like any MCP result.
pub fn shape_granted(server: &str, method: &str, info: &Value, answer: Value) -> Value {
    fn strip_blobs(v: &mut Value, omitted: &mut usize) {
        match v {
            Value::Object(o) => {
                if let Some(b) = o.get_mut("blob") {
                    *omitted += 1;
                    *b = json!(format!("(binary, {} base64 characters, omitted)", b.as_str().map_or(0, str::len)));
                }
                o.values_mut().for_each(|x| strip_blobs(x, omitted));
            }
            Value::Array(a) => a.iter_mut().for_each(|x| strip_blobs(x, omitted)),
            _ => {}
        }
    }
    let mut answer = answer;
    let mut omitted = 0;
    strip_blobs(&mut answer, &mut omitted);
    let text = serde_json::to_string_pretty(&answer).unwrap_or_default();
    let (text, cut) = crate::text::cap_with_note(&text, MAX_TEXT);
    let mut out = json!({
        "summary": format!("mcp.{server}: {method} answered"),
        "content": text,
        "mcp": {
            "server": server,
            "server_version": crate::text::clipped(info["version"].as_str().unwrap_or_default(), 40),
            "method": method,
        },
    });
    if cut {
        out["truncated"] = json!(true);
    }
    if omitted > 0 {
        out["omitted_parts"] = json!(omitted);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_kept_capped_and_the_rest_noted() {
        let answer = json!({"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "AAAA"},
                                        {"type": "text", "text": "b"}], "isError": false});
        let out = shape("s", "t", &json!({"version": "1"}), "abc", answer);
        assert_eq!(out["content"], "a\nb");
        assert_eq!(out["omitted_parts"], json!(["image"]));
        assert_eq!(out["mcp"]["pin_sha256"], "abc");
        let big = json!({"content": [{"type": "text", "text": "x".repeat(MAX_TEXT * 2)}], "isError": true});
        let out = shape("s", "t", &Value::Null, "", big);
        assert_eq!(out["truncated"], true);
        assert_eq!(out["is_error"], true);
        assert!(out["content"].as_str().unwrap().chars().count() < MAX_TEXT + 200);
    }
}
