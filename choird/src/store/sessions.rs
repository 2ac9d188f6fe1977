//! Sessions as the operator sees them (`choirctl sessions`).

use choir_common::admin::SessionRow;
use choir_common::ids::AgentId;

use super::Store;
use crate::db::DbError;

impl Store {
    /// Records what a session runs in (`container <id>`, `pid <n>`).
    pub fn set_session_instance(&self, session: i64, instance: &str) -> Result<(), DbError> {
        self.db.with(|c| c.execute("UPDATE sessions SET instance = $2 WHERE id = $1", &[&session, &instance]).map(drop))
    }

    /// The latest `limit` sessions, of one agent or all, newest first, with
    /// their commits and model tokens.
    pub fn sessions(&self, agent: Option<&AgentId>, limit: i64) -> Result<Vec<SessionRow>, DbError> {
        let agent = agent.map(AgentId::as_str);
        self.flush_ledger_for_read();
        self.db.with(|c| {
            let rows = c.query(
                "SELECT s.id, s.agent_id, s.runtime, s.started_at::text, s.ended_at::text, s.end_reason, s.instance,
                        extract(epoch FROM coalesce(s.ended_at, now()) - s.started_at)::float8,
                        (SELECT count(*) FROM commit_events e WHERE e.session_id = s.id),
                        (SELECT coalesce(sum(l.prompt_tokens + l.completion_tokens), 0)::bigint
                           FROM llm_calls l WHERE l.session_id = s.id)
                 FROM sessions s WHERE $1::text IS NULL OR s.agent_id = $1
                 ORDER BY s.id DESC LIMIT $2",
                &[&agent, &limit],
            )?;
            Ok(rows
                .iter()
                .map(|r| SessionRow {
                    id: r.get(0),
                    agent: r.get(1),
                    runtime: r.get(2),
                    started_at: r.get(3),
                    ended_at: r.get(4),
                    end_reason: r.get(5),
                    instance: r.get(6),
                    seconds: r.get::<_, f64>(7).max(0.0) as u64,
                    commits: r.get::<_, i64>(8) as u64,
                    tokens: r.get::<_, i64>(9) as u64,
                })
                .collect())
        })
    }
}
