//! Mail for agents (`agents.<id>.email`): `choir.email.send` (SMTP through
//! lettre), `choir.email.check` and `choir.email.receive` (IMAP through the
//! `imap` crate over our own rustls stream), messages parsed with
//! `mailparse`. One TLS stack (rustls with ring), certificate checks always
//! on — the public roots, or the account's own CA file for a self-hosted
//! server; `security: none` only to loopback (config validation). The
//! password stays in choird. What a message holds is outside content:
//! wrapped and marked untrusted, with its sender recorded.

use std::sync::Arc;

use choir_common::ids::AgentId;

use crate::config::{Config, EmailConfig};
use crate::host_tools::{Registry, RegistryError, Status};
use crate::http::ApiError;
use crate::shared::Shared;

pub mod imap_session;
pub mod parse;
pub mod read;
pub mod send;
pub mod tls;

/// Registers the mail tools.
pub fn register(shared: &Arc<Shared>, registry: &mut Registry) -> Result<(), RegistryError> {
    registry.register(Arc::new(send::Send::new(shared.clone())))?;
    registry.register(Arc::new(read::Check::new(shared.clone())))?;
    registry.register(Arc::new(read::Receive::new(shared.clone())))?;
    Ok(())
}

/// The agent's account and its password, or why the tools are not served.
pub struct Account {
    /// The account.
    pub cfg: EmailConfig,
    /// Its password.
    pub password: String,
}

/// The status of a mail tool for `agent`.
pub fn status(config: &Config, secrets: &crate::secrets::Secrets, agent: &AgentId) -> Status {
    match config.agents.get(agent).and_then(|a| a.email.as_ref()) {
        None => Status::Available(format!("agents.{agent}.email is not configured")),
        Some(m) if !secrets.contains(&m.password_secret) => {
            Status::Available(format!("missing secret {}", m.password_secret))
        }
        Some(_) => Status::Connected,
    }
}

/// The agent's account, with its password from the secrets.
pub fn account(shared: &Shared, agent: &AgentId) -> Result<Account, ApiError> {
    let config = shared.config();
    let Some(cfg) = config.agents.get(agent).and_then(|a| a.email.clone()) else {
        return Err(ApiError::Unavailable(format!("agents.{agent}.email is not configured")));
    };
    let password = shared
        .secrets()
        .get(&cfg.password_secret)
        .map(str::to_owned)
        .ok_or_else(|| ApiError::Unavailable(format!("missing secret {}", cfg.password_secret)))?;
    Ok(Account { cfg, password })
}
