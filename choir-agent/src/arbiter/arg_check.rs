//! The argument policy as a call policy: choird's merged
//! [`PolicySet`] (from FETCH_DYNAMIC_CONFIG, replaced whenever choird
//! reloads it) evaluated over a call's values and their provenance in the
//! lane's [`Evidence`]. A `confirm` tells the human, for each value that
//! triggered it, where it was seen; a `forbid` tells the model which rule.

use std::sync::Arc;
use std::time::Duration;

use choir_common::arg_policy::{CallFacts, CompiledPolicy, Decision, Evaluation, PolicySet, Provenance};
use choir_common::manifest::ToolManifest;
use choir_common::roles::RoleMap;
use parking_lot::RwLock;
use serde_json::Value;

use crate::arbiter::intent::{lane_facts, LaneFacts};
use crate::arbiter::lane_ctx::LaneCtx;
use crate::arbiter::policy::{CallPolicy, Verdict};
use crate::arbiter::provenance::{trace, Evidence, Sighting, Source, Trace};

/// Most values a human is shown the provenance of, in one confirmation.
const MAX_LINES: usize = 8;

/// The argument policy choird sent last, as sent and compiled.
#[derive(Default)]
pub struct ArgumentPolicy {
    set: RwLock<(Arc<PolicySet>, Arc<CompiledPolicy>)>,
}

impl ArgumentPolicy {
    /// Replaces the rules (a dynamic config arrived). A set that does not
    /// compile (choird checked it, so it should) leaves the rules in force.
    pub fn set(&self, set: &PolicySet) {
        if *self.set.read().0 == *set {
            return;
        }
        match set.compile() {
            Ok(compiled) => {
                log::info!("argument policy: {} rules", set.rules.len());
                *self.set.write() = (Arc::new(set.clone()), Arc::new(compiled));
            }
            Err(e) => log::error!("argument policy refused, the rules in force stay: {e}"),
        }
    }
}

fn sources(t: &Trace) -> String {
    t.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// For a human: each value that decided, and where it was seen; for a rule
/// about the call itself, what the intent was and what the lane had read.
fn explain(tool: &str, eval: &Evaluation, traces: &[(String, Trace)], lane: &LaneFacts) -> String {
    let mut lines = Vec::new();
    let deciding = eval.deciding();
    for hit in deciding.iter().take(MAX_LINES) {
        let why = hit.why.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        if hit.pointer.is_empty() {
            lines.push(format!("the call: {} — rule {} ({}){why}", lane.explain(tool), hit.rule, hit.file));
            continue;
        }
        let value = eval.values.iter().find(|v| v.pointer == hit.pointer);
        let trace = traces.iter().find(|(v, _)| Some(v) == value.map(|v| &v.value)).map(|(_, t)| t);
        let shown = value.map(|v| clip(&v.value, 200)).unwrap_or_default();
        let whence = match trace {
            Some(t) if t.seen.is_empty() => "made by the model: seen nowhere in this conversation".to_owned(),
            Some(t) => {
                let only = if t.sources.len() == 1 { "seen only in" } else { "seen in" };
                let places: Vec<String> =
                    t.seen.iter().map(|s| format!("{} («{}»)", s.place, clip(&s.excerpt, 160))).collect();
                format!("{only} {} [{}]", places.join("; "), sources(t))
            }
            None => "not traced".to_owned(),
        };
        lines.push(format!("{} = {shown:?}: {whence} — rule {} ({}){why}", hit.pointer, hit.rule, hit.file));
    }
    if deciding.len() > MAX_LINES {
        lines.push(format!("… and {} more value(s) like these", deciding.len() - MAX_LINES));
    }
    lines.join("\n")
}

impl CallPolicy for ArgumentPolicy {
    fn name(&self) -> &str {
        "argument"
    }

    fn check(&self, lane: &LaneCtx, tool: &str, m: &ToolManifest, input: &Value, ev: &Evidence<'_>) -> Verdict {
        let (set, remembered) = {
            let guard = self.set.read();
            (guard.1.clone(), guard.0.clone())
        };
        if !set.covers(tool) {
            return Verdict::Allow;
        }
        let now = choir_common::arg_policy::now_unix();
        let roles = RoleMap::of(&m.runtime);
        let lane_facts = lane_facts(lane, ev);
        let facts = CallFacts {
            roles: &roles,
            side_effect: m.runtime.side_effect,
            after_untrusted: Some(lane_facts.after_untrusted()),
            in_intent: Some(lane_facts.includes(tool)),
        };
        let mut traces: Vec<(String, Trace)> = Vec::new();
        let eval = set.evaluate(tool, &facts, input, &mut |value| {
            let mut t = trace(value, ev);
            // A destination the operator approved and asked to remember is
            // the operator's, until it expires.
            if let Some(r) = remembered.remembered(value, now) {
                t.sources.remove(&Source::Model);
                t.sources.insert(Source::Operator);
                t.seen.insert(
                    0,
                    Sighting {
                        source: Source::Operator,
                        place: format!("remembered by {} when approving #{} ({})", r.by, r.approval, r.tool),
                        excerpt: r.value.clone(),
                    },
                );
            }
            let p = Provenance { sources: t.sources.clone(), carried: t.carried.clone() };
            traces.push((value.to_owned(), t));
            p
        });
        match eval.decision {
            Decision::Allow => Verdict::Allow,
            Decision::Confirm => Verdict::Confirm {
                reason: format!(
                    "{tool}: the argument policy asks a human to confirm this call.\n{}",
                    explain(tool, &eval, &traces, &lane_facts)
                ),
                wait: Duration::from_secs(set.confirm_wait_s),
            },
            Decision::Forbid => Verdict::Forbid { reason: explain(tool, &eval, &traces, &lane_facts) },
        }
    }
}
