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

impl Store {
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
