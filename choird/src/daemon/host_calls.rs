//! choird's own judgment of a host-tool call's arguments (R-ARB-5 against
//! T2): the agent's arbiter applies the argument policy first, but an agent
//! binary with its valid token can send EXECUTE_HOST_TOOL without asking
//! it, so choird applies the same policy again before the tool runs, by the
//! same tracing rule ([`choir_common::provenance::trace`]) over **what
//! choird itself witnessed**:
//!
//! - the messages people sent the agent (the user),
//! - the operator's words: the agent's identity (`persona.md`, `rules.md`
//!   under `repos/`) and its scheduled jobs' specs,
//! - the tool results the agent reported (stored before any model saw
//!   them) — the agent's word, so never more than untrusted.
//!
//! A call the policy would send to a person runs only if a person approved
//! exactly this call (its tool and input) within the last day, and each
//! approval is used by one host call (a retry of the same call finds it
//! again). **Limits:** a value the agent's arbiter traced to a trusted
//! tool's output is untrusted here (choird cannot tell a trusted result the
//! agent reports from a forged one), so such a call needs the confirmation
//! the agent did not ask for; it fails with a message saying so.

use choir_common::arg_policy::{CallFacts, Decision};
use choir_common::ids::AgentId;
use choir_common::manifest::SideEffect;
use choir_common::provenance::Source;
use choir_common::roles::RoleMap;
use choir_common::rpc::ExecuteHostToolRequest;
use serde_json::{json, Value};

use super::{Authed, Daemon};
use crate::error::Error;
use crate::home::Home;

/// Largest identity file read as the operator's words.
const MAX_IDENTITY_BYTES: u64 = 256 * 1024;
/// Most strings taken from one stored value (a job spec, a tool result).
const MAX_STRINGS: usize = 2_000;

/// The operator's words for `agent`: its identity's persona and rules (the
/// agent layer's file, else the global one), as the agent reads them.
fn operator_words(home: &Home, agent: &AgentId) -> String {
    let repos = home.repos();
    let read = |file: &str| {
        [repos.join("agents").join(agent.as_str()).join("identity"), repos.join("global").join("identity")]
            .iter()
            .map(|dir| dir.join(file))
            .find_map(|path| {
                let meta = std::fs::symlink_metadata(&path).ok()?;
                (meta.is_file() && meta.len() <= MAX_IDENTITY_BYTES).then(|| std::fs::read_to_string(&path).ok())?
            })
    };
    [read("persona.md"), read("rules.md")].into_iter().flatten().collect::<Vec<_>>().join("\n\n")
}

/// The strings inside `v` (at most [`MAX_STRINGS`]).
fn strings_in(v: &Value, out: &mut Vec<String>) {
    if out.len() >= MAX_STRINGS {
        return;
    }
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|x| strings_in(x, out)),
        Value::Object(map) => map.values().for_each(|x| strings_in(x, out)),
        _ => {}
    }
}

impl Daemon {
    /// What of `result` (a JSON text) `tool`'s manifest declares private:
    /// all of it for the pointer `""`, else the values at its pointers.
    /// `None` for a tool choird has no manifest of (the agent's built-ins:
    /// their files are in the agent's hands anyway) or that declares none.
    fn private_of(&self, tool: &str, result: &str) -> Option<String> {
        let pointers = self.host_tools.manifest(tool)?.runtime.private_fields;
        if pointers.is_empty() {
            return None;
        }
        if pointers.iter().any(String::is_empty) {
            return Some(result.to_owned());
        }
        let v: Value = serde_json::from_str(result).ok()?;
        let mut values = Vec::new();
        for p in &pointers {
            if let Ok(segments) = choir_common::pointer::split(p) {
                choir_common::pointer::values_at(&v, "", &segments, &mut values);
            }
        }
        Some(values.into_iter().map(|(_, v)| v).collect::<Vec<_>>().join("\n"))
    }

    /// Judges `req` by `who`'s argument policy over what choird witnessed;
    /// `Ok` when it may run.
    pub(super) fn judge_host_call(&self, who: &Authed, req: &ExecuteHostToolRequest) -> Result<(), Error> {
        let set = self.argument_policy(&who.agent);
        let runtime = self.host_tools.manifest(&req.tool).map(|m| m.runtime);
        let roles = runtime.as_ref().map(RoleMap::of).unwrap_or_default();
        let side_effect = runtime.map_or(SideEffect::Read, |r| r.side_effect);
        // Most host-tool calls (memory, search) are named by no rule and
        // have no roles: nothing to compile or read for them.
        let named = set.rules.iter().any(|r| r.tool == req.tool);
        if !named && roles.entries.is_empty() {
            return Ok(());
        }
        let policy = set.compile().map_err(Error::Internal)?;
        // choird sees no lane's order: rules about the call itself (after
        // untrusted content, outside the intent) are the agent's arbiter's.
        let facts = CallFacts { roles: &roles, side_effect, after_untrusted: None, in_intent: None };
        let seen = self.store.witnessed(&who.agent)?;
        let operator = operator_words(&self.home, &who.agent);
        let mut texts: Vec<(Source, String)> = seen.user.into_iter().map(|t| (Source::User, t)).collect();
        texts.push((Source::Operator, operator));
        // Destinations the operator approved and asked to remember.
        let now = choir_common::arg_policy::now_unix();
        texts.extend(set.remembered.iter().filter(|r| r.until_unix > now).map(|r| (Source::Operator, r.value.clone())));
        let mut strings = Vec::new();
        for job in &seen.jobs {
            strings.clear();
            strings_in(job, &mut strings);
            texts.extend(strings.drain(..).map(|s| (Source::Operator, s)));
        }
        // Reported results as their JSON text: an address or a web address
        // in it is found as it is; other text may hold escapes, which only
        // makes a value the model's rather than untrusted (neither vouches).
        // A result of a tool that declares private fields (received mail,
        // Notion, memory) also labels what they hold.
        for (tool, result) in seen.results {
            if let Some(private) = self.private_of(&tool, &result) {
                texts.push((Source::Private, private));
            }
            texts.push((Source::Untrusted, result));
        }
        // JSON with escapes is also read decoded, as the agent reads it.
        let decoded: Vec<(Source, std::borrow::Cow<'_, str>)> =
            texts.iter().map(|(s, t)| (*s, choir_common::provenance::with_json_strings(t))).collect();
        let texts: Vec<(Source, &str)> = decoded.iter().map(|(s, t)| (*s, t.as_ref())).collect();
        let eval = policy.evaluate(&req.tool, &facts, &req.input, &mut |value| {
            choir_common::provenance::trace(value, &texts).into()
        });
        let values = eval
            .deciding()
            .iter()
            .filter_map(|hit| {
                let v = eval.values.iter().find(|v| v.pointer == hit.pointer)?;
                let from: Vec<&str> = v.sources.iter().map(|s| s.as_str()).collect();
                Some(format!(
                    "{} = {} (from {}; rule {})",
                    v.pointer,
                    crate::http::printable(&v.value),
                    from.join(", "),
                    hit.rule
                ))
            })
            .collect::<Vec<_>>()
            .join("; ");
        let refuse = |outcome: &str, message: String| {
            self.shared.audit_always(
                Some(&who.agent),
                "EXECUTE_HOST_TOOL",
                outcome,
                json!({"tool": req.tool, "lane": req.lane, "call_id": req.call_id, "judged_by": "choird",
                       "values": values}),
            );
            Err(Error::Forbidden(message))
        };
        match eval.decision {
            Decision::Allow => Ok(()),
            Decision::Forbid => {
                refuse("forbidden", format!("{}: the argument policy forbids this call: {values}", req.tool))
            }
            Decision::Confirm => {
                let marker = req.call_id.as_deref().unwrap_or_default();
                if self.store.use_call_approval(&who.agent, &req.tool, &req.input, marker)? {
                    return Ok(());
                }
                refuse(
                    "not_confirmed",
                    format!(
                        "{}: the argument policy asks a person to confirm this call, and choird holds no approval of \
                         exactly this call: {values}",
                        req.tool
                    ),
                )
            }
        }
    }
}
