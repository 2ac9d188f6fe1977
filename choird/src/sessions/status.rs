//! The agent summaries `choirctl status` and `agent list` show.

use super::*;

impl Sessions {
    /// The summary of one agent (`None`: no slot).
    pub fn summary(&self, id: &AgentId, runtime: &str) -> Option<AgentSummary> {
        self.table.lock().get(id).map(|slot| summary(id, slot, runtime))
    }

    /// Summaries of the agents `keep` selects, or that have a live session.
    pub fn summaries(&self, runtime: &str, keep: impl Fn(&AgentId) -> bool) -> Vec<AgentSummary> {
        let t = self.table.lock();
        t.iter()
            .filter(|(id, slot)| keep(id) || slot.session.is_some())
            .map(|(id, s)| summary(id, s, runtime))
            .collect()
    }
}

/// The runtime a live session runs in (a SIGHUP may have switched the
/// configured one since; it applies at the next start).
fn running_runtime(instance: &Instance) -> &'static str {
    match instance {
        Instance::Process { .. } => "process",
        Instance::Container { .. } => "docker",
    }
}

fn summary(id: &AgentId, slot: &AgentSlot, configured: &str) -> AgentSummary {
    let s = slot.session.as_ref();
    let runtime = s.and_then(|s| s.instance.as_ref()).map(running_runtime).unwrap_or(configured);
    AgentSummary {
        id: id.to_string(),
        runtime: runtime.to_owned(),
        configured_runtime: (runtime != configured).then(|| configured.to_owned()),
        state: slot.phase.as_str().to_owned(),
        session_id: s.map(|s| s.id).or(slot.last_session),
        pid: s.and_then(|s| match &s.instance {
            Some(Instance::Process { pid }) => Some(*pid),
            _ => None,
        }),
        container: s.and_then(|s| match &s.instance {
            Some(Instance::Container { id, .. }) => Some(id.clone()),
            _ => None,
        }),
        image: s.and_then(|s| match &s.instance {
            Some(Instance::Container { image, .. }) => Some(image.clone()),
            _ => None,
        }),
        last_heartbeat_ms: s.map(|s| s.last_seen.elapsed().as_millis() as u64),
        replicated_seq: slot.replicated_seq,
        // What the agent last reported holds only while its session lives:
        // a stopped agent has no session state and no lanes.
        session_state: s.and(slot.status.as_ref()).map(|st| st.session_state.clone()),
        lanes: s.and(slot.status.as_ref()).map(|st| st.lanes.clone()).unwrap_or_default(),
        // How the previous session ended is news until the agent runs again.
        last_exit: (slot.phase != Phase::Running).then(|| slot.last_exit.clone()).flatten(),
        config_version: s.and(slot.config_version),
        fallbacks: None,
    }
}
