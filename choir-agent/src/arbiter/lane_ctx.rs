//! The calling lane's context: who is calling a tool ([`LaneCtx`]: the lane,
//! its kind, allowlist, turn, skill and state, cancellation, the hooks lane
//! tools act on) and where a lane is in a skill ([`SkillAt`]). The arbiter
//! decides with it, proposals carry it to choird, and lanes and skills build
//! it; it knows none of them.

use choir_common::lane::Lane;

use std::sync::Arc;

use crate::origin::Entry;
use crate::tools::tool::LaneHooks;

/// Who is calling, and what they may call.
#[derive(Clone)]
pub struct LaneCtx {
    /// Lane name (`edge`, or a core job).
    pub lane: String,
    /// Edge or core (for output exposure).
    pub kind: Lane,
    /// Tools allowed right now; `None` means every offered tool.
    pub allowlist: Option<Vec<String>>,
    /// The inbound message whose turn this is.
    pub turn: Option<u64>,
    /// What lane tools act on (core pool, working memory).
    pub hooks: Option<Arc<dyn LaneHooks>>,
    /// Set when the lane is cancelled: every later call is refused (also
    /// after waiting for locks). `None` while a non-interruptible skill runs.
    pub cancel: Option<Arc<crate::cancel::Cancel>>,
    /// The skill and state the lane is in, if any (recorded in every event).
    pub skill: Option<SkillAt>,
    /// The user conversation this work is for (proposals carry it, so the
    /// decision is told there).
    pub conversation: Option<String>,
    /// Whether the lane waits for the decision on a proposal it makes.
    pub waits_for_approval: bool,
    /// When set, the tools listed to the model are narrowed to these (the
    /// allowlist still decides what may run).
    pub offer: Option<Vec<String>>,
    /// The task's allowlist (a core job started with `allowed_tools`): a
    /// skill run in this lane gets its state's list intersected with it.
    pub task_allowlist: Option<Vec<String>>,
    /// What the lane inherited from the lane that started it (a core job
    /// from the edge): provenance evidence, never shown to a model.
    pub inherited: Option<Arc<Vec<Entry>>>,
}

/// Where a lane is in a skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillAt {
    /// The skill.
    pub name: String,
    /// Its current state.
    pub state: String,
}

impl LaneCtx {
    /// A lane with no allowlist, turn, hooks, cancellation or skill.
    pub fn new(lane: &str, kind: Lane) -> LaneCtx {
        LaneCtx {
            lane: lane.to_owned(),
            kind,
            allowlist: None,
            turn: None,
            hooks: None,
            cancel: None,
            skill: None,
            conversation: None,
            waits_for_approval: false,
            offer: None,
            task_allowlist: None,
            inherited: None,
        }
    }

    /// Whether the lane has been cancelled (nothing more may run).
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.is_set())
    }
}

impl std::fmt::Debug for LaneCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneCtx")
            .field("lane", &self.lane)
            .field("allowlist", &self.allowlist)
            .field("turn", &self.turn)
            .field("skill", &self.skill)
            .finish()
    }
}
