//! The vector index of an agent's memory, as it is and as it is rebuilt
//! (the lifecycle's reads and writes; the decisions are in
//! [`crate::memory::lifecycle`]).
//!
//! **Invariant:** a build never leaves a table without a usable index it
//! had: the new index is made beside the old one (`items_embedding_next`,
//! `CREATE INDEX CONCURRENTLY`, so upserts and queries go on meanwhile),
//! and only once it is valid is the old one dropped (`DROP INDEX
//! CONCURRENTLY`) and the new one given its name. An index left half made
//! by a crash is never used (PostgreSQL marks it invalid) and is dropped by
//! the next build. The schema is named from the agent id, never from input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use parking_lot::Mutex;

use super::Store;
use crate::db::{agent_schema, DbError};
use crate::memory::lifecycle::{build_memory_mib, Kind, Shape};

/// Where a running build leaves the means to cancel it (so stopping choird
/// need not wait out a build that reads a whole table).
pub type BuildCancel = Arc<Mutex<Option<postgres::CancelToken>>>;

/// Cancels the build running now, if any; it then fails, leaving an invalid
/// index the next build drops. Blocks for one connection to PostgreSQL.
pub fn cancel_build(cancel: &BuildCancel) {
    if let Some(token) = cancel.lock().take() {
        let _ = token.cancel_query(postgres::NoTls);
    }
}

impl Store {
    /// The index `agent`'s `items.embedding` has, and the rows of its table
    /// that have a vector there: the larger of the planner's estimate (kept
    /// by autovacuum and by every index build) and the statistics' live rows
    /// (kept at every commit), or a count for a table never analyzed; times
    /// the share of rows with a vector as ANALYZE last saw it.
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
                        (SELECT s.n_live_tup FROM pg_stat_all_tables s WHERE s.relid = t.oid),
                        (SELECT s.null_frac FROM pg_stats s
                          WHERE s.schemaname = $3 AND s.tablename = 'items' AND s.attname = 'embedding')
                 FROM pg_class t WHERE t.oid = to_regclass($1)",
                &[
                    &format!("{schema}.items"),
                    &format!("{schema}.items_embedding"),
                    &format!("agent_{}", agent.as_str()),
                ],
            )?;
            // Every column may be NULL: a table without `embedding` (an
            // operator's hand, or a schema half made) must not panic here.
            let (estimate, dims, am, lists): (Option<i64>, Option<i32>, Option<String>, Option<String>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let (live, no_vector): (Option<i64>, Option<f32>) = (r.get(4), r.get(5));
            let rows = if let Some(estimate) = estimate.filter(|e| *e >= 0) {
                estimate.max(live.unwrap_or(0))
            } else {
                c.query_one(&format!("SELECT count(*) FROM {schema}.items"), &[])?.get(0)
            };
            // Rows with a vector in `embedding` are what the index lists and
            // its k-means samples: items still waiting for theirs (an
            // endpoint down) or fresh do not count.
            let rows = (rows.max(0) as f64 * (1.0 - f64::from(no_vector.unwrap_or(0.0)).clamp(0.0, 1.0))) as u64;
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

    /// Builds an IVFFlat index of `lists` lists over `agent`'s embeddings
    /// and puts it in place of the present one (see the module's
    /// invariant); returns how long it took. Runs on a pooled connection of
    /// its own, outside any transaction (as `CONCURRENTLY` must), with the
    /// memory the k-means sample needs, reset afterwards.
    pub fn memory_index_build(
        &self,
        agent: &AgentId,
        lists: u32,
        dims: u32,
        cancel: &BuildCancel,
    ) -> Result<Duration, DbError> {
        let schema = agent_schema(agent);
        let started = Instant::now();
        self.db.with(|c| {
            *cancel.lock() = Some(c.cancel_token());
            c.batch_execute(&format!("SET maintenance_work_mem = '{}MB'", build_memory_mib(lists, dims)))?;
            let built = (|| {
                c.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.items_embedding_next"))?;
                c.batch_execute(&format!(
                    "CREATE INDEX CONCURRENTLY items_embedding_next ON {schema}.items
                     USING ivfflat (embedding vector_cosine_ops) WITH (lists = {lists})"
                ))?;
                c.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.items_embedding"))?;
                c.batch_execute(&format!("ALTER INDEX {schema}.items_embedding_next RENAME TO items_embedding"))
            })();
            cancel.lock().take();
            let reset = c.batch_execute("RESET maintenance_work_mem");
            built.and(reset)
        })?;
        Ok(started.elapsed())
    }
}
