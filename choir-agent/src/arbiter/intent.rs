//! Control flow: what a lane has read since its user last spoke, and the
//! turn's **trusted intent** — the tools what was asked needs, fixed from
//! trusted input only. A policy rule about the call itself
//! (`choir_common::arg_policy::CallCondition`) judges by them; the shipped
//! default asks a human before a tool that acts outside runs after
//! untrusted content entered the turn, unless the intent includes it (a
//! tool without arguments — unlock the door — is harmful by the call
//! alone, and no rule over values can see that).
//!
//! **The intent, deterministically, from the lane's history:**
//! - in a skill, the state's tool list (an operator-approved procedure);
//! - in a core job started with `allowed_tools` whose inherited context had
//!   read nothing untrusted since its user spoke (a scheduled job's list is
//!   the operator's), that list;
//! - otherwise the tools named by the lane's `choir.plan` calls made after
//!   the user's last message and **before anything untrusted entered**: the
//!   model had seen only the user's and operator's words. The arbiter
//!   refuses a plan made later ([`plan_refusal`]), so an injected page cannot
//!   widen it. The plan calls are committed like any call, so the log holds
//!   the intent every decision was made under.
//!
//! What counts as untrusted content is [`Origin::untrusted_tools`]: an
//! untrusted tool's result, or a summary that folded one. A core job counts
//! what it inherited after its user's last message too. **Limit:** the plan
//! is the model's, made from trusted input; a model already steered by
//! untrusted content of an *earlier* turn still in its context can plan for
//! the attacker. The values of the calls it plans are still judged by their
//! roles and provenance.

use std::collections::{BTreeMap, BTreeSet};

use choir_common::ids::canonical_tool_name;
use serde_json::Value;

use crate::arbiter::lane_ctx::LaneCtx;
use crate::arbiter::provenance::Evidence;
use crate::origin::{Entry, Origin};

pub use crate::tools::plan::{MAX_PLANNED, PLAN_TOOL};

/// Most untrusted places a lane's facts name.
const MAX_PLACES: usize = 4;

/// What fixed a turn's intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentBy {
    /// The skill state's tool list.
    Skill(String),
    /// The core job's `allowed_tools`.
    Task,
    /// The lane's plan, made before anything untrusted was read.
    Plan,
    /// Nothing: no tool is part of it.
    Nothing,
}

/// A lane's state as far as control flow goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneFacts {
    /// The untrusted tools whose output entered since the user last spoke
    /// (empty: none), at most a few.
    pub untrusted: Vec<String>,
    /// The tools the intent includes.
    pub intent: BTreeSet<String>,
    /// How many calls of a tool the plan said the request needs.
    pub times: BTreeMap<String, u64>,
    /// Calls of each tool that ran since the user last spoke.
    pub done: BTreeMap<String, u64>,
    /// What fixed it.
    pub by: IntentBy,
}

impl LaneFacts {
    /// Whether untrusted content entered since the user last spoke.
    pub fn after_untrusted(&self) -> bool {
        !self.untrusted.is_empty()
    }

    /// Whether a call of `tool` now is part of the intent: the tool is, and
    /// the calls the plan counted for it are not used up.
    pub fn includes(&self, tool: &str) -> bool {
        self.intent.contains(tool)
            && self.times.get(tool).is_none_or(|n| self.done.get(tool).copied().unwrap_or(0) < *n)
    }

    /// For a human: why a call of `tool` counts as not asked for.
    pub fn explain(&self, tool: &str) -> String {
        if let (true, Some(n)) = (self.intent.contains(tool), self.times.get(tool)) {
            return format!(
                "the plan made before anything untrusted was read needed {n} call(s) of {tool}, and {} ran; since \
                 the user's message the lane had read the output of {}",
                self.done.get(tool).copied().unwrap_or(0),
                self.untrusted.join(", ")
            );
        }
        let intent = match &self.by {
            IntentBy::Skill(s) => format!("the skill state {s} allows {}", list(&self.intent)),
            IntentBy::Task => format!("the job's allowed tools are {}", list(&self.intent)),
            IntentBy::Plan => format!("the plan made before anything untrusted was read named {}", list(&self.intent)),
            IntentBy::Nothing => "no plan was made before anything untrusted was read".to_owned(),
        };
        format!(
            "{tool} was not part of what was asked ({intent}); since the user's message the lane had read the output of {}",
            self.untrusted.join(", ")
        )
    }
}

fn list(tools: &BTreeSet<String>) -> String {
    if tools.is_empty() {
        "no tool".to_owned()
    } else {
        tools.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// The tools a `choir.plan` input names, and the calls it counts, if it is one.
fn planned(arguments: &str) -> Option<(Vec<String>, BTreeMap<String, u64>)> {
    let v: Value = serde_json::from_str(arguments).ok()?;
    let tools = v.get("tools")?.as_array()?;
    let tools: Vec<String> = tools.iter().map(|t| t.as_str().map(str::to_owned)).collect::<Option<_>>()?;
    let times = v
        .get("times")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, n)| Some((k.clone(), n.as_u64()?))).take(MAX_PLANNED).collect())
        .unwrap_or_default();
    Some((tools, times))
}

/// Whether the tool call `id` was answered with success in `entries`.
fn succeeded(entries: &[&Entry], id: &str) -> bool {
    entries.iter().any(|e| {
        matches!(&e.origin, Origin::Tool { tool, .. } if tool == PLAN_TOOL)
            && e.message.tool_call_id.as_deref() == Some(id)
            && e.message
                .content
                .as_deref()
                .and_then(|c| serde_json::from_str::<Value>(c).ok())
                .is_some_and(|r| r["status"] == "success")
    })
}

/// `lane`'s facts from its evidence (see the module's rule).
pub fn lane_facts(lane: &LaneCtx, ev: &Evidence<'_>) -> LaneFacts {
    let all: Vec<&Entry> = ev.inherited.iter().chain(ev.history).collect();
    let own_from = ev.inherited.len();
    let start = all.iter().rposition(|e| e.origin == Origin::User).map_or(0, |i| i + 1);
    let mut untrusted: Vec<String> = Vec::new();
    let mut inherited_untrusted = false;
    let mut plan: BTreeSet<String> = BTreeSet::new();
    let mut times: BTreeMap<String, u64> = BTreeMap::new();
    let mut planned_any = false;
    for (i, e) in all.iter().enumerate().skip(start) {
        let tools = e.origin.untrusted_tools();
        if !tools.is_empty() {
            inherited_untrusted |= i < own_from;
            for t in tools {
                if !untrusted.contains(&t) && untrusted.len() < MAX_PLACES {
                    untrusted.push(t);
                }
            }
            continue;
        }
        if !untrusted.is_empty() || i < own_from || e.origin != Origin::Model {
            continue;
        }
        for call in &e.message.tool_calls {
            if canonical_tool_name(&call.function.name).as_deref() != Some(PLAN_TOOL) {
                continue;
            }
            if let Some((tools, counts)) = planned(&call.function.arguments).filter(|_| succeeded(&all[i..], &call.id))
            {
                planned_any = true;
                plan.extend(tools.into_iter().take(MAX_PLANNED));
                for (t, n) in counts {
                    *times.entry(t).or_default() += n;
                }
            }
        }
    }
    let (intent, by) = match (&lane.skill, &lane.allowlist) {
        (Some(at), Some(list)) => {
            (list.iter().cloned().collect(), IntentBy::Skill(format!("{}/{}", at.name, at.state)))
        }
        (None, Some(list)) if lane.task_allowlist.is_some() && !inherited_untrusted => {
            (list.iter().cloned().collect(), IntentBy::Task)
        }
        _ if planned_any => (plan, IntentBy::Plan),
        _ => (BTreeSet::new(), IntentBy::Nothing),
    };
    if by != IntentBy::Plan {
        times.clear();
    }
    // The calls of counted tools that ran in the turn (a refused or failed
    // one does not count).
    let mut done: BTreeMap<String, u64> = BTreeMap::new();
    for e in &all[start.min(all.len())..] {
        if let Origin::Tool { tool, .. } = &e.origin {
            if times.contains_key(tool)
                && e.message
                    .content
                    .as_deref()
                    .and_then(|c| serde_json::from_str::<Value>(c).ok())
                    .is_some_and(|r| r["status"] == "success")
            {
                *done.entry(tool.clone()).or_default() += 1;
            }
        }
    }
    LaneFacts { untrusted, intent, times, done, by }
}

/// Why a `choir.plan` call with `input` must be refused now, if it must:
/// untrusted content already entered the turn, or it names a tool that is
/// not one of `known`.
pub fn plan_refusal(facts: &LaneFacts, input: &Value, known: &dyn Fn(&str) -> bool) -> Option<String> {
    if facts.after_untrusted() {
        return Some(format!(
            "a plan is made before anything untrusted is read, and since the user's message this lane read the \
             output of {}; go on without one (a tool that acts outside then needs a human's confirmation)",
            facts.untrusted.join(", ")
        ));
    }
    let tools: Vec<&str> = input["tools"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let unknown: Vec<&str> = tools.iter().copied().filter(|t| !known(t)).collect();
    if !unknown.is_empty() {
        return Some(format!("the plan names tools that are not offered here: {}", unknown.join(", ")));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use choir_common::openai::{ChatMessage, FunctionCall, Role, ToolCall};
    use choir_common::trust::OutputTrust;

    fn calls(id: &str, tool: &str, args: &str) -> Entry {
        let mut m = ChatMessage::text(Role::Assistant, "");
        m.content = None;
        m.tool_calls = vec![ToolCall {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall { name: tool.into(), arguments: args.into() },
            extra_content: None,
        }];
        Entry::model(m)
    }

    fn result(id: &str, tool: &str, status: &str, trust: OutputTrust) -> Entry {
        Entry::tool_result(
            id,
            format!(r#"{{"status": "{status}", "summary": "x"}}"#),
            Origin::Tool { tool: tool.into(), trust },
        )
    }

    fn plan(id: &str, tools: &str) -> [Entry; 2] {
        [
            calls(id, "choir__plan", &format!(r#"{{"tools": {tools}}}"#)),
            result(id, PLAN_TOOL, "success", OutputTrust::Trusted),
        ]
    }

    fn web(id: &str) -> [Entry; 2] {
        [
            calls(id, "choir__web__browse", r#"{"action": "open"}"#),
            result(id, "choir.web.browse", "success", OutputTrust::Untrusted),
        ]
    }

    fn facts(history: &[Entry]) -> LaneFacts {
        lane_facts(&LaneCtx::new("edge", choir_common::lane::Lane::Edge), &Evidence { history, ..Evidence::default() })
    }

    #[test]
    fn a_plan_made_before_untrusted_content_is_the_intent_and_one_made_after_is_not() {
        let mut h = vec![Entry::user("book the flight and mail me")];
        h.extend(plan("p1", r#"["x.book", "choir.email.send"]"#));
        h.extend(web("w1"));
        h.extend(plan("p2", r#"["x.unlock_door"]"#));
        let f = facts(&h);
        assert_eq!(f.by, IntentBy::Plan);
        assert_eq!(f.intent, BTreeSet::from(["x.book".to_owned(), "choir.email.send".to_owned()]));
        assert_eq!(f.untrusted, vec!["choir.web.browse".to_owned()]);
        assert!(f.explain("x.unlock_door").contains("read the output of choir.web.browse"));
        // A new user message starts a new turn: nothing untrusted, no plan.
        h.push(Entry::user("thanks"));
        let f = facts(&h);
        assert!(!f.after_untrusted());
        assert_eq!(f.by, IntentBy::Nothing);
    }

    #[test]
    fn regression_a_second_call_of_a_planned_tool_ran_for_the_injection() {
        // The user asked for one reminder; the page asked for another.
        let mut h = vec![Entry::user("add a reminder to book the hotel")];
        h.push(calls("p1", "choir__plan", r#"{"tools": ["x.cal.create"], "times": {"x.cal.create": 1}}"#));
        h.push(result("p1", PLAN_TOOL, "success", OutputTrust::Trusted));
        h.extend(web("w1"));
        assert!(facts(&h).includes("x.cal.create"), "the first is the user's");
        h.push(calls("c1", "x__cal__create", "{}"));
        h.push(result("c1", "x.cal.create", "success", OutputTrust::Trusted));
        let f = facts(&h);
        assert!(!f.includes("x.cal.create"));
        assert!(
            f.explain("x.cal.create").contains("needed 1 call(s) of x.cal.create, and 1 ran"),
            "{}",
            f.explain("x.cal.create")
        );
        // The negative control: a plan without counts allows any number.
        let mut h2 = vec![Entry::user("add reminders")];
        h2.extend(plan("p1", r#"["x.cal.create"]"#));
        h2.extend(web("w1"));
        h2.push(calls("c1", "x__cal__create", "{}"));
        h2.push(result("c1", "x.cal.create", "success", OutputTrust::Trusted));
        assert!(facts(&h2).includes("x.cal.create"));
    }

    #[test]
    fn a_refused_plan_fixes_nothing() {
        let mut h = vec![Entry::user("hi")];
        h.push(calls("p1", "choir__plan", r#"{"tools": ["x.unlock_door", "nope"]}"#));
        h.push(result("p1", PLAN_TOOL, "rejected", OutputTrust::Trusted));
        assert_eq!(facts(&h).by, IntentBy::Nothing);
    }

    #[test]
    fn a_plan_is_refused_after_untrusted_content_or_naming_unknown_tools() {
        let known = |t: &str| t.starts_with("x.");
        let input = serde_json::json!({"tools": ["x.a"]});
        let mut h = vec![Entry::user("hi")];
        assert_eq!(plan_refusal(&facts(&h), &input, &known), None);
        let bad = serde_json::json!({"tools": ["x.a", "y.b"]});
        assert!(plan_refusal(&facts(&h), &bad, &known).unwrap().contains("not offered here: y.b"));
        h.extend(web("w1"));
        assert!(plan_refusal(&facts(&h), &input, &known).unwrap().contains("read the output of choir.web.browse"));
    }

    #[test]
    fn a_job_counts_what_it_inherited_and_its_task_list_is_intent_only_when_clean() {
        let mut lane = LaneCtx::new("core-j", choir_common::lane::Lane::Core);
        lane.allowlist = Some(vec!["x.book".into()]);
        lane.task_allowlist = lane.allowlist.clone();
        let clean = vec![Entry::user("book it")];
        let f = lane_facts(&lane, &Evidence { inherited: &clean, ..Evidence::default() });
        assert_eq!((f.by.clone(), f.after_untrusted()), (IntentBy::Task, false));
        let mut tainted = clean.clone();
        tainted.extend(web("w1"));
        let f = lane_facts(&lane, &Evidence { inherited: &tainted, ..Evidence::default() });
        assert!(f.after_untrusted());
        assert_eq!(f.by, IntentBy::Nothing, "a list chosen by a model that had read a page is no intent");
    }
}
