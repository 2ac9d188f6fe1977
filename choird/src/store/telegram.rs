//! The Telegram gateway's tables: received updates and offsets, the
//! outbox, refused users, and messages that came from Telegram.
//!
//! **Invariant:** an update becomes at most one user message (unique per
//! (bot, update id)), written in the same transaction that marks the update
//! handled; an outbox row is written in the same transaction as the answer it
//! carries. A plain message (see [`Plain`]) may be queued in the very
//! transaction that stores its update, but only while no earlier update of
//! its bot waits for the dispatcher: users' messages are queued in the order
//! they were sent.

use choir_common::ids::AgentId;
use serde_json::Value;

use super::{Queued, Store};
use crate::db::DbError;

/// One row of the outbox.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Its id (order of sending within a chat).
    pub id: i64,
    /// The chat.
    pub chat_id: i64,
    /// `text`, `file` or `edit`.
    pub kind: String,
    /// What to send.
    pub body: Value,
    /// Failed attempts so far.
    pub attempts: i32,
}

/// A user message an update becomes with nothing to do but store it (text
/// from a user or group the bot's live config routes to an agent; no
/// command, no file): the poller queues it with its update in one
/// transaction instead of leaving it to the dispatcher.
#[derive(Debug, Clone)]
pub struct Plain {
    /// Its update.
    pub update_id: i64,
    /// The agent it goes to.
    pub agent: AgentId,
    /// The conversation of its chat.
    pub conversation: String,
    /// `telegram:<user id>`.
    pub sender: String,
    /// What the user wrote.
    pub text: String,
    /// Where it came from (bot, update id, chat, user, message id).
    pub origin: Value,
}

/// What [`Store::store_updates`] stored.
#[derive(Debug, Default)]
pub struct StoredUpdates {
    /// The offset to ask for next.
    pub next_offset: i64,
    /// The messages queued, in the order of their ids: each one's plain
    /// update (an index into the `plain` given) and what was before it.
    pub queued: Vec<(usize, Queued)>,
    /// Updates left to the dispatcher.
    pub for_dispatch: usize,
}

/// A batch of updates and the offset past it, in one statement (and so
/// one commit): `$2`/`$3` the batch in order, `$4`…`$8` the messages of its
/// plain prefix (row n is the batch's update n). The first update that is
/// not plain, was stored before, or has an earlier update of the bot still
/// waiting for the dispatcher is `blocked`: the updates before it are
/// stored handled with their messages queued (in order: the messages' ids
/// follow `ORDER BY`), it and the rest are stored for the dispatcher. The
/// messages' agents are locked first, in the order of their names, so each
/// message commits after every earlier one of its agent (see
/// [`super::INSERT_MESSAGE`]); under the lock, before any message of the
/// batch is inserted, each (agent, conversation) of the batch reads what
/// came before it (`agent_messages_before`, whose lock an agent's second
/// conversation takes again at once).
/// Returns the next offset, how many were left to the dispatcher, the
/// messages queued (ids, agents, conversations, update ids; in the order
/// of their ids) and what was read before them (agents, conversations,
/// the highest pending id, whether the conversation had messages).
pub const STORE_BATCH: &str = "WITH batch AS (
         SELECT b.id, b.payload, b.ord
         FROM unnest($2::bigint[], $3::jsonb[]) WITH ORDINALITY AS b(id, payload, ord)),
     plain AS (
         SELECT * FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::jsonb[]) WITH ORDINALITY
                AS p(agent, conversation, sender, text, origin, ord)),
     blocked AS (
         SELECT min(b.ord) AS ord
         FROM batch b LEFT JOIN plain p USING (ord)
         WHERE p.ord IS NULL
            OR (SELECT true FROM telegram_updates s WHERE s.bot = $1::text AND s.update_id = b.id) IS NOT NULL
            OR b.id > (SELECT min(update_id) FROM telegram_updates WHERE bot = $1::text AND handled_at IS NULL)),
     fast AS (
         INSERT INTO telegram_updates (bot, update_id, payload, handled_at, outcome)
         SELECT $1::text, b.id, b.payload, now(), 'queued' FROM batch b, blocked k
         WHERE k.ord IS NULL OR b.ord < k.ord
         ON CONFLICT (bot, update_id) DO NOTHING
         RETURNING update_id),
     turns AS (
         SELECT array_agg(pc.agent) AS agents, array_agg(pc.conversation) AS conversations,
                array_agg(h.pending) AS pending, array_agg(h.earlier) AS earlier
         FROM (SELECT DISTINCT agent, conversation FROM plain ORDER BY agent, conversation) pc,
              LATERAL agent_messages_before(pc.agent, pc.conversation) h),
     queued AS (
         INSERT INTO messages (agent_id, conversation, sender, text, origin)
         SELECT p.agent, p.conversation, p.sender, p.text, p.origin
         FROM plain p JOIN batch b USING (ord) JOIN fast f ON f.update_id = b.id CROSS JOIN turns
         ORDER BY p.ord
         ON CONFLICT ((origin->>'bot'), (origin->>'update_id')) WHERE origin IS NOT NULL DO NOTHING
         RETURNING id, agent_id, conversation, (origin->>'update_id')::bigint AS update_id),
     rest AS (
         INSERT INTO telegram_updates (bot, update_id, payload)
         SELECT $1::text, b.id, b.payload FROM batch b, blocked k WHERE b.ord >= k.ord
         ON CONFLICT (bot, update_id) DO NOTHING
         RETURNING update_id),
     next AS (
         INSERT INTO telegram_offsets (bot, next_offset) VALUES ($1::text, $9::bigint)
         ON CONFLICT (bot) DO UPDATE SET next_offset = GREATEST(telegram_offsets.next_offset, $9::bigint),
                                         updated_at = now()
         RETURNING next_offset)
     SELECT (SELECT next_offset FROM next), (SELECT count(*) FROM rest),
            (SELECT array_agg(id ORDER BY id) FROM queued), (SELECT array_agg(agent_id ORDER BY id) FROM queued),
            (SELECT array_agg(conversation ORDER BY id) FROM queued),
            (SELECT array_agg(update_id ORDER BY id) FROM queued),
            t.agents, t.conversations, t.pending, t.earlier
     FROM turns t";
/// A message a batch inserted (a row of its `queued`).
#[derive(Debug, Clone)]
struct Inserted {
    id: u64,
    agent: String,
    conversation: String,
    update: i64,
}

/// What a batch read of an (agent, conversation) under the agent's lock,
/// before inserting any of its messages.
#[derive(Debug, Clone)]
struct Before {
    agent: String,
    conversation: String,
    pending: Option<u64>,
    earlier: bool,
}

/// Each inserted message's update and [`Queued`] report, in id order: what
/// was read before the batch, moved along by the batch's own earlier
/// messages (the statement's reads could not see them). A message whose
/// (agent, conversation) was not read is reported as following an unknown
/// pending message, so its poll queries.
fn batch_reports(inserted: &[Inserted], before: &[Before]) -> Vec<(i64, Queued)> {
    let mut sorted: Vec<&Inserted> = inserted.iter().collect();
    sorted.sort_by_key(|m| m.id);
    let mut out: Vec<(i64, Queued)> = Vec::with_capacity(sorted.len());
    for (n, m) in sorted.iter().enumerate() {
        let read = before.iter().find(|b| b.agent == m.agent && b.conversation == m.conversation);
        let earlier_in_batch = sorted[..n].iter().rev().find(|e| e.agent == m.agent);
        let pending_before = match (earlier_in_batch, read) {
            (Some(e), _) => Some(e.id),
            (None, Some(b)) => b.pending,
            (None, None) => Some(u64::MAX),
        };
        let earlier = read.is_none_or(|b| b.earlier)
            || sorted[..n].iter().any(|e| e.agent == m.agent && e.conversation == m.conversation);
        out.push((m.update, Queued { id: m.id, pending_before, earlier }));
    }
    out
}

/// The dispatcher's message (`$1` agent … `$5` origin), once every earlier
/// message of the agent has committed (see [`super::INSERT_MESSAGE`]);
/// nothing if the update's message is queued already. Public for the test
/// of that order.
pub const INSERT_TELEGRAM_MESSAGE: &str = "WITH turn AS (SELECT * FROM agent_messages_before($1::text, $2::text))
     INSERT INTO messages (agent_id, conversation, sender, text, origin)
     SELECT $1::text, $2::text, $3::text, $4::text, $5::jsonb FROM turn
     ON CONFLICT ((origin->>'bot'), (origin->>'update_id')) WHERE origin IS NOT NULL DO NOTHING
     RETURNING id, (SELECT pending FROM turn), (SELECT earlier FROM turn)";
// The sender's statements, prepared once per connection: a statement sent
// as text costs a Parse round trip, and its Close rides on the connection's
// next use — another thread's turn.
const UNSENT: &str = "SELECT id, chat_id, kind, body, attempts FROM telegram_outbox
     WHERE bot = $1 AND sent_at IS NULL AND failed IS NULL ORDER BY id LIMIT $2";
const MARK_SENT: &str = "UPDATE telegram_outbox SET sent_at = now(), telegram_message_id = $2 WHERE id = $1";
const MARK_ATTEMPT: &str = "UPDATE telegram_outbox SET attempts = attempts + 1, last_error = $2,
            failed = CASE WHEN $3 THEN $2 ELSE NULL END WHERE id = $1";
const MARK_QUEUED: &str =
    "UPDATE telegram_updates SET handled_at = now(), outcome = 'queued' WHERE bot = $1 AND update_id = $2";

/// Queue depths of one bot.
#[derive(Debug, Clone, Copy, Default)]
pub struct Depths {
    /// Stored updates not yet handled.
    pub updates: i64,
    /// Outbox rows not yet sent (nor given up).
    pub outbox: i64,
    /// Outbox rows given up on.
    pub failed: i64,
}

pub use super::enqueue;

impl Store {
    /// The offset to ask `bot` for next (0: from the start).
    pub fn telegram_offset(&self, bot: &str) -> Result<i64, DbError> {
        self.db.with(|c| {
            let row = c.query_opt("SELECT next_offset FROM telegram_offsets WHERE bot = $1", &[&bot])?;
            Ok(row.map(|r| r.get(0)).unwrap_or(0))
        })
    }

    /// Stores updates (a resent one once) and moves the offset past them, in
    /// one statement, so one commit: only then may the offset be confirmed
    /// to Telegram. `plain` are queued as messages in the same statement,
    /// each with its update stored already handled, as long as no earlier
    /// update of the bot is left waiting for the dispatcher — from this
    /// batch or one before (the first that is not plain, was stored before,
    /// or has one stored before still waiting stops them: it and the rest
    /// are dispatched in order).
    pub fn store_updates(
        &self,
        bot: &str,
        updates: &[(i64, Value)],
        plain: &[Plain],
    ) -> Result<StoredUpdates, DbError> {
        let ids: Vec<i64> = updates.iter().map(|(id, _)| *id).collect();
        let payloads: Vec<&Value> = updates.iter().map(|(_, p)| p).collect();
        // The plain prefix of the batch, in its order (row n is update n).
        let prefix: Vec<&Plain> =
            updates.iter().map_while(|(id, _)| plain.iter().find(|p| p.update_id == *id)).collect();
        let column = |f: fn(&Plain) -> &str| prefix.iter().map(|p| f(p)).collect::<Vec<&str>>();
        let (agents, conversations, senders, texts) =
            (column(|p| p.agent.as_str()), column(|p| &p.conversation), column(|p| &p.sender), column(|p| &p.text));
        let origins: Vec<&Value> = prefix.iter().map(|p| &p.origin).collect();
        let next = updates.iter().map(|(id, _)| id + 1).max().unwrap_or(0);
        self.db.with(|c| {
            let store = c.prepared(STORE_BATCH)?;
            let row = c.query_one(
                &store,
                &[&bot, &ids, &payloads, &agents, &conversations, &senders, &texts, &origins, &next],
            )?;
            let list = |i: usize| row.get::<_, Option<Vec<String>>>(i).unwrap_or_default();
            let ids = row.get::<_, Option<Vec<i64>>>(2).unwrap_or_default();
            let updates = row.get::<_, Option<Vec<i64>>>(5).unwrap_or_default();
            let inserted: Vec<Inserted> = ids
                .iter()
                .zip(list(3))
                .zip(list(4))
                .zip(updates)
                .map(|(((id, agent), conversation), update)| Inserted { id: *id as u64, agent, conversation, update })
                .collect();
            let pending = row.get::<_, Option<Vec<Option<i64>>>>(8).unwrap_or_default();
            let earlier = row.get::<_, Option<Vec<bool>>>(9).unwrap_or_default();
            let before: Vec<Before> = list(6)
                .into_iter()
                .zip(list(7))
                .zip(pending)
                .zip(earlier)
                .map(|(((agent, conversation), pending), earlier)| Before {
                    agent,
                    conversation,
                    pending: pending.map(|p| p as u64),
                    earlier,
                })
                .collect();
            let queued = batch_reports(&inserted, &before)
                .into_iter()
                .filter_map(|(update, q)| plain.iter().position(|p| p.update_id == update).map(|i| (i, q)))
                .collect();
            Ok(StoredUpdates { next_offset: row.get(0), for_dispatch: row.get::<_, i64>(1) as usize, queued })
        })
    }

    /// Updates not yet handled, oldest first: (bot, update id, payload).
    pub fn pending_updates(&self, limit: i64) -> Result<Vec<(String, i64, Value)>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT bot, update_id, payload FROM telegram_updates WHERE handled_at IS NULL
                 ORDER BY bot, update_id LIMIT $1",
                &[&limit],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
        })
    }

    /// Marks an update handled with `outcome`.
    pub fn mark_update(&self, bot: &str, update_id: i64, outcome: &str) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE telegram_updates SET handled_at = now(), outcome = $3 WHERE bot = $1 AND update_id = $2",
                &[&bot, &update_id, &outcome],
            )
            .map(drop)
        })
    }

    /// Turns update `update_id` of `bot` into a user message for `agent` and
    /// marks it handled, in one transaction; `None` if it already was (a
    /// replay after a crash). `origin` must carry the same bot and update id.
    #[allow(clippy::too_many_arguments)]
    pub fn telegram_message(
        &self,
        bot: &str,
        update_id: i64,
        agent: &AgentId,
        conversation: &str,
        sender: &str,
        text: &str,
        origin: &Value,
    ) -> Result<Option<Queued>, DbError> {
        self.db.with(|c| {
            let message = c.prepared(INSERT_TELEGRAM_MESSAGE)?;
            let queued = c.prepared(MARK_QUEUED)?;
            let mut tx = c.transaction()?;
            let row = tx.query_opt(&message, &[&agent.as_str(), &conversation, &sender, &text, origin])?;
            tx.execute(&queued, &[&bot, &update_id])?;
            tx.commit()?;
            Ok(row.as_ref().map(Queued::from_row))
        })
    }

    /// Records that `user` was refused by `bot`; true the first time only.
    pub fn refuse_once(&self, bot: &str, user: i64) -> Result<bool, DbError> {
        self.db.with(|c| {
            let n = c.execute(
                "INSERT INTO telegram_refused (bot, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&bot, &user],
            )?;
            Ok(n == 1)
        })
    }

    /// Queues rows to send (in order).
    pub fn enqueue_outbox(&self, bot: &str, chat: i64, rows: &[(&str, Value)]) -> Result<(), DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            for (kind, body) in rows {
                enqueue(&mut tx, bot, chat, kind, body)?;
            }
            tx.commit()
        })
    }

    /// Unsent rows of `bot`, oldest first.
    pub fn unsent(&self, bot: &str, limit: i64) -> Result<Vec<OutboxRow>, DbError> {
        self.db.with(|c| {
            let unsent = c.prepared(UNSENT)?;
            let rows = c.query(&unsent, &[&bot, &limit])?;
            Ok(rows
                .iter()
                .map(|r| OutboxRow {
                    id: r.get(0),
                    chat_id: r.get(1),
                    kind: r.get(2),
                    body: r.get(3),
                    attempts: r.get(4),
                })
                .collect())
        })
    }

    /// Marks a row sent (with the message Telegram made of it, if any).
    pub fn mark_sent(&self, id: i64, message_id: Option<i64>) -> Result<(), DbError> {
        self.db.with(|c| {
            let sent = c.prepared(MARK_SENT)?;
            c.execute(&sent, &[&id, &message_id]).map(drop)
        })
    }

    /// Records a failed attempt; with `give_up`, the row is not tried again.
    pub fn mark_attempt(&self, id: i64, error: &str, give_up: bool) -> Result<(), DbError> {
        self.db.with(|c| {
            let attempt = c.prepared(MARK_ATTEMPT)?;
            c.execute(&attempt, &[&id, &error, &give_up]).map(drop)
        })
    }

    /// Messages sent for proposal `approval`: (bot, chat, message id, text).
    pub fn approval_messages(&self, approval: i64) -> Result<Vec<(String, i64, i64, String)>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT bot, chat_id, telegram_message_id, body->>'text' FROM telegram_outbox
                 WHERE kind = 'text' AND (body->>'approval_id')::bigint = $1 AND telegram_message_id IS NOT NULL",
                &[&approval],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect())
        })
    }

    /// Chats of `bot` with a message still waiting for its answer (for the
    /// typing indicator), recent ones only.
    pub fn chats_waiting(&self, bot: &str) -> Result<Vec<i64>, DbError> {
        self.db.with(|c| {
            let waiting = c.prepared(
                "SELECT DISTINCT (origin->>'chat_id')::bigint FROM messages
                 WHERE origin IS NOT NULL AND origin->>'bot' = $1 AND replied_at IS NULL
                   AND created_at > now() - interval '10 minutes'",
            )?;
            let rows = c.query(&waiting, &[&bot])?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// Queue depths of `bot`.
    pub fn telegram_depths(&self, bot: &str) -> Result<Depths, DbError> {
        self.db.with(|c| {
            let u: i64 = c
                .query_one("SELECT count(*) FROM telegram_updates WHERE bot = $1 AND handled_at IS NULL", &[&bot])?
                .get(0);
            let row = c.query_one(
                "SELECT count(*) FILTER (WHERE sent_at IS NULL AND failed IS NULL), count(*) FILTER (WHERE failed IS NOT NULL)
                 FROM telegram_outbox WHERE bot = $1",
                &[&bot],
            )?;
            Ok(Depths { updates: u, outbox: row.get(0), failed: row.get(1) })
        })
    }
}

/// A request to be let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pairing {
    /// The bot.
    pub bot: String,
    /// The Telegram user.
    pub user_id: i64,
    /// Their @username, if any.
    pub username: Option<String>,
    /// `pending`, `approved` or `refused`.
    pub status: String,
    /// When they asked.
    pub requested_at: String,
    /// Who decided.
    pub decided_by: Option<String>,
}

impl Store {
    /// Records that `user` asked `bot` to be let in; true the first time.
    pub fn request_pairing(&self, bot: &str, user: i64, username: Option<&str>) -> Result<bool, DbError> {
        self.db.with(|c| {
            let n = c.execute(
                "INSERT INTO telegram_pairings (bot, user_id, username) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                &[&bot, &user, &username],
            )?;
            Ok(n == 1)
        })
    }

    /// Decides a pending request; false if there is none (or it was decided).
    pub fn decide_pairing(&self, bot: &str, user: i64, approve: bool, by: &str) -> Result<bool, DbError> {
        let status = if approve { "approved" } else { "refused" };
        self.db.with(|c| {
            let n = c.execute(
                "UPDATE telegram_pairings SET status = $3, decided_by = $4, decided_at = now()
                 WHERE bot = $1 AND user_id = $2 AND status = 'pending'",
                &[&bot, &user, &status, &by],
            )?;
            Ok(n == 1)
        })
    }

    /// Reopens a request whose approval could not be applied.
    pub fn decide_pairing_undo(&self, bot: &str, user: i64) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE telegram_pairings SET status = 'pending', decided_by = NULL, decided_at = NULL
                 WHERE bot = $1 AND user_id = $2",
                &[&bot, &user],
            )
            .map(drop)
        })
    }

    /// Requests, newest first (pending only, unless `all`).
    pub fn pairings(&self, all: bool) -> Result<Vec<Pairing>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT bot, user_id, username, status, requested_at::text, decided_by FROM telegram_pairings
                 WHERE $1 OR status = 'pending' ORDER BY requested_at DESC LIMIT 500",
                &[&all],
            )?;
            Ok(rows
                .iter()
                .map(|r| Pairing {
                    bot: r.get(0),
                    user_id: r.get(1),
                    username: r.get(2),
                    status: r.get(3),
                    requested_at: r.get(4),
                    decided_by: r.get(5),
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inserted(id: u64, agent: &str, conversation: &str) -> Inserted {
        Inserted { id, agent: agent.into(), conversation: conversation.into(), update: id as i64 + 1000 }
    }

    fn before(agent: &str, conversation: &str, pending: Option<u64>, earlier: bool) -> Before {
        Before { agent: agent.into(), conversation: conversation.into(), pending, earlier }
    }

    /// A batch's reads happen before it inserts anything: its own earlier
    /// messages are added in, agent by agent, conversation by conversation.
    #[test]
    fn a_batch_reports_each_message_as_following_what_was_read_and_the_batchs_own_earlier_messages() {
        let reads = [before("a", "x", Some(3), true), before("a", "y", Some(3), false), before("b", "x", None, false)];
        // Returned out of order: reported in the order of the ids.
        let rows = [inserted(12, "a", "x"), inserted(10, "a", "y"), inserted(11, "b", "x"), inserted(13, "a", "y")];
        let got: Vec<(i64, Option<u64>, bool)> =
            batch_reports(&rows, &reads).into_iter().map(|(u, q)| (u - 1000, q.pending_before, q.earlier)).collect();
        assert_eq!(
            got,
            [
                // a's first follows a's pending message read (3); y had none before.
                (10, Some(3), false),
                // b's first follows nothing.
                (11, None, false),
                // a's second follows a's first, in another conversation.
                (12, Some(10), true),
                // a's third follows its second; y has the batch's 10 before it.
                (13, Some(12), true),
            ]
        );
        // A message whose (agent, conversation) was not read (not
        // expected) is reported as following something unknown.
        let got = batch_reports(&[inserted(20, "c", "z")], &reads);
        assert_eq!((got[0].1.pending_before, got[0].1.earlier), (Some(u64::MAX), true));
    }
}
