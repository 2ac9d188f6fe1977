//! Call policies: checks the arbiter asks about a call that passed its own
//! (schema, allowlist, paths, lease, kill switch). Each answers with a
//! [`Verdict`]; the arbiter combines them with its own decision, and **the
//! strictest wins**: forbid over confirm over allow
//! ([`Verdict::stricter`]). No policy can loosen what another, or the
//! arbiter, decided.
//!
//! Production builds have the argument policy ([`crate::arbiter::arg_check`]); the
//! test build (feature `failpoints`) also has [`ConfirmListed`], which asks
//! a human to confirm the calls of the tools named in
//! `<state dir>/confirm.json`.

use std::time::Duration;

use choir_common::manifest::ToolManifest;
use serde_json::Value;

use crate::arbiter::lane_ctx::LaneCtx;
use crate::arbiter::provenance::Evidence;

/// The longest a lane waits for a human to confirm one call (choird refuses
/// confirmations asked for longer).
pub const MAX_CONFIRM_WAIT: Duration = Duration::from_secs(3600);

/// What one policy says of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing against it.
    Allow,
    /// A human must confirm this exact call first; the lane waits up to
    /// `wait`, and the call is refused if no one does.
    Confirm {
        /// What the human is told.
        reason: String,
        /// How long the lane waits for the decision.
        wait: Duration,
    },
    /// Refused.
    Forbid {
        /// Why, for the model.
        reason: String,
    },
}

impl Verdict {
    /// Its kind, in the one order of strictness every policy shares
    /// (`Decision`'s: allow < confirm < forbid).
    pub fn decision(&self) -> choir_common::arg_policy::Decision {
        use choir_common::arg_policy::Decision;
        match self {
            Verdict::Allow => Decision::Allow,
            Verdict::Confirm { .. } => Decision::Confirm,
            Verdict::Forbid { .. } => Decision::Forbid,
        }
    }

    /// The stricter of two verdicts (the first on a tie, except that of two
    /// confirmations the shorter wait is kept: a human is asked once).
    pub fn stricter(self, other: Verdict) -> Verdict {
        match (self, other) {
            (Verdict::Confirm { reason, wait: a }, Verdict::Confirm { wait: b, .. }) => {
                Verdict::Confirm { reason, wait: a.min(b) }
            }
            (a, b) if b.decision() > a.decision() => b,
            (a, _) => a,
        }
    }
}

/// A check of calls that passed the arbiter's own. Must not block or do
/// I/O: it runs inside every decision.
pub trait CallPolicy: Send + Sync {
    /// Its name, for the explanation a refusal carries.
    fn name(&self) -> &str;
    /// Its verdict on `tool` (canonical name, `manifest`) called with the
    /// validated `input` by `lane`, whose history and inheritance are `ev`.
    fn check(&self, lane: &LaneCtx, tool: &str, manifest: &ToolManifest, input: &Value, ev: &Evidence<'_>) -> Verdict;
}

/// Every policy's verdict, combined: the strictest.
pub fn combine(
    policies: &[std::sync::Arc<dyn CallPolicy>],
    lane: &LaneCtx,
    tool: &str,
    manifest: &ToolManifest,
    input: &Value,
    ev: &Evidence<'_>,
) -> Verdict {
    policies.iter().fold(Verdict::Allow, |acc, p| {
        let v = match p.check(lane, tool, manifest, input, ev) {
            Verdict::Forbid { reason } => Verdict::Forbid { reason: format!("{} policy: {reason}", p.name()) },
            other => other,
        };
        acc.stricter(v)
    })
}

/// The test build's policy: the tools listed in `<state dir>/confirm.json`
/// (`{"tools": [...], "wait_ms": N}`, read once at start) need a human's
/// confirmation of each call.
#[cfg(feature = "failpoints")]
pub struct ConfirmListed {
    tools: Vec<String>,
    wait: Duration,
}

#[cfg(feature = "failpoints")]
impl ConfirmListed {
    /// The policy `dir/confirm.json` asks for, if there is one.
    pub fn from_dir(dir: &std::path::Path) -> Option<ConfirmListed> {
        let text = std::fs::read_to_string(dir.join("confirm.json")).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        let tools = v["tools"].as_array()?.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect();
        let wait = Duration::from_millis(v["wait_ms"].as_u64().unwrap_or(60_000)).min(MAX_CONFIRM_WAIT);
        log::warn!("test policy: calls of {tools:?} need a human's confirmation");
        Some(ConfirmListed { tools, wait })
    }
}

#[cfg(feature = "failpoints")]
impl CallPolicy for ConfirmListed {
    fn name(&self) -> &str {
        "confirm-listed (test)"
    }

    fn check(&self, _lane: &LaneCtx, tool: &str, _m: &ToolManifest, _input: &Value, _ev: &Evidence<'_>) -> Verdict {
        if self.tools.iter().any(|t| t == tool) {
            Verdict::Confirm {
                reason: format!("the test policy asks a human to confirm every {tool} call"),
                wait: self.wait,
            }
        } else {
            Verdict::Allow
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Says(Verdict);
    impl CallPolicy for Says {
        fn name(&self) -> &str {
            "says"
        }
        fn check(&self, _: &LaneCtx, _: &str, _: &ToolManifest, _: &Value, _: &Evidence<'_>) -> Verdict {
            self.0.clone()
        }
    }

    fn confirm(s: u64) -> Verdict {
        Verdict::Confirm { reason: format!("{s}"), wait: Duration::from_secs(s) }
    }

    #[test]
    fn the_strictest_verdict_wins_whatever_the_order() {
        let forbid = Verdict::Forbid { reason: "no".into() };
        let all = [Verdict::Allow, confirm(5), forbid.clone()];
        for a in &all {
            for b in &all {
                let want = a.decision().max(b.decision());
                assert_eq!(a.clone().stricter(b.clone()).decision(), want, "{a:?} {b:?}");
            }
        }
        assert_eq!(
            confirm(9).stricter(confirm(3)),
            Verdict::Confirm { reason: "9".into(), wait: Duration::from_secs(3) }
        );
    }

    #[test]
    fn combined_policies_name_the_one_that_forbids() {
        let manifest = crate::tools::Registry::builtins().unwrap().get("choir.fs.read").unwrap().manifest.clone();
        let lane = LaneCtx::new("edge", choir_common::lane::Lane::Edge);
        let none: Vec<Arc<dyn CallPolicy>> = vec![];
        assert_eq!(
            combine(&none, &lane, "choir.fs.read", &manifest, &Value::Null, &Evidence::default()),
            Verdict::Allow
        );
        let policies: Vec<Arc<dyn CallPolicy>> = vec![
            Arc::new(Says(confirm(5))),
            Arc::new(Says(Verdict::Forbid { reason: "no".into() })),
            Arc::new(Says(Verdict::Allow)),
        ];
        assert_eq!(
            combine(&policies, &lane, "choir.fs.read", &manifest, &Value::Null, &Evidence::default()),
            Verdict::Forbid { reason: "says policy: no".into() }
        );
    }
}
