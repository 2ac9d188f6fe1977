//! Secrets for the operator (`choirctl secrets`): see [`crate::secret_admin`].

use serde_json::{json, Value};

use super::Daemon;
use crate::error::Error;
use crate::secret_admin;

impl Daemon {
    /// `GET /secrets`.
    pub fn secret_list(&self) -> Result<choir_common::admin::SecretList, Error> {
        let config = serde_json::to_value(&*self.config()).map_err(|e| Error::Internal(e.to_string()))?;
        Ok(secret_admin::list(self.home.root(), &config, &self.secrets()))
    }

    /// `PUT /secrets/<name>`: written, reloaded, audited (the name only).
    pub fn set_secret(&self, name: &str, value: &str) -> Result<Value, Error> {
        secret_admin::check_set(name, value)?;
        let _one = self.config_gate()?;
        let secrets = self.secrets().with(name, value);
        secret_admin::write(&self.home.secrets(), &secrets)?;
        let config = self.config();
        self.reload((*config).clone(), secrets);
        self.audit("admin", None, "secrets.set", "ok", json!({"name": name, "length": value.len()}));
        let agents: Vec<String> = config
            .agents
            .iter()
            .filter(|(_, a)| a.secrets.iter().any(|s| s == name))
            .map(|(id, _)| id.to_string())
            .collect();
        Ok(json!({"name": name, "length": value.len(), "agents": agents}))
    }

    /// `DELETE /secrets/<name>`: refused while anything uses it.
    pub fn remove_secret(&self, name: &str) -> Result<Value, Error> {
        let _one = self.config_gate()?;
        let current = self.secrets();
        if !current.contains(name) {
            return Err(Error::NotFound(format!("no secret {:?} in secrets.json", crate::http::printable(name))));
        }
        let config = serde_json::to_value(&*self.config()).map_err(|e| Error::Internal(e.to_string()))?;
        if let Some(places) = secret_admin::uses(self.home.root(), &config).get(name).filter(|p| !p.is_empty()) {
            return Err(Error::Conflict(format!(
                "secret {name} is used by {}; remove those uses first",
                places.join(", ")
            )));
        }
        let secrets = current.without(name);
        secret_admin::write(&self.home.secrets(), &secrets)?;
        self.reload((*self.config()).clone(), secrets);
        self.audit("admin", None, "secrets.rm", "ok", json!({"name": name}));
        Ok(json!({"name": name, "removed": true}))
    }
}
