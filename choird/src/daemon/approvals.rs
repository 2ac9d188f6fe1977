//! The approval pipeline's control-plane side (R-TOOL-8, R-CTL-1):
//! REQUEST_APPROVAL from agents, and the operator's list / show / approve /
//! reject (choirctl today, Telegram admins later: both call these methods).
//!
//! **Invariant:** an approval is bound to the sha256 of the proposal's
//! canonical content: approving checks that the stored content still has the
//! digest it was proposed with (and the one the approver saw, when given),
//! claims the row only if neither changed, and applies exactly that content.
//! An altered proposal is reported and never applied; it needs a new proposal.

use std::sync::Arc;

use choir_common::admin::{AddRequest, ApprovalDetail, ApprovalInfo, ApprovalList, ApproveRequest};
use choir_common::arg_policy::MAX_REMEMBER_DAYS;
use choir_common::ids::AgentId;
use choir_common::rpc::{ApprovalRequest, ApprovalResponse, ProposalKind, ProposalScope};
use serde_json::{json, Value};

use super::{Authed, Daemon};
use crate::error::Error;
use crate::proposals::{self, Approval};

fn kind_of(s: &str) -> Result<ProposalKind, Error> {
    match s {
        "tool" => Ok(ProposalKind::Tool),
        "skill" => Ok(ProposalKind::Skill),
        "config_change" => Ok(ProposalKind::ConfigChange),
        "call" => Ok(ProposalKind::Call),
        "schedule" => Ok(ProposalKind::Schedule),
        "mcp" => Ok(ProposalKind::Mcp),
        other => Err(Error::Internal(format!("stored proposal of unknown kind {other:?}"))),
    }
}

fn scope_of(s: &str) -> ProposalScope {
    if s == "global" {
        ProposalScope::Global
    } else {
        ProposalScope::Agent
    }
}

impl Daemon {
    /// The agent's current settings, as JSON (every key, defaults included).
    fn agent_settings(&self, agent: &AgentId) -> Value {
        let config = self.config();
        config.agents.get(agent).and_then(|a| serde_json::to_value(a).ok()).unwrap_or_else(|| json!({}))
    }

    /// REQUEST_APPROVAL: validates the proposal completely, stores it as
    /// pending with its digest, and tells the operator's channels.
    pub fn request_approval(&self, who: &Authed, req: &ApprovalRequest) -> Result<ApprovalResponse, Error> {
        // What only the operator may propose is never taken from an agent.
        let operators = req.content.get("spec").is_some() || req.content.get("remove").is_some();
        if req.lane == proposals::OPERATOR_LANE || (req.kind == ProposalKind::Mcp && operators) {
            self.audit(
                "agent-rpc",
                Some(&who.agent),
                "REQUEST_APPROVAL",
                "invalid",
                json!({"kind": req.kind.as_str(), "error": "operator-only proposal"}),
            );
            return Err(Error::Invalid(
                "an MCP server (and anything else the operator adds with choirctl) is never proposed by an agent"
                    .into(),
            ));
        }
        let settings = self.agent_settings(&who.agent);
        let validated = proposals::validate(&self.home, &who.agent, &settings, req).and_then(|p| {
            // A job is checked against the agent too: its chat, tools, skill.
            if req.kind == ProposalKind::Schedule {
                let spec = super::schedule::proposed_spec(&req.content).map_err(proposals::Invalid)?;
                self.check_job(&who.agent, &spec).map_err(proposals::Invalid)?;
            }
            Ok(p)
        });
        let proposal = match validated {
            Ok(p) => p,
            Err(e) => {
                self.audit(
                    "agent-rpc",
                    Some(&who.agent),
                    "REQUEST_APPROVAL",
                    "invalid",
                    json!({"kind": req.kind.as_str(), "error": e.0}),
                );
                return Err(Error::Invalid(e.0));
            }
        };
        let quota = self.config().agents.get(&who.agent).map(|a| a.quotas.pending_proposals).unwrap_or_default();
        let waiting = self.store.pending_count(&who.agent)?;
        if waiting >= quota {
            self.audit(
                "agent-rpc",
                Some(&who.agent),
                "REQUEST_APPROVAL",
                "over_quota",
                json!({"kind": req.kind.as_str(), "pending": waiting}),
            );
            return Err(Error::Invalid(format!(
                "{waiting} proposal(s) of this agent already wait for a human (quotas.pending_proposals is {quota}); \
                 wait for their decisions before proposing more"
            )));
        }
        let (id, status) = self.store.insert_approval(&who.agent, &proposal, req)?;
        self.audit(
            "agent-rpc",
            Some(&who.agent),
            "REQUEST_APPROVAL",
            "pending",
            json!({"approval": id, "kind": req.kind.as_str(), "subject": proposal.subject, "sha256": proposal.sha256, "lane": req.lane}),
        );
        if status == "pending" {
            self.events.send(crate::events::Event::ProposalPending { id });
        }
        log::info!(
            "agent {}: proposal {id} ({} {}) waits for approval: choirctl approvals show {id}",
            who.agent,
            req.kind.as_str(),
            proposal.subject
        );
        Ok(ApprovalResponse {
            approval_id: id,
            summary: format!("{} {} proposed", req.kind.as_str(), proposal.subject),
            sha256: proposal.sha256,
            status,
        })
    }

    /// `choirctl tools add` / `skills add`: a file the operator reviewed
    /// takes the path of an approved proposal — validated exactly as one,
    /// recorded, and approved by the operator at once (committed to
    /// `repos/` by git, then rolled out). Nobody is asked: the operator is
    /// the human. A refused file changes nothing.
    pub fn add_reviewed(self: &Arc<Self>, agent: &str, add: &AddRequest) -> Result<ApprovalInfo, Error> {
        let agent = self.known_agent(agent)?;
        let kind = match add.kind.as_str() {
            "tool" => ProposalKind::Tool,
            "skill" => ProposalKind::Skill,
            "mcp" => ProposalKind::Mcp,
            other => return Err(Error::Malformed(format!("kind {other:?}: add a tool, a skill or an MCP server"))),
        };
        let request = ApprovalRequest {
            kind,
            scope: if add.global { ProposalScope::Global } else { ProposalScope::Agent },
            content: add.content.clone(),
            reason: "added by the operator with choirctl".into(),
            lane: proposals::OPERATOR_LANE.into(),
            skill: None,
            state: None,
            conversation: None,
        };
        let settings = self.agent_settings(&agent);
        let proposal = proposals::validate(&self.home, &agent, &settings, &request).map_err(|e| {
            self.audit("admin", Some(&agent), "repos.add", "invalid", json!({"kind": add.kind, "error": e.0}));
            Error::Invalid(e.0)
        })?;
        let (id, _) = self.store.insert_approval(&agent, &proposal, &request)?;
        self.audit(
            "admin",
            Some(&agent),
            "repos.add",
            "ok",
            json!({"approval": id, "kind": add.kind, "subject": proposal.subject, "global": add.global}),
        );
        self.approve(
            id,
            &ApproveRequest {
                sha256: Some(proposal.sha256.clone()),
                by: Some("admin".into()),
                remember_days: None,
                pins: None,
            },
        )
    }

    /// Proposals, newest first.
    pub fn approvals(&self, status: Option<&str>, agent: Option<&str>) -> Result<ApprovalList, Error> {
        self.store.expire_confirmations()?;
        if let Some(s) = status.filter(|s| !matches!(*s, "pending" | "approved" | "rejected")) {
            return Err(Error::Malformed(format!("no status {s:?}; use pending, approved or rejected")));
        }
        let agent = agent.map(AgentId::parse).transpose().map_err(|e| Error::Malformed(e.to_string()))?;
        let rows = self.store.approvals(status, agent.as_ref(), 500)?;
        Ok(ApprovalList { approvals: rows.into_iter().map(|(info, _)| info).collect() })
    }

    fn load_approval(&self, id: i64) -> Result<(ApprovalInfo, String), Error> {
        let (mut info, text) =
            self.store.approval(id)?.ok_or_else(|| Error::NotFound(format!("there is no proposal {id}")))?;
        info.rollout = self.rollouts.get(id);
        Ok((info, text))
    }

    /// One proposal: its content and a diff against what it would replace.
    pub fn approval(&self, id: i64) -> Result<ApprovalDetail, Error> {
        let (info, text) = self.load_approval(id)?;
        let content: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let agent = AgentId::parse(&info.agent).map_err(|e| Error::Internal(e.to_string()))?;
        let diff = if info.status == "pending" {
            proposals::render(
                &self.home,
                &agent,
                kind_of(&info.kind)?,
                scope_of(&info.scope),
                &content,
                &self.agent_settings(&agent),
            )
        } else {
            format!("(already {}; applied as {})\n", info.status, info.applied.as_deref().unwrap_or("-"))
        };
        Ok(ApprovalDetail { info, content, diff })
    }

    /// Approves proposal `id` and applies it: a tool or skill is committed to
    /// its repository clone and rolled out to the running agent when
    /// `approvals.auto_update` is on (see `rollout.rs`; else the next
    /// `agent update` or start picks it up); a config change is written to
    /// `config.json` and reloaded.
    pub fn approve(self: &Arc<Self>, id: i64, req: &ApproveRequest) -> Result<ApprovalInfo, Error> {
        // A backup sees an approval wholly or not at all.
        let _applying = self.approval_gate()?;
        self.store.expire_confirmations()?;
        let by = req.by.clone().unwrap_or_else(|| "admin".to_owned());
        let (info, text) = self.load_approval(id)?;
        let agent = AgentId::parse(&info.agent).map_err(|e| Error::Internal(e.to_string()))?;
        if !info.intact {
            self.audit(&by, Some(&agent), "approval.approve", "refused_altered", json!({"approval": id}));
            return Err(Error::Conflict(format!(
                "proposal {id} was altered after it was proposed: its content no longer has sha256 {}; it cannot be \
                 approved and needs a new proposal",
                info.sha256
            )));
        }
        // The digest seen, or (from a Telegram button, whose data is short) a
        // prefix of at least 32 hex digits of it.
        let matches = |seen: &str| seen == info.sha256 || (seen.len() >= 32 && info.sha256.starts_with(seen));
        if let Some(seen) = req.sha256.as_deref().filter(|s| !matches(s)) {
            return Err(Error::Conflict(format!(
                "proposal {id} has sha256 {}, not the {seen} you approved; look at it again (choirctl approvals show {id})",
                info.sha256
            )));
        }
        if info.status != "pending" {
            return Err(Error::Conflict(format!("proposal {id} is already {}", info.status)));
        }
        let kind = kind_of(&info.kind)?;
        // Refused before anything is decided: remembering is for a call, for
        // a bounded time.
        if let Some(days) = req.remember_days {
            if kind != ProposalKind::Call {
                return Err(Error::Malformed(format!(
                    "remember_days is for a call's confirmation; proposal {id} is a {}",
                    info.kind
                )));
            }
            if days == 0 || days > MAX_REMEMBER_DAYS {
                return Err(Error::Malformed(format!("remember_days must be between 1 and {MAX_REMEMBER_DAYS}")));
            }
        }
        let content: Value = serde_json::from_str(&text).map_err(|e| Error::Internal(e.to_string()))?;
        // Claim it first: only a row still pending with this very content moves on.
        if !self.store.decide_approval(id, "approved", &by, None, &text, &info.sha256)? {
            return Err(Error::Conflict(format!("proposal {id} changed or was decided meanwhile; look at it again")));
        }
        let applied = match kind {
            ProposalKind::ConfigChange => self.apply_config_change(&agent, &content),
            // The agent runs the exact call when it hears the decision.
            ProposalKind::Call => match req.remember_days {
                None => Ok(format!("the agent may run {} once", info.subject)),
                Some(days) => self.remember_destinations(&agent, id, &content, days, &by).map(|kept| {
                    format!("the agent may run {} once; remembered for {days} day(s): {kept}", info.subject)
                }),
            },
            ProposalKind::Schedule => super::schedule::proposed_spec(&content)
                .map_err(|e| e.to_string())
                .and_then(|spec| {
                    self.schedule_add(agent.as_str(), &spec, &format!("approval #{id} ({by})"))
                        .map_err(|e| e.to_string())
                })
                .map(|row| {
                    format!("scheduled job {} added; first firing {}", row.spec.name, row.next_due.unwrap_or_default())
                }),
            _ => proposals::apply(
                &self.home,
                &Approval {
                    id,
                    agent: &agent,
                    kind,
                    scope: scope_of(&info.scope),
                    subject: &info.subject,
                    content: &content,
                    sha256: &info.sha256,
                    reason: &info.reason,
                    approver: &by,
                    pins: req.pins.as_ref(),
                },
            )
            .map(|commit| {
                format!(
                    "commit {commit} in {}",
                    proposals::repo_dir(&self.home, &agent, scope_of(&info.scope)).display()
                )
            })
            .map_err(|e| e.to_string()),
        };
        match applied {
            Ok(applied) => {
                self.store.set_applied(id, &applied)?;
                self.audit(
                    &by,
                    Some(&agent),
                    "approval.approve",
                    "approved",
                    json!({"approval": id, "sha256": info.sha256, "applied": applied}),
                );
                log::info!("proposal {id} approved by {by}: {applied}");
                self.decision_due(&agent);
                self.events.send(crate::events::Event::ProposalDecided { id });
                if matches!(kind, ProposalKind::Tool | ProposalKind::Skill | ProposalKind::Mcp) {
                    self.start_rollout(id, &agent);
                }
                Ok(self.load_approval(id)?.0)
            }
            Err(e) => {
                self.store.reopen_approval(id)?;
                self.audit(&by, Some(&agent), "approval.approve", "apply_failed", json!({"approval": id, "error": e}));
                Err(Error::Internal(format!("proposal {id} could not be applied, and stays pending: {e}")))
            }
        }
    }

    /// Remembers the destinations of the confirmed calls in
    /// `content` for `agent` for `days`, audited, and sends the agent its
    /// policy with them; what was kept, for the record.
    fn remember_destinations(
        self: &Arc<Self>,
        agent: &AgentId,
        id: i64,
        content: &Value,
        days: u64,
        by: &str,
    ) -> Result<String, String> {
        let until = choir_common::arg_policy::now_unix() + days * 86_400;
        let mut kept: Vec<String> = Vec::new();
        for call in choir_common::rpc::confirmed_calls(content) {
            let tool = call["tool"].as_str().unwrap_or_default();
            let runtime = crate::arg_policies::runtime_of(&self.home, &self.host_tools, agent, tool);
            let values = crate::arg_policies::destinations_of(runtime.as_ref(), &call["input"]);
            if values.is_empty() {
                continue;
            }
            crate::arg_policies::remember(&self.home, agent, &values, until, id, tool, by)?;
            self.audit(
                by,
                Some(agent),
                "approval.remember",
                "remembered",
                json!({"approval": id, "tool": tool, "values": values, "until_unix": until}),
            );
            kept.extend(values.into_iter().filter(|v| !kept.contains(v)).collect::<Vec<_>>());
        }
        if kept.is_empty() {
            return Ok("nothing (no call has a destination)".into());
        }
        self.reload_policies(by);
        Ok(kept.join(", "))
    }

    /// Rejects proposal `id`, with a reason the agent is told.
    pub fn reject(&self, id: i64, reason: &str, by: Option<&str>) -> Result<ApprovalInfo, Error> {
        self.store.expire_confirmations()?;
        let by = by.unwrap_or("admin");
        if reason.trim().is_empty() {
            return Err(Error::Malformed("a rejection needs a reason (--reason TEXT)".into()));
        }
        let (info, text) = self.load_approval(id)?;
        if info.status != "pending" {
            return Err(Error::Conflict(format!("proposal {id} is already {}", info.status)));
        }
        let agent = AgentId::parse(&info.agent).map_err(|e| Error::Internal(e.to_string()))?;
        // A rejection stands whatever the content became; it binds the digest proposed.
        if !self.store.decide_approval(id, "rejected", by, Some(reason), &text, &info.sha256)? {
            return Err(Error::Conflict(format!("proposal {id} changed or was decided meanwhile; look at it again")));
        }
        self.audit(by, Some(&agent), "approval.reject", "rejected", json!({"approval": id, "reason": reason}));
        self.decision_due(&agent);
        self.events.send(crate::events::Event::ProposalDecided { id });
        Ok(self.load_approval(id)?.0)
    }

    /// Writes an approved config change into `config.json` and reloads it.
    fn apply_config_change(&self, agent: &AgentId, content: &Value) -> Result<String, String> {
        let mut changed = Vec::new();
        self.rewrite_config(|text| {
            let (new, keys) = proposals::apply_config(text, agent, content).map_err(|e| e.to_string())?;
            changed = keys;
            Ok(new)
        })?;
        Ok(format!("config.json agents.{agent}: {}", changed.join(", ")))
    }

    /// Replaces an agent's tool policy in `config.json` (rewritten
    /// atomically) and applies it: running agents refetch their dynamic
    /// config and offer and run only what it permits.
    pub fn set_tool_policy(
        &self,
        id: &str,
        policy: &choir_common::tool_policy::ToolPolicy,
        force: bool,
    ) -> Result<choir_common::tool_policy::ToolPolicy, Error> {
        let agent = self.known(id)?;
        policy.check().map_err(|e| Error::Malformed(format!("agents.{agent}.tools.{e}")))?;
        // A pattern naming no tool the agent has is most often a typo, and a
        // mistyped deny leaves the tool allowed: refused unless forced (a
        // rule for a tool not installed yet).
        if !force {
            let (_, known) = crate::tool_list::known_names(&self.shared, &self.host_tools, &agent)?;
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            let current = self.config().agents.get(&agent).map(|a| a.tools.clone()).unwrap_or_default();
            let unmatched = policy.unmatched(&known, &current);
            if !unmatched.is_empty() {
                let each: Vec<String> = unmatched.iter().map(|u| format!("agents.{agent}.tools.{u}")).collect();
                return Err(Error::Malformed(format!(
                    "{}; nothing changed (`choirctl tools list {agent}` shows its tools; --force keeps a pattern for a \
                     tool not installed yet)",
                    each.join("; ")
                )));
            }
        }
        self.rewrite_config(|text| {
            let value = (*policy != choir_common::tool_policy::ToolPolicy::default()).then(|| json!(policy));
            crate::config::edit::set(text, &["agents", agent.as_str(), "tools"], value.as_ref())
        })
        .map_err(Error::Conflict)?;
        self.audit("admin", Some(&agent), "policy.tools", "ok", json!({"allow": policy.allow, "deny": policy.deny}));
        log::info!("agent {agent}: tool policy now allow {:?}, deny {:?}", policy.allow, policy.deny);
        Ok(self.config().agents.get(&agent).map(|a| a.tools.clone()).unwrap_or_default())
    }

    /// Marks that the agent has a decision to receive and wakes its poll.
    fn decision_due(&self, agent: &AgentId) {
        self.sessions.decision_due(agent);
    }

    /// Asks a running agent to cancel `lane` (`edge`, `core:<job>` or `all`).
    pub fn cancel_lane(&self, id: &str, lane: &str, actor: &str) -> Result<(), Error> {
        let id = self.known(id)?;
        let valid = lane == "edge" || lane == "all" || lane.strip_prefix("core:").is_some_and(|j| !j.is_empty());
        if !valid {
            return Err(Error::Malformed(format!("no lane {lane:?}; use edge, core:<job> or all")));
        }
        match self.sessions.cancel(&id, lane) {
            None => return Err(Error::NotFound(format!("no agent {id}"))),
            Some(false) => return Err(Error::Conflict(format!("agent {id} is not running"))),
            Some(true) => {}
        }
        self.audit(actor, Some(&id), "agent.cancel", "requested", json!({"lane": lane}));
        Ok(())
    }
}
