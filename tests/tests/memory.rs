//! Agent memory end to end: a real PostgreSQL with pgvector, a deterministic
//! fake of the embeddings API, and agents calling `choir.memory.upsert` and
//! `choir.memory.query` through the arbiter and EXECUTE_HOST_TOOL.

use std::time::Duration;

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{test_config, Choird, TempHome};
use choir_tests::observe::{system_of, wait_for};
use choir_tests::pg::TestPg;
use choird::store::memory::Breadth;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn config(llm: &FakeLlm, pg: &TestPg, emb: &FakeEmbeddings, agents: &[&str]) -> Value {
    let mut c = test_config(&llm.base_url(), Some(&pg.url()), agents);
    c["memory"] = json!({"embeddings": {"base_url": emb.base_url(), "model": "fake-embed", "dimensions": emb.dims(),
                                        "timeout_s": 5},
                         "batch_ms": 30, "upsert_wait_ms": 2000});
    c
}

fn sha(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The tool results (parsed) of every request, in order.
fn tool_results(llm: &FakeLlm) -> Vec<Value> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in llm.requests() {
        for m in r.body["messages"].as_array().into_iter().flatten() {
            if m["role"] == "tool" {
                let id = m["tool_call_id"].as_str().unwrap_or("").to_owned();
                if seen.insert(id) {
                    out.push(serde_json::from_str(m["content"].as_str().unwrap()).unwrap());
                }
            }
        }
    }
    out
}

fn contents(result: &Value) -> Vec<String> {
    result["items"].as_array().into_iter().flatten().map(|i| i["content"].as_str().unwrap().to_owned()).collect()
}

const WIFI: &str = "The office wifi password is on the fridge";
const TEA: &str = "User prefers tea over coffee";
const BACKUPS: &str = "Backups run nightly at two";

#[test]
fn memory_round_trips_in_three_modes_dedupes_filters_and_keeps_agents_apart() {
    let Some(pg) = TestPg::start() else { return };
    let emb = FakeEmbeddings::start(64);
    let alpha_steps = vec![
        Step::call(
            "choir.memory.upsert",
            json!({"items": [
            {"tier": "knowledge", "content": WIFI, "metadata": {"topic": "office"}},
            {"tier": "session", "content": TEA, "metadata": {"topic": "drinks"}},
            {"tier": "knowledge", "content": BACKUPS, "metadata": {"topic": "ops"}}]}),
        ),
        Step::call("choir.memory.upsert", json!({"tier": "knowledge", "content": WIFI, "metadata": {"seen": 2}})),
        Step::call("choir.memory.query", json!({"mode": "semantic", "query": "where is the wifi password", "k": 2})),
        Step::call("choir.memory.query", json!({"mode": "semantic", "query": "wifi password", "tier": "session"})),
        Step::call(
            "choir.memory.query",
            json!({"mode": "semantic", "query": "password", "metadata": {"topic": "ops"}}),
        ),
        Step::call("choir.memory.query", json!({"mode": "hash", "hash": sha(TEA)})),
        Step::call("choir.memory.query", json!({"mode": "range", "since": "2000-01-01T00:00:00Z"})),
        Step::call(
            "choir.memory.query",
            json!({"mode": "semantic", "query": "wifi",
                                                 "metadata": {"x": "'; SELECT * FROM agent_beta.items; --"}}),
        ),
        Step::Text("done".into()),
    ];
    let beta_steps = vec![
        Step::call("choir.memory.query", json!({"mode": "semantic", "query": "where is the wifi password"})),
        Step::call("choir.memory.query", json!({"mode": "hash", "hash": sha(WIFI)})),
        Step::call("choir.memory.upsert", json!({"tier": "working", "content": "beta's own note"})),
        Step::Text("done".into()),
    ];
    let queues = std::sync::Arc::new(parking_lot::Mutex::new((alpha_steps, beta_steps)));
    let llm = FakeLlm::with_responder(move |req, _| {
        let mut q = queues.lock();
        let list = if system_of(req).starts_with("You are alpha") { &mut q.0 } else { &mut q.1 };
        (!list.is_empty()).then(|| list.remove(0))
    });
    let choird = Choird::start(&config(&llm, &pg, &emb, &["alpha", "beta"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "alpha"]);
    choird.ctl_ok(&["agent", "start", "beta"]);
    assert_eq!(choird.ctl_ok(&["chat", "alpha", "remember things"]), "done\n");
    let r = tool_results(&llm);
    assert_eq!(r[0]["items"].as_array().unwrap().len(), 3);
    assert_eq!(r[0]["embedding"], "done", "{}", r[0]);
    assert!(r[0]["items"].as_array().unwrap().iter().all(|i| i["status"] == "inserted"));
    // The same content in the same tier: one item, metadata merged.
    assert_eq!(r[1]["items"][0]["status"], "updated");
    assert_eq!(r[1]["items"][0]["id"], r[0]["items"][0]["id"]);
    assert_eq!(contents(&r[2])[0], WIFI, "{}", r[2]);
    assert!(r[2]["items"][0]["score"].as_f64().unwrap() > r[2]["items"][1]["score"].as_f64().unwrap());
    assert_eq!(r[2]["items"][0]["metadata"], json!({"topic": "office", "seen": 2}));
    assert_eq!(contents(&r[3]), [TEA], "tier filter");
    assert_eq!(contents(&r[4]), [BACKUPS], "metadata filter");
    assert_eq!(contents(&r[5]), [TEA], "hash lookup");
    assert_eq!(contents(&r[6]), [WIFI, TEA, BACKUPS], "range, oldest first");
    assert!(contents(&r[7]).is_empty(), "a crafted filter is only data");

    // Beta sees none of alpha's memory, by meaning or by hash.
    assert_eq!(choird.ctl_ok(&["chat", "beta", "what do you know"]), "done\n");
    let r = tool_results(&llm);
    assert!(contents(&r[8]).is_empty() && contents(&r[9]).is_empty(), "{} {}", r[8], r[9]);
    let count = |schema: &str| -> i64 {
        pg.client().query_one(&format!("SELECT count(*) FROM {schema}.items"), &[]).unwrap().get(0)
    };
    assert_eq!((count("agent_alpha"), count("agent_beta")), (3, 1));

    // The source of each item: lane, call, and (once replicated) its commit sequence.
    wait_for("commit sequences", Duration::from_secs(20), || {
        let missing: i64 = pg
            .client()
            .query_one("SELECT count(*) FROM agent_alpha.items WHERE commit_seq IS NULL", &[])
            .unwrap()
            .get(0);
        missing == 0
    });
    let row =
        pg.client().query_one("SELECT lane, commit_seq FROM agent_alpha.items WHERE content = $1", &[&TEA]).unwrap();
    assert_eq!(row.get::<_, String>(0), "edge");
    assert!(row.get::<_, i64>(1) >= 1);

    // The operator's view, once the memory-index thread has indexed every
    // fresh vector.
    let stats = || -> Value { serde_json::from_str(&choird.ctl_ok(&["--json", "memory", "stats", "alpha"])).unwrap() };
    wait_for("every vector in the HNSW index", Duration::from_secs(20), || stats()["fresh_embeddings"] == 0);
    let indexed: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM agent_alpha.items WHERE embedding IS NOT NULL AND fresh IS NULL", &[])
        .unwrap()
        .get(0);
    assert_eq!(indexed, 3);
    let stats = stats();
    assert_eq!(stats["tiers"], json!({"knowledge": 2, "session": 1}));
    assert_eq!((stats["pending_embeddings"].as_i64(), stats["dimensions"].as_i64()), (Some(0), Some(64)));
    assert!(stats["index_bytes"].as_i64().unwrap() > 0);
    assert_eq!(
        stats["index"],
        json!({"kind": "hnsw", "lists": null}),
        "a small table keeps the HNSW index it was made with"
    );
    let found = choird.ctl_ok(&["memory", "search", "alpha", "wifi password"]);
    assert!(found.lines().next().unwrap().ends_with(WIFI), "{found}");
    let export = choird.ctl_ok(&["memory", "export", "alpha"]);
    let lines: Vec<Value> = export.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["embedding"].as_array().unwrap().len(), 64);
    assert!(choird.ctl_err(&["memory", "stats", "nobody"]).contains("no agent"));
}

#[test]
fn with_the_embedding_endpoint_down_upserts_wait_in_the_outbox_and_are_embedded_when_it_returns() {
    let Some(pg) = TestPg::start() else { return };
    let emb = FakeEmbeddings::start(64);
    emb.set_down(true);
    let llm = FakeLlm::start(vec![
        Step::call(
            "choir.memory.upsert",
            json!({"items": [
            {"tier": "knowledge", "content": "The cat is called Tom"},
            {"tier": "knowledge", "content": "The dog is called Rex"}]}),
        ),
        Step::call("choir.memory.query", json!({"mode": "semantic", "query": "cat name"})),
        Step::call("choir.memory.query", json!({"mode": "hash", "hash": sha("The cat is called Tom")})),
        Step::Text("stored".into()),
        Step::call("choir.memory.query", json!({"mode": "semantic", "query": "what is the cat called", "k": 1})),
        Step::Text("found".into()),
    ]);
    let mut cfg = config(&llm, &pg, &emb, &["alpha"]);
    cfg["memory"]["upsert_wait_ms"] = json!(300);
    let choird = Choird::start(&cfg, &json!({"llm_key": "k"}));
    assert!(choird.stderr().contains("the embedding endpoint is unavailable"), "the outage is reported at start");
    choird.ctl_ok(&["agent", "start", "alpha"]);
    assert_eq!(choird.ctl_ok(&["chat", "alpha", "remember the pets"]), "stored\n");
    let r = tool_results(&llm);
    assert_eq!(r[0]["embedding"], "pending");
    assert_eq!(r[1]["status"], "error");
    assert!(r[1]["summary"].as_str().unwrap().contains("semantic search is unavailable right now"), "{}", r[1]);
    assert_eq!(contents(&r[2]), ["The cat is called Tom"], "hash queries work without embeddings");
    let outbox = || -> (i64, i64) {
        let row =
            pg.client().query_one("SELECT count(*), coalesce(max(attempts), 0) FROM embedding_outbox", &[]).unwrap();
        (row.get(0), row.get::<_, i32>(1) as i64)
    };
    wait_for("a failed attempt", Duration::from_secs(20), || outbox().1 >= 1);
    assert_eq!(outbox().0, 2, "both items wait in the outbox");

    emb.set_down(false);
    wait_for("the outbox to drain", Duration::from_secs(60), || outbox().0 == 0);
    assert!(emb.batches().contains(&2), "both were embedded in one request: {:?}", emb.batches());
    assert_eq!(choird.ctl_ok(&["chat", "alpha", "what is the cat called?"]), "found\n");
    let r = tool_results(&llm);
    assert_eq!(contents(&r[3]), ["The cat is called Tom"]);
}

#[test]
fn a_dimension_mismatch_is_a_clear_error_never_a_truncation() {
    let Some(pg) = TestPg::start() else { return };
    let emb = FakeEmbeddings::start(64);
    let llm = FakeLlm::start(vec![]);
    // The endpoint answers with 64 dimensions; config says 32: choird refuses to start.
    let mut cfg = config(&llm, &pg, &emb, &["alpha"]);
    cfg["memory"]["embeddings"]["dimensions"] = json!(32);
    let home = TempHome::new(&cfg, &json!({"llm_key": "k"}));
    let (status, stderr) = home.run_choird_to_exit(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        stderr.contains("the embedding model returns 64-dimensional vectors, but memory.embeddings.dimensions is 32"),
        "{stderr}"
    );

    // A schema made for 64 dimensions, then config changed to 32 while the
    // endpoint is down (so start-up cannot tell): the agent's start says why.
    let choird = Choird::start(&config(&llm, &pg, &emb, &["alpha"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "alpha"]);
    drop(choird);
    emb.set_down(true);
    let choird = Choird::start(&cfg, &json!({"llm_key": "k"}));
    let err = choird.ctl_err(&["agent", "start", "alpha"]);
    assert!(err.contains("agent alpha's memory was made for 64-dimensional embeddings"), "{err}");
    let dims: String = pg
        .client()
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = 'agent_alpha.items'::regclass AND attname = 'embedding'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(dims, "vector(64)", "the schema was left as it was");
}

#[test]
fn a_postgres_restart_under_load_fails_operations_clearly_and_loses_nothing() {
    let Some(mut pg) = TestPg::start() else { return };
    let emb = FakeEmbeddings::start(64);
    // The model stores whatever note the user gives, then reports the outcome.
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "user" {
            let note = last["content"].as_str()?.to_owned();
            return Some(Step::call("choir.memory.upsert", json!({"tier": "working", "content": note})));
        }
        let result: Value = serde_json::from_str(last["content"].as_str()?).ok()?;
        Some(Step::Text(format!(
            "{}: {}",
            result["status"].as_str().unwrap_or("?"),
            result["summary"].as_str().unwrap_or("")
        )))
    });
    let choird = Choird::start(&config(&llm, &pg, &emb, &["alpha"]), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "alpha"]);
    let mut outcomes = Vec::new();
    for i in 0..30 {
        if i == 10 {
            // Crash-restart while the agent works.
            pg.restart_immediate();
        }
        if i == 20 {
            // Down for a while: what is asked meanwhile fails, and says so.
            pg.stop_immediate();
            let out = choird.ctl(&["chat", "alpha", "note during the outage"]);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!out.status.success() && err.contains("database is unavailable, try again"), "{err}");
            pg.start_again();
        }
        // A note is retried until it is stored; every attempt's outcome is kept.
        for _attempt in 0..20 {
            let out = choird.ctl(&["chat", "alpha", &format!("note {i}")]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            outcomes.push(text.clone());
            if text.starts_with("success: stored 1 item") {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let failures: Vec<&String> = outcomes.iter().filter(|o| !o.starts_with("success")).collect();
    for f in &failures {
        assert!(
            f.contains("unavailable") || f.contains("database") || f.contains("try again"),
            "an outage error that says what happened: {f}"
        );
    }
    let rows = pg.client().query("SELECT content FROM agent_alpha.items ORDER BY content", &[]).unwrap();
    let mut stored: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    stored.sort();
    let mut expected: Vec<String> = (0..30).map(|i| format!("note {i}")).collect();
    expected.sort();
    assert_eq!(stored, expected, "every note once, none lost or doubled");
    wait_for("every embedding", Duration::from_secs(30), || {
        pg.client().query_one("SELECT count(*) FROM embedding_outbox", &[]).unwrap().get::<_, i64>(0) == 0
    });
}

#[test]
fn compact_folds_session_items_into_a_knowledge_summary_written_by_the_core_model() {
    let Some(pg) = TestPg::start() else { return };
    let emb = FakeEmbeddings::start(64);
    let llm = FakeLlm::start(vec![
        Step::call(
            "choir.memory.upsert",
            json!({"items": [
            {"tier": "session", "content": "The user lives in Lyon"},
            {"tier": "session", "content": "The user's daughter is called Ada"},
            {"tier": "knowledge", "content": "Backups run nightly"}]}),
        ),
        Step::call("choir.memory.compact", json!({})),
        Step::Text("compacted".into()),
    ]);
    let core = FakeLlm::start(vec![Step::Text("The user lives in Lyon and has a daughter, Ada.".into())]);
    let mut cfg = config(&llm, &pg, &emb, &["alpha"]);
    cfg["llm"]["core"]["base_url"] = json!(core.base_url());
    let choird = Choird::start(&cfg, &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "alpha"]);
    assert_eq!(choird.ctl_ok(&["chat", "alpha", "tidy your memory"]), "compacted\n");
    let r = tool_results(&llm);
    assert!(r[1]["summary"].as_str().unwrap().contains("folded 2 session item(s) into knowledge item"), "{}", r[1]);
    // The core model was asked to fold exactly the session notes.
    let asked = core.requests()[0].body["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(asked.contains("1. The user lives in Lyon\n2. The user's daughter is called Ada"), "{asked}");
    assert!(!asked.contains("Backups"), "knowledge is not refolded");
    let rows = pg.client().query("SELECT tier, content, metadata FROM agent_alpha.items ORDER BY id", &[]).unwrap();
    let tiers: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        tiers,
        [
            ("knowledge".to_owned(), "Backups run nightly".to_owned()),
            ("knowledge".to_owned(), "The user lives in Lyon and has a daughter, Ada.".to_owned())
        ]
    );
    assert_eq!(rows[1].get::<_, Value>(2)["folded"], 2);
    // The fold is the agent's own model call, on its account.
    let calls: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM llm_calls WHERE agent_id = 'alpha' AND lane = 'core'", &[])
        .unwrap()
        .get(0);
    assert_eq!(calls, 1);
}

/// 32 tools with ordinary descriptions, and queries that say the same thing
/// in other words: (query, the tool that should come first).
const TOOLS: &[(&str, &str)] = &[
    ("x.mail.send", "Send an email message to a recipient with a subject and body."),
    ("x.mail.search", "Search the mailbox for messages matching a sender or subject."),
    ("x.calendar.add", "Add an event or meeting to the calendar at a given date and time."),
    ("x.calendar.list", "List upcoming calendar entries for the coming days."),
    ("x.weather.forecast", "Get the weather forecast, rain and wind for a city."),
    ("x.currency.convert", "Convert an amount of money between currencies using exchange rates."),
    ("x.translate.text", "Translate text from one language into another language."),
    ("x.timer.set", "Set a countdown timer or alarm that rings after some minutes."),
    ("x.notes.create", "Create a new note in the notebook with a title and text."),
    ("x.todo.add", "Add a task to the to-do list with an optional due date."),
    ("x.todo.complete", "Mark a task on the to-do list as done."),
    ("x.contacts.lookup", "Look up a person's phone number and address in the contacts."),
    ("x.maps.route", "Plan a route and travel directions between two places."),
    ("x.music.play", "Play a song, album or playlist on the speakers."),
    ("x.lights.dim", "Dim or switch off the lights in a room of the house."),
    ("x.thermostat.set", "Set the heating thermostat to a target temperature."),
    ("x.shop.order", "Order groceries or products from the online shop."),
    ("x.bank.balance", "Show the balance and recent transactions of a bank account."),
    ("x.stocks.quote", "Get the current share price of a company on the stock market."),
    ("x.news.headlines", "Fetch today's news headlines on a topic."),
    ("x.pdf.extract", "Extract the text content of a PDF document."),
    ("x.image.resize", "Resize or crop a picture to given dimensions."),
    ("x.zip.archive", "Compress files and folders into a zip archive."),
    ("x.backup.run", "Back up the workspace to remote storage."),
    ("x.server.ping", "Check whether a server or website is reachable and how fast it answers."),
    ("x.dns.resolve", "Resolve a domain name to its IP addresses."),
    ("x.git.commit", "Commit staged changes in a git repository with a message."),
    ("x.docker.restart", "Restart a running Docker container by name."),
    ("x.sql.query", "Run a read-only SQL query against the reporting database."),
    ("x.chart.plot", "Plot numbers as a line or bar chart image."),
    ("x.flight.search", "Search flights between two airports on a date."),
    ("x.hotel.book", "Book a hotel room in a city for some nights."),
];

const QUERIES: &[(&str, &str)] = &[
    ("write an email to my landlord", "x.mail.send"),
    ("will it rain in Paris tomorrow", "x.weather.forecast"),
    ("convert 50 euros into dollars", "x.currency.convert"),
    ("put a meeting with Sam in my calendar on Tuesday", "x.calendar.add"),
    ("ring me in ten minutes", "x.timer.set"),
    ("what is Anna's phone number", "x.contacts.lookup"),
    ("directions to the museum", "x.maps.route"),
    ("turn the living room lights off", "x.lights.dim"),
    ("how much is left in my bank account", "x.bank.balance"),
    ("pull the text out of this PDF file", "x.pdf.extract"),
    ("make this picture smaller", "x.image.resize"),
    ("is our website reachable right now", "x.server.ping"),
    ("save my changes to git", "x.git.commit"),
    ("find me a cheap flight to Rome", "x.flight.search"),
    ("bounce the web container", "x.docker.restart"),
];

fn install_tools(choird: &Choird) {
    let dir = choird.tools_dir("alpha");
    for (name, description) in TOOLS {
        let stem = name.replace('.', "_");
        let manifest = json!({
            "llm": {"name": name, "description": description,
                    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "additionalProperties": false}},
            "runtime": {"exec_path": stem, "timeout_ms": 5000, "side_effect": "read", "version": "1"}
        });
        std::fs::write(dir.join(format!("{stem}.json")), manifest.to_string()).unwrap();
        let script = format!("#!/bin/sh\ncat >/dev/null\necho '{{\"summary\": \"{name} ran\"}}'\n");
        std::fs::write(dir.join(&stem), script).unwrap();
        std::fs::set_permissions(dir.join(&stem), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
}

fn find_everything(with_memory: bool) {
    let Some(pg) = TestPg::start() else { return };
    let emb = FakeEmbeddings::start(384);
    let calls: Vec<(String, String)> =
        QUERIES.iter().map(|(q, _)| ("choir.tools.find".to_owned(), json!({"query": q, "k": 3}).to_string())).collect();
    let llm = FakeLlm::start(vec![
        Step::ToolCalls(calls),
        Step::call("x.mail.send", json!({"input": "hello"})),
        Step::Text("done".into()),
    ]);
    let mut cfg = config(&llm, &pg, &emb, &["alpha"]);
    if !with_memory {
        cfg.as_object_mut().unwrap().remove("memory");
    }
    cfg["agents"]["alpha"] = json!({"tool_exposure": "find"});
    let choird = Choird::start(&cfg, &json!({"llm_key": "k"}));
    install_tools(&choird);
    choird.ctl_ok(&["agent", "start", "alpha"]);
    assert_eq!(choird.ctl_ok(&["chat", "alpha", "do things"]), "done\n");
    let reqs = llm.requests();
    let listed = |i: usize| -> Vec<String> {
        reqs[i].body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // Only Choir's own tools at first: the agent's 32 are found, not listed.
    assert!(listed(0).contains(&"choir__tools__find".to_owned()));
    assert!(!listed(0).iter().any(|n| n.starts_with("x__")), "{:?}", listed(0));
    assert!(!system_of(&reqs[0].body).contains("x.mail.send"));
    let results = tool_results(&llm);
    let method = if with_memory { "semantic" } else { "keyword" };
    let mut misses = Vec::new();
    for ((query, want), r) in QUERIES.iter().zip(&results) {
        assert_eq!(r["method"], method, "{r}");
        let first = r["tools"][0]["name"].as_str().unwrap_or("");
        if first != *want {
            misses.push(format!("{query:?}: got {first}, wanted {want}"));
        }
        // LLM views only: name, description, parameters (and a score).
        let keys: Vec<&String> = r["tools"][0].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["description", "name", "parameters", "score"]);
    }
    assert!(misses.is_empty(), "{} of {} ranked wrong:\n{}", misses.len(), QUERIES.len(), misses.join("\n"));
    // What was found is offered from then on (and nothing else of the
    // agent's), and can be called.
    let mut found: Vec<String> = results[..QUERIES.len()]
        .iter()
        .flat_map(|r| r["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().replace('.', "__")))
        .collect();
    found.sort();
    found.dedup();
    let agents_own: Vec<String> = listed(1).into_iter().filter(|n| n.starts_with("x__")).collect();
    assert_eq!(agents_own, found);
    assert!(found.len() < TOOLS.len(), "not everything was found, so the check means something");
    assert_eq!(results[QUERIES.len()]["summary"], "x.mail.send ran");
}

#[test]
fn tools_find_ranks_the_right_tool_first_for_paraphrased_queries_by_meaning() {
    find_everything(true);
}

#[test]
fn tools_find_falls_back_to_keywords_without_embeddings() {
    find_everything(false);
}

/// The batcher's store path in one statement per agent: a batch spanning two
/// agents is read and stored whole; outbox rows whose item is gone, or whose
/// agent id is not one (a row written by hand, hostile to the schema name),
/// are dropped without touching anything else.
#[test]
fn an_embedding_batch_spanning_agents_is_stored_whole_and_stale_outbox_rows_are_dropped() {
    use choir_common::ids::AgentId;
    use choird::store::memory::NewItem;
    let Some(pg) = TestPg::start() else { return };
    let (a, b) = (AgentId::parse("alpha").unwrap(), AgentId::parse("beta").unwrap());
    let store = memory_store(&pg, &[(&a, 3), (&b, 3)]);
    let item = |text: &str| NewItem {
        tier: "session".into(),
        content: text.into(),
        sha256: sha(text),
        metadata: json!({"k": text}),
    };
    let got_a = store.memory_upsert(&a, &[item("a1"), item("a2"), item("a1")], "edge", None).unwrap();
    assert_eq!(got_a.iter().map(|u| u.inserted).collect::<Vec<_>>(), [true, true, false], "a repeat merges");
    assert_eq!(got_a[0].id, got_a[2].id);
    let got_b = store.memory_upsert(&b, &[item("b1"), item("b2")], "edge", None).unwrap();
    let mut c = pg.client();
    c.execute("DELETE FROM \"agent_beta\".items WHERE id = $1", &[&got_b[1].id]).unwrap();
    c.execute("INSERT INTO embedding_outbox (agent_id, item_id) VALUES ('x\"; DROP TABLE y; --', 1)", &[]).unwrap();

    let batch = store.outbox_batch(100).unwrap();
    let seen: Vec<(String, String)> = batch.iter().map(|(_, ag, _, t)| (ag.as_str().to_owned(), t.clone())).collect();
    assert_eq!(
        seen,
        [("alpha".into(), "a1".into()), ("alpha".into(), "a2".into()), ("beta".into(), "b1".into())],
        "oldest first, the gone item and the bad agent id left out"
    );
    let left: i64 = c.query_one("SELECT count(*) FROM embedding_outbox", &[]).unwrap().get(0);
    assert_eq!(left, 3, "the two stale rows are dropped, the three live ones kept");

    let done: Vec<_> =
        batch.into_iter().enumerate().map(|(i, (o, ag, id, _))| (o, ag, id, vec![i as f32 + 1.0, 0.5, -1.0])).collect();
    store.store_embeddings(&done, 0).unwrap();
    let left: i64 = c.query_one("SELECT count(*) FROM embedding_outbox", &[]).unwrap().get(0);
    assert_eq!(left, 0);
    let mut stored = |schema: &str, id: i64| -> String {
        c.query_one(&format!("SELECT embedding::text FROM \"{schema}\".items WHERE id = $1"), &[&id]).unwrap().get(0)
    };
    assert_eq!(stored("agent_alpha", got_a[0].id), "[1,0.5,-1]");
    assert_eq!(stored("agent_alpha", got_a[1].id), "[2,0.5,-1]");
    assert_eq!(stored("agent_beta", got_b[0].id), "[3,0.5,-1]", "each vector on its own agent's item");
    // Nothing more to do: an empty batch, and storing nothing is harmless.
    assert!(store.outbox_batch(100).unwrap().is_empty());
    store.store_embeddings(&[], 0).unwrap();
}

/// A store on `pg`, migrated, with each agent's memory schema made for its
/// dimension.
fn memory_store(pg: &TestPg, agents: &[(&choir_common::ids::AgentId, u32)]) -> choird::store::Store {
    let db = choird::db::Db::connect(&pg.url()).unwrap();
    db.migrate().unwrap();
    for (agent, dims) in agents {
        db.migrate_agent(agent, *dims).unwrap();
    }
    choird::store::Store::new(db)
}

/// Issue 19, item 5: a stored vector waits fresh (outside the HNSW index,
/// found by an exact scan) for the `memory-index` thread; queries find an
/// item once, fresh or indexed, with the same score and filters either way.
#[test]
fn fresh_vectors_are_found_at_once_with_filters_and_the_same_scores_after_indexing() {
    use choir_common::ids::AgentId;
    use choird::host_tools::memory::indexer;
    use choird::store::memory::NewItem;
    let Some(pg) = TestPg::start() else { return };
    let a = AgentId::parse("alpha").unwrap();
    let store = memory_store(&pg, &[(&a, 3)]);
    let item = |text: &str, tier: &str, k: &str| NewItem {
        tier: tier.into(),
        content: text.into(),
        sha256: sha(text),
        metadata: json!({ "k": k }),
    };
    let items = [
        item("a0", "session", "x"),
        item("a1", "session", "y"),
        item("a2", "session", "x"),
        item("a3", "knowledge", "y"),
        item("a4", "knowledge", "x"),
    ];
    let ids: Vec<i64> = store.memory_upsert(&a, &items, "edge", None).unwrap().iter().map(|u| u.id).collect();
    let done: Vec<_> = store
        .outbox_batch(100)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, (o, ag, id, _))| (o, ag, id, vec![1.0, i as f32 * 0.3, 0.1]))
        .collect();
    assert_eq!(store.store_embeddings(&done, 3).unwrap(), 3, "three fit under fresh_max, two go to the index");
    let mut c = pg.client();
    let placed = |c: &mut postgres::Client| -> Vec<(i64, bool, bool)> {
        c.query("SELECT id, fresh IS NOT NULL, embedding IS NOT NULL FROM agent_alpha.items ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    let want: Vec<_> = ids.iter().enumerate().map(|(i, id)| (*id, i < 3, i >= 3)).collect();
    assert_eq!(placed(&mut c), want, "the oldest three fresh, the rest indexed, none both");
    assert_eq!(store.memory_stats(&a).unwrap().fresh, 3);

    let query = |tier: Option<&str>, meta: Value, k: i64| -> Vec<(String, i64)> {
        store
            .memory_semantic(&a, vec![1.0, 0.0, 0.0], tier, &meta, k, Breadth::DEFAULT)
            .unwrap()
            .iter()
            .map(|(i, score)| (i.content.clone(), (score * 1e6).round() as i64))
            .collect()
    };
    let names = |r: &[(String, i64)]| r.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let all = query(None, json!({}), 10);
    assert_eq!(names(&all), ["a0", "a1", "a2", "a3", "a4"], "every item once, nearest first, fresh and indexed");
    assert_eq!(names(&query(None, json!({}), 2)), ["a0", "a1"], "k bounds the merged answer");
    assert_eq!(names(&query(Some("knowledge"), json!({}), 10)), ["a3", "a4"], "the tier filter holds on both");
    assert_eq!(names(&query(None, json!({"k": "x"}), 10)), ["a0", "a2", "a4"], "the metadata filter holds on both");
    let exported = store.memory_export(&a, 0, 10).unwrap();
    assert_eq!(exported[0]["embedding"], json!([1.0, 0.0, 0.1f32]), "export carries a fresh vector");

    let mut waits = indexer::Waits::default();
    let r = indexer::round(&store, &mut waits).unwrap();
    assert_eq!((r.moved, r.failed.len()), (3, 0));
    assert_eq!(indexer::round(&store, &mut waits).unwrap().moved, 0, "nothing left to index");
    let want: Vec<_> = ids.iter().map(|id| (*id, false, true)).collect();
    assert_eq!(placed(&mut c), want);
    assert_eq!(query(None, json!({}), 10), all, "the same answers and scores once indexed");
    assert_eq!(store.memory_stats(&a).unwrap().fresh, 0);
}

/// A flood of upserts cannot make every query scan more than `fresh_max`
/// vectors: past the bound the batcher stores vectors straight into the
/// index, batch after batch; a vector for an item already indexed (its
/// outbox row queued again) replaces the indexed one and never makes two;
/// the database itself refuses an item with two vectors.
#[test]
fn fresh_vectors_stay_within_fresh_max_across_batches_and_an_item_never_holds_two() {
    use choir_common::ids::AgentId;
    use choird::store::memory::NewItem;
    let Some(pg) = TestPg::start() else { return };
    let a = AgentId::parse("alpha").unwrap();
    let store = memory_store(&pg, &[(&a, 3)]);
    let mut c = pg.client();
    let count = |c: &mut postgres::Client, what: &str| -> i64 {
        c.query_one(&format!("SELECT count(*) FROM agent_alpha.items WHERE {what}"), &[]).unwrap().get(0)
    };
    let mut stored_fresh = Vec::new();
    for batch in 0..4 {
        let items: Vec<NewItem> = (0..5)
            .map(|i| {
                let text = format!("flood {batch}-{i}");
                NewItem { tier: "working".into(), sha256: sha(&text), content: text, metadata: json!({}) }
            })
            .collect();
        store.memory_upsert(&a, &items, "edge", None).unwrap();
        let done: Vec<_> = store
            .outbox_batch(100)
            .unwrap()
            .into_iter()
            .map(|(o, ag, id, _)| (o, ag, id, vec![1.0, 0.5, 0.0]))
            .collect();
        stored_fresh.push(store.store_embeddings(&done, 7).unwrap());
    }
    assert_eq!(stored_fresh, [5, 2, 0, 0], "the bound holds across batches");
    assert_eq!(count(&mut c, "fresh IS NOT NULL"), 7);
    assert_eq!(count(&mut c, "embedding IS NOT NULL"), 13);

    // The outbox row of an indexed item and of a fresh one queued again.
    let (indexed, fresh): (i64, i64) = (
        c.query_one("SELECT min(id) FROM agent_alpha.items WHERE embedding IS NOT NULL", &[]).unwrap().get(0),
        c.query_one("SELECT min(id) FROM agent_alpha.items WHERE fresh IS NOT NULL", &[]).unwrap().get(0),
    );
    c.execute(
        "INSERT INTO embedding_outbox (agent_id, item_id) VALUES ('alpha', $1), ('alpha', $2)",
        &[&indexed, &fresh],
    )
    .unwrap();
    let done: Vec<_> =
        store.outbox_batch(100).unwrap().into_iter().map(|(o, ag, id, _)| (o, ag, id, vec![0.0, 0.0, 1.0])).collect();
    assert_eq!(done.len(), 2);
    store.store_embeddings(&done, 100).unwrap();
    let vectors = |c: &mut postgres::Client, id: i64| -> (Option<String>, Option<String>) {
        let r =
            c.query_one("SELECT fresh::text, embedding::text FROM agent_alpha.items WHERE id = $1", &[&id]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(vectors(&mut c, indexed), (None, Some("[0,0,1]".into())), "the indexed vector replaced in place");
    assert_eq!(vectors(&mut c, fresh), (Some("[0,0,1]".into()), None), "a fresh vector replaced in place");
    let both = c.execute("UPDATE agent_alpha.items SET fresh = embedding WHERE id = $1", &[&indexed]);
    let err = both.expect_err("two vectors on one item are refused");
    assert_eq!(err.as_db_error().and_then(|e| e.constraint()), Some("items_one_vector"), "{err:?}");
    assert_eq!(vectors(&mut c, indexed), (None, Some("[0,0,1]".into())), "the refused update changed nothing");
}

/// Stores `n` items for `agent` with vectors at angle i/1000 from the x
/// axis (item i is the i-th nearest to [1, 0, 0]), fresh up to `fresh_max`.
fn store_items(store: &choird::store::Store, agent: &choir_common::ids::AgentId, n: usize, fresh_max: i64) -> u64 {
    use choird::store::memory::NewItem;
    let items: Vec<NewItem> = (0..n)
        .map(|i| {
            let text = format!("item {i}");
            NewItem { tier: "knowledge".into(), sha256: sha(&text), content: text, metadata: json!({}) }
        })
        .collect();
    store.memory_upsert(agent, &items, "edge", None).unwrap();
    let done: Vec<_> = store
        .outbox_batch(10_000)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, (o, ag, id, _))| (o, ag, id, vec![1.0, i as f32 / 1000.0, 0.0]))
        .collect();
    store.store_embeddings(&done, fresh_max).unwrap()
}

/// While the indexer moves vectors, every query (one statement, one
/// snapshot) finds each item once: never twice, never lost between the two
/// — after each round (some fresh, some indexed), and with rounds running
/// beside the queries.
#[test]
fn queries_during_indexing_find_each_item_exactly_once() {
    use choir_common::ids::AgentId;
    use choird::host_tools::memory::indexer::{self, Waits};
    let Some(pg) = TestPg::start() else { return };
    let (a, b) = (AgentId::parse("alpha").unwrap(), AgentId::parse("beta").unwrap());
    let store = std::sync::Arc::new(memory_store(&pg, &[(&a, 3), (&b, 3)]));
    assert_eq!(store_items(&store, &a, 64, 1000), 64);
    let fresh = |agent: &str| -> i64 {
        pg.client()
            .query_one(&format!("SELECT count(*) FROM agent_{agent}.items WHERE fresh IS NOT NULL"), &[])
            .unwrap()
            .get(0)
    };
    let nearest = |agent: &AgentId, k: usize| -> Vec<String> {
        let got =
            store.memory_semantic(agent, vec![1.0, 0.0, 0.0], None, &json!({}), k as i64, Breadth::DEFAULT).unwrap();
        got.iter().map(|(i, _)| i.content.clone()).collect()
    };
    let want = |k: usize| -> Vec<String> { (0..k).map(|i| format!("item {i}")).collect() };
    let mut waits = Waits::default();
    for round in 1..=4 {
        assert_eq!(indexer::round(&store, &mut waits).unwrap().moved, 16);
        assert_eq!(fresh("alpha"), 64 - 16 * round, "round {round}: indexed and fresh side by side");
        assert_eq!(nearest(&a, 40), want(40), "round {round}: each of the nearest once, in order");
    }

    assert_eq!(store_items(&store, &b, 400, 1000), 400);
    let mover = {
        let store = store.clone();
        std::thread::spawn(move || {
            let (mut rounds, mut waits) = (0, Waits::default());
            while indexer::round(&store, &mut waits).unwrap().moved > 0 {
                rounds += 1;
            }
            rounds
        })
    };
    let mut checked = 0;
    while !mover.is_finished() || checked == 0 {
        assert_eq!(nearest(&b, 20), want(20), "query {checked} beside the indexer");
        checked += 1;
    }
    assert_eq!(mover.join().unwrap(), 25, "400 items in rounds of {}", indexer::BATCH);
    assert_eq!(fresh("beta"), 0);
}

/// An agent whose memory predates the `fresh` column is skipped by the
/// indexer (no failure every round); the batcher brings its schema up to
/// date when it first meets its queued embeddings, and holds back (one more
/// failed attempt, the rows kept) the rows of an agent whose schema cannot
/// be, while the others' go on. An agent whose move fails waits out its own
/// backoff while the others are indexed.
#[test]
fn old_or_broken_memory_schemas_hold_up_only_their_own_agent() {
    use choir_common::ids::AgentId;
    use choird::host_tools::memory::batcher;
    use choird::host_tools::memory::indexer::{self, Waits};
    let Some(pg) = TestPg::start() else { return };
    let [a, b, g] = ["alpha", "beta", "gamma"].map(|n| AgentId::parse(n).unwrap());
    let store = memory_store(&pg, &[(&a, 3), (&b, 3), (&g, 4)]);
    let mut c = pg.client();
    // Beta as an older choird left it: no fresh column, migration 2 not recorded.
    c.batch_execute(
        "ALTER TABLE agent_beta.items DROP COLUMN fresh;
         DELETE FROM agent_migrations WHERE agent_id = 'beta' AND version = 2",
    )
    .unwrap();
    assert_eq!(store.memory_agents(Some(choird::db::FRESH_MIGRATION)).unwrap(), [a.clone(), g.clone()]);
    let mut waits = Waits::default();
    let r = indexer::round(&store, &mut waits).unwrap();
    assert!(r.failed.is_empty(), "beta is skipped, not failed: {:?}", r.failed);

    let item = |text: &str| choird::store::memory::NewItem {
        tier: "working".into(),
        content: text.into(),
        sha256: sha(text),
        metadata: json!({}),
    };
    for (agent, text) in [(&g, "g1"), (&b, "b1"), (&a, "a1")] {
        store.memory_upsert(agent, &[item(text)], "edge", None).unwrap();
    }
    let migrated = parking_lot::Mutex::new(std::collections::HashSet::new());
    let ready = batcher::schema_ready(&store, 3, &migrated, store.outbox_batch(100).unwrap());
    let names: Vec<&str> = ready.iter().map(|(_, ag, _, _)| ag.as_str()).collect();
    assert_eq!(names, ["beta", "alpha"], "gamma's schema was made for 4 dimensions: its row is held back");
    assert!(migrated.lock().contains(&b), "beta brought up to date");
    let held: (i32, String) = c
        .query_one("SELECT attempts, last_error FROM embedding_outbox WHERE agent_id = 'gamma'", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(held.0, 1);
    assert!(held.1.contains("schema is not up to date"), "{}", held.1);
    let done: Vec<_> = ready.into_iter().map(|(o, ag, id, _)| (o, ag, id, vec![1.0, 0.0, 0.0])).collect();
    assert_eq!(store.store_embeddings(&done, 100).unwrap(), 2, "beta's vector stored fresh like alpha's");
    let next = store.outbox_batch(100).unwrap();
    assert_eq!(next.len(), 1, "gamma's row is still queued, behind any newer ones");

    // Gamma's move fails every time (its table gone from under it): it waits,
    // the others are indexed.
    c.batch_execute(
        "DELETE FROM embedding_outbox WHERE agent_id = 'gamma'; ALTER TABLE agent_gamma.items RENAME TO gone",
    )
    .unwrap();
    let r = indexer::round(&store, &mut waits).unwrap();
    assert_eq!(r.moved, 2, "alpha's and beta's vectors indexed");
    assert_eq!(r.failed.iter().map(|(ag, _)| ag.as_str()).collect::<Vec<_>>(), ["gamma"]);
    store_items(&store, &a, 3, 100);
    let r = indexer::round(&store, &mut waits).unwrap();
    assert_eq!((r.moved, r.failed.len()), (3, 0), "gamma waits out its backoff; alpha goes on");
}

/// Issue 19, item 5: once an agent's table is large its vector index becomes
/// IVFFlat (inserts a nearest-centre lookup, not a graph search), with lists
/// sized to its rows, and is rebuilt only when the rows have doubled —
/// looking again without growth builds nothing, however often. Queries find
/// the same nearest items before, during (a half-made index left by a
/// crash is never used) and after; a leftover index is dropped by the next
/// build; an agent whose build fails waits while the others are built.
#[test]
fn the_vector_index_becomes_ivfflat_at_scale_and_is_rebuilt_only_when_the_rows_double() {
    use choir_common::ids::AgentId;
    use choird::host_tools::memory::indexer::{self, Builds};
    use choird::host_tools::memory::lifecycle::{Kind, Policy};
    use choird::store::memory_index::{BuildCancel, Settled};
    use std::sync::atomic::AtomicBool;
    let Some(pg) = TestPg::start() else { return };
    let [a, b] = ["alpha", "beta"].map(|n| AgentId::parse(n).unwrap());
    let store = memory_store(&pg, &[(&a, 3), (&b, 3)]);
    let mut c = pg.client();
    // Item i at angle i/1000 from [1, 0, 0]: item i is the i-th nearest.
    let grow = |c: &mut postgres::Client, agent: &str, to: i64| {
        c.batch_execute(&format!(
            "INSERT INTO agent_{agent}.items (tier, content, content_sha256, embedding)
             SELECT 'knowledge', 'item ' || i, md5(i::text), ('[1,' || (i / 1000.0) || ',0]')::vector
             FROM generate_series((SELECT count(*) FROM agent_{agent}.items), {to} - 1) AS i;
             ANALYZE agent_{agent}.items"
        ))
        .unwrap();
    };
    let policy = Policy { build_at: 200, rows_per_list: 20, sqrt_from: u64::MAX, growth: 2 };
    let (cancel, stop) = (BuildCancel::default(), AtomicBool::new(false));
    let mut builds = Builds::default();
    let settle = |builds: &mut Builds| -> Vec<(String, Settled)> {
        let r = indexer::reshape(&store, &policy, builds, &cancel, &stop).unwrap();
        assert!(r.failed.is_empty() && r.built.is_empty(), "{r:?}");
        r.settled.iter().map(|(a, s)| (a.to_string(), *s)).collect()
    };
    let look = |builds: &mut Builds| -> Vec<(String, u32)> {
        let r = indexer::reshape(&store, &policy, builds, &cancel, &stop).unwrap();
        assert!(r.failed.is_empty(), "{:?}", r.failed);
        r.built.iter().map(|b| (b.agent.to_string(), b.lists)).collect()
    };
    let nearest = |k: usize| -> Vec<String> {
        let got = store.memory_semantic(&a, vec![1.0, 0.0, 0.0], None, &json!({}), k as i64, Breadth::DEFAULT).unwrap();
        got.iter().map(|(i, _)| i.content.clone()).collect()
    };
    let want = |k: usize| -> Vec<String> { (0..k).map(|i| format!("item {i}")).collect() };
    let kind = |agent: &AgentId| store.memory_index_shape(agent).unwrap().kind;

    grow(&mut c, "alpha", 199);
    // Beta's 250 items all wait for their vectors (the endpoint down): they
    // are not rows an index could sample, so nothing is built for them.
    c.batch_execute(
        "INSERT INTO agent_beta.items (tier, content, content_sha256)
         SELECT 'knowledge', 'pending ' || i, md5('p' || i) FROM generate_series(1, 250) AS i;
         ANALYZE agent_beta.items",
    )
    .unwrap();
    assert_eq!(store.memory_index_shape(&b).unwrap().rows, 0, "rows without a vector do not count");
    assert_eq!(look(&mut builds), [], "below build_at the schema's own index stays");
    assert_eq!(kind(&a), Kind::Other("hnsw".into()));
    assert_eq!(nearest(10), want(10));

    grow(&mut c, "alpha", 200);
    assert_eq!(look(&mut builds), [("alpha".to_owned(), 10)], "built at build_at, rows / 20 lists");
    assert_eq!(kind(&a), Kind::IvfFlat(10));
    assert_eq!(kind(&b), Kind::Other("hnsw".into()), "beta's small table is left alone");
    assert_eq!(nearest(10), want(10), "the same answers through IVFFlat");
    for _ in 0..5 {
        assert_eq!(look(&mut Builds::default()), [], "looking again without growth builds nothing");
    }
    grow(&mut c, "alpha", 399);
    assert_eq!(look(&mut builds), [], "19 lists wanted, 10 built: within a factor of two");
    grow(&mut c, "alpha", 400);
    assert_eq!(look(&mut builds), [("alpha".to_owned(), 20)], "rebuilt at a doubling");
    assert_eq!(kind(&a), Kind::IvfFlat(20));
    let plan: String = {
        let mut tx = c.transaction().unwrap();
        tx.batch_execute("SET LOCAL enable_seqscan = off").unwrap();
        let plan = tx
            .query("EXPLAIN SELECT id FROM agent_alpha.items ORDER BY embedding <=> '[1,0,0]' LIMIT 5", &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        tx.commit().unwrap();
        plan
    };
    assert!(plan.contains("items_embedding"), "queries use the new index: {plan}");
    // A narrow filter still finds its items through IVFFlat (pgvector's
    // iterative scan, bounded at four times the probes); without the GIN
    // index on metadata, IVFFlat is the only way to the answer.
    c.batch_execute("DROP INDEX agent_alpha.items_metadata").unwrap();
    c.batch_execute(
        "UPDATE agent_alpha.items SET metadata = '{\"k\": \"rare\"}' WHERE content IN ('item 300', 'item 399')",
    )
    .unwrap();
    let rare =
        store.memory_semantic(&a, vec![1.0, 0.0, 0.0], None, &json!({"k": "rare"}), 5, Breadth::DEFAULT).unwrap();
    assert_eq!(rare.iter().map(|(i, _)| i.content.as_str()).collect::<Vec<_>>(), ["item 300", "item 399"]);
    // The bound binds: at 1 probe the scan reads at most 4 of the 20 lists
    // (the nearest, holding the items nearest [1, 0, 0]) and stops there,
    // answering without the far rare items rather than reading every list.
    let one = Breadth { probes: 1, ..Breadth::DEFAULT };
    let bounded = store.memory_semantic(&a, vec![1.0, 0.0, 0.0], None, &json!({"k": "rare"}), 5, one).unwrap();
    assert!(bounded.is_empty(), "{:?}", bounded.iter().map(|(i, _)| &i.content).collect::<Vec<_>>());
    let near = store.memory_semantic(&a, vec![1.0, 0.0, 0.0], None, &json!({}), 10, one).unwrap();
    assert_eq!(
        near.iter().map(|(i, _)| i.content.clone()).collect::<Vec<_>>(),
        want(10),
        "unfiltered, 1 probe is enough"
    );

    // What a crash or a cancel can leave, put right by the next look without
    // a build. (1) An invalid `items_embedding_next` (a concurrent build that
    // failed): never used, dropped.
    let indexes = |c: &mut postgres::Client| -> Vec<(String, bool)> {
        c.query(
            "SELECT i.relname::text, x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
             WHERE x.indrelid = 'agent_alpha.items'::regclass AND i.relname LIKE 'items_emb%' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    let item = |n: &str, valid: bool| (n.to_owned(), valid);
    let failed = c.batch_execute("CREATE UNIQUE INDEX CONCURRENTLY items_embedding_next ON agent_alpha.items (tier)");
    assert!(failed.is_err(), "the tiers repeat");
    assert_eq!(indexes(&mut c), [item("items_embedding", true), item("items_embedding_next", false)]);
    assert_eq!(nearest(10), want(10));
    assert_eq!(settle(&mut builds), [("alpha".to_owned(), Settled::DroppedInvalid)], "settled, not built");
    assert_eq!(indexes(&mut c), [item("items_embedding", true)]);
    // (2) A crash between the old index's drop and the new one's rename.
    c.batch_execute("ALTER INDEX agent_alpha.items_embedding RENAME TO items_embedding_next").unwrap();
    assert_eq!(kind(&a), Kind::None);
    assert_eq!(settle(&mut builds), [("alpha".to_owned(), Settled::Swapped)], "renamed, not built");
    assert_eq!((kind(&a), indexes(&mut c)), (Kind::IvfFlat(20), vec![item("items_embedding", true)]));
    // (3) The old index left invalid (a cancelled DROP INDEX CONCURRENTLY),
    // the new one valid: the old one goes, the new one takes its name.
    c.batch_execute(
        "CREATE INDEX items_embedding_next ON agent_alpha.items USING ivfflat (embedding vector_cosine_ops)
           WITH (lists = 19);
         UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'agent_alpha.items_embedding'::regclass",
    )
    .unwrap();
    assert_eq!(kind(&a), Kind::None, "an invalid index is no index");
    assert_eq!(settle(&mut builds), [("alpha".to_owned(), Settled::Swapped)]);
    assert_eq!((kind(&a), indexes(&mut c)), (Kind::IvfFlat(19), vec![item("items_embedding", true)]));
    assert_eq!(nearest(10), want(10));

    // (4) choird stopping mid-build: the build is cancelled, not waited
    // out (here it waits behind a writer's open transaction), and the old
    // index serves on; the next look drops the half-made one.
    grow(&mut c, "alpha", 800);
    let mut writer = pg.client();
    let mut open = writer.transaction().unwrap();
    open.execute("INSERT INTO agent_alpha.items (tier, content, content_sha256) VALUES ('working', 'w', 'w')", &[])
        .unwrap();
    let stopping = BuildCancel::default();
    let cancelled = std::thread::scope(|s| {
        let building = s.spawn(|| store.memory_index_build(&a, 40, 64, &stopping));
        let waiting = || {
            pg.client()
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX CONCURRENTLY%'
                     AND wait_event_type = 'Lock'",
                    &[],
                )
                .unwrap()
                .get::<_, i64>(0)
                == 1
        };
        let since = std::time::Instant::now();
        while !waiting() {
            assert!(since.elapsed() < Duration::from_secs(30), "the build never waited");
            std::thread::sleep(Duration::from_millis(20));
        }
        stopping.cancel();
        building.join().unwrap()
    });
    assert!(matches!(cancelled, Err(choird::db::DbError::Stopped)), "{cancelled:?}");
    open.rollback().unwrap();
    assert_eq!(indexes(&mut c), [item("items_embedding", true), item("items_embedding_next", false)]);
    assert_eq!(nearest(10), want(10), "the old index serves on");
    assert!(matches!(store.memory_index_build(&a, 40, 64, &stopping), Err(choird::db::DbError::Stopped)));
    assert_eq!(look(&mut builds), [("alpha".to_owned(), 40)], "the leftover dropped, the build done");
    assert_eq!(indexes(&mut c), [item("items_embedding", true)]);
    assert_eq!(nearest(10), want(10));
    let stats = store.memory_stats(&a).unwrap();
    assert!(stats.index_bytes > 0 && stats.total_bytes > stats.index_bytes, "{stats:?}");

    // Beta's build fails (its vectors' column taken from under it): it waits
    // out FAILED_BUILD_WAIT, alpha is still built; nothing of beta changed.
    grow(&mut c, "beta", 500);
    assert_eq!(store.memory_index_shape(&b).unwrap().rows, 250, "half of beta's rows have vectors");
    c.batch_execute("ALTER TABLE agent_beta.items RENAME COLUMN embedding TO gone").unwrap();
    grow(&mut c, "alpha", 1600);
    let r = indexer::reshape(&store, &policy, &mut builds, &cancel, &stop).unwrap();
    assert_eq!(r.built.iter().map(|b| b.agent.as_str()).collect::<Vec<_>>(), ["alpha"]);
    assert_eq!(r.failed.iter().map(|(ag, _)| ag.as_str()).collect::<Vec<_>>(), ["beta"]);
    assert_eq!(kind(&b), Kind::Other("hnsw".into()), "beta keeps the index it had");
    let r = indexer::reshape(&store, &policy, &mut builds, &cancel, &stop).unwrap();
    assert!(r.built.is_empty() && r.failed.is_empty(), "beta is not tried again at once: {r:?}");
    // With nothing running, a cancel is harmless.
    cancel.cancel();
}
