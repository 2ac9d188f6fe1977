//! Argument roles and trusted output fields: what a tool's manifest says its
//! values *do*, so the shipped policy can judge every tool by what it does
//! instead of by its name (docs/policies.md, "Roles").
//!
//! A manifest's runtime view may map argument pointers
//! ([`crate::pointer`], wildcards `*` and `**`) to a role:
//!
//! | role | what the value is | shipped default rule |
//! | --- | --- | --- |
//! | `destination` | where data or an effect goes: a recipient, a URL, an account, a phone number, a channel, a path outside the workspace | confirm unless the user, the operator or a trusted tool gave it |
//! | `target` | what an effect acts on: an id to delete, an event to cancel, a file to share, an account to change | the same |
//! | `payload` | content sent out: a body, a message, a form's text | confirm when it carries a link, address or number only untrusted content gave, or the user's private data |
//! | `locator` | an address the tool fetches from: a URL to open | confirm when the model made it up (seen nowhere: it may carry data out in its path or query) |
//! | `inert` | none of these (a count, a format, a flag) | none |
//!
//! **The strictest default.** A tool whose `side_effect` is `external` and
//! that declares no roles has every string argument, at any depth, taken as
//! a `destination` ([`RoleMap::of`]): nobody wrote a rule for it, so any
//! value in it that the user or operator did not give needs a human. A tool
//! that declares roles has exactly those; its other arguments are `inert`.
//!
//! A manifest may also name `trusted_fields`: pointers into its *result*
//! whose values the tool itself produces and an outsider cannot choose (an
//! id the drive assigned, the user's own account number). Only those values
//! of an otherwise untrusted result vouch for a value. A received mail's
//! sender is **not** such a field: anyone can send mail.

pub use crate::manifest::Role;
use crate::manifest::{RuntimeView, SideEffect};

/// The roles of one tool's arguments, pointers split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleMap {
    /// (pointer segments, role), in the manifest's order.
    pub entries: Vec<(Vec<String>, Role)>,
    /// Whether these are the strictest default rather than declared (then
    /// only string values count: numbers and flags are not where anything
    /// goes).
    pub implicit: bool,
}

impl RoleMap {
    /// The roles `runtime` gives its tool's arguments (see the module's
    /// rule). Pointers were checked by [`crate::manifest::ToolManifest::validate`];
    /// one that does not split is skipped.
    pub fn of(runtime: &RuntimeView) -> RoleMap {
        if runtime.roles.is_empty() {
            if runtime.side_effect == SideEffect::External {
                return RoleMap { entries: vec![(vec!["**".to_owned()], Role::Destination)], implicit: true };
            }
            return RoleMap::default();
        }
        let entries =
            runtime.roles.iter().filter_map(|(p, r)| crate::pointer::split(p).ok().map(|s| (s, *r))).collect();
        RoleMap { entries, implicit: false }
    }

    /// The values of `input` that have `role`, with their concrete pointers
    /// (as [`crate::pointer::values_at`] reads them; strings only under the
    /// strictest default).
    pub fn values(&self, role: Role, input: &serde_json::Value) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for segments in self.pointers(role) {
            crate::pointer::values_at(input, "", segments, &mut found);
        }
        if self.implicit {
            found.retain(|(p, _)| input.pointer(p).is_some_and(serde_json::Value::is_string));
        }
        found
    }

    /// The pointers that have `role`.
    pub fn pointers(&self, role: Role) -> impl Iterator<Item = &[String]> {
        self.entries.iter().filter(move |(_, r)| *r == role).map(|(p, _)| p.as_slice())
    }
}
