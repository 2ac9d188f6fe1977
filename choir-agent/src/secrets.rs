//! The agent's secret store (invariant 8): values fetched with GET_SECRETS live
//! only in this process's memory, are never written to disk, and are redacted
//! from anything the agent records.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// Secret name → value, in memory only. `Debug` prints names, never values.
#[derive(Default, Clone)]
pub struct SecretStore {
    values: BTreeMap<String, String>,
}

impl fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretStore").field("names", &self.values.keys().collect::<Vec<_>>()).finish()
    }
}

impl SecretStore {
    /// A store holding `values`.
    pub fn new(values: BTreeMap<String, String>) -> SecretStore {
        SecretStore { values }
    }

    /// (name, value) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The subset named in `names`.
    pub fn subset(&self, names: &[String]) -> SecretStore {
        SecretStore {
            values: self
                .values
                .iter()
                .filter(|(k, _)| names.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// Replaces every occurrence of a secret value in the strings of `v` with
    /// `[REDACTED:<name>]`. Values shorter than 4 characters are not redacted
    /// (they would mangle ordinary text and carry little secrecy).
    pub fn redact(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.redact_str(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.redact(x)).collect()),
            Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), self.redact(x))).collect()),
            other => other.clone(),
        }
    }

    /// [`SecretStore::redact`] for one string.
    pub fn redact_str(&self, s: &str) -> String {
        let mut out = s.to_owned();
        for (name, value) in &self.values {
            if value.len() >= 4 && out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &format!("[REDACTED:{name}]"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_redacted_everywhere() {
        let s = SecretStore::new([("gh".to_owned(), "tok-12345".to_owned()), ("x".to_owned(), "ab".to_owned())].into());
        assert_eq!(
            s.redact(&json!({"a": ["use tok-12345 now", 3], "ab": "ab"})),
            json!({"a": ["use [REDACTED:gh] now", 3], "ab": "ab"})
        );
        assert!(!format!("{s:?}").contains("tok-12345"));
    }
}
