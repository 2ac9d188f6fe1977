//! SQL of at-most-once host tool calls (`host_calls`).

use choir_common::ids::AgentId;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Store;
use crate::db::DbError;

/// What claiming a call found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// First time: it is claimed; run it and store its outcome.
    New,
    /// It ran before: its outcome (the result, or the error's message).
    Done(Result<Value, String>),
    /// It was claimed before and never finished (choird died while it ran).
    Unfinished,
    /// The call id was used for another tool or input.
    Different,
}

fn input_sha(tool: &str, input: &Value) -> String {
    let canonical = choir_common::commit::canonical_json(&json!({"tool": tool, "input": input}));
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// Most user messages, scheduled jobs and stored events choird reads to
/// judge one host-tool call (the newest of each).
pub const EVIDENCE_MESSAGES: i64 = 200;
/// See [`EVIDENCE_MESSAGES`].
pub const EVIDENCE_EVENTS: i64 = 200;
/// Most of one reported result read (in characters).
pub const EVIDENCE_RESULT_BYTES: i32 = 64 * 1024;

/// What choird witnessed of an agent, for judging a host-tool call's
/// arguments by its own record rather than the agent's word.
#[derive(Debug, Clone, Default)]
pub struct Witnessed {
    /// The texts of the newest messages people sent the agent.
    pub user: Vec<String>,
    /// The specs of its scheduled jobs (set by the operator or approved by
    /// a person).
    pub jobs: Vec<Value>,
    /// The results of the newest tool calls the agent reported, each with
    /// its tool's name, as JSON text, each cut at [`EVIDENCE_RESULT_BYTES`]
    /// (the agent's word: never more than untrusted).
    pub results: Vec<(String, String)>,
}

impl Store {
    /// What choird witnessed of `agent` (see [`Witnessed`]).
    pub fn witnessed(&self, agent: &AgentId) -> Result<Witnessed, DbError> {
        self.db.with(|c| {
            let user = c
                .query(
                    "SELECT text FROM messages WHERE agent_id = $1 ORDER BY id DESC LIMIT $2",
                    &[&agent.as_str(), &EVIDENCE_MESSAGES],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let jobs = c
                .query(
                    "SELECT spec FROM schedule_jobs WHERE agent_id = $1 ORDER BY id DESC LIMIT $2",
                    &[&agent.as_str(), &EVIDENCE_MESSAGES],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let results = c
                .query(
                    "SELECT coalesce(event->>'tool', ''), left((event->'result')::text, $3) FROM commit_events
                     WHERE agent_id = $1 AND event ? 'result' ORDER BY seq DESC LIMIT $2",
                    &[&agent.as_str(), &EVIDENCE_EVENTS, &EVIDENCE_RESULT_BYTES],
                )?
                .iter()
                .filter_map(|r| Some((r.get(0), r.get::<_, Option<String>>(1)?)))
                .collect();
            Ok(Witnessed { user, jobs, results })
        })
    }

    /// Uses up a person's approval of exactly this call — `tool` with
    /// `input`, for `agent`, approved within the last day and not used by
    /// another call — for the host call `marker`; true if there was one. A
    /// retry of the same call (same marker) finds its approval again. A
    /// confirmation of several calls decided together is used once per call
    /// it names (each call of it by one host call).
    pub fn use_call_approval(&self, agent: &AgentId, tool: &str, input: &Value, marker: &str) -> Result<bool, DbError> {
        // No approval holds a NUL (PostgreSQL's jsonb cannot): none to use,
        // and the database is not asked what it cannot answer.
        if input.to_string().contains("\\u0000") {
            return Ok(false);
        }
        // Its `applied` record says what used it: `…; used by host call
        // <marker>`, and for one of several calls ` as call #<n>.`.
        let used = format!("; used by host call {marker:?}");
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let rows = tx.query(
                "SELECT id, content, coalesce(applied, '') FROM approvals
                 WHERE agent_id = $1 AND kind = 'call' AND status = 'approved'
                   AND decided_at > now() - interval '1 day'
                   AND (content::jsonb ->> 'tool' = $2 AND content::jsonb -> 'input' = $3
                        OR EXISTS (SELECT 1 FROM jsonb_array_elements(
                                       CASE WHEN jsonb_typeof(content::jsonb -> 'calls') = 'array'
                                            THEN content::jsonb -> 'calls' ELSE '[]'::jsonb END) AS e
                                   WHERE e ->> 'tool' = $2 AND e -> 'input' = $3))
                 ORDER BY id FOR UPDATE",
                &[&agent.as_str(), &tool, input],
            )?;
            // Each (approval, its record, the mark this call would leave on it, whether that call of it is used).
            let mut candidates = Vec::new();
            for row in &rows {
                let (id, content, applied): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
                let content: Value = serde_json::from_str(&content).unwrap_or(Value::Null);
                let group = content.get("calls").is_some();
                for (i, call) in choir_common::rpc::confirmed_calls(&content).into_iter().enumerate() {
                    if call["tool"] != tool || call["input"] != *input {
                        continue;
                    }
                    let (mark, taken) = if group {
                        let which = format!(" as call #{}.", i + 1);
                        (format!("{used}{which}"), applied.contains(&which))
                    } else {
                        (used.clone(), applied.contains("; used by host call "))
                    };
                    candidates.push((id, applied.contains(&mark), mark, taken));
                }
            }
            // A retry finds what it used; else the oldest call not used.
            if candidates.iter().any(|(_, mine, _, _)| *mine) {
                return Ok(true);
            }
            let Some((id, _, mark, _)) = candidates.into_iter().find(|(_, _, _, taken)| !taken) else {
                return Ok(false);
            };
            tx.execute("UPDATE approvals SET applied = coalesce(applied, '') || $2 WHERE id = $1", &[&id, &mark])?;
            tx.commit()?;
            Ok(true)
        })
    }

    /// Claims `(agent, call_id)` for `tool` with `input` (see [`Claim`]).
    pub fn claim_host_call(&self, agent: &AgentId, call_id: &str, tool: &str, input: &Value) -> Result<Claim, DbError> {
        let sha = input_sha(tool, input);
        self.db.with(|c| {
            let inserted = c.execute(
                "INSERT INTO host_calls (agent_id, call_id, tool, input_sha256) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (agent_id, call_id) DO NOTHING",
                &[&agent.as_str(), &call_id, &tool, &sha],
            )?;
            if inserted == 1 {
                return Ok(Claim::New);
            }
            let row = c.query_one(
                "SELECT input_sha256, finished_at IS NOT NULL, outcome FROM host_calls WHERE agent_id = $1 AND call_id = $2",
                &[&agent.as_str(), &call_id],
            )?;
            let (stored_sha, finished, outcome): (String, bool, Option<Value>) = (row.get(0), row.get(1), row.get(2));
            if stored_sha != sha {
                return Ok(Claim::Different);
            }
            if !finished {
                return Ok(Claim::Unfinished);
            }
            let outcome = outcome.unwrap_or(Value::Null);
            Ok(Claim::Done(match outcome.get("error").and_then(Value::as_str) {
                Some(e) => Err(e.to_owned()),
                None => Ok(outcome.get("result").cloned().unwrap_or(Value::Null)),
            }))
        })
    }

    /// Stores the outcome of a claimed call.
    pub fn finish_host_call(
        &self,
        agent: &AgentId,
        call_id: &str,
        outcome: &Result<Value, String>,
    ) -> Result<(), DbError> {
        let stored = match outcome {
            Ok(v) => json!({"result": v}),
            Err(e) => json!({"error": e}),
        };
        self.db.with(|c| {
            c.execute(
                "UPDATE host_calls SET finished_at = now(), outcome = $3 WHERE agent_id = $1 AND call_id = $2",
                &[&agent.as_str(), &call_id, &stored],
            )
            .map(drop)
        })
    }
}
