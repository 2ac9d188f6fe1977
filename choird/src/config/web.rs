//! The web's part of `config.json`: `web` (the Brave Search API and the
//! browser, for all agents) and `agents.<id>.web` (one agent's egress
//! policy, what it may post where, and with which secrets). Without an
//! agent's `web` section none of the web tools is served to it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `web`: the services behind the web tools.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    /// The Brave Search API (none: `choir.web.search` is not served).
    #[serde(default)]
    pub brave: Option<BraveConfig>,
    /// The browser behind `choir.web.browse`.
    #[serde(default)]
    pub browser: BrowserConfig,
}

/// `web.brave`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BraveConfig {
    /// API base; requests go to `<base_url>/res/v1/web/search`.
    #[serde(default = "default_brave_base")]
    pub base_url: String,
    /// Name of the subscription token in `secrets.json`.
    pub api_key_secret: String,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_brave_timeout")]
    pub timeout_s: u64,
}

fn default_brave_base() -> String {
    "https://api.search.brave.com".into()
}
fn default_brave_timeout() -> u64 {
    15
}

/// `web.browser`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserConfig {
    /// The Chromium binary; default `/usr/bin/chromium`, then `chromium` on `PATH`.
    #[serde(default)]
    pub chromium: Option<PathBuf>,
    /// The uid (and gid) Chromium runs as when choird runs as root (its
    /// sandbox refuses root); default 65534 (`nobody`).
    #[serde(default = "default_browser_uid")]
    pub uid: u32,
    /// Milliseconds a page may take to load.
    #[serde(default = "default_load_timeout")]
    pub load_timeout_ms: u64,
    /// Milliseconds any other action may take.
    #[serde(default = "default_action_timeout")]
    pub action_timeout_ms: u64,
    /// Bytes one connection of a page may receive, in MiB.
    #[serde(default = "default_page_mb")]
    pub max_page_mb: u64,
    /// Characters of a page's text returned at most.
    #[serde(default = "default_text_chars")]
    pub max_text_chars: usize,
}

fn default_browser_uid() -> u32 {
    65534
}
fn default_load_timeout() -> u64 {
    20_000
}
fn default_action_timeout() -> u64 {
    10_000
}
fn default_page_mb() -> u64 {
    10
}
fn default_text_chars() -> usize {
    20_000
}

impl Default for BrowserConfig {
    fn default() -> Self {
        BrowserConfig {
            chromium: None,
            uid: default_browser_uid(),
            load_timeout_ms: default_load_timeout(),
            action_timeout_ms: default_action_timeout(),
            max_page_mb: default_page_mb(),
            max_text_chars: default_text_chars(),
        }
    }
}

/// `agents.<id>.web`: one agent's egress policy (see `crate::egress`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentWeb {
    /// When not empty, only these domains (and their subdomains).
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// Never these domains (and their subdomains).
    #[serde(default)]
    pub deny_domains: Vec<String>,
    /// Internal address ranges (CIDR) the agent may reach after all, e.g.
    /// `127.0.0.1/32` for a service on this host. Everything private,
    /// loopback or link-local is refused otherwise.
    #[serde(default)]
    pub allow_addresses: Vec<String>,
    /// Exact origins (`https://hooks.example.com`) `choir.http.post` may post to.
    #[serde(default)]
    pub post_origins: Vec<String>,
    /// Secrets choird may send as a header with a post, by name: the value
    /// never reaches the agent.
    #[serde(default)]
    pub post_secrets: BTreeMap<String, PostSecret>,
}

/// How a secret is sent with `choir.http.post`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostSecret {
    /// The header it goes in.
    #[serde(default = "default_secret_header")]
    pub header: String,
    /// Text before the value (`Bearer `).
    #[serde(default = "default_secret_prefix")]
    pub prefix: String,
    /// The origins it may be sent to (each one of `post_origins`).
    pub origins: Vec<String>,
}

fn default_secret_header() -> String {
    "Authorization".into()
}
fn default_secret_prefix() -> String {
    "Bearer ".into()
}

/// A config problem: (dotted field, reason).
type Problem = (String, String);

/// Checks `web`.
pub fn validate(web: &WebConfig) -> Result<(), Problem> {
    let e = |field: &str, reason: &str| Err((field.to_owned(), reason.to_owned()));
    if let Some(b) = &web.brave {
        if !(b.base_url.starts_with("http://") || b.base_url.starts_with("https://")) {
            return e("web.brave.base_url", "must start with http:// or https://");
        }
        if b.api_key_secret.is_empty() {
            return e("web.brave.api_key_secret", "must name a secret in secrets.json");
        }
        if b.timeout_s == 0 || b.timeout_s > 120 {
            return e("web.brave.timeout_s", "must be between 1 and 120");
        }
    }
    let b = &web.browser;
    if b.load_timeout_ms < 100 || b.action_timeout_ms < 100 {
        return e("web.browser", "load_timeout_ms and action_timeout_ms must be at least 100");
    }
    if b.max_page_mb == 0 || b.max_page_mb > 1024 {
        return e("web.browser.max_page_mb", "must be between 1 and 1024");
    }
    if b.max_text_chars < 100 || b.max_text_chars > 1_000_000 {
        return e("web.browser.max_text_chars", "must be between 100 and 1000000");
    }
    if b.uid == 0 {
        return e("web.browser.uid", "must not be 0: the browser never runs as root");
    }
    Ok(())
}

/// Checks `agents.<id>.web`; `agent_secrets` are the secrets the agent
/// itself is handed (a post secret must not be one of them).
pub fn validate_agent(at: &str, web: &AgentWeb, agent_secrets: &[String]) -> Result<(), Problem> {
    let e = |field: &str, reason: String| Err((format!("{at}.{field}"), reason));
    for (i, d) in web.allow_domains.iter().chain(&web.deny_domains).enumerate() {
        let ok = !d.is_empty()
            && d.len() <= 253
            && d.split('.').all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        if !ok {
            return e("allow_domains", format!("entry {i} ({d:?}) is not a domain name like example.com"));
        }
    }
    for (i, a) in web.allow_addresses.iter().enumerate() {
        if a.parse::<ipnet::IpNet>().is_err() {
            return e(&format!("allow_addresses[{i}]"), format!("{a:?} is not an address range like 127.0.0.1/32"));
        }
    }
    for (i, o) in web.post_origins.iter().enumerate() {
        let parsed = url::Url::parse(o).ok().filter(|u| matches!(u.scheme(), "http" | "https"));
        match parsed {
            Some(u) if u.origin().ascii_serialization() == *o => {}
            _ => {
                return e(
                    &format!("post_origins[{i}]"),
                    format!("{o:?} must be an origin like https://hooks.example.com (scheme, host, port; no path)"),
                )
            }
        }
    }
    for (name, s) in &web.post_secrets {
        if agent_secrets.contains(name) {
            return e(
                &format!("post_secrets.{name}"),
                "is also in the agent's own secrets; a secret choird sends for the agent must not be handed to it"
                    .into(),
            );
        }
        let valid_header = !s.header.is_empty() && s.header.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid_header || s.prefix.chars().any(char::is_control) {
            return e(&format!("post_secrets.{name}.header"), "must be a header name (letters, digits, '-')".into());
        }
        if s.origins.is_empty() {
            return e(&format!("post_secrets.{name}.origins"), "must name at least one origin".into());
        }
        if let Some(o) = s.origins.iter().find(|o| !web.post_origins.contains(o)) {
            return e(&format!("post_secrets.{name}.origins"), format!("{o} is not in post_origins"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(v: serde_json::Value) -> AgentWeb {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_post_secret_is_never_also_the_agents_and_goes_only_to_listed_origins() {
        let w = agent(
            json!({"post_origins": ["https://h.test"], "post_secrets": {"tok": {"origins": ["https://h.test"]}}}),
        );
        assert!(validate_agent("agents.a.web", &w, &[]).is_ok());
        let err = validate_agent("agents.a.web", &w, &["tok".into()]).unwrap_err();
        assert_eq!(err.0, "agents.a.web.post_secrets.tok");
        let w = agent(
            json!({"post_origins": ["https://h.test"], "post_secrets": {"tok": {"origins": ["https://x.test"]}}}),
        );
        assert!(validate_agent("agents.a.web", &w, &[]).unwrap_err().1.contains("not in post_origins"));
    }

    #[test]
    fn origins_domains_and_ranges_are_checked() {
        for bad in [
            json!({"post_origins": ["https://h.test/path"]}),
            json!({"post_origins": ["ftp://h.test"]}),
            json!({"allow_domains": ["a b.test"]}),
            json!({"deny_domains": [""]}),
            json!({"allow_addresses": ["127.0.0.1/33"]}),
        ] {
            assert!(validate_agent("w", &agent(bad.clone()), &[]).is_err(), "{bad}");
        }
        let ok =
            agent(json!({"post_origins": ["http://127.0.0.1:8080"], "allow_addresses": ["127.0.0.1/32", "::1/128"]}));
        assert!(validate_agent("w", &ok, &[]).is_ok());
    }
}
