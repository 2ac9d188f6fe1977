//! An agent's mail account as the mail tools use it: its config and its
//! password (from choird's secrets), or why the tools are not served.

use choir_common::ids::AgentId;

use crate::config::{Config, EmailConfig};
use crate::error::Error;
use crate::host_tools::ToolStatus;
use crate::shared::Shared;

/// The agent's account and its password, or why the tools are not served.
pub struct Account {
    /// The account.
    pub cfg: EmailConfig,
    /// Its password.
    pub password: String,
}

/// The status of a mail tool for `agent`.
pub fn status(config: &Config, secrets: &crate::secrets::Secrets, agent: &AgentId) -> ToolStatus {
    match config.agents.get(agent).and_then(|a| a.email.as_ref()) {
        None => ToolStatus::Available(format!("agents.{agent}.email is not configured")),
        Some(m) if !secrets.contains(&m.password_secret) => {
            ToolStatus::Available(format!("missing secret {}", m.password_secret))
        }
        Some(_) => ToolStatus::Connected,
    }
}

/// The agent's account, with its password from the secrets.
pub fn account(shared: &Shared, agent: &AgentId) -> Result<Account, Error> {
    let config = shared.config();
    let Some(cfg) = config.agents.get(agent).and_then(|a| a.email.clone()) else {
        return Err(Error::Unavailable(format!("agents.{agent}.email is not configured")));
    };
    let password = shared
        .secrets()
        .get(&cfg.password_secret)
        .map(str::to_owned)
        .ok_or_else(|| Error::Unavailable(format!("missing secret {}", cfg.password_secret)))?;
    Ok(Account { cfg, password })
}
