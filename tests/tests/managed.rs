//! The embedded default (R-MEM-3): with no database_url, choird runs its own
//! PostgreSQL under <home>/pg, with pgvector, and stops it on shutdown.

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird};
use serde_json::json;
use std::time::Duration;

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
    // No autovacuum launcher: the keeper tends the tables (`db/upkeep.rs`).
    let launchers: Vec<String> = client
        .query("SELECT backend_type FROM pg_stat_activity WHERE backend_type LIKE 'autovacuum%'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(launchers.is_empty(), "{launchers:?}");
    let background: i64 = client
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'checkpointer'", &[])
        .unwrap()
        .get(0);
    assert_eq!(background, 1, "the query sees background processes, so the check above can fail");
    drop(client);

    let status = choird.stop().unwrap();
    assert!(status.success(), "choird exited with {status}: {}", choird.stderr());
    assert!(!pg.join("data/postmaster.pid").exists(), "the managed PostgreSQL was stopped");
    assert!(!choird.home.path().join("socks/choird.sock").exists(), "the admin socket was removed");
}

/// The managed cluster in a unit of its own (`choird cluster`, the choir-db
/// unit): choird adopts it, a restart of choird leaves the very same server
/// running, and only one of the two keeps a home's cluster at a time —
/// whichever comes second is refused and changes nothing. The control: a
/// choird that keeps the cluster itself stops it when it stops.
#[test]
fn a_cluster_kept_by_choird_cluster_outlives_choird_restarts() {
    use choir_tests::harness::{ClusterKeeper, TempHome};
    use choird::db::cluster::ManagedCluster;
    if ManagedCluster::find_bin_dir(None).is_err() {
        assert!(!choir_tests::services_required(), "PostgreSQL is required");
        eprintln!("SKIPPED: no PostgreSQL server binaries");
        return;
    }
    let fake = FakeLlm::with_responder(|_, _| Some(Step::Text("ok".into())));
    let config = test_config(&fake.base_url(), None, &["demo"]);
    let home = TempHome::new(&config, &json!({"llm_key": "k"}));
    let (home_dir, pg) = (home.path().to_owned(), home.path().join("pg"));

    // choird alone keeps its cluster: `choird cluster` is refused meanwhile.
    let mut choird = Choird::start_in(home);
    let alone = ManagedCluster::postmaster_pid(&pg).expect("choird started its cluster");
    let (status, err) = choir_tests::harness::run_to_exit(ClusterKeeper::command(&home_dir), Duration::from_secs(30));
    assert!(!status.success() && err.contains("kept already by pid"), "{status}: {err}");
    assert_eq!(ManagedCluster::postmaster_pid(&pg), Some(alone), "the refused keeper changed nothing");
    // The control: choird stopping stops the cluster it keeps.
    assert!(choird.stop().unwrap().success(), "{}", choird.stderr());
    assert_eq!(ManagedCluster::postmaster_pid(&pg), None, "choird stopped the cluster it kept");

    // With `choird cluster` keeping it, choird adopts it and leaves it.
    let mut keeper = ClusterKeeper::start(&home_dir);
    let kept = keeper.postmaster();
    choird.spawn_again();
    choird.wait_ready();
    let status = choird.ctl_ok(&["status"]);
    assert!(status.contains("kept by `choird cluster`"), "{status}");
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "hi"]), "ok\n");
    for _ in 0..2 {
        choird.restart();
        assert_eq!(ManagedCluster::postmaster_pid(&pg), Some(kept), "a choird restart left the same server");
    }
    choird.wait_running("demo");
    assert_eq!(choird.ctl_ok(&["chat", "demo", "after the restarts"]), "ok\n");
    // A second keeper is refused while the first holds the cluster.
    let (status, err) = choir_tests::harness::run_to_exit(ClusterKeeper::command(&home_dir), Duration::from_secs(30));
    assert!(!status.success() && err.contains("kept already by pid"), "{status}: {err}");
    assert_eq!(ManagedCluster::postmaster_pid(&pg), Some(kept), "the refused keeper changed nothing");
    // choird stopped: the cluster stays; the keeper stopped: it goes.
    assert!(choird.stop().unwrap().success(), "{}", choird.stderr());
    assert_eq!(ManagedCluster::postmaster_pid(&pg), Some(kept), "choird left the kept cluster running");
    assert!(keeper.stop().unwrap().success(), "choird cluster stopped cleanly");
    assert_eq!(ManagedCluster::postmaster_pid(&pg), None, "choird cluster stopped the cluster");
    assert!(!pg.join("data/postmaster.pid").exists(), "a clean shutdown, not a crash");
}

/// The keeper's upkeep, in place of the autovacuum launcher: a table whose
/// rows were mostly deleted is vacuumed, one with enough rows changed since
/// its last analyze is analyzed, a table barely touched is left alone; and
/// a second pass right after finds nothing due (the control: the first
/// pass's work is what the statistics say it did).
#[test]
fn the_keepers_upkeep_vacuums_and_analyzes_what_changed_enough_and_nothing_else() {
    use choir_tests::pg::TestPg;
    use choird::db::upkeep::tend;
    let Some(pg) = TestPg::start() else { return };
    let mut c = pg.client();
    c.batch_execute(
        "CREATE TABLE churn (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false);
         CREATE TABLE edited (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false);
         CREATE TABLE calm (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false);
         INSERT INTO churn SELECT g, 'x' FROM generate_series(1, 2000) g;
         INSERT INTO edited SELECT g, 'x' FROM generate_series(1, 900) g;
         INSERT INTO calm SELECT g, 'x' FROM generate_series(1, 500) g;",
    )
    .unwrap();
    // A backend hands its statistics to the shared store when idle or at
    // its end: end it, and wait until they are there.
    drop(c);
    let mut c = pg.client();
    wait_for_stats(&mut c, "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'calm'", 500);
    // The inserts are due a vacuum (1,000 + 20 %) only for churn; settle
    // the other two first, so the edits below are all that is new.
    c.batch_execute("VACUUM (ANALYZE) edited, calm").unwrap();
    c.batch_execute(
        "DELETE FROM churn WHERE id > 500;
         UPDATE edited SET v = 'y' WHERE id <= 200;
         UPDATE calm SET v = 'y' WHERE id <= 10;",
    )
    .unwrap();
    // The statistics reach the shared store when the session goes idle
    // (within a second or so): wait until they show the deletes.
    let stats = |c: &mut postgres::Client, t: &str| -> (i64, i64) {
        let r = c
            .query_one("SELECT n_dead_tup, n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = $1", &[&t])
            .unwrap();
        (r.get(0), r.get(1))
    };
    drop(c);
    let mut c = pg.client();
    wait_for_stats(&mut c, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'churn'", 1500);
    wait_for_stats(&mut c, "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'edited'", 200);
    let first = tend(&pg.url()).unwrap();
    let has = |v: &[String], t: &str| v.iter().any(|x| x == &format!("public.{t}"));
    assert!(has(&first.vacuumed, "churn"), "{first:?}");
    assert!(has(&first.analyzed, "edited") && !has(&first.vacuumed, "edited"), "{first:?}");
    assert!(!has(&first.vacuumed, "calm") && !has(&first.analyzed, "calm"), "{first:?}");
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    assert_eq!(stats(&mut c, "churn").0, 0, "the dead rows were reclaimed");
    let again = tend(&pg.url()).unwrap();
    assert!(!has(&again.vacuumed, "churn") && !has(&again.analyzed, "edited"), "{again:?}");
    // A refused connection is an error, not a pass that did nothing.
    assert!(tend("host=/nonexistent port=1 user=postgres dbname=choir connect_timeout=1").is_err());
}

/// Waits until `query` (one bigint) reads at least `least`.
fn wait_for_stats(c: &mut postgres::Client, query: &str, least: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.query_one(query, &[]).unwrap().get::<_, i64>(0) < least {
        assert!(std::time::Instant::now() < deadline, "the statistics never showed {query} ≥ {least}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
