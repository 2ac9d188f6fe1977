//! Typed access to choird's tables. Every SQL statement choird runs lives here,
//! with parameters only (no SQL is built from data).

use choir_common::commit::{ChainError, ChainHead, CommitEvent, GENESIS_HASH};
use choir_common::ids::AgentId;
use choir_common::rpc::{Exchange, InboundMessage};
use serde_json::Value;

pub use calls::Tokens;

use crate::db::{Db, DbError};

mod approvals;
pub mod calls;
pub mod host_calls;
pub mod ledger;
pub mod memory;
pub mod memory_index;
pub mod schedule;
mod sessions;
pub mod telegram;
pub mod turns;
pub mod usage;

/// Replication refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// The events do not extend the stored chain (fork, gap, bad hash).
    #[error("commit log rejected: {0}")]
    Chain(#[from] ChainError),
    /// The database failed (retryable).
    #[error(transparent)]
    Db(#[from] DbError),
}

/// What [`Store::record_replies`] recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Conversations of notices refused because the agent was never
    /// addressed there.
    pub refused: Vec<String>,
    /// (message id, text) of every answer that was new.
    pub new: Vec<(u64, String)>,
    /// Conversations an answer or notice was queued for outside choird
    /// (by the [`Delivery`]).
    pub delivered: Vec<String>,
}

/// One row of the outbox of a chat outside choird (today: Telegram's).
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    /// The bot that sends it.
    pub bot: String,
    /// The chat it goes to.
    pub chat: i64,
    /// `text`, `file`, … (the sender's kinds).
    pub kind: &'static str,
    /// What the sender needs.
    pub body: serde_json::Value,
}

/// How a recorded answer reaches a chat outside choird: the outbox rows it
/// becomes, written in the answer's own transaction (so an answer is queued
/// exactly once with the answer itself). The Telegram gateway implements it;
/// the store knows only the outbox table.
pub trait Delivery: Send + Sync {
    /// The rows for `text` answered in `conversation` (none: not a chat
    /// this delivers to).
    fn rows(&self, conversation: &str, text: &str) -> Vec<OutboxRow>;
}

/// Delivers nowhere (choirctl conversations, tests).
pub struct Nowhere;

impl Delivery for Nowhere {
    fn rows(&self, _conversation: &str, _text: &str) -> Vec<OutboxRow> {
        Vec::new()
    }
}

/// Queues a row of the chat outbox (`telegram_outbox`) inside a transaction.
pub fn enqueue(
    tx: &mut postgres::Transaction<'_>,
    bot: &str,
    chat: i64,
    kind: &str,
    body: &Value,
) -> Result<i64, postgres::Error> {
    let row = tx.query_one(ENQUEUE, &[&bot, &chat, &kind, body])?;
    Ok(row.get(0))
}

/// The statement of [`enqueue`] (prepared by callers on a hot path).
pub(crate) const ENQUEUE: &str =
    "INSERT INTO telegram_outbox (bot, chat_id, kind, body) VALUES ($1, $2, $3, $4) RETURNING id";

/// The store, a thin layer over the pool.
pub struct Store {
    pub(crate) db: Db,
    /// Cost ledger rows waiting for the next answer's statement.
    pub(crate) ledger: calls::Ledger,
}

/// Queues message `$4` from `$3` in conversation `$2` for agent `$1`,
/// once every earlier message of the agent has committed
/// (`agent_messages_before` takes `lock_agent_messages`, migration 0018:
/// the agent is handed its messages past a position, so one committing
/// after a later one would be passed over); returns its id, then what was
/// read under that lock ([`Queued`]). Public for the test of that order.
pub const INSERT_MESSAGE: &str = "WITH turn AS (SELECT * FROM agent_messages_before($1::text, $2::text))
     INSERT INTO messages (agent_id, conversation, sender, text)
     SELECT $1::text, $2::text, $3::text, $4::text FROM turn
     RETURNING id, (SELECT pending FROM turn), (SELECT earlier FROM turn)";

/// A message just queued, as its statement committed it: its id, and what
/// the statement read of the agent's messages once every earlier one had
/// committed (migration 0021): the highest id still unanswered before it,
/// and whether its conversation had messages before. Enough to hand it to
/// the agent's long-poll without reading it back (`Sessions::stored`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The message's id.
    pub id: u64,
    /// The highest id of the agent's messages still unanswered before it.
    pub pending_before: Option<u64>,
    /// Its conversation had messages before it.
    pub earlier: bool,
}

impl Queued {
    /// From a row of `id, pending, earlier`.
    fn from_row(row: &postgres::Row) -> Queued {
        Queued {
            id: row.get::<_, i64>(0) as u64,
            pending_before: row.get::<_, Option<i64>>(1).map(|p| p as u64),
            earlier: row.get(2),
        }
    }
}

/// An agent's unanswered messages after a position (`$1` agent, `$2` after,
/// `$3` limit), each with `earlier`: one probe of `messages_conversation`
/// per message. Any earlier message counts, answered or not: one handed out
/// while the one before it is still being answered may reach the edge after
/// that conversation was dropped. Public for the test that pins its plan.
pub const PENDING_MESSAGES: &str = "SELECT id, conversation, sender, text,
        EXISTS (SELECT 1 FROM messages p
                WHERE p.agent_id = m.agent_id AND p.conversation = m.conversation AND p.id < m.id)
 FROM messages m
 WHERE agent_id = $1 AND id > $2 AND replied_at IS NULL ORDER BY id LIMIT $3";

/// Message ids (of every agent: they share one sequence) that a restarted
/// agent's choice of conversations to hold looks back over: one range of
/// the primary key, at most this many rows read. With every message
/// answered in a long history, the whole-history query took 0.36 s for
/// 1,000,000 of one agent's messages (of the crash → resumed budget of
/// 0.5 s); the window 10–16 ms.
pub const RECENT_WINDOW: i64 = 20_000;

/// The `$3` most recently answered conversations of agent `$1` among the
/// messages with ids in (`$2 - $4`, `$2`], least recent first. Public for
/// the test that pins its plan.
pub const RECENT_CONVERSATIONS: &str = "SELECT conversation FROM (
     SELECT conversation, max(id) AS last FROM messages
     WHERE agent_id = $1 AND replied_at IS NOT NULL AND id <= $2 AND id > $2 - $4
     GROUP BY conversation ORDER BY last DESC LIMIT $3) r
 ORDER BY last";

/// The last answered exchanges of one conversation in a range of ids (`$1`
/// agent, `$2` conversation, `$3` after, `$4` up to, `$5` limit), oldest
/// first: one range of `messages_conversation`. Public for the test that pins its plan.
pub const EXCHANGES_AFTER: &str = "SELECT text, reply, id FROM (
     SELECT id, text, reply FROM messages
     WHERE agent_id = $1 AND conversation = $2 AND id > $3 AND id <= $4 AND replied_at IS NOT NULL
     ORDER BY id DESC LIMIT $5) t ORDER BY id";

/// The latest compaction of one conversation (`$1` agent, `$2`
/// conversation): one probe of `commit_events_compactions`. Public for the
/// test that pins its plan.
pub const COMPACTION_OF: &str = "SELECT event->'result'->>'summary',
        CASE WHEN (event->'input'->>'upto_message') ~ '^[0-9]{1,18}$'
             THEN (event->'input'->>'upto_message')::bigint ELSE 0 END
 FROM commit_events
 WHERE agent_id = $1 AND event->'input'->>'conversation' = $2
   AND event->>'kind' = 'compaction' AND event->>'outcome' = 'ok'
 ORDER BY seq DESC LIMIT 1";

/// Where an agent stands: what choird holds of its chain, and of its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The replicated chain head.
    pub head: ChainHead,
    /// The highest message id the agent answered (its word, cut to the
    /// highest message): the answered history a restarted agent recovers
    /// ends here.
    pub processed: u64,
    /// Where a (re)started agent is handed messages from, and resumes the
    /// turns of its commit log after: just below the agent's first
    /// unanswered message, never above `processed`.
    ///
    /// **Invariant:** every message of the agent above this position that
    /// is not answered is handed out again, in id order. One high-water
    /// mark is not enough: the edge answers a conversation's messages
    /// (several, when they were injected into its running turn) while an
    /// earlier message of another conversation waits or runs, and the
    /// answer's position passes over that message; an agent that stopped
    /// then was never handed it again.
    pub resume_from: u64,
}

/// An agent's head, processed position, and the position below its first
/// unanswered message (one probe of `messages_pending`); `$1` agent.
/// Public for the test that pins its plan.
pub const AGENT_POSITION: &str = "SELECT s.head_seq, s.head_hash, p.processed_upto,
        coalesce((SELECT min(m.id) - 1 FROM messages m WHERE m.agent_id = $1 AND m.replied_at IS NULL),
                 p.processed_upto)
   FROM agent_state s JOIN agent_processed p USING (agent_id) WHERE agent_id = $1";

impl Store {
    /// Wraps a migrated database.
    pub fn new(db: Db) -> Store {
        Store { db, ledger: calls::Ledger::default() }
    }

    /// Sets a policy value (e.g. `kill_switch`).
    pub fn set_policy(&self, key: &str, value: &Value, actor: &str) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "INSERT INTO policy (key, value, updated_by) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET value = $2, updated_by = $3, updated_at = now()",
                &[&key, value, &actor],
            )
            .map(drop)
        })
    }

    /// A policy value.
    pub fn policy(&self, key: &str) -> Result<Option<Value>, DbError> {
        self.db.with(|c| Ok(c.query_opt("SELECT value FROM policy WHERE key = $1", &[&key])?.map(|r| r.get(0))))
    }

    /// Opens a session (a lease) and returns its id.
    pub fn create_session(&self, agent: &AgentId, runtime: &str, token_sha256: &[u8]) -> Result<i64, DbError> {
        self.db.with(|c| {
            let row = c.query_one(
                "INSERT INTO sessions (agent_id, runtime, token_sha256) VALUES ($1, $2, $3) RETURNING id",
                &[&agent.as_str(), &runtime, &token_sha256],
            )?;
            Ok(row.get(0))
        })
    }

    /// Marks a session's INIT_HELLO.
    pub fn session_hello(&self, session: i64) -> Result<(), DbError> {
        self.db.with(|c| c.execute("UPDATE sessions SET hello_at = now() WHERE id = $1", &[&session]).map(drop))
    }

    /// Ends a session (idempotent: the first reason wins).
    pub fn end_session(&self, session: i64, reason: &str) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE sessions SET ended_at = now(), end_reason = $2 WHERE id = $1 AND ended_at IS NULL",
                &[&session, &reason],
            )
            .map(drop)
        })
    }

    /// Ends sessions a previous choird left open, except the adopted ones;
    /// returns how many were ended.
    pub fn end_orphaned_sessions(&self, adopted: &[i64]) -> Result<u64, DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE sessions SET ended_at = now(), end_reason = 'choird restarted'
                 WHERE ended_at IS NULL AND NOT (id = ANY($1))",
                &[&adopted],
            )
        })
    }

    /// Appends an audit record.
    pub fn audit(
        &self,
        actor: &str,
        agent: Option<&AgentId>,
        action: &str,
        outcome: &str,
        detail: &Value,
    ) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "INSERT INTO audit (actor, agent_id, action, outcome, detail) VALUES ($1, $2, $3, $4, $5)",
                &[&actor, &agent.map(AgentId::as_str), &action, &outcome, detail],
            )
            .map(drop)
        })
    }

    /// Audit rows, newest last (for choirctl and tests).
    pub fn audit_rows(&self, agent: Option<&AgentId>, limit: i64) -> Result<Vec<Value>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT id, to_char(at, 'YYYY-MM-DD\"T\"HH24:MI:SS.MSOF'), actor, agent_id, action, outcome, detail
                 FROM (SELECT * FROM audit WHERE ($1::text IS NULL OR agent_id = $1) ORDER BY id DESC LIMIT $2) a
                 ORDER BY id",
                &[&agent.map(AgentId::as_str), &limit],
            )?;
            Ok(rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "id": r.get::<_, i64>(0), "at": r.get::<_, String>(1), "actor": r.get::<_, String>(2),
                        "agent_id": r.get::<_, Option<String>>(3), "action": r.get::<_, String>(4),
                        "outcome": r.get::<_, String>(5), "detail": r.get::<_, Value>(6),
                    })
                })
                .collect())
        })
    }

    /// The agent's replicated head and message positions, creating their
    /// rows on first use (the processed position has a row of its own: see
    /// `turns::PROCESSED`).
    pub fn agent_position(&self, agent: &AgentId) -> Result<Position, DbError> {
        self.db.with(|c| {
            c.execute(
                "INSERT INTO agent_state (agent_id, head_hash) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&agent.as_str(), &GENESIS_HASH],
            )?;
            c.execute("INSERT INTO agent_processed (agent_id) VALUES ($1) ON CONFLICT DO NOTHING", &[&agent.as_str()])?;
            let row = c.query_one(AGENT_POSITION, &[&agent.as_str()])?;
            let head = ChainHead { seq: row.get::<_, i64>(0) as u64, hash: row.get(1) };
            let processed = row.get::<_, i64>(2) as u64;
            Ok(Position { head, processed, resume_from: (row.get::<_, i64>(3) as u64).min(processed) })
        })
    }

    /// The conversations of agent `agent` with a message still unanswered
    /// (at most `limit`, one range of `messages_pending`).
    pub fn conversations_waiting(&self, agent: &AgentId, limit: i64) -> Result<Vec<String>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT DISTINCT conversation FROM (SELECT conversation FROM messages
                  WHERE agent_id = $1 AND replied_at IS NULL ORDER BY id LIMIT 10000) w LIMIT $2",
                &[&agent.as_str(), &limit],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// Replicated events with `seq > after`, in order.
    pub fn events(&self, agent: &AgentId, after: u64, limit: i64) -> Result<Vec<CommitEvent>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT event FROM commit_events WHERE agent_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                &[&agent.as_str(), &(after as i64), &limit],
            )?;
            Ok(rows.iter().filter_map(|r| serde_json::from_value(r.get::<_, Value>(0)).ok()).collect())
        })
    }

    /// The keys of an agent's `n` most recently answered conversations among
    /// the messages of the last [`RECENT_WINDOW`] ids up to `upto`, least
    /// recent first: what a (re)started agent holds at once. Reads at most
    /// the window, however long the history (a conversation answered only
    /// before it is recalled when it speaks again).
    pub fn recent_conversations(&self, agent: &AgentId, upto: u64, n: i64) -> Result<Vec<String>, DbError> {
        self.db.with(|c| {
            let rows = c.query(RECENT_CONVERSATIONS, &[&agent.as_str(), &(upto as i64), &n, &RECENT_WINDOW])?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// Answered exchanges of one conversation with `after < id <= upto`, the
    /// last `limit` of them, oldest first.
    pub fn exchanges_after(
        &self,
        agent: &AgentId,
        conversation: &str,
        after: u64,
        upto: u64,
        limit: i64,
    ) -> Result<Vec<Exchange>, DbError> {
        self.db.with(|c| {
            let rows =
                c.query(EXCHANGES_AFTER, &[&agent.as_str(), &conversation, &(after as i64), &(upto as i64), &limit])?;
            Ok(rows
                .iter()
                .map(|r| Exchange {
                    user: r.get(0),
                    assistant: r.get::<_, Option<String>>(1).unwrap_or_default(),
                    id: r.get::<_, i64>(2) as u64,
                })
                .collect())
        })
    }

    /// The token digest of a session that has not ended (for adopting a
    /// container after a choird restart).
    pub fn open_session(&self, session: i64) -> Result<Option<(String, Vec<u8>)>, DbError> {
        self.db.with(|c| {
            let row = c.query_opt(
                "SELECT agent_id, token_sha256 FROM sessions WHERE id = $1 AND ended_at IS NULL",
                &[&session],
            )?;
            Ok(row.map(|r| (r.get(0), r.get(1))))
        })
    }

    /// Queues a user message.
    pub fn insert_message(
        &self,
        agent: &AgentId,
        conversation: &str,
        sender: &str,
        text: &str,
    ) -> Result<Queued, DbError> {
        self.db.with(|c| {
            let insert = c.prepared(INSERT_MESSAGE)?;
            let row = c.query_one(&insert, &[&agent.as_str(), &conversation, &sender, &text])?;
            Ok(Queued::from_row(&row))
        })
    }

    /// Unanswered messages with `id > after`, oldest first, each saying
    /// whether its conversation had messages before it.
    pub fn pending_messages(&self, agent: &AgentId, after: u64, limit: i64) -> Result<Vec<InboundMessage>, DbError> {
        self.db.with(|c| {
            let pending = c.prepared(PENDING_MESSAGES)?;
            let rows = c.query(&pending, &[&agent.as_str(), &(after as i64), &limit])?;
            Ok(rows
                .iter()
                .map(|r| InboundMessage {
                    id: r.get::<_, i64>(0) as u64,
                    conversation: r.get(1),
                    sender: r.get(2),
                    text: r.get(3),
                    earlier: r.get(4),
                })
                .collect())
        })
    }

    /// Whether `agent` has received a message in `conversation`.
    pub fn addressed(&self, agent: &AgentId, conversation: &str) -> Result<bool, DbError> {
        self.db.with(|c| {
            Ok(c.query_opt(
                "SELECT 1 FROM messages WHERE agent_id = $1 AND conversation = $2 LIMIT 1",
                &[&agent.as_str(), &conversation],
            )?
            .is_some())
        })
    }

    /// An agent's notices with `id > after`, oldest first, as (id, conversation, text).
    pub fn notices(&self, agent: &AgentId, after: i64, limit: i64) -> Result<Vec<(i64, String, String)>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT id, conversation, text FROM notices WHERE agent_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                &[&agent.as_str(), &after, &limit],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
        })
    }

    /// The latest compaction of one conversation: its summary as committed
    /// and the highest message id it folded (an index probe:
    /// `commit_events_compactions`).
    pub fn compaction_of(&self, agent: &AgentId, conversation: &str) -> Result<Option<(String, u64)>, DbError> {
        self.db.with(|c| {
            let row = c.query_opt(COMPACTION_OF, &[&agent.as_str(), &conversation])?;
            Ok(row.and_then(|r| Some((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1) as u64))))
        })
    }

    /// The stored answer to a message, if any.
    pub fn reply_of(&self, agent: &AgentId, message: u64) -> Result<Option<String>, DbError> {
        self.db.with(|c| {
            let row = c.query_opt(
                "SELECT reply FROM messages WHERE agent_id = $1 AND id = $2",
                &[&agent.as_str(), &(message as i64)],
            )?;
            Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
        })
    }

    /// Counters for the metrics page: replied messages per agent, committed
    /// events per agent and outcome, relayed tokens per agent and kind.
    pub fn metric_counts(&self) -> Result<MetricCounts, DbError> {
        self.flush_ledger_for_read();
        self.db.with(|c| {
            let mut m = MetricCounts::default();
            for r in c.query("SELECT agent_id, count(*) FROM messages WHERE replied_at IS NOT NULL GROUP BY 1", &[])? {
                m.processed.insert(r.get(0), r.get::<_, i64>(1) as u64);
            }
            for r in c.query(
                "SELECT agent_id, coalesce(event->>'outcome', '?'), count(*) FROM commit_events GROUP BY 1, 2",
                &[],
            )? {
                m.tool_calls.insert((r.get(0), r.get(1)), r.get::<_, i64>(2) as u64);
            }
            for r in c.query(
                "SELECT agent_id, coalesce(sum(prompt_tokens), 0)::bigint, coalesce(sum(completion_tokens), 0)::bigint
                 FROM llm_calls GROUP BY 1",
                &[],
            )? {
                let agent: String = r.get(0);
                m.tokens.insert((agent.clone(), "prompt".into()), r.get::<_, i64>(1) as u64);
                m.tokens.insert((agent, "completion".into()), r.get::<_, i64>(2) as u64);
            }
            Ok(m)
        })
    }

    /// All agents' tokens together, spent today (UTC) and in total.
    pub fn token_usage_all(&self) -> Result<(u64, u64), DbError> {
        self.flush_ledger_for_read();
        self.db.with(|c| {
            let row = c.query_one(
                "SELECT COALESCE(sum(tokens) FILTER (WHERE day = (now() AT TIME ZONE 'UTC')::date), 0)::bigint,
                        COALESCE(sum(tokens), 0)::bigint
                 FROM token_usage",
                &[],
            )?;
            Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
        })
    }

    /// An agent's tokens spent today (UTC) and in total.
    pub fn token_usage(&self, agent: &AgentId) -> Result<(u64, u64), DbError> {
        self.flush_ledger_for_read();
        self.db.with(|c| {
            let row = c.query_one(
                "SELECT COALESCE(sum(tokens) FILTER (WHERE day = (now() AT TIME ZONE 'UTC')::date), 0)::bigint,
                        COALESCE(sum(tokens), 0)::bigint
                 FROM token_usage WHERE agent_id = $1",
                &[&agent.as_str()],
            )?;
            Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
        })
    }
}

/// Counters for `metrics.rs`.
#[derive(Debug, Default)]
pub struct MetricCounts {
    /// Replied messages per agent.
    pub processed: std::collections::BTreeMap<String, u64>,
    /// Committed events per (agent, outcome).
    pub tool_calls: std::collections::BTreeMap<(String, String), u64>,
    /// Relayed tokens per (agent, `prompt`|`completion`).
    pub tokens: std::collections::BTreeMap<(String, String), u64>,
}
