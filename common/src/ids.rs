//! Identifiers that name things across the system: agent ids and tool names.
//!
//! **Invariant:** an [`AgentId`] is always a safe identifier (`[a-z][a-z0-9_]{0,31}`),
//! so it can name a file, a socket, a container and (later) a Postgres schema
//! without quoting. Tool names are canonical, namespaced and dotted
//! (`choir.fs.read`); the OpenAI wire format forbids dots in function names, so the
//! model sees [`wire_tool_name`] (`choir__fs__read`), a mapping that is invertible
//! because segments may not contain `__`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why an identifier was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    /// The agent id does not match `[a-z][a-z0-9_]{0,31}`.
    #[error(
        "invalid agent id {0:?}: use 1-32 characters, a lowercase letter first, then lowercase letters, digits or '_'"
    )]
    Agent(String),
    /// The tool name is not a dotted, namespaced name.
    #[error("invalid tool name {0:?}: use two or more dot-separated segments of lowercase letters, digits and single '_' (e.g. choir.fs.read)")]
    Tool(String),
}

/// A validated agent identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AgentId(String);

impl AgentId {
    /// Validates `s` as an agent id.
    pub fn parse(s: &str) -> Result<AgentId, IdError> {
        let mut chars = s.chars();
        let ok = matches!(chars.next(), Some('a'..='z'))
            && s.len() <= 32
            && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'));
        if ok {
            Ok(AgentId(s.to_owned()))
        } else {
            Err(IdError::Agent(s.to_owned()))
        }
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AgentId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AgentId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Checks a canonical tool name: at least two segments separated by '.', each
/// segment `[a-z0-9]+(_[a-z0-9]+)*`, at most 64 characters once mapped to the wire.
pub fn validate_tool_name(name: &str) -> Result<(), IdError> {
    let segment_ok = |seg: &str| {
        !seg.is_empty()
            && !seg.starts_with('_')
            && !seg.ends_with('_')
            && !seg.contains("__")
            && seg.chars().all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
    };
    let segments: Vec<&str> = name.split('.').collect();
    if segments.len() >= 2 && segments.iter().all(|s| segment_ok(s)) && wire_tool_name(name).len() <= 64 {
        Ok(())
    } else {
        Err(IdError::Tool(name.to_owned()))
    }
}

/// Whether `name` can be set as a secret's name (`choirctl secrets set`):
/// 1–64 letters, digits, `_` or `-` (choird and choirctl check the same).
pub fn valid_secret_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The name a tool carries on the OpenAI wire (`^[a-zA-Z0-9_-]{1,64}$`).
pub fn wire_tool_name(canonical: &str) -> String {
    canonical.replace('.', "__")
}

/// Inverse of [`wire_tool_name`]; `None` if the wire name cannot be a tool name.
pub fn canonical_tool_name(wire: &str) -> Option<String> {
    let name = wire.replace("__", ".");
    validate_tool_name(&name).ok().map(|()| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids() {
        for ok in ["demo", "a", "agent_7", "abcdefghijabcdefghijabcdefghijab"] {
            assert!(AgentId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Demo", "7up", "a-b", "a b", "a;drop", "../x", "abcdefghijabcdefghijabcdefghijabc"] {
            assert_eq!(AgentId::parse(bad), Err(IdError::Agent(bad.into())), "{bad}");
        }
    }

    #[test]
    fn tool_names_round_trip_through_the_wire() {
        for name in ["choir.fs.read", "choir.repo.git_status", "x.y"] {
            validate_tool_name(name).unwrap();
            assert_eq!(canonical_tool_name(&wire_tool_name(name)).as_deref(), Some(name));
        }
        for bad in ["fs", "choir..fs", "choir.fs.", "Choir.fs", "choir.a__b", "choir._x", "choir.fs-read"] {
            assert!(validate_tool_name(bad).is_err(), "{bad}");
        }
        assert_eq!(wire_tool_name("choir.fs.read"), "choir__fs__read");
        assert_eq!(canonical_tool_name("read_file"), None);
    }
}
