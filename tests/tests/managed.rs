//! The embedded default (R-MEM-3): with no database_url, choird runs its own
//! PostgreSQL under <home>/pg, with pgvector, and stops it on shutdown.

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use serde_json::json;

#[test]
fn choird_runs_and_stops_its_own_postgres_with_pgvector() {
    if choird::db::cluster::ManagedCluster::find_bin_dir(None).is_err() {
        assert!(!choir_tests::services_required(), "PostgreSQL is required");
        eprintln!("SKIPPED: no PostgreSQL server binaries");
        return;
    }
    let fake = FakeLlm::start(vec![
        Step::call("choir.memory.upsert", json!({"tier": "knowledge", "content": "managed memory works"})),
        Step::Text("hello from the managed setup".into()),
    ]);
    let emb = FakeEmbeddings::start(16);
    let mut config = test_config(&fake.base_url(), None, &["demo"]);
    config["memory"] = json!({"embeddings": {"base_url": emb.base_url(), "model": "fake", "dimensions": 16}});
    let mut choird = Choird::start(&config, &json!({"llm_key": "k"}));
    let status = choird.ctl_ok(&["status"]);
    assert!(status.contains("database: managed"), "{status}");
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "hello from the managed setup\n");

    let pg = choird.home.path().join("pg");
    let url = format!("host={} port=5432 user=postgres dbname=choir", pg.join("run").display());
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let v: String =
        client.query_one("SELECT extversion FROM pg_extension WHERE extname = 'vector'", &[]).unwrap().get(0);
    assert!(!v.is_empty());
    // HNSW and cosine distance work.
    client
        .batch_execute("CREATE TEMP TABLE t (v vector(3)); CREATE INDEX ON t USING hnsw (v vector_cosine_ops);")
        .unwrap();
    let d: f64 = client.query_one("SELECT '[1,0,0]'::vector <=> '[0,1,0]'::vector", &[]).unwrap().get(0);
    assert!((d - 1.0).abs() < 1e-9);
    // The same per-agent migrations made the agent's memory, and it was used.
    let (content, dims): (String, String) = {
        let r = client
            .query_one(
                "SELECT content, format_type(atttypid, atttypmod) FROM agent_demo.items, pg_attribute
                 WHERE attrelid = 'agent_demo.items'::regclass AND attname = 'embedding'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((content.as_str(), dims.as_str()), ("managed memory works", "vector(16)"));
    drop(client);

    let status = choird.stop().unwrap();
    assert!(status.success(), "choird exited with {status}: {}", choird.stderr());
    assert!(!pg.join("data/postmaster.pid").exists(), "the managed PostgreSQL was stopped");
    assert!(!choird.home.path().join("socks/choird.sock").exists(), "the admin socket was removed");
}
