//! Proposals and decisions (the `approvals` table): see
//! `crate::daemon` (approvals) for the pipeline these statements serve.

use choir_common::admin::ApprovalInfo;
use choir_common::ids::AgentId;
use choir_common::rpc::{ApprovalDecision, ApprovalRequest};

use super::Store;
use crate::db::DbError;
use crate::proposals::Proposal;

/// Seconds until a confirmation expires (`NULL`, never, for proposals).
fn expires_in(p: &Proposal, req: &ApprovalRequest) -> Option<f64> {
    (p.kind == choir_common::rpc::ProposalKind::Call).then(|| req.content["timeout_s"].as_u64().unwrap_or(0) as f64)
}

impl Store {
    /// Confirmations not decided within their time are refused (by choird).
    pub fn expire_confirmations(&self) -> Result<u64, DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'rejected', decided_by = 'choird',
                        decision_reason = 'not confirmed within its time', decided_at = now()
                 WHERE kind = 'call' AND status = 'pending' AND expires_at < now()",
                &[],
            )
        })
    }

    /// How many proposals of an agent wait for a decision.
    pub fn pending_count(&self, agent: &AgentId) -> Result<u64, DbError> {
        self.db.with(|c| {
            let row = c.query_one(
                "SELECT count(*) FROM approvals WHERE agent_id = $1 AND status = 'pending'",
                &[&agent.as_str()],
            )?;
            Ok(row.get::<_, i64>(0) as u64)
        })
    }

    /// Stores a validated proposal as pending; an identical pending one of
    /// the same agent (same digest) is returned instead. Returns (id, status).
    pub fn insert_approval(
        &self,
        agent: &AgentId,
        p: &Proposal,
        req: &ApprovalRequest,
    ) -> Result<(i64, String), DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let same = tx.query_opt(
                "SELECT id FROM approvals WHERE agent_id = $1 AND sha256 = $2 AND kind = $3 AND scope = $4 AND status = 'pending'",
                &[&agent.as_str(), &p.sha256, &p.kind.as_str(), &p.scope.as_str()],
            )?;
            if let Some(row) = same {
                return Ok((row.get(0), "pending".to_owned()));
            }
            let row = tx.query_one(
                "INSERT INTO approvals (agent_id, kind, scope, subject, content, sha256, reason, lane, skill, state, conversation,
                                        expires_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                         now() + make_interval(secs => $12::float8)) RETURNING id",
                &[
                    &agent.as_str(),
                    &p.kind.as_str(),
                    &p.scope.as_str(),
                    &p.subject,
                    &p.canonical,
                    &p.sha256,
                    &req.reason,
                    &req.lane,
                    &req.skill,
                    &req.state,
                    &req.conversation,
                    &expires_in(p, req),
                ],
            )?;
            tx.commit()?;
            Ok((row.get(0), "pending".to_owned()))
        })
    }

    /// Proposals, newest first, optionally of one status and one agent.
    pub fn approvals(
        &self,
        status: Option<&str>,
        agent: Option<&AgentId>,
        limit: i64,
    ) -> Result<Vec<(ApprovalInfo, String)>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "{APPROVAL_COLUMNS} WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR agent_id = $2)
                     ORDER BY id DESC LIMIT $3"
                ),
                &[&status, &agent.map(AgentId::as_str), &limit],
            )?;
            Ok(rows.iter().map(approval_row).collect())
        })
    }

    /// One proposal and its stored content.
    pub fn approval(&self, id: i64) -> Result<Option<(ApprovalInfo, String)>, DbError> {
        self.db.with(|c| {
            let row = c.query_opt(&format!("{APPROVAL_COLUMNS} WHERE id = $1"), &[&id])?;
            Ok(row.as_ref().map(approval_row))
        })
    }

    /// Records a decision on a pending proposal whose stored content and
    /// digest are still exactly `content` and `sha256`; false if it was
    /// decided meanwhile or changed since it was read.
    pub fn decide_approval(
        &self,
        id: i64,
        status: &str,
        by: &str,
        reason: Option<&str>,
        content: &str,
        sha256: &str,
    ) -> Result<bool, DbError> {
        self.db.with(|c| {
            let n = c.execute(
                "UPDATE approvals SET status = $2, decided_by = $3, decision_reason = $4, decided_at = now()
                 WHERE id = $1 AND status = 'pending' AND content = $5 AND sha256 = $6",
                &[&id, &status, &by, &reason, &content, &sha256],
            )?;
            Ok(n == 1)
        })
    }

    /// Records how an approved proposal was applied; the decision is handed
    /// to the agent from now on.
    pub fn set_applied(&self, id: i64, applied: &str) -> Result<(), DbError> {
        self.db.with(|c| c.execute("UPDATE approvals SET applied = $2 WHERE id = $1", &[&id, &applied]).map(drop))
    }

    /// Appends how its rollout ended to an approval's `applied` record.
    pub fn note_rollout(&self, id: i64, note: &str) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute("UPDATE approvals SET applied = coalesce(applied || '; ', '') || $2 WHERE id = $1", &[&id, &note])
                .map(drop)
        })
    }

    /// Puts an approval whose application failed back to pending.
    pub fn reopen_approval(&self, id: i64) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE approvals SET status = 'pending', decided_by = NULL, decided_at = NULL WHERE id = $1",
                &[&id],
            )
            .map(drop)
        })
    }

    /// Decisions not yet handed to the agent, marked handed over now.
    pub fn take_decisions(&self, agent: &AgentId) -> Result<Vec<ApprovalDecision>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "UPDATE approvals SET delivered_at = now()
                 WHERE agent_id = $1 AND decided_at IS NOT NULL AND delivered_at IS NULL
                   AND (status = 'rejected' OR applied IS NOT NULL)
                 RETURNING id, status, kind, subject, decided_by, decision_reason, conversation, sha256",
                &[&agent.as_str()],
            )?;
            let mut out: Vec<ApprovalDecision> = rows
                .iter()
                .map(|r| ApprovalDecision {
                    approval_id: r.get(0),
                    status: r.get(1),
                    subject: format!("{} {}", r.get::<_, String>(2), r.get::<_, String>(3)),
                    decided_by: r.get::<_, Option<String>>(4).unwrap_or_default(),
                    reason: r.get(5),
                    conversation: r.get(6),
                    sha256: r.get(7),
                })
                .collect();
            out.sort_by_key(|d| d.approval_id);
            Ok(out)
        })
    }
}

const APPROVAL_COLUMNS: &str = "SELECT id, agent_id, kind, scope, subject, sha256, reason, lane, skill, state, status,
        created_at::text, decided_at::text, decided_by, decision_reason, applied, content FROM approvals";

fn approval_row(r: &postgres::Row) -> (ApprovalInfo, String) {
    let content: String = r.get(16);
    let sha256: String = r.get(5);
    let info = ApprovalInfo {
        id: r.get(0),
        agent: r.get(1),
        kind: r.get(2),
        scope: r.get(3),
        subject: r.get(4),
        intact: crate::proposals::digest(&content) == sha256,
        sha256,
        reason: r.get(6),
        lane: r.get(7),
        skill: r.get(8),
        state: r.get(9),
        status: r.get(10),
        created_at: r.get(11),
        decided_at: r.get(12),
        decided_by: r.get(13),
        decision_reason: r.get(14),
        applied: r.get(15),
        rollout: None,
    };
    (info, content)
}
