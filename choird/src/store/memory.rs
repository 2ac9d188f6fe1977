//! Agent memory: each agent's `agent_<id>.items` table (made by the
//! per-agent migrations) and the shared embedding outbox.
//!
//! **Invariant:** the schema an operation touches is named from the agent
//! id the caller authenticated as — a validated identifier, quoted — and
//! never from anything in a request; every value is a parameter.
//!
//! **Invariant:** an item has at most one vector: `fresh` (stored by the
//! batcher, outside the vector index, found by an exact scan) or `embedding`
//! (in the index); a CHECK constraint holds it. At most `fresh_max` items
//! per agent hold a fresh vector when the batcher stores one (the rest go
//! straight into the index), and [`Store::index_fresh`] moves fresh vectors
//! into the index in the background. A semantic query reads both in one
//! statement, so under one snapshot an item is found once, fresh or indexed.

use std::collections::HashMap;

use choir_common::ids::AgentId;
use pgvector::Vector;
use serde_json::{json, Value};

use super::Store;
use crate::db::{agent_schema, DbError};

/// An item to store.
#[derive(Debug, Clone)]
pub struct NewItem {
    /// `working`, `session` or `knowledge`.
    pub tier: String,
    /// The text.
    pub content: String,
    /// Its sha256, hex.
    pub sha256: String,
    /// Metadata (merged into an existing item's).
    pub metadata: Value,
}

/// What an upsert did to one item.
#[derive(Debug, Clone)]
pub struct Upserted {
    /// The item's id.
    pub id: i64,
    /// Its tier.
    pub tier: String,
    /// Its sha256.
    pub sha256: String,
    /// New (true) or an existing item whose metadata was merged (false).
    pub inserted: bool,
}

/// A stored item.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its id.
    pub id: i64,
    /// Its tier.
    pub tier: String,
    /// The text.
    pub content: String,
    /// Its sha256.
    pub sha256: String,
    /// Its metadata.
    pub metadata: Value,
    /// The lane that stored it.
    pub lane: Option<String>,
    /// The commit sequence of the call that stored it, once replicated.
    pub commit_seq: Option<i64>,
    /// When it was stored.
    pub created_at: String,
    /// Whether it has its embedding yet.
    pub embedded: bool,
}

impl Item {
    /// As the model sees it.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "tier": self.tier, "content": self.content, "sha256": self.sha256,
               "metadata": self.metadata, "lane": self.lane, "commit_seq": self.commit_seq,
               "created_at": self.created_at})
    }
}

const COLUMNS: &str = "id, tier, content, content_sha256, metadata, lane, commit_seq, created_at::text, \
                       (embedding IS NOT NULL OR fresh IS NOT NULL)";

fn item(r: &postgres::Row) -> Item {
    Item {
        id: r.get(0),
        tier: r.get(1),
        content: r.get(2),
        sha256: r.get(3),
        metadata: r.get(4),
        lane: r.get(5),
        commit_seq: r.get(6),
        created_at: r.get(7),
        embedded: r.get(8),
    }
}

/// A range query's bounds.
#[derive(Debug, Clone, Default)]
pub struct Range {
    /// Only this tier.
    pub tier: Option<String>,
    /// Commit sequence from (inclusive).
    pub from_seq: Option<i64>,
    /// Commit sequence to (inclusive).
    pub to_seq: Option<i64>,
    /// Stored at or after (RFC 3339).
    pub since: Option<String>,
    /// Stored before (RFC 3339).
    pub until: Option<String>,
    /// Metadata containing this.
    pub metadata: Value,
}

/// How wide a semantic query searches, in whichever index the agent's
/// table has now (see [`crate::host_tools::memory::lifecycle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breadth {
    /// HNSW's `hnsw.ef_search` (while a table is small).
    pub ef_search: u32,
    /// IVFFlat's `ivfflat.probes`: the lists read (once it is large). A
    /// filtered query reads at most four times as many before it stops
    /// (pgvector's iterative scan): a narrow filter cannot make it read all.
    pub probes: u32,
}

impl Breadth {
    /// The configuration's defaults (`memory.ef_search`, `memory.probes`).
    pub const DEFAULT: Breadth = Breadth { ef_search: 100, probes: 10 };
}

/// Per-agent figures for `choirctl memory stats`.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// (tier, items) for each tier present.
    pub tiers: Vec<(String, i64)>,
    /// Items waiting for their embedding.
    pub pending: i64,
    /// Items the endpoint kept refusing: set aside, never embedded.
    pub failed: i64,
    /// Items embedded but not yet in the vector index (found by exact scan).
    pub fresh: i64,
    /// Size of the vector index, bytes (0 if there is none).
    pub index_bytes: i64,
    /// Size of the table with its indexes, bytes.
    pub total_bytes: i64,
}

impl Store {
    /// Stores items (one transaction): new ones are queued for embedding;
    /// an item already in its tier (same sha256) gets its metadata merged.
    pub fn memory_upsert(
        &self,
        agent: &AgentId,
        items: &[NewItem],
        lane: &str,
        call_id: Option<&str>,
    ) -> Result<Vec<Upserted>, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let upsert = tx.prepare(&format!(
                "INSERT INTO {schema}.items (tier, content, content_sha256, metadata, lane, call_id)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (tier, content_sha256) DO UPDATE
                   SET metadata = {schema}.items.metadata || EXCLUDED.metadata, updated_at = now()
                 RETURNING id, (xmax = 0)"
            ))?;
            let mut out = Vec::new();
            let mut queued = Vec::new();
            for it in items {
                let row = tx.query_one(&upsert, &[&it.tier, &it.content, &it.sha256, &it.metadata, &lane, &call_id])?;
                let (id, inserted): (i64, bool) = (row.get(0), row.get(1));
                if inserted {
                    queued.push(id);
                }
                out.push(Upserted { id, tier: it.tier.clone(), sha256: it.sha256.clone(), inserted });
            }
            if !queued.is_empty() {
                tx.execute(
                    "INSERT INTO embedding_outbox (agent_id, item_id) SELECT $1, unnest($2::bigint[]) ON CONFLICT DO NOTHING",
                    &[&agent.as_str(), &queued],
                )?;
            }
            tx.commit()?;
            Ok(out)
        })
    }

    /// Items with this content hash (in `tier`, if given).
    pub fn memory_by_hash(&self, agent: &AgentId, sha256: &str, tier: Option<&str>) -> Result<Vec<Item>, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT {COLUMNS} FROM {schema}.items WHERE content_sha256 = $1 AND ($2::text IS NULL OR tier = $2)
                     ORDER BY id"
                ),
                &[&sha256, &tier],
            )?;
            Ok(rows.iter().map(item).collect())
        })
    }

    /// Items within a commit-sequence or time range, oldest first.
    pub fn memory_range(&self, agent: &AgentId, r: &Range, limit: i64) -> Result<Vec<Item>, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT {COLUMNS} FROM {schema}.items
                     WHERE ($1::text IS NULL OR tier = $1)
                       AND ($2::bigint IS NULL OR commit_seq >= $2) AND ($3::bigint IS NULL OR commit_seq <= $3)
                       AND ($4::text IS NULL OR created_at >= $4::timestamptz)
                       AND ($5::text IS NULL OR created_at < $5::timestamptz)
                       AND metadata @> $6
                     ORDER BY created_at, id LIMIT $7"
                ),
                &[&r.tier, &r.from_seq, &r.to_seq, &r.since, &r.until, &r.metadata, &limit],
            )?;
            Ok(rows.iter().map(item).collect())
        })
    }

    /// The `k` items nearest to `query` by cosine distance, with their
    /// similarity (1 − distance): the `k` nearest in the vector index (HNSW
    /// or IVFFlat, as the table's size has it) and the
    /// `k` nearest fresh vectors (an exact scan of at most `fresh_max` rows,
    /// through the partial index `items_fresh`), in one statement, merged.
    /// Filters apply inside the index scan (pgvector's iterative scan), so a
    /// narrow filter still finds `k` — within the scan's bound (HNSW's
    /// `hnsw.max_scan_tuples`, 20,000; IVFFlat's 4 × `probes` lists), past
    /// which a filter that rare answers fewer than `k` rather than reading
    /// the whole table. Only the filters given appear in the
    /// statement: a catch-all predicate would steer the planner away from
    /// the vector index.
    pub fn memory_semantic(
        &self,
        agent: &AgentId,
        query: Vec<f32>,
        tier: Option<&str>,
        metadata: &Value,
        k: i64,
        breadth: Breadth,
    ) -> Result<Vec<(Item, f64)>, DbError> {
        let schema = agent_schema(agent);
        let v = Vector::from(query);
        let filter_meta = metadata.as_object().is_some_and(|m| !m.is_empty());
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&v, &k];
        let mut filters = String::new();
        if let Some(t) = &tier {
            params.push(t);
            filters.push_str(&format!(" AND tier = ${}", params.len()));
        }
        if filter_meta {
            params.push(metadata);
            filters.push_str(&format!(" AND metadata @> ${}", params.len()));
        }
        let sql = format!(
            "(SELECT {COLUMNS}, 1 - (embedding <=> $1) FROM {schema}.items
              WHERE embedding IS NOT NULL{filters} ORDER BY embedding <=> $1 LIMIT $2)
             UNION ALL
             (SELECT {COLUMNS}, 1 - (fresh <=> $1) FROM {schema}.items
              WHERE fresh IS NOT NULL{filters} ORDER BY fresh <=> $1 LIMIT $2)"
        );
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            // No sequential scan: the fresh branch reads its rows through
            // `items_fresh` whatever the statistics say (the index branch is an
            // index scan either way). The entries of rows since indexed are
            // skipped once marked dead, which the batcher's and the indexer's
            // plain index scans of `items_fresh` do as they pass them. No JIT:
            // statistics that have not seen the column yet (a table loaded
            // after its migration) make the fresh branch look like a million
            // rows, and compiling the plan then cost 35 ms a query at a
            // million items (bench-memory) for a few rows read.
            let Breadth { ef_search, probes } = breadth;
            tx.batch_execute(&format!(
                "SET LOCAL hnsw.ef_search = {ef_search}; SET LOCAL hnsw.iterative_scan = relaxed_order;
                 SET LOCAL ivfflat.probes = {probes}; SET LOCAL ivfflat.iterative_scan = relaxed_order;
                 SET LOCAL ivfflat.max_probes = {};
                 SET LOCAL enable_seqscan = off; SET LOCAL jit = off",
                probes.saturating_mul(4)
            ))?;
            let rows = tx.query(&sql, &params)?;
            tx.commit()?;
            // relaxed_order may return neighbours slightly out of order: sort exactly.
            let mut out: Vec<(Item, f64)> = rows.iter().map(|r| (item(r), r.get::<_, f64>(9))).collect();
            out.sort_by(|a, b| b.1.total_cmp(&a.1));
            out.truncate(usize::try_from(k).unwrap_or(0));
            Ok(out)
        })
    }

    /// Items waiting for their embedding, oldest first, across agents:
    /// (outbox id, agent, item id, content). Rows whose item is gone (or
    /// whose agent id no longer parses) are dropped. One statement per agent
    /// in the batch, not one per item.
    pub fn outbox_batch(&self, limit: i64) -> Result<Vec<(i64, AgentId, i64, String)>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT id, agent_id, item_id FROM embedding_outbox WHERE failed_at IS NULL ORDER BY attempts, id LIMIT $1",
                &[&limit],
            )?;
            let queued: Vec<(i64, String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
            let mut contents: HashMap<(String, i64), String> = HashMap::new();
            let mut agents: Vec<&str> = queued.iter().map(|(_, a, _)| a.as_str()).collect();
            agents.sort_unstable();
            agents.dedup();
            for name in agents {
                let Ok(agent) = AgentId::parse(name) else { continue };
                let ids: Vec<i64> = queued.iter().filter(|(_, a, _)| a == name).map(|(_, _, i)| *i).collect();
                let schema = agent_schema(&agent);
                for r in c.query(&format!("SELECT id, content FROM {schema}.items WHERE id = ANY($1)"), &[&ids])? {
                    contents.insert((name.to_owned(), r.get(0)), r.get(1));
                }
            }
            let (mut out, mut gone) = (Vec::new(), Vec::new());
            for (id, agent, item_id) in queued {
                match (AgentId::parse(&agent), contents.remove(&(agent, item_id))) {
                    (Ok(agent), Some(content)) => out.push((id, agent, item_id, content)),
                    _ => gone.push(id),
                }
            }
            if !gone.is_empty() {
                c.execute("DELETE FROM embedding_outbox WHERE id = ANY($1)", &[&gone])?;
            }
            Ok(out)
        })
    }

    /// Stores embeddings and clears their outbox rows, in one transaction:
    /// one `UPDATE … FROM unnest(…)` per agent in the batch and one `DELETE`.
    /// Each agent's first vectors are stored fresh (no graph search) while
    /// fewer than `fresh_max` of its items wait for the index; the rest go
    /// straight into `embedding` (the index insert: slow for HNSW, cheap for
    /// IVFFlat). An item
    /// that already has an indexed vector gets the new one there.
    /// Returns how many were stored fresh.
    pub fn store_embeddings(&self, done: &[(i64, AgentId, i64, Vec<f32>)], fresh_max: i64) -> Result<u64, DbError> {
        let mut by_agent: Vec<(&AgentId, Vec<i64>, Vec<Vector>)> = Vec::new();
        for (_, agent, item_id, v) in done {
            let at = match by_agent.iter().position(|(a, _, _)| *a == agent) {
                Some(at) => at,
                None => {
                    by_agent.push((agent, Vec::new(), Vec::new()));
                    by_agent.len() - 1
                }
            };
            by_agent[at].1.push(*item_id);
            by_agent[at].2.push(Vector::from(v.clone()));
        }
        let outbox: Vec<i64> = done.iter().map(|(o, _, _, _)| *o).collect();
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            // The count reads `items_fresh` (an index scan, which marks dead
            // entries for later scans to skip), never the whole table.
            tx.batch_execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off")?;
            let mut fresh = 0;
            for (agent, ids, vectors) in &by_agent {
                let schema = agent_schema(agent);
                // `room`: how many more may wait fresh. The batcher is the only
                // writer of fresh vectors, so the count cannot race upward.
                let rows = tx.query(
                    &format!(
                        "WITH room AS (SELECT greatest($3 - count(*), 0) AS n FROM {schema}.items WHERE fresh IS NOT NULL),
                              u AS (SELECT u.id, u.e, (u.o <= room.n) AS f
                                    FROM unnest($1::bigint[], $2::vector[]) WITH ORDINALITY AS u(id, e, o), room)
                         UPDATE {schema}.items AS i
                            SET fresh = CASE WHEN u.f AND i.embedding IS NULL THEN u.e END,
                                embedding = CASE WHEN u.f AND i.embedding IS NULL THEN NULL ELSE u.e END
                           FROM u WHERE i.id = u.id
                         RETURNING i.fresh IS NOT NULL"
                    ),
                    &[ids, vectors, &fresh_max],
                )?;
                fresh += rows.iter().filter(|r| r.get::<_, bool>(0)).count() as u64;
            }
            tx.execute("DELETE FROM embedding_outbox WHERE id = ANY($1)", &[&outbox])?;
            tx.commit()?;
            Ok(fresh)
        })
    }

    /// Moves up to `limit` of an agent's fresh vectors into the vector index,
    /// in one transaction; returns how many. Rows a concurrent move holds are
    /// skipped, never waited for. No `ORDER BY`: with one the planner may walk
    /// the primary key from the oldest item to find the newest; without, the
    /// partial index `items_fresh` (which lists only these rows) is the cheap
    /// path, and sequential and bitmap scans are off.
    pub fn index_fresh(&self, agent: &AgentId, limit: i64) -> Result<u64, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            tx.batch_execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off")?;
            let n = tx.execute(
                &format!(
                    "UPDATE {schema}.items SET embedding = fresh, fresh = NULL
                     WHERE id IN (SELECT id FROM {schema}.items WHERE fresh IS NOT NULL LIMIT $1
                                  FOR UPDATE SKIP LOCKED)"
                ),
                &[&limit],
            )?;
            tx.commit()?;
            Ok(n)
        })
    }

    /// The agents whose memory schema exists: with `migrated`, only those
    /// whose schema has migration `migrated` applied.
    pub fn memory_agents(&self, migrated: Option<i32>) -> Result<Vec<AgentId>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT DISTINCT agent_id FROM agent_migrations WHERE $1::integer IS NULL OR version = $1 ORDER BY agent_id",
                &[&migrated],
            )?;
            Ok(rows.iter().filter_map(|r| AgentId::parse(r.get::<_, &str>(0)).ok()).collect())
        })
    }

    /// Records a failed embedding attempt for outbox rows.
    pub fn outbox_failed(&self, ids: &[i64], error: &str) -> Result<(), DbError> {
        self.db.with(|c| {
            c.execute(
                "UPDATE embedding_outbox SET attempts = attempts + 1, last_error = $2 WHERE id = ANY($1)",
                &[&ids, &error],
            )
            .map(drop)
        })
    }

    /// The endpoint refused this one item (embedded alone): counted, and set
    /// aside for good (`failed_at`) after `give_up_after` refusals, so it no
    /// longer holds up the items behind it. Returns whether it was set aside.
    pub fn outbox_refused(&self, id: i64, error: &str, give_up_after: i32) -> Result<bool, DbError> {
        self.db.with(|c| {
            let row = c.query_opt(
                "UPDATE embedding_outbox SET attempts = attempts + 1, last_error = $2,
                        failed_at = CASE WHEN attempts + 1 >= $3 THEN now() END
                 WHERE id = $1 RETURNING failed_at IS NOT NULL",
                &[&id, &error, &give_up_after],
            )?;
            Ok(row.is_some_and(|r| r.get(0)))
        })
    }

    /// How many of `items` still wait for their embedding.
    pub fn outbox_pending(&self, agent: &AgentId, items: &[i64]) -> Result<i64, DbError> {
        self.db.with(|c| {
            let row = c.query_one(
                "SELECT count(*) FROM embedding_outbox WHERE agent_id = $1 AND item_id = ANY($2)",
                &[&agent.as_str(), &items],
            )?;
            Ok(row.get(0))
        })
    }

    /// Sets the commit sequence of what call `call_id` stored (at replication).
    pub fn memory_set_commit_seq(&self, agent: &AgentId, call_id: &str, seq: i64) -> Result<(), DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            c.execute(
                &format!("UPDATE {schema}.items SET commit_seq = $2 WHERE call_id = $1 AND commit_seq IS NULL"),
                &[&call_id, &seq],
            )
            .map(drop)
        })
    }

    /// Replaces session items `folded` by one knowledge item (a summary), in
    /// one transaction; the summary is queued for embedding.
    pub fn memory_fold(
        &self,
        agent: &AgentId,
        folded: &[i64],
        summary: &NewItem,
        lane: &str,
        call_id: Option<&str>,
    ) -> Result<i64, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let row = tx.query_one(
                &format!(
                    "INSERT INTO {schema}.items (tier, content, content_sha256, metadata, lane, call_id)
                     VALUES ('knowledge', $1, $2, $3, $4, $5)
                     ON CONFLICT (tier, content_sha256) DO UPDATE SET updated_at = now()
                     RETURNING id, (xmax = 0)"
                ),
                &[&summary.content, &summary.sha256, &summary.metadata, &lane, &call_id],
            )?;
            let (id, inserted): (i64, bool) = (row.get(0), row.get(1));
            if inserted {
                tx.execute(
                    "INSERT INTO embedding_outbox (agent_id, item_id) VALUES ($1, $2)",
                    &[&agent.as_str(), &id],
                )?;
            }
            tx.execute(&format!("DELETE FROM {schema}.items WHERE tier = 'session' AND id = ANY($1)"), &[&folded])?;
            tx.execute(
                "DELETE FROM embedding_outbox WHERE agent_id = $1 AND item_id = ANY($2)",
                &[&agent.as_str(), &folded],
            )?;
            tx.commit()?;
            Ok(id)
        })
    }

    /// Cached embeddings of tool descriptions, by text sha256.
    pub fn tool_embeddings(&self, shas: &[String], model: &str) -> Result<Vec<(String, Vec<f32>)>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT text_sha256, embedding FROM tool_embeddings WHERE model = $2 AND text_sha256 = ANY($1)",
                &[&shas, &model],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    /// Caches embeddings of tool descriptions.
    pub fn put_tool_embeddings(&self, rows: &[(String, Vec<f32>)], model: &str) -> Result<(), DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            for (sha, v) in rows {
                tx.execute(
                    "INSERT INTO tool_embeddings (text_sha256, model, embedding) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[sha, &model, v],
                )?;
            }
            tx.commit()
        })
    }

    /// How many items an agent's memory holds.
    pub fn memory_count(&self, agent: &AgentId) -> Result<u64, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| Ok(c.query_one(&format!("SELECT count(*) FROM {schema}.items"), &[])?.get::<_, i64>(0) as u64))
    }

    /// Figures for `choirctl memory stats`.
    pub fn memory_stats(&self, agent: &AgentId) -> Result<Stats, DbError> {
        let schema = agent_schema(agent);
        let plain = format!("agent_{}", agent.as_str());
        self.db.with(|c| {
            let tiers = c
                .query(&format!("SELECT tier, count(*) FROM {schema}.items GROUP BY tier ORDER BY tier"), &[])?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let counts = c.query_one(
                "SELECT count(*) FILTER (WHERE failed_at IS NULL), count(*) FILTER (WHERE failed_at IS NOT NULL)
                 FROM embedding_outbox WHERE agent_id = $1",
                &[&agent.as_str()],
            )?;
            let (pending, failed): (i64, i64) = (counts.get(0), counts.get(1));
            let fresh: i64 =
                c.query_one(&format!("SELECT count(*) FROM {schema}.items WHERE fresh IS NOT NULL"), &[])?.get(0);
            // The index may be missing (dropped by an operator, or between a
            // rebuild's two steps): its size is then 0, not an error.
            let sizes = c.query_one(
                "SELECT coalesce(pg_relation_size(to_regclass($1 || '.items_embedding')), 0),
                        pg_total_relation_size(($1 || '.items')::regclass)",
                &[&plain],
            )?;
            Ok(Stats { tiers, pending, failed, fresh, index_bytes: sizes.get(0), total_bytes: sizes.get(1) })
        })
    }

    /// Every item of an agent, oldest first, with its embedding (for export).
    pub fn memory_export(&self, agent: &AgentId, after: i64, limit: i64) -> Result<Vec<Value>, DbError> {
        let schema = agent_schema(agent);
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT {COLUMNS}, coalesce(embedding, fresh), updated_at::text FROM {schema}.items
                     WHERE id > $1 ORDER BY id LIMIT $2"
                ),
                &[&after, &limit],
            )?;
            Ok(rows
                .iter()
                .map(|r| {
                    let mut v = item(r).to_json();
                    let e: Option<Vector> = r.get(9);
                    v["embedding"] = json!(e.map(|e| e.to_vec()));
                    v["updated_at"] = json!(r.get::<_, String>(10));
                    v
                })
                .collect())
        })
    }
}
