//! An agent's accounts with outside services in `config.json`:
//! `agents.<id>.notion` (its Notion integration) and `agents.<id>.email`
//! (its mailbox). Their secrets stay in choird; none of them may also be
//! one of the agent's own secrets.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A config problem: (dotted field, reason).
type Problem = (String, String);

/// `agents.<id>.notion`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotionConfig {
    /// Name of the integration token in `secrets.json`.
    pub token_secret: String,
    /// The API base.
    #[serde(default = "default_notion_base")]
    pub base_url: String,
}

fn default_notion_base() -> String {
    "https://api.notion.com".into()
}

/// How a mail connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// TLS from the first byte (SMTPS 465, IMAPS 993).
    Tls,
    /// Plain, then STARTTLS (submission 587, IMAP 143).
    Starttls,
    /// No TLS: only to a loopback address.
    None,
}

/// One mail server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailServer {
    /// Host name (checked against its certificate).
    pub host: String,
    /// Port.
    pub port: u16,
    /// TLS, STARTTLS or none.
    pub security: Security,
}

/// `agents.<id>.email`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// Where mail is sent.
    pub smtp: MailServer,
    /// Where mail is read.
    pub imap: MailServer,
    /// The login.
    pub username: String,
    /// Name of the password in `secrets.json`.
    pub password_secret: String,
    /// The sender address (`Name <a@b>` or `a@b`).
    pub from: String,
    /// A PEM file of CA certificates trusted for this account's servers
    /// (for self-hosted servers); the public roots otherwise.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

fn loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Checks `agents.<id>.notion` and `agents.<id>.email`.
pub fn validate(
    at: &str,
    notion: Option<&NotionConfig>,
    email: Option<&EmailConfig>,
    agent_secrets: &[String],
) -> Result<(), Problem> {
    let e = |f: &str, r: &str| Err((format!("{at}.{f}"), r.to_owned()));
    if let Some(n) = notion {
        if n.token_secret.is_empty() {
            return e("notion.token_secret", "must name a secret in secrets.json");
        }
        if agent_secrets.contains(&n.token_secret) {
            return e(
                "notion.token_secret",
                "is also in the agent's own secrets; choird's tools keep it from the agent",
            );
        }
        if !(n.base_url.starts_with("https://") || n.base_url.starts_with("http://")) {
            return e("notion.base_url", "must start with https:// or http://");
        }
    }
    if let Some(m) = email {
        if m.password_secret.is_empty() || agent_secrets.contains(&m.password_secret) {
            return e(
                "email.password_secret",
                "must name a secret in secrets.json that is not also one of the agent's own secrets",
            );
        }
        for (name, s) in [("smtp", &m.smtp), ("imap", &m.imap)] {
            if s.host.is_empty() || s.port == 0 {
                return e(&format!("email.{name}"), "needs a host and a port");
            }
            if s.security == Security::None && !loopback(&s.host) {
                return e(&format!("email.{name}.security"), "none is allowed only to a loopback address");
            }
        }
        if m.username.is_empty() {
            return e("email.username", "must not be empty");
        }
        if !m.from.contains('@') {
            return e("email.from", "must be a mail address");
        }
    }
    Ok(())
}
