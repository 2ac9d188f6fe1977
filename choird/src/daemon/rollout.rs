//! Approvals that roll out (R-CTL-1): an approved tool or skill reaches the
//! running agent without another command. When `approvals.auto_update` is
//! on, a rollout thread waits for the agent to be between messages (at most
//! `approvals.idle_wait_s`), builds its image for the new inputs (docker),
//! and only then restarts it on that image; the new session resumes from the
//! recovery snapshot. Progress is kept for `choirctl approvals show`, the end
//! is written into the approval's `applied` record, audited, and told to the
//! agent's admins on Telegram (choirctl's `approvals approve` follows it).
//!
//! **Invariant:** a failed build changes nothing that runs: the agent is
//! stopped only after its new image exists.

use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use serde_json::json;

use super::Daemon;
use crate::config::RuntimeKind;

impl Daemon {
    /// Starts the rollout of approval `id` (a tool or skill of `agent`)
    /// when `approvals.auto_update` is on.
    pub(super) fn start_rollout(self: &Arc<Self>, id: i64, agent: &AgentId) {
        let config = self.config();
        if !config.approvals.auto_update {
            return;
        }
        self.rollouts.begin(id);
        let wait = Duration::from_secs(config.approvals.idle_wait_s);
        let (d, agent) = (self.clone(), agent.clone());
        if let Err(e) = self.tasks.spawn(format!("rollout-{id}"), move || d.run_rollout(id, &agent, wait)) {
            self.rollouts.update(id, |r| {
                r.state = "failed".into();
                r.outcome = Some(format!("the rollout could not start: {e}"));
            });
        }
    }

    fn run_rollout(self: &Arc<Self>, id: i64, agent: &AgentId, wait: Duration) {
        let result = self.roll_out(id, agent, wait);
        let (state, outcome) = match result {
            Ok((state, text)) => (state, text),
            Err(text) => ("failed", text),
        };
        log::info!("agent {agent}: rollout of proposal {id}: {state}: {outcome}");
        self.rollouts.update(id, |r| {
            r.state = state.into();
            r.outcome = Some(outcome.clone());
        });
        if let Err(e) = self.store.note_rollout(id, &format!("rollout {state}: {outcome}")) {
            log::warn!("proposal {id}: recording its rollout: {e}");
        }
        self.audit("choird", Some(agent), "approval.rollout", state, json!({"approval": id, "outcome": outcome}));
        self.events.send(crate::events::Event::RolloutDone {
            agent: agent.clone(),
            text: format!("Proposal {id} for {agent}: rollout {state}. {outcome}"),
        });
    }

    /// Waits for the agent to be idle, builds, restarts; `(state, outcome)`.
    fn roll_out(self: &Arc<Self>, id: i64, agent: &AgentId, wait: Duration) -> Result<(&'static str, String), String> {
        let say = |line: &str| self.rollouts.update(id, |r| r.lines.push(line.to_owned()));
        let not_running = || ("skipped", format!("{agent} is not running: it starts with the change"));
        let deadline = Instant::now() + wait;
        loop {
            if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(format!("choird is shutting down: {agent} gets the change at its next start"));
            }
            // Lanes the agent did not say just now may be old: not idle.
            let fresh = self.refresh_status(Some(agent), crate::sessions::STATUS_FRESH);
            let summary = self.summary(agent.as_str()).map_err(|e| e.to_string())?;
            if summary.state != "running" {
                return Ok(not_running());
            }
            let mut busy: Vec<String> = summary
                .lanes
                .iter()
                .filter(|l| !l.state.eq_ignore_ascii_case("idle"))
                .map(|l| l.lane.clone())
                .collect();
            if !fresh {
                let waited = crate::sessions::STATUS_WAIT.as_millis();
                busy.push(format!("its lanes unknown: no status within {waited} ms"));
            }
            if busy.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                say(&format!(
                    "still busy ({}) after {} s: restarting now; its work resumes from the recovery snapshot",
                    busy.join(", "),
                    wait.as_secs()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let runtime = self.config().runtime;
        let tag = match runtime {
            RuntimeKind::Docker => {
                self.rollouts.update(id, |r| r.state = "building".into());
                say(&format!("building {agent}'s image"));
                let tag = self
                    .build_image(agent.as_str(), say)
                    .map_err(|e| format!("the image build failed, so {agent} keeps running as it was: {e}"))?;
                Some(tag)
            }
            RuntimeKind::Process => None,
        };
        self.rollouts.update(id, |r| r.state = "rolling".into());
        let summary =
            self.restart_on(agent.as_str(), tag.as_deref(), &mut |l: &str| say(l)).map_err(|e| e.to_string())?;
        if summary.state == "stopped" {
            return Ok(not_running());
        }
        Ok((
            "done",
            match &summary.image {
                Some(image) => format!("{agent} runs {image} with the change"),
                None => format!("{agent} was restarted (pid {}) with the change", summary.pid.unwrap_or(0)),
            },
        ))
    }
}
