//! `bench-memory` (not part of `make test`; `make bench-memory`): the memory
//! store at scale, on a private PostgreSQL cluster with pgvector — load
//! 1,000,000 random 384-dimensional vectors into an agent schema made by the
//! real per-agent migration, build the index the `memory-index` thread
//! builds for a table that size (IVFFlat, lists from the lifecycle policy,
//! through `Store::memory_index_build`), then report recall@10 against
//! exact search and p50/p99 query latency for `probes` 5, 10, 20 and 40,
//! and upsert throughput: batches of 100 through `Store::memory_upsert` and
//! `Store::store_embeddings` (the vectors stored fresh, searchable by exact
//! scan at once), queries while they wait, how fast the `memory-index`
//! thread's rounds put them into the index, and a longer burst past
//! `fresh_max` (the sustained rate) — each against the floor, the same
//! number of items inserted with their vectors straight into the index.
//!
//! `CHOIR_BENCH_N` changes the number of vectors (default 1,000,000; at
//! least the policy's `build_at`, 10,000);
//! `CHOIR_BENCH_INDEX=hnsw` builds the HNSW index the per-agent migration
//! makes instead (what small tables keep, and what every table had before
//! the lifecycle), reporting `ef_search` 40, 100, 200 and 400;
//! `CHOIR_BENCH_M` and `CHOIR_BENCH_EFC` its `m` and
//! `ef_construction` (default 32 and 128, as the per-agent migration);
//! `CHOIR_BENCH_DATA=clustered` draws them around 1,000 random centres (as
//! text embeddings are: structured) instead of uniformly on the sphere (the
//! default, the hardest case for any approximate index);
//! `CHOIR_BENCH_SHARED_BUFFERS` (e.g. `2GB`) sizes the cluster's
//! shared_buffers (ALTER SYSTEM and a restart) before the load;
//! `CHOIR_BENCH_UPSERTS` the number of items in the floor's insert and in
//! the long burst of upserts (default 10,000, a multiple of 100); the short
//! burst is the default `fresh_max`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use choir_tests::pg::TestPg;
use choird::db::Db;
use choird::host_tools::memory::indexer;
use choird::host_tools::memory::lifecycle::{self, Kind, Policy, Step};
use choird::store::memory::{Breadth, NewItem};
use choird::store::memory_index::BuildCancel;
use choird::store::Store;
use pgvector::Vector;
use serde_json::json;

const DIMS: usize = 384;
const QUERIES: usize = 100;

/// xorshift64*: reproducible vectors without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn vector(&mut self) -> Vec<f32> {
        let v: Vec<f32> = (0..DIMS).map(|_| self.next()).collect();
        normalised(v)
    }
}

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

/// Where the vectors come from.
struct Source {
    rng: Rng,
    centres: Vec<Vec<f32>>,
}

impl Source {
    fn new(clustered: bool) -> Source {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let centres = if clustered { (0..1000).map(|_| rng.vector()).collect() } else { Vec::new() };
        Source { rng, centres }
    }

    fn vector(&mut self) -> Vec<f32> {
        if self.centres.is_empty() {
            return self.rng.vector();
        }
        let c = (self.rng.next().abs() * self.centres.len() as f32) as usize % self.centres.len();
        let noise = self.rng.vector();
        normalised(self.centres[c].iter().zip(noise).map(|(a, b)| a + 0.6 * b).collect())
    }
}

fn pct(mut v: Vec<Duration>, q: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e3
}

fn main() {
    let n: usize = std::env::var("CHOIR_BENCH_N").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let pg = TestPg::start().expect("PostgreSQL is needed");
    if let Ok(sb) = std::env::var("CHOIR_BENCH_SHARED_BUFFERS") {
        // As an operator would size it for the index (ALTER SYSTEM, then a restart).
        pg.client().batch_execute(&format!("ALTER SYSTEM SET shared_buffers = '{sb}'")).unwrap();
        pg.restart_immediate();
    }
    let sb: String = pg.client().query_one("SHOW shared_buffers", &[]).unwrap().get(0);
    choir_tests::report!("shared_buffers: {sb}");
    let db = Db::connect(&pg.url()).unwrap();
    db.migrate().unwrap();
    let agent = AgentId::parse("bench").unwrap();
    db.migrate_agent(&agent, DIMS as u32).unwrap();
    let mut c = pg.client();
    // Bulk load first, then build the index once (as one would for a big import).
    c.batch_execute("DROP INDEX agent_bench.items_embedding").unwrap();
    let clustered = std::env::var("CHOIR_BENCH_DATA").is_ok_and(|v| v == "clustered");
    let mut rng = Source::new(clustered);
    choir_tests::report!("data: {}", if clustered { "clustered (1,000 centres)" } else { "uniform on the sphere" });
    let started = Instant::now();
    let chunk = 1000;
    for start in (0..n).step_by(chunk) {
        let mut tx = c.transaction().unwrap();
        let stmt = tx
            .prepare(
                "INSERT INTO agent_bench.items (tier, content, content_sha256, embedding)
                 SELECT 'knowledge', 'item ' || i, md5(i::text), e FROM unnest($1::bigint[], $2::vector[]) AS t(i, e)",
            )
            .unwrap();
        let ids: Vec<i64> = (start..(start + chunk).min(n)).map(|i| i as i64).collect();
        let vecs: Vec<Vector> = ids.iter().map(|_| Vector::from(rng.vector())).collect();
        tx.execute(&stmt, &[&ids, &vecs]).unwrap();
        tx.commit().unwrap();
    }
    let load = started.elapsed();
    choir_tests::report!(
        "loaded {n} vectors of {DIMS} dimensions in {:.1} s ({:.0}/s)",
        load.as_secs_f64(),
        n as f64 / load.as_secs_f64()
    );

    let hnsw = std::env::var("CHOIR_BENCH_INDEX").is_ok_and(|v| v == "hnsw");
    let store = Store::new(Db::connect(&pg.url()).unwrap());
    let started = Instant::now();
    let index = if hnsw {
        c.batch_execute("SET maintenance_work_mem = '6GB'; SET max_parallel_maintenance_workers = 1").unwrap();
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        let with = format!(
            " WITH (m = {}, ef_construction = {})",
            env("CHOIR_BENCH_M").unwrap_or(32),
            env("CHOIR_BENCH_EFC").unwrap_or(128)
        );
        c.batch_execute(&format!(
            "CREATE INDEX items_embedding ON agent_bench.items USING hnsw (embedding vector_cosine_ops){with}"
        ))
        .unwrap();
        format!("HNSW index{with}")
    } else {
        // What the memory-index thread builds for a table this size.
        c.batch_execute("ANALYZE agent_bench.items").unwrap();
        let shape = store.memory_index_shape(&agent).unwrap();
        let Step::Build(lists) = lifecycle::step(&Policy::DEFAULT, &shape) else {
            panic!("{n} rows call for no build: {shape:?} (CHOIR_BENCH_N below the policy's build_at?)")
        };
        let mib = lifecycle::build_memory_mib(lists, DIMS as u32);
        store.memory_index_build(&agent, lists, mib, &BuildCancel::default()).unwrap().expect("the build lock");
        assert_eq!(store.memory_index_shape(&agent).unwrap().kind, Kind::IvfFlat(lists));
        format!("IVFFlat index (lists {lists}, as the memory-index thread builds it)")
    };
    let build = started.elapsed();
    let size: i64 = c.query_one("SELECT pg_relation_size('agent_bench.items_embedding')", &[]).unwrap().get(0);
    choir_tests::report!("{index} built in {:.1} s, {} MiB", build.as_secs_f64(), size / 1024 / 1024);

    let queries: Vec<Vec<f32>> = (0..QUERIES).map(|_| rng.vector()).collect();
    // Exact answers: a sequential scan.
    let started = Instant::now();
    let truth = exact(&mut c, &queries, "embedding");
    choir_tests::report!(
        "exact search: {:.0} ms per query (sequential scan)",
        started.elapsed().as_secs_f64() * 1e3 / QUERIES as f64
    );

    let widths: Vec<(String, Breadth)> = if hnsw {
        [40u32, 100, 200, 400]
            .iter()
            .map(|&ef| (format!("ef_search {ef}"), Breadth { ef_search: ef, ..Breadth::DEFAULT }))
            .collect()
    } else {
        [5u32, 10, 20, 40].iter().map(|&p| (format!("probes {p}"), Breadth { probes: p, ..Breadth::DEFAULT })).collect()
    };
    for (label, breadth) in widths {
        // Warm the cache once, then measure what the agents' queries run.
        for q in queries.iter().take(10) {
            store.memory_semantic(&agent, q.clone(), None, &json!({}), 10, breadth).unwrap();
        }
        let (mut times, mut hits) = (Vec::new(), 0usize);
        for (q, want) in queries.iter().zip(&truth) {
            let t = Instant::now();
            let got = store.memory_semantic(&agent, q.clone(), None, &json!({}), 10, breadth).unwrap();
            times.push(t.elapsed());
            hits += got.iter().filter(|(i, _)| want.contains(&i.id)).count();
        }
        choir_tests::report!(
            "{label}: recall@10 {:.3}, latency p50 {:.2} ms p99 {:.2} ms ({QUERIES} queries)",
            hits as f64 / (10 * QUERIES) as f64,
            pct(times.clone(), 0.5),
            pct(times, 0.99)
        );
    }
    let kind = if hnsw { "HNSW" } else { "IVFFlat" };

    // The floor: the same number of items written with their vectors by one
    // bulk statement per 100 (no outbox, no second pass): what the index
    // costs by itself.
    let total: usize = std::env::var("CHOIR_BENCH_UPSERTS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let started = Instant::now();
    for b in 0..total / 100 {
        let ids: Vec<i64> = (0..100).map(|i| (n + b * 100 + i) as i64).collect();
        let vecs: Vec<Vector> = ids.iter().map(|_| Vector::from(rng.vector())).collect();
        c.execute(
            "INSERT INTO agent_bench.items (tier, content, content_sha256, embedding)
             SELECT 'working', 'floor ' || i, md5(i::text), e FROM unnest($1::bigint[], $2::vector[]) AS t(i, e)",
            &[&ids, &vecs],
        )
        .unwrap();
    }
    let floor = total as f64 / started.elapsed().as_secs_f64();
    choir_tests::report!(
        "floor: {total} items inserted with their vectors, 100 per statement, {kind} maintained: {floor:.0} items/s"
    );

    // Upserts through the store, with their embeddings, as the memory-embed
    // batcher stores them (its embedder answering at once). A burst within
    // the default fresh_max: every vector fresh, searchable at once.
    let fresh_max = i64::from(choird::config::DEFAULT_FRESH_MAX);
    let mut upsert = Upserts { store: &store, agent: &agent, rng: &mut rng, next: 0 };
    let (up, fresh) = upsert.burst(fresh_max as usize, fresh_max);
    assert_eq!(fresh, fresh_max as usize, "within fresh_max every vector is stored fresh");
    choir_tests::report!(
        "upserts, a burst of {fresh_max} (= fresh_max) in batches of 100 (insert + outbox + embedding stored fresh, \
         searchable at once): {up:.0} items/s ({:.1}x the floor)",
        up / floor
    );

    // Queries while they wait fresh: the exact scan's cost, and recall
    // against exact search over every vector, indexed or fresh.
    let sample = &queries[..QUERIES.min(50)];
    let measure = |c: &mut postgres::Client, label: &str| {
        let truth = exact(c, sample, "coalesce(embedding, fresh)");
        for q in sample.iter().take(10) {
            store.memory_semantic(&agent, q.clone(), None, &json!({}), 10, Breadth::DEFAULT).unwrap();
        }
        let (mut times, mut hits, mut fresh_hits) = (Vec::new(), 0usize, 0usize);
        for (q, want) in sample.iter().zip(&truth) {
            let t = Instant::now();
            let got = store.memory_semantic(&agent, q.clone(), None, &json!({}), 10, Breadth::DEFAULT).unwrap();
            times.push(t.elapsed());
            hits += got.iter().filter(|(i, _)| want.contains(&i.id)).count();
            fresh_hits += got.iter().filter(|(i, _)| i.tier == "session").count();
        }
        choir_tests::report!(
            "default breadth with {label}: recall@10 {:.3} ({fresh_hits} of the answers new items), latency p50 {:.2} ms \
             p99 {:.2} ms ({} queries)",
            hits as f64 / (10 * sample.len()) as f64,
            pct(times.clone(), 0.5),
            pct(times, 0.99),
            sample.len()
        );
    };
    measure(&mut c, &format!("{fresh_max} items fresh"));
    let indexed = drain(&store, &mut c, fresh_max as usize);
    choir_tests::report!(
        "indexed in the background: {fresh_max} fresh vectors moved into the {kind} index by the indexer's rounds \
         (16 items each): {indexed:.0} items/s ({:.0}% of the floor)",
        100.0 * indexed / floor
    );
    measure(&mut c, "every item indexed");

    // A longer burst: past fresh_max, vectors go straight into the index.
    let (up, fresh) = upsert.burst(total, fresh_max);
    choir_tests::report!(
        "upserts, a burst of {total}: {up:.0} items/s ({:.1}x the floor, {:.1}x the 1,000 items/s target; {fresh} \
         stored fresh, the rest indexed as stored)",
        up / floor,
        up / 1000.0
    );
    drain(&store, &mut c, fresh);
}

/// Upserts through the store, `memory-embed`'s way, with random vectors.
struct Upserts<'a> {
    store: &'a Store,
    agent: &'a AgentId,
    rng: &'a mut Source,
    next: usize,
}

impl Upserts<'_> {
    /// `n` items (a multiple of 100) in batches of 100; (items/s, stored fresh).
    fn burst(&mut self, n: usize, fresh_max: i64) -> (f64, usize) {
        let (started, mut fresh) = (Instant::now(), 0);
        for _ in 0..n / 100 {
            let items: Vec<NewItem> = (0..100)
                .map(|_| {
                    self.next += 1;
                    let content = format!("new item {}", self.next);
                    NewItem {
                        tier: "session".into(),
                        sha256: format!("{:x}", md5ish(&content)),
                        content,
                        metadata: json!({}),
                    }
                })
                .collect();
            let stored = self.store.memory_upsert(self.agent, &items, "edge", None).unwrap();
            let done: Vec<(i64, AgentId, i64, Vec<f32>)> = self
                .store
                .outbox_batch(200)
                .unwrap()
                .into_iter()
                .map(|(o, a, id, _)| (o, a, id, self.rng.vector()))
                .collect();
            assert_eq!(done.len(), stored.len());
            fresh += self.store.store_embeddings(&done, fresh_max).unwrap() as usize;
        }
        (n as f64 / started.elapsed().as_secs_f64(), fresh)
    }
}

/// The indexer's rounds, back to back, until no vector waits; items/s.
fn drain(store: &Store, c: &mut postgres::Client, fresh: usize) -> f64 {
    let started = Instant::now();
    let mut waits = indexer::Waits::default();
    while indexer::round(store, &mut waits).unwrap().moved > 0 {}
    let left: i64 = c.query_one("SELECT count(*) FROM agent_bench.items WHERE fresh IS NOT NULL", &[]).unwrap().get(0);
    assert_eq!(left, 0);
    fresh as f64 / started.elapsed().as_secs_f64()
}

/// Exact answers for `queries` over `column`: a sequential scan.
fn exact(c: &mut postgres::Client, queries: &[Vec<f32>], column: &str) -> Vec<Vec<i64>> {
    let mut truth = Vec::new();
    for q in queries {
        let mut tx = c.transaction().unwrap();
        tx.batch_execute("SET LOCAL enable_indexscan = off; SET LOCAL max_parallel_workers_per_gather = 2").unwrap();
        let rows = tx
            .query(
                &format!(
                    "SELECT id FROM agent_bench.items WHERE {column} IS NOT NULL ORDER BY {column} <=> $1 LIMIT 10"
                ),
                &[&Vector::from(q.clone())],
            )
            .unwrap();
        truth.push(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>());
        tx.commit().unwrap();
    }
    truth
}

/// A cheap distinct hash for synthetic contents.
fn md5ish(s: &str) -> u128 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u128, |h, b| (h ^ u128::from(b)).wrapping_mul(0x1000_0000_0000_0000_0000_013b))
}
