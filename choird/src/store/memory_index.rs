//! The vector index of an agent's memory, as it is and as it is rebuilt
//! (the lifecycle's reads and writes; the decisions are in
//! [`crate::host_tools::memory::lifecycle`]).
//!
//! **Invariant:** a build never leaves a table without a usable index it
//! had: the new index is made beside the old one (`items_embedding_next`,
//! `CREATE INDEX CONCURRENTLY`, so upserts and queries go on meanwhile),
//! and only once it is valid is the old one dropped (`DROP INDEX
//! CONCURRENTLY`) and the new one given its name. Whatever a crash or a
//! cancel interrupts, [`Store::memory_index_settle`] (run before every look)
//! puts right without a new build: a valid `items_embedding_next` finishes
//! its swap (the old index, valid or not, dropped; the new one renamed), an
//! invalid one (never used by PostgreSQL, but kept up to date by every
//! insert) is dropped. Builds and settling take a session advisory lock per
//! agent on a connection of their own, so two choirds on one database never
//! drop each other's index, and no setting outlives the work. The schema is
//! named from the agent id, never from input.

use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use parking_lot::Mutex;
use postgres::Client;

use super::Store;
use crate::db::{agent_schema, DbError};

/// The vector index's name (the per-agent migration's), and the name a
/// build makes its new index under.
const INDEX: &str = "items_embedding";
const NEXT: &str = "items_embedding_next";

/// Key of the per-agent build lock ("vect"; the second key is the agent).
const BUILD_LOCK: i32 = 0x7665_6374;

/// How a running build is cancelled when choird stops, so stopping need not
/// wait out a pass over a whole table.
///
/// **Invariant:** once [`BuildCancel::cancel`] has run, no statement of a
/// build starts (each checks first, under the same lock), and the statement
/// running then is cancelled: the cancel is sent again until the build has
/// let go of its connection, since PostgreSQL ignores one that reaches a
/// connection between statements.
#[derive(Default)]
pub struct BuildCancel {
    state: Mutex<(Option<postgres::CancelToken>, bool)>,
}

impl BuildCancel {
    /// Cancels the build running now, and any to come. Blocks while it
    /// sends the cancel (a connection to PostgreSQL each); stops sending
    /// after 10 s (a build still running then ends when its statement does).
    pub fn cancel(&self) {
        self.state.lock().1 = true;
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let Some(token) = self.state.lock().0.clone() else { return };
            let _ = token.cancel_query(postgres::NoTls);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `sql` unless cancelled.
    fn run(&self, c: &mut Client, sql: &str) -> Result<(), DbError> {
        if self.state.lock().1 {
            return Err(DbError::Stopped);
        }
        c.batch_execute(sql).map_err(|e| if self.state.lock().1 { DbError::Stopped } else { DbError::Query(e) })
    }

    /// Holds `c`'s cancel token while the returned guard lives.
    fn hold(&self, c: &Client) -> Held<'_> {
        self.state.lock().0 = Some(c.cancel_token());
        Held(self)
    }
}

impl std::fmt::Debug for BuildCancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BuildCancel {{ cancelled: {} }}", self.state.lock().1)
    }
}

/// Clears the token when a build lets go of its connection.
struct Held<'a>(&'a BuildCancel);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.state.lock().0 = None;
    }
}

/// The index an agent's `items.embedding` has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// No valid index (the exact scan answers queries).
    None,
    /// IVFFlat with this many lists.
    IvfFlat(u32),
    /// Another kind (HNSW, as the per-agent migration made it).
    Other(String),
}

/// What the indexer knows of one agent's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Its index.
    pub kind: Kind,
    /// Its rows with a vector (as ANALYZE last saw them).
    pub rows: u64,
    /// The embedding dimension (sizes the build's memory).
    pub dims: u32,
}

/// What settling did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Nothing to put right.
    Nothing,
    /// A valid `items_embedding_next` took the old index's place.
    Swapped,
    /// An invalid `items_embedding_next` was dropped.
    DroppedInvalid,
    /// Another connection holds the agent's build lock (a build elsewhere).
    Busy,
}

impl Store {
    /// The index `agent`'s `items.embedding` has, and the rows of its table
    /// that have a vector there: the planner's estimate of its rows times
    /// the share with a vector, both as ANALYZE (the keeper's upkeep's, or
    /// autovacuum's on a server choird does not manage, after a tenth of
    /// the table changed) last saw them; 0 for a table never analyzed.
    /// No `count(*)`: this runs every minute. (Not the statistics' live
    /// rows: an ANALYZE racing the flush of a backend's insert counts makes
    /// them count those rows twice, until the next ANALYZE.)
    pub fn memory_index_shape(&self, agent: &AgentId) -> Result<Shape, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let r = c.query_one(
                "SELECT t.reltuples::bigint,
                        (SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attname = 'embedding'),
                        (SELECT am.amname FROM pg_class i JOIN pg_am am ON am.oid = i.relam
                           JOIN pg_index x ON x.indexrelid = i.oid
                          WHERE i.oid = to_regclass($2) AND x.indisvalid),
                        (SELECT o FROM pg_class i, unnest(i.reloptions) AS o
                          WHERE i.oid = to_regclass($2) AND o LIKE 'lists=%'),
                        (SELECT s.null_frac FROM pg_stats s
                          WHERE s.schemaname = $3 AND s.tablename = 'items' AND s.attname = 'embedding')
                 FROM pg_class t WHERE t.oid = to_regclass($1)",
                &[&format!("{schema}.items"), &format!("{schema}.{INDEX}"), &format!("agent_{}", agent.as_str())],
            )?;
            // Every column may be NULL: a table without `embedding` (an
            // operator's hand, or a schema half made) must not panic here.
            let (estimate, dims, am, lists): (Option<i64>, Option<i32>, Option<String>, Option<String>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let no_vector: Option<f32> = r.get(4);
            let rows = estimate.unwrap_or(0).max(0);
            // Rows with a vector in `embedding` are what the index lists and
            // its k-means samples: items still waiting for theirs (an
            // endpoint down) or fresh do not count.
            let rows = (rows as f64 * (1.0 - f64::from(no_vector.unwrap_or(0.0)).clamp(0.0, 1.0))) as u64;
            let kind = match am.as_deref() {
                None => Kind::None,
                Some("ivfflat") => {
                    Kind::IvfFlat(lists.and_then(|l| l.strip_prefix("lists=")?.parse().ok()).unwrap_or(100))
                }
                Some(other) => Kind::Other(other.to_owned()),
            };
            Ok(Shape { kind, rows, dims: dims.unwrap_or(1).max(1) as u32 })
        })
    }

    /// Puts right what an interrupted build left (see the module's
    /// invariant), under the agent's build lock; cancelled like a build.
    pub fn memory_index_settle(&self, agent: &AgentId, cancel: &BuildCancel) -> Result<Settled, DbError> {
        // Nearly always nothing is left: one catalog read on a pooled
        // connection, no connection of its own, no lock.
        if self.db.with(|c| next_index(c, agent))?.is_none() {
            return Ok(Settled::Nothing);
        }
        Ok(self.db.dedicated(|c| locked(c, agent, cancel, |c| settle(c, agent, cancel)))?.unwrap_or(Settled::Busy))
    }

    /// Builds an IVFFlat index of `lists` lists over `agent`'s embeddings
    /// and puts it in place of the present one (see the module's
    /// invariant); returns how long it took, or `None` when another
    /// connection holds the agent's build lock. On a connection of its own,
    /// outside any transaction (as `CONCURRENTLY` must), with no statement
    /// or lock timeout (a role's own would fail every large build) and at
    /// least `memory_mib` of `maintenance_work_mem` (what pgvector's k-means
    /// needs: [`crate::host_tools::memory::lifecycle::build_memory_mib`]).
    pub fn memory_index_build(
        &self,
        agent: &AgentId,
        lists: u32,
        memory_mib: u64,
        cancel: &BuildCancel,
    ) -> Result<Option<Duration>, DbError> {
        let (schema, started) = (agent_schema(agent), Instant::now());
        self.db.dedicated(|c| {
            locked(c, agent, cancel, |c| {
                cancel.run(c, "SET statement_timeout = 0; SET lock_timeout = 0")?;
                let have: i64 =
                    c.query_one("SELECT pg_size_bytes(current_setting('maintenance_work_mem')) / 1048576", &[])?.get(0);
                if i64::try_from(memory_mib).unwrap_or(i64::MAX) > have {
                    cancel.run(c, &format!("SET maintenance_work_mem = '{memory_mib}MB'"))?;
                }
                cancel.run(c, &format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.{NEXT}"))?;
                cancel.run(
                    c,
                    &format!(
                        "CREATE INDEX CONCURRENTLY {NEXT} ON {schema}.items
                         USING ivfflat (embedding vector_cosine_ops) WITH (lists = {lists})"
                    ),
                )?;
                settle(c, agent, cancel)?;
                Ok(started.elapsed())
            })
        })
    }
}

/// Runs `f` holding `agent`'s build lock for the session (released when
/// the dedicated connection closes) with the connection's cancel token
/// left in `cancel`; `None` if another session holds the lock.
fn locked<T>(
    c: &mut Client,
    agent: &AgentId,
    cancel: &BuildCancel,
    f: impl FnOnce(&mut Client) -> Result<T, DbError>,
) -> Result<Option<T>, DbError> {
    let took: bool =
        c.query_one("SELECT pg_try_advisory_lock($1, hashtext($2))", &[&BUILD_LOCK, &agent.as_str()])?.get(0);
    if !took {
        return Ok(None);
    }
    let _held = cancel.hold(c);
    f(c).map(Some)
}

/// Whether `agent`'s `items_embedding_next` exists, and if so whether it
/// is valid.
fn next_index(c: &mut Client, agent: &AgentId) -> Result<Option<bool>, postgres::Error> {
    Ok(c.query_opt(
        "SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = to_regclass($1)",
        &[&format!("{}.{NEXT}", agent_schema(agent))],
    )?
    .map(|r| r.get(0)))
}

/// The settling itself, on a connection holding the build lock.
fn settle(c: &mut Client, agent: &AgentId, cancel: &BuildCancel) -> Result<Settled, DbError> {
    let schema = agent_schema(agent);
    let next = next_index(c, agent)?;
    match next {
        None => Ok(Settled::Nothing),
        Some(false) => {
            cancel.run(c, &format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.{NEXT}"))?;
            Ok(Settled::DroppedInvalid)
        }
        Some(true) => {
            cancel.run(c, &format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.{INDEX}"))?;
            cancel.run(c, &format!("ALTER INDEX {schema}.{NEXT} RENAME TO {INDEX}"))?;
            Ok(Settled::Swapped)
        }
    }
}
