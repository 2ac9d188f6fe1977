//! A model provider's refusal, in words an agent's user and the operator can
//! act on: the lane, the model, the provider's status and its own message
//! (read from the shapes providers use: OpenAI's and OpenRouter's
//! `{"error": {"message", "code"}}`, Anthropic's `{"type": "error", "error":
//! {"type", "message"}}`, a bare `{"message"}` or `{"detail"}`, or plain
//! text), and how long the provider asked to wait.
//!
//! The wait is read as the careful clients read it (openai-python's
//! `_base_client.py`): `retry-after-ms`, else `Retry-After` in seconds or as
//! an HTTP date (RFC 9110 §10.2.3), else — on a 429 — the longer of
//! `x-ratelimit-reset-requests` and `x-ratelimit-reset-tokens` (durations
//! like `1s`, `6m0s`, `20ms`).
//!
//! **Invariant:** the message never carries the endpoint's key (replaced if
//! a provider echoes it) or its address, and is at most 300 characters of
//! the provider's text on one line, every hostile character escaped.

use std::time::{Duration, SystemTime};

use crate::config::Lane;
use crate::error::Error;

/// Longest wait read from a provider's headers (a day).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Whether a provider's `status` says a later try may succeed: 408, 409,
/// 425, 429, every 5xx (Anthropic's 529 "overloaded" among them).
pub fn retryable(status: u16) -> bool {
    matches!(status, 408 | 409 | 425 | 429) || status >= 500
}

/// The provider's refusal of a `lane` call to `model`: `status`, its
/// headers (by lower-case name), its body; `key` is the endpoint's key,
/// never repeated.
pub fn refusal(
    lane: Lane,
    model: &str,
    status: u16,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
    key: Option<&str>,
) -> Error {
    let mut said = words(body);
    if let Some(key) = key.filter(|k| k.len() >= 8) {
        said = said.replace(key, "[its key]");
    }
    let wait = wait(status, header, SystemTime::now());
    Error::Provider {
        message: format!("the {} model {model:?}'s provider answered {status}: {said}", lane.as_str()),
        retryable: retryable(status),
        wait_ms: wait.map(|w| w.as_millis() as u64),
    }
}

/// The provider's own words in `body`, cleaned and cut short.
fn words(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
    let found = [&v["error"]["message"], &v["message"], &v["detail"], &v["error"]]
        .into_iter()
        .find_map(|m| m.as_str().map(str::to_owned));
    let kind = [&v["error"]["code"], &v["error"]["type"]].into_iter().find_map(|c| match c {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    let text = match (found, kind) {
        (Some(m), Some(k)) => format!("{m} ({k})"),
        (Some(m), None) => m,
        (None, _) if v.is_null() => String::from_utf8_lossy(&body[..body.len().min(2048)]).trim().to_owned(),
        (None, _) => "no message".to_owned(),
    };
    let text = if text.is_empty() { "no message".to_owned() } else { text };
    choir_common::text::clipped(&text, 300)
}

/// How long the provider asked to wait before a new try, if it said.
pub fn wait(status: u16, header: &dyn Fn(&str) -> Option<String>, now: SystemTime) -> Option<Duration> {
    let asked = header("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| Duration::from_millis(ms as u64))
        .or_else(|| {
            let v = header("retry-after")?;
            let v = v.trim();
            match v.parse::<u64>() {
                Ok(s) => Some(Duration::from_secs(s)),
                Err(_) => httpdate::parse_http_date(v).ok().map(|at| at.duration_since(now).unwrap_or_default()),
            }
        })
        .or_else(|| {
            (status == 429).then_some(())?;
            ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
                .into_iter()
                .filter_map(|h| header(h).and_then(|v| go_duration(&v)))
                .max()
        });
    asked.map(|w| w.min(MAX_WAIT))
}

/// A duration as Go prints one (`1s`, `6m0s`, `1h2m3.5s`, `20ms`, `0.5s`).
fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        total += n * match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        rest = &rest[unit..];
    }
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total.min(MAX_WAIT.as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn the_wait_is_read_from_every_header_providers_use_in_the_order_clients_read_them() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let at = |h: &'static [(&'static str, &'static str)], status| wait(status, &headers(h), now);
        assert_eq!(at(&[("retry-after-ms", "1500"), ("retry-after", "9")], 429), Some(Duration::from_millis(1500)));
        assert_eq!(at(&[("retry-after", "3600")], 429), Some(Duration::from_secs(3600)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(90));
        let dated = |name: &str| (name == "retry-after").then(|| date.clone());
        assert_eq!(wait(503, &dated, now), Some(Duration::from_secs(90)));
        assert_eq!(
            at(&[("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-reset-tokens", "6m0s")], 429),
            Some(Duration::from_secs(360))
        );
        assert_eq!(at(&[("x-ratelimit-reset-tokens", "20ms")], 429), Some(Duration::from_millis(20)));
        // The reset of a limit is no wait asked for on another status.
        assert_eq!(at(&[("x-ratelimit-reset-tokens", "6m0s")], 500), None);
        assert_eq!(at(&[("retry-after", "soon")], 429), None);
        assert_eq!(at(&[("retry-after", "99999999999")], 429), Some(MAX_WAIT));
        assert_eq!(go_duration("1h2m3.5s"), Some(Duration::from_secs_f64(3723.5)));
        assert_eq!(go_duration("5 minutes"), None);
    }

    #[test]
    fn a_refusal_names_the_provider_its_status_and_words_never_the_key() {
        let key = "sk-test-0123456789abcdef";
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-test-0123456789abcdef.","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        let e = refusal(Lane::Edge, "gpt-x", 401, &headers(&[]), body, Some(key));
        let text = e.to_string();
        assert!(
            text.contains("the edge model \"gpt-x\"'s provider answered 401: Incorrect API key provided"),
            "{text}"
        );
        assert!(!text.contains(key) && text.contains("[its key]"), "{text}");
        assert!(!e.retryable(), "a refused key is not tried again");
        let overloaded =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#;
        let e = refusal(Lane::Core, "claude", 529, &headers(&[("retry-after", "2")]), overloaded, None);
        assert_eq!(e.to_string(), "the core model \"claude\"'s provider answered 529: Overloaded (overloaded_error)");
        assert!(matches!(e, Error::Provider { retryable: true, wait_ms: Some(2000), .. }));
        let html = b"<html>\n<body>502 Bad Gateway</body></html>";
        let said = refusal(Lane::Edge, "m", 502, &headers(&[]), html, None).to_string();
        assert!(said.ends_with("<html>\\n<body>502 Bad Gateway</body></html>"), "{said}");
        // Hostile: a bidi override or a bell in the provider's words is escaped.
        let spoof = br#"{"error": {"message": "fine\u202e\u0007"}}"#;
        let said = refusal(Lane::Edge, "m", 500, &headers(&[]), spoof, None).to_string();
        assert!(!said.contains('\u{202e}') && !said.contains('\u{7}'), "{said:?}");
    }
}
