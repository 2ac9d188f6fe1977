//! What an agent's HEARTBEAT brings back from a turn: its replicated commit
//! events and its replies, stored in **one** transaction (one commit, one
//! fsync per turn on the way out), with statements prepared once per
//! connection. A HEARTBEAT of one answer to one message and nothing else
//! (the agent's link-reply sends its answers apart from its events) is one
//! statement, its own commit, outbox rows and all ([`ANSWER_AT_ONCE`]).
//!
//! **Invariants:** events are stored only if they extend the stored chain
//! (a resend of stored events is accepted, anything else is a fork and
//! nothing of the HEARTBEAT is stored); a reply is never stored without the
//! events that came with it, nor the events without the reply: a failure
//! anywhere rolls the whole HEARTBEAT back and the agent resends it.

use std::collections::HashMap;

use choir_common::commit::{verify_extension, ChainError, ChainHead, CommitEvent, GENESIS_HASH};
use choir_common::ids::AgentId;
use choir_common::rpc::OutboundReply;
use postgres::{Statement, Transaction};
use serde_json::Value;

use super::{Delivery, Recorded, ReplicationError, Store, ENQUEUE};
use crate::db::{Conn, DbError};

/// Creates the agent's chain state if missing and locks it: one round trip.
const HEAD_LOCK: &str = "INSERT INTO agent_state (agent_id, head_hash) VALUES ($1, $2)
     ON CONFLICT (agent_id) DO UPDATE SET head_seq = agent_state.head_seq
     RETURNING head_seq, head_hash";
const STORED_HASH: &str = "SELECT hash FROM commit_events WHERE agent_id = $1 AND seq = $2";
/// All of a HEARTBEAT's new events in one statement (one round trip however
/// many core steps they record), in order.
const INSERT_EVENTS: &str = "INSERT INTO commit_events (agent_id, seq, prev_hash, hash, session_id, event)
     SELECT $1, s, p, h, $2, e FROM unnest($3::bigint[], $4::text[], $5::text[], $6::jsonb[]) AS u(s, p, h, e)";
/// A HEARTBEAT of events and nothing else, whole in **one statement** (its
/// own commit: one round trip against the transaction's five, BEGIN to
/// COMMIT), when the events are new and extend the stored head as the
/// agent sent them: `$7`/`$8` the head they say they follow (the first
/// event's `seq - 1` and `prev_hash`), `$9`/`$10` the head they make. The
/// head's row is locked and checked in the statement; when it is missing
/// (an agent's first events) or elsewhere (a resend, a fork, a gap, a
/// concurrent HEARTBEAT's events), nothing is written and the turn's
/// transaction decides, as for every HEARTBEAT before this statement. One
/// row: whether it stored.
const EVENTS_AT_ONCE: &str = "WITH head AS (SELECT 1 FROM agent_state
                   WHERE agent_id = $1 AND head_seq = $7 AND head_hash = $8 FOR UPDATE),
     stored AS (INSERT INTO commit_events (agent_id, seq, prev_hash, hash, session_id, event)
                SELECT $1, s, p, h, $2, e FROM unnest($3::bigint[], $4::text[], $5::text[], $6::jsonb[]) AS u(s, p, h, e)
                WHERE EXISTS (SELECT 1 FROM head)),
     moved AS (UPDATE agent_state SET head_seq = $9, head_hash = $10
               WHERE agent_id = $1 AND EXISTS (SELECT 1 FROM head))
     SELECT EXISTS (SELECT 1 FROM head)";
const AUDIT_EXTERNAL: &str = "INSERT INTO audit (actor, agent_id, action, outcome, detail)
     VALUES ('agent-rpc', $1, 'tool.external', $2, $3)";
/// The agent's chain head, when events moved it, at the end of the
/// turn's transaction (its row is locked since [`HEAD_LOCK`]).
const HEAD_UPDATE: &str = "UPDATE agent_state SET head_seq = $2, head_hash = $3 WHERE agent_id = $1";
/// The processed position moved up to `top.at` (a CTE each statement
/// defines before these, on agent `$1`), or its row made if missing: the
/// CTEs `moved` and `made`, shared by [`PROCESSED`] and [`ANSWER_AT_ONCE`].
/// `made` (and its conflict branch, for two first writers at once) runs
/// only without the row (`agent_position` makes it at INIT_HELLO). A
/// position that does not move writes nothing: no tuple, no lock, no WAL,
/// no fsync at the commit.
macro_rules! move_processed {
    () => {
        "moved AS (UPDATE agent_processed p SET processed_upto = top.at FROM top
                   WHERE p.agent_id = $1 AND p.processed_upto < top.at RETURNING 1),
         made AS (INSERT INTO agent_processed (agent_id, processed_upto) SELECT $1, top.at FROM top
                  WHERE NOT EXISTS (SELECT 1 FROM moved) AND NOT EXISTS (SELECT 1 FROM agent_processed WHERE agent_id = $1)
                  ON CONFLICT (agent_id) DO UPDATE SET processed_upto = EXCLUDED.processed_upto
                  WHERE agent_processed.processed_upto < EXCLUDED.processed_upto RETURNING 1)"
    };
}

/// The agent's processed position (`$2`), in a row of its own: the agent's
/// answers store it (its link-reply thread) while a HEARTBEAT of core
/// events (link-push) holds the head's row locked until its commit, and an
/// answer must not wait for that. One statement ([`move_processed`]; every
/// long-poll used to rewrite the position, while the edge worked on the
/// message just handed out). A position past every stored message (the
/// agent's word alone) is cut to the highest message id: past it, a
/// restarted agent would be handed no message again, ever (one probe of
/// the primary key).
pub const PROCESSED: &str = concat!(
    "WITH top AS (SELECT LEAST($2::bigint, (SELECT coalesce(max(id), 0) FROM messages)) AS at), ",
    move_processed!(),
    " SELECT 1"
);

/// A HEARTBEAT of one answer to one message and nothing else, whole in
/// **one statement** and so in its own commit (no BEGIN, no second
/// statement, no COMMIT round trip: 0.2 ms against 0.42–0.47 for the
/// transaction's four round trips, pgbench on this machine kind): the
/// answer (`$3` to message `$2` of agent `$1`, unless answered), its outbox
/// rows (`$6`–`$9`: bot, chat, kind, body, in order; none for a chat the
/// delivery does not reach) and the processed position (`$4`, cut as in
/// [`PROCESSED`]). The rows are made from the conversation the agent named
/// (`$5`), so the statement stores only when the message is in that
/// conversation (`plain`; a message's conversation never changes, so the
/// check and the update cannot disagree); otherwise it writes nothing and
/// the turn's transaction stores the answer, with the rows of the
/// conversation the message is in. The rows are queued only with an
/// answer. One row: `plain`, the id answered (NULL when it was not), and
/// how many rows were queued. One message, a scalar: PostgreSQL keeps a
/// generic plan for it (planned once per connection), while for
/// `id = ANY($2)` it guesses ten ids and plans every execution anew (0.16
/// ms for this statement). It also writes the cost ledger's waiting rows
/// (`$10`, `ledger.rs`), whatever else it writes: a relayed call's row
/// costs no statement and no commit of its own.
const ANSWER_AT_ONCE: &str = concat!(
    "WITH ",
    super::ledger::ledger_rows!("$10"),
    ",
     plain AS (SELECT NOT EXISTS (SELECT 1 FROM messages
                    WHERE agent_id = $1 AND id = $2 AND conversation <> $5::text) AS ok),
     answered AS (UPDATE messages SET reply = $3, replied_at = now()
                  WHERE (SELECT ok FROM plain) AND agent_id = $1 AND id = $2 AND replied_at IS NULL
                  RETURNING id),
     queued AS (INSERT INTO telegram_outbox (bot, chat_id, kind, body)
                SELECT r.bot, r.chat, r.kind, r.body
                FROM unnest($6::text[], $7::bigint[], $8::text[], $9::jsonb[]) WITH ORDINALITY AS r(bot, chat, kind, body, ord)
                WHERE EXISTS (SELECT 1 FROM answered) ORDER BY r.ord
                RETURNING 1),
     top AS (SELECT LEAST($4::bigint, (SELECT coalesce(max(id), 0) FROM messages)) AS at
             FROM plain WHERE plain.ok AND $4::bigint > 0), ",
    move_processed!(),
    " SELECT (SELECT ok FROM plain), (SELECT id FROM answered), (SELECT count(*) FROM queued)"
);
const ADDRESSED: &str = "SELECT 1 FROM messages WHERE agent_id = $1 AND conversation = $2 LIMIT 1";
const INSERT_NOTICE: &str = "INSERT INTO notices (agent_id, conversation, key, text) VALUES ($1, $2, $3, $4)
     ON CONFLICT (agent_id, key) DO NOTHING";
/// One statement per reply, however many messages it covers (at most
/// `MAX_COVERS`, checked before).
const ANSWER: &str = "UPDATE messages SET reply = $3, replied_at = now()
     WHERE agent_id = $1 AND id = ANY($2) AND replied_at IS NULL
     RETURNING id, conversation";

/// Which part of a HEARTBEAT failed to store, for [`Store::store_turn`]:
/// the caller answers an event's data error by refusing that event (the
/// agent quarantines it), any other failure as retryable. Either way
/// nothing of the HEARTBEAT was stored.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The events: a chain error, or the database refused or failed them.
    #[error(transparent)]
    Events(#[from] ReplicationError),
    /// The replies, or the transaction itself (retryable).
    #[error(transparent)]
    Db(DbError),
}

/// The replies half of a HEARTBEAT.
pub struct Replies<'a> {
    /// Answers and notices, as choird speaks them.
    pub replies: &'a [OutboundReply],
    /// The agent's processed position.
    pub processed_upto: u64,
    /// Where a Telegram answer is queued.
    pub delivery: &'a dyn Delivery,
}

/// The statements of a turn, prepared on the connection before its
/// transaction begins.
struct Prepared {
    head_lock: Statement,
    stored_hash: Statement,
    insert_events: Statement,
    audit_external: Statement,
    head_update: Statement,
    processed: Statement,
    addressed: Statement,
    insert_notice: Statement,
    answer: Statement,
    enqueue: Statement,
}

impl Prepared {
    fn on(c: &mut Conn) -> Result<Prepared, postgres::Error> {
        Ok(Prepared {
            head_lock: c.prepared(HEAD_LOCK)?,
            stored_hash: c.prepared(STORED_HASH)?,
            insert_events: c.prepared(INSERT_EVENTS)?,
            audit_external: c.prepared(AUDIT_EXTERNAL)?,
            head_update: c.prepared(HEAD_UPDATE)?,
            processed: c.prepared(PROCESSED)?,
            addressed: c.prepared(ADDRESSED)?,
            insert_notice: c.prepared(INSERT_NOTICE)?,
            answer: c.prepared(ANSWER)?,
            enqueue: c.prepared(ENQUEUE)?,
        })
    }
}

/// How far a turn's transaction got, to name what failed.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Setup,
    Events,
    Replies,
}

impl Store {
    /// Stores replicated events after verifying they extend the stored chain.
    /// Events at or below the stored head are accepted only if identical to
    /// what is stored (a resend after a lost acknowledgement); anything else is
    /// a fork. Each new event flagged `external` gets its audit record
    /// (`tool.external`) in the same transaction. Returns the new head
    /// sequence number.
    pub fn append_events(
        &self,
        agent: &AgentId,
        session: i64,
        events: &[CommitEvent],
    ) -> Result<u64, ReplicationError> {
        match self.store_turn(agent, session, events, None) {
            Ok((head, _)) => Ok(head.unwrap_or_default()),
            Err(TurnError::Events(e)) => Err(e),
            Err(TurnError::Db(e)) => Err(ReplicationError::Db(e)),
        }
    }

    /// Records answers (the first answer to a message wins; one text may
    /// answer several injected messages), the agent's own notices (once per
    /// key) and its processed position. An answer (or notice) in a Telegram
    /// conversation is queued for sending in the same transaction, once.
    ///
    /// **Invariant:** an agent speaks only where it was spoken to. An answer
    /// goes to the conversation of the stored message it answers (whatever
    /// conversation the agent named); a notice only to a conversation in
    /// which this agent has received a message, else it is dropped and
    /// counted in [`Recorded::refused`].
    pub fn record_replies(
        &self,
        agent: &AgentId,
        replies: &[OutboundReply],
        processed_upto: u64,
        delivery: &dyn Delivery,
    ) -> Result<Recorded, DbError> {
        let half = Replies { replies, processed_upto, delivery };
        match self.store_turn(agent, 0, &[], Some(half)) {
            Ok((_, recorded)) => Ok(recorded),
            Err(TurnError::Db(e)) | Err(TurnError::Events(ReplicationError::Db(e))) => Err(e),
            Err(TurnError::Events(e @ ReplicationError::Chain(_))) => {
                unreachable!("no events were given, so no chain was checked: {e}")
            }
        }
    }

    /// A HEARTBEAT's events ([`Store::append_events`]) and replies
    /// ([`Store::record_replies`]) in one transaction. Returns the new
    /// head (when there were events) and what was recorded (empty without
    /// `replies`).
    pub fn store_turn(
        &self,
        agent: &AgentId,
        session: i64,
        events: &[CommitEvent],
        replies: Option<Replies<'_>>,
    ) -> Result<(Option<u64>, Recorded), TurnError> {
        if let (true, Some(r)) = (events.is_empty(), replies.as_ref()) {
            if let Some(recorded) = self.answer_at_once(agent, r).map_err(TurnError::Db)? {
                return Ok((None, recorded));
            }
        }
        if replies.is_none() && !events.is_empty() {
            if let Some(head) = self.events_at_once(agent, session, events).map_err(ReplicationError::Db)? {
                return Ok((Some(head), Recorded::default()));
            }
        }
        let mut part = Part::Setup;
        let mut chain = None;
        let out = self.db.with(|c| {
            let p = Prepared::on(c)?;
            let mut tx = c.transaction()?;
            let head = if events.is_empty() {
                None
            } else {
                part = Part::Events;
                match append(&mut tx, &p, agent, session, events)? {
                    Ok(head) => Some(head),
                    Err(e) => {
                        // Rolled back when `tx` drops.
                        chain = Some(e);
                        return Ok(None);
                    }
                }
            };
            // Past i64 (the agent's word): the highest, cut by `PROCESSED`.
            let processed = replies.as_ref().map_or(0, |r| i64::try_from(r.processed_upto).unwrap_or(i64::MAX));
            let recorded = match replies {
                None => Recorded::default(),
                Some(r) => {
                    part = Part::Replies;
                    record(&mut tx, &p, agent, &r)?
                }
            };
            // The head (when it moved) and the processed position (when
            // reported); neither an event's content nor a reply's: retryable.
            part = Part::Setup;
            if let Some(moved) = head.as_ref().filter(|a| a.moved).map(|a| &a.head) {
                tx.execute(&p.head_update, &[&agent.as_str(), &(moved.seq as i64), &moved.hash])?;
            }
            if processed > 0 {
                tx.execute(&p.processed, &[&agent.as_str(), &processed])?;
            }
            part = Part::Setup;
            tx.commit()?;
            Ok(Some((head.map(|a| a.head.seq), recorded)))
        });
        match (out, chain) {
            (Ok(Some(done)), _) => Ok(done),
            (Ok(None), Some(e)) => Err(TurnError::Events(ReplicationError::Chain(e))),
            (Ok(None), None) => unreachable!("a turn's transaction ends early only on a chain error"),
            (Err(e), _) if part == Part::Events => Err(TurnError::Events(ReplicationError::Db(e))),
            (Err(e), _) => Err(TurnError::Db(e)),
        }
    }
}

impl Store {
    /// A HEARTBEAT of events alone, stored by [`EVENTS_AT_ONCE`] when they
    /// are new, whole (each links to the one before and hashes right) and
    /// extend the stored head, and none is an action on the outside world
    /// (those are audited in the turn's transaction): the new head. `None`,
    /// with nothing written, when they are not; the caller's transaction
    /// then stores or refuses them. Public for the test that shows which.
    pub fn events_at_once(
        &self,
        agent: &AgentId,
        session: i64,
        events: &[CommitEvent],
    ) -> Result<Option<u64>, DbError> {
        let Some(first) = events.first() else { return Ok(None) };
        if events.iter().any(|ev| ev.external) || first.seq == 0 {
            return Ok(None);
        }
        let base = ChainHead { seq: first.seq - 1, hash: first.prev_hash.clone() };
        let Ok(head) = verify_extension(&base, events) else { return Ok(None) };
        let (Ok(base_seq), Ok(head_seq)) = (i64::try_from(base.seq), i64::try_from(head.seq)) else { return Ok(None) };
        let Columns { seqs, prevs, hashes, json } = Columns::of(events);
        self.db.with(|c| {
            let at_once = c.prepared(EVENTS_AT_ONCE)?;
            let row = c.query_one(
                &at_once,
                &[
                    &agent.as_str(),
                    &session,
                    &seqs,
                    &prevs,
                    &hashes,
                    &json,
                    &base_seq,
                    &base.hash,
                    &head_seq,
                    &head.hash,
                ],
            )?;
            Ok(row.get::<_, bool>(0).then_some(head.seq))
        })
    }

    /// A HEARTBEAT of one answer to one message and nothing else, stored
    /// by [`ANSWER_AT_ONCE`] with the outbox rows of the conversation the
    /// agent named; `None` (nothing written) when it is not one, or when
    /// the message is in another conversation than the agent named.
    fn answer_at_once(&self, agent: &AgentId, r: &Replies<'_>) -> Result<Option<Recorded>, DbError> {
        let [reply] = r.replies else { return Ok(None) };
        let &[message] = reply.answers() else { return Ok(None) };
        // Past i64 (a hostile id): answers nothing, as no message has it.
        let message = i64::try_from(message).unwrap_or(i64::MAX);
        // Past i64 (the agent's word): the highest, cut by the statement.
        let processed = i64::try_from(r.processed_upto).unwrap_or(i64::MAX);
        let rows = r.delivery.rows(&reply.conversation, &reply.text);
        let bots: Vec<&str> = rows.iter().map(|row| row.bot.as_str()).collect();
        let chats: Vec<i64> = rows.iter().map(|row| row.chat).collect();
        let kinds: Vec<&str> = rows.iter().map(|row| row.kind).collect();
        let bodies: Vec<&Value> = rows.iter().map(|row| &row.body).collect();
        let taken = self.ledger.take();
        let answer = |ledger: &Value| {
            self.db.with(|c| {
                let at_once = c.prepared(ANSWER_AT_ONCE)?;
                c.query_one(
                    &at_once,
                    &[
                        &agent.as_str(),
                        &message,
                        &reply.text,
                        &processed,
                        &reply.conversation,
                        &bots,
                        &chats,
                        &kinds,
                        &bodies,
                        ledger,
                    ],
                )
            })
        };
        let none = Value::Array(Vec::new());
        let row = match taken {
            None => answer(&none)?,
            Some(taken) => {
                let row = answer(&taken.json);
                self.carried(taken, row.as_ref().err());
                match row {
                    Ok(row) => row,
                    // Never an answer lost to a ledger row: the rows went
                    // their way (`carried`), the answer goes again without.
                    Err(_) => answer(&none)?,
                }
            }
        };
        {
            if !row.get::<_, bool>(0) {
                return Ok(None);
            }
            let mut out = Recorded::default();
            if let Some(id) = row.get::<_, Option<i64>>(1) {
                out.new.push((id as u64, reply.text.clone()));
                if row.get::<_, i64>(2) > 0 {
                    out.delivered.push(reply.conversation.clone());
                }
            }
            Ok(Some(out))
        }
    }
}

/// The messages `reply` answered (of `answered`: id → its conversation),
/// in the reply's order, each with the reply's text, and the conversation
/// of the first: it names the chat, and covered messages of other
/// conversations are answered there, not sent elsewhere. An id listed
/// twice is answered once.
fn in_reply_order(reply: &OutboundReply, mut answered: HashMap<u64, String>) -> (Vec<(u64, String)>, Option<String>) {
    let mut new = Vec::new();
    let mut conversation = None;
    for id in reply.answers() {
        if let Some(conv) = answered.remove(id) {
            new.push((*id, reply.text.clone()));
            conversation.get_or_insert(conv);
        }
    }
    (new, conversation)
}

/// A batch of events as the columns [`INSERT_EVENTS`] and
/// [`EVENTS_AT_ONCE`] unnest, in the batch's order.
struct Columns<'a> {
    seqs: Vec<i64>,
    prevs: Vec<&'a str>,
    hashes: Vec<&'a str>,
    json: Vec<Value>,
}

impl<'a> Columns<'a> {
    fn of(events: &'a [CommitEvent]) -> Columns<'a> {
        Columns {
            seqs: events.iter().map(|ev| ev.seq as i64).collect(),
            prevs: events.iter().map(|ev| ev.prev_hash.as_str()).collect(),
            hashes: events.iter().map(|ev| ev.hash.as_str()).collect(),
            json: events.iter().map(|ev| serde_json::to_value(ev).unwrap_or(Value::Null)).collect(),
        }
    }
}

/// What [`append`] stored: the new head, and whether it moved (the caller
/// writes it to `agent_state`).
struct Appended {
    head: ChainHead,
    moved: bool,
}

/// The events half: `Ok(Err(_))` when they do not extend the chain (the
/// caller rolls back).
fn append(
    tx: &mut Transaction<'_>,
    p: &Prepared,
    agent: &AgentId,
    session: i64,
    events: &[CommitEvent],
) -> Result<Result<Appended, ChainError>, postgres::Error> {
    let row = tx.query_one(&p.head_lock, &[&agent.as_str(), &GENESIS_HASH])?;
    let head = ChainHead { seq: row.get::<_, i64>(0) as u64, hash: row.get(1) };
    let mut fresh = Vec::new();
    for ev in events {
        if ev.seq <= head.seq {
            let stored = tx.query_opt(&p.stored_hash, &[&agent.as_str(), &(ev.seq as i64)])?;
            if stored.map(|r| r.get::<_, String>(0)) != Some(ev.hash.clone()) {
                return Ok(Err(ChainError::Fork { seq: ev.seq, prev: ev.seq.saturating_sub(1) }));
            }
        } else {
            fresh.push(ev.clone());
        }
    }
    let new_head = match verify_extension(&head, &fresh) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    let moved = new_head.seq != head.seq;
    let Columns { seqs, prevs, hashes, json } = Columns::of(&fresh);
    if !fresh.is_empty() {
        tx.execute(&p.insert_events, &[&agent.as_str(), &session, &seqs, &prevs, &hashes, &json])?;
    }
    for (ev, json) in fresh.iter().zip(&json).filter(|(ev, _)| ev.external) {
        // An action on the outside world: audited with its record, in the
        // same transaction (never one without the other), outside the
        // agent's audit quota.
        let outcome = json["outcome"].as_str().unwrap_or("ok").to_owned();
        let clip = |s: &str| s.chars().take(200).collect::<String>();
        let detail = serde_json::json!({"seq": ev.seq, "hash": ev.hash, "lane": clip(&ev.lane),
                                        "tool": clip(&ev.tool), "call_id": ev.call_id.as_deref().map(clip),
                                        "duration_us": ev.duration_us});
        tx.execute(&p.audit_external, &[&agent.as_str(), &outcome, &detail])?;
    }
    Ok(Ok(Appended { head: new_head, moved }))
}

/// The replies half (see [`Store::record_replies`]).
fn record(
    tx: &mut Transaction<'_>,
    p: &Prepared,
    agent: &AgentId,
    r: &Replies<'_>,
) -> Result<Recorded, postgres::Error> {
    let mut out = Recorded::default();
    for reply in r.replies {
        let (fresh, conversation) = if reply.in_reply_to == 0 {
            let addressed = tx.query_opt(&p.addressed, &[&agent.as_str(), &reply.conversation])?.is_some();
            if !addressed {
                out.refused.push(reply.conversation.clone());
                continue;
            }
            let n = tx.execute(&p.insert_notice, &[&agent.as_str(), &reply.conversation, &reply.key, &reply.text])?;
            (n == 1, Some(reply.conversation.clone()))
        } else {
            let ids: Vec<i64> = reply.answers().iter().map(|&id| id as i64).collect();
            let rows = tx.query(&p.answer, &[&agent.as_str(), &ids, &reply.text])?;
            let answered = rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get(1))).collect();
            let (new, conversation) = in_reply_order(reply, answered);
            out.new.extend(new);
            (conversation.is_some(), conversation)
        };
        if let (true, Some(conversation)) = (fresh, conversation) {
            let rows = r.delivery.rows(&conversation, &reply.text);
            if !rows.is_empty() {
                for row in rows {
                    tx.query_one(&p.enqueue, &[&row.bot, &row.chat, &row.kind, &row.body])?;
                }
                out.delivered.push(conversation);
            }
        }
    }
    Ok(out)
}
