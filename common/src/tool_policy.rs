//! The operator's per-agent tool policy (R-CTL-2 "policies"):
//! `agents.<id>.tools: {allow?, deny?}` in config.json, names or `prefix.*`.
//! choird checks it and sends it in the dynamic config; the agent's registry
//! offers only what it permits, and the arbiter refuses anything else.
//!
//! **Invariant:** a tool is permitted when `allow` is absent or one of its
//! patterns matches, and no `deny` pattern matches (deny wins).

use serde::{Deserialize, Serialize};

/// An allow/deny list of tool names and `prefix.*` patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    /// Only these (absent: every tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Never these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// Whether `pattern` (a name, or `prefix.*`) matches `tool`.
pub fn matches(pattern: &str, tool: &str) -> bool {
    match pattern.strip_suffix(".*") {
        Some(prefix) => tool.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.')),
        None => pattern == tool,
    }
}

/// Whether `pattern` is well formed: a tool name, or a name prefix and `.*`.
pub fn valid_pattern(pattern: &str) -> bool {
    let name = pattern.strip_suffix(".*").unwrap_or(pattern);
    !name.is_empty()
        && name.len() <= 128
        && name.split('.').all(|part| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
}

/// A pattern that matches none of the tools an agent has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmatched {
    /// `allow` or `deny`.
    pub field: &'static str,
    /// The pattern as given.
    pub pattern: String,
    /// The known tool (or `prefix.*`) closest to it, when one is close.
    pub did_you_mean: Option<String>,
}

impl std::fmt::Display for Unmatched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?} matches none of the agent's tools", self.field, self.pattern)?;
        match &self.did_you_mean {
            Some(m) => write!(f, "; did you mean {m:?}?"),
            None => Ok(()),
        }
    }
}

/// The closest of `known` to `typed` (Jaro-Winkler ≥ 0.85), for a "did
/// you mean".
pub fn closest<'a>(typed: &str, known: impl IntoIterator<Item = &'a str>) -> Option<String> {
    known
        .into_iter()
        .map(|k| (strsim::jaro_winkler(typed, k), k))
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.to_owned())
}

impl ToolPolicy {
    /// The patterns of this policy, not in `already` (those the operator kept
    /// before), that match none of `known` tools — each a typo that would
    /// leave a denied tool allowed — with the nearest known name or prefix.
    pub fn unmatched(&self, known: &[&str], already: &ToolPolicy) -> Vec<Unmatched> {
        let mut prefixes: Vec<String> = Vec::new();
        for k in known {
            let mut at = 0;
            while let Some(dot) = k[at..].find('.') {
                prefixes.push(format!("{}.*", &k[..at + dot]));
                at += dot + 1;
            }
        }
        let allow = self.allow.iter().flatten().map(|p| ("allow", p));
        let kept = |p: &String| already.allow.iter().flatten().chain(&already.deny).any(|a| a == p);
        allow
            .chain(self.deny.iter().map(|p| ("deny", p)))
            .filter(|(_, p)| !kept(p) && !known.iter().any(|k| matches(p, k)))
            .map(|(field, p)| Unmatched {
                field,
                pattern: p.clone(),
                did_you_mean: if p.ends_with(".*") {
                    closest(p, prefixes.iter().map(String::as_str))
                } else {
                    closest(p, known.iter().copied())
                },
            })
            .collect()
    }

    /// Whether `tool` may be offered and run.
    pub fn permits(&self, tool: &str) -> bool {
        self.allow.as_ref().is_none_or(|a| a.iter().any(|p| matches(p, tool)))
            && !self.deny.iter().any(|p| matches(p, tool))
    }

    /// Why `tool` is not permitted (none when it is).
    pub fn refusal(&self, tool: &str) -> Option<String> {
        if let Some(p) = self.deny.iter().find(|p| matches(p, tool)) {
            return Some(format!("the operator has turned {tool} off for this agent (deny {p:?})"));
        }
        if self.allow.as_ref().is_some_and(|a| !a.iter().any(|p| matches(p, tool))) {
            return Some(format!("the operator allows this agent only some tools, and {tool} is not one of them"));
        }
        None
    }

    /// The first malformed pattern, as an error naming the field.
    pub fn check(&self) -> Result<(), String> {
        let allow = self.allow.iter().flatten().map(|p| ("allow", p));
        for (field, p) in allow.chain(self.deny.iter().map(|p| ("deny", p))) {
            if !valid_pattern(p) {
                return Err(format!(
                    "{field}: {p:?} is not a tool name or a `prefix.*` pattern (lowercase, digits, _ and .)"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_wins_and_prefixes_match_whole_segments() {
        let p =
            ToolPolicy { allow: Some(vec!["choir.fs.*".into(), "choir.exec".into()]), deny: vec!["choir.exec".into()] };
        assert!(p.permits("choir.fs.read") && p.permits("choir.fs.write"));
        assert!(!p.permits("choir.exec"), "deny wins over allow");
        assert!(!p.permits("choir.fsx.read") && !p.permits("choir.fs"), "a prefix matches whole segments");
        assert!(!p.permits("mail.send"), "not allowed");
        assert!(p.refusal("choir.exec").is_some_and(|r| r.contains("deny")));
        assert!(p.refusal("mail.send").is_some_and(|r| r.contains("only some tools")));
        assert!(ToolPolicy::default().permits("anything.at_all"));
    }

    /// `--deny choir.exc` left choir.exec allowed, answering "applied".
    #[test]
    fn regression_a_deny_pattern_with_a_typo_was_accepted_and_denied_nothing() {
        let known = ["choir.exec", "choir.fs.read", "choir.fs.write", "mail.send"];
        let p = ToolPolicy { allow: None, deny: vec!["choir.exc".into()] };
        let u = p.unmatched(&known, &ToolPolicy::default());
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].did_you_mean.as_deref(), Some("choir.exec"));
        assert!(u[0].to_string().contains("did you mean \"choir.exec\""), "{}", u[0]);
        // A prefix typo gets a prefix back; patterns that match are fine.
        let p = ToolPolicy { allow: Some(vec!["choir.fz.*".into(), "mail.*".into()]), deny: vec!["choir.exec".into()] };
        let u = p.unmatched(&known, &ToolPolicy::default());
        assert_eq!((u.len(), u[0].field, u[0].did_you_mean.as_deref()), (1, "allow", Some("choir.fs.*")));
        // What the operator kept before is not asked about again.
        assert!(p.unmatched(&known, &p).is_empty());
        // Nothing close: no guess.
        let p = ToolPolicy { allow: None, deny: vec!["weather.today".into()] };
        assert_eq!(p.unmatched(&known, &ToolPolicy::default())[0].did_you_mean, None);
    }

    #[test]
    fn malformed_patterns_are_named() {
        let p = ToolPolicy { allow: None, deny: vec!["choir.*".into(), "Bad Name".into()] };
        assert!(p.check().is_err_and(|e| e.contains("deny: \"Bad Name\"")));
        assert!(!valid_pattern("*") && !valid_pattern("a..b") && !valid_pattern(".*") && valid_pattern("web.*"));
    }
}
