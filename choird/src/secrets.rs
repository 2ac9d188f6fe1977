//! `secrets.json`: a strict JSON object of name → string value, mode 0600, held
//! in choird's memory. Values are handed out only through GET_SECRETS (to the
//! agent they are bound to) and the LLM relay (never to an agent at all).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The loaded secrets. `Debug` never prints values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    values: BTreeMap<String, String>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets").field("names", &self.values.keys().collect::<Vec<_>>()).finish()
    }
}

/// `secrets.json` could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct SecretsError {
    /// The file.
    pub path: String,
    /// What is wrong (never contains a value).
    pub reason: String,
}

impl Secrets {
    /// Loads and checks the file (call [`crate::home::Home::check_secrets_mode`] first).
    pub fn load(path: &Path) -> Result<Secrets, SecretsError> {
        let err = |reason: String| SecretsError { path: path.display().to_string(), reason };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let values: BTreeMap<String, String> = serde_json::from_str(&text).map_err(|e| {
            // serde_json's message names the position, not the value.
            err(format!("must be a JSON object of name -> string value: {e}"))
        })?;
        for name in values.keys() {
            // Names set by `choirctl secrets set` are also at most 64 long.
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(err(format!("secret name {name:?} must use only letters, digits, '_' or '-'")));
            }
        }
        Ok(Secrets { values })
    }

    /// A secret's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether a secret exists.
    pub fn contains(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// A copy with `name` set to `value`.
    pub fn with(&self, name: &str, value: &str) -> Secrets {
        let mut values = self.values.clone();
        values.insert(name.to_owned(), value.to_owned());
        Secrets { values }
    }

    /// A copy without `name`.
    pub fn without(&self, name: &str) -> Secrets {
        let mut values = self.values.clone();
        values.remove(name);
        Secrets { values }
    }

    /// The name → value map, for writing the file.
    pub fn to_map(&self) -> &BTreeMap<String, String> {
        &self.values
    }
}

pub use choir_common::ids::valid_secret_name as valid_name;

#[cfg(test)]
impl Secrets {
    /// Secrets from pairs, for tests.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Secrets {
        Secrets { values: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }
}
