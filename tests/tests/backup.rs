//! `choirctl backup` and `choirctl restore`: a home's
//! config, secrets, repos, database and workspaces go into one archive and
//! come back in a new, empty home, where the agent answers with its memory
//! and its conversation intact.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command;

use choir_tests::fake_embeddings::FakeEmbeddings;
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{bin, test_config, Choird, TempHome};
use serde_json::json;

const FACT: &str = "The pantry door code is 4711";
const ASKED: &str = "remember that the pantry door code is 4711";

fn restore(home: &std::path::Path, file: &std::path::Path) -> std::process::Output {
    Command::new(bin("choirctl")).arg("--home").arg(home).arg("restore").arg(file).output().unwrap()
}

#[test]
fn backup_then_restore_into_a_new_home_keeps_memory_history_and_workspace() {
    if choird::db::cluster::ManagedCluster::find_bin_dir(None).is_err() {
        assert!(!choir_tests::services_required(), "PostgreSQL is required");
        eprintln!("SKIPPED: no PostgreSQL server binaries");
        return;
    }
    let llm = FakeLlm::start(vec![
        Step::call("choir.memory.upsert", json!({"tier": "knowledge", "content": FACT})),
        Step::Text("remembered".into()),
        // After the restore, in the new home:
        Step::call("choir.memory.query", json!({"mode": "semantic", "query": "pantry door code"})),
        Step::Text("it is 4711".into()),
    ]);
    let emb = FakeEmbeddings::start(16);
    let mut config = test_config(&llm.base_url(), None, &["demo"]);
    config["memory"] = json!({"embeddings": {"base_url": emb.base_url(), "model": "fake", "dimensions": 16}});
    let mut old = Choird::start(&config, &json!({"llm_key": "k"}));
    old.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(old.ctl_ok(&["chat", "demo", ASKED]).trim(), "remembered");
    // The workspace: a file, a link to a host file, and a FIFO (a hostile
    // agent's trap: reading it would block the backup forever).
    let ws = old.workspace("demo");
    std::fs::write(ws.join("notes.txt"), "shopping: tea").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ws.join("passwd-link")).unwrap();
    let fifo = ws.join("trap.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());

    // A destination an operator approved and asked to remember.
    let remembered = r#"{"remembered": [{"value": "bob@corp.test", "until_unix": 4102444800, "approval": 7,
                                          "tool": "choir.email.send", "by": "admin"}]}"#;
    std::fs::create_dir_all(old.home.path().join("remembered")).unwrap();
    std::fs::write(old.home.path().join("remembered/demo.json"), remembered).unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let archive = out_dir.path().join("choir.tar.gz");
    let said = old.ctl_ok(&["backup", archive.to_str().unwrap(), "--workspaces"]);
    assert!(said.contains("wrote") && said.contains("1 special files"), "{said}");
    assert_eq!(std::fs::metadata(&archive).unwrap().permissions().mode() & 0o777, 0o600, "it holds the secrets");
    let again = old.ctl_err(&["backup", archive.to_str().unwrap()]);
    assert!(again.contains("exists"), "{again}");
    // To standard output (`-`): the same archive format, as a stream.
    let streamed = Command::new(bin("choirctl"))
        .arg("--home")
        .arg(old.home.path())
        .args(["backup", "-"])
        .stdout(std::fs::File::create(out_dir.path().join("streamed.tar.gz")).unwrap())
        .output()
        .unwrap();
    assert!(streamed.status.success(), "{}", String::from_utf8_lossy(&streamed.stderr));
    let head = std::fs::read(out_dir.path().join("streamed.tar.gz")).unwrap();
    assert_eq!(&head[..2], &[0x1f, 0x8b], "a gzip stream");
    std::fs::remove_file(out_dir.path().join("streamed.tar.gz")).unwrap();
    // Interrupted (its client killed mid-way, as Ctrl-C does): nothing is
    // left in the directory, not even a partial file.
    let interrupted = out_dir.path().join("interrupted.tar.gz");
    // A workspace large enough that the archive takes a while (random
    // bytes: gzip cannot shrink them), so the kill lands mid-way.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let big: Vec<u8> = (0..(48usize << 20) / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    std::fs::write(ws.join("big.bin"), &big).unwrap();
    drop(big);
    let started = std::time::Instant::now();
    let mut child = Command::new(bin("choirctl"))
        .arg("--home")
        .arg(old.home.path())
        .args(["backup", interrupted.to_str().unwrap(), "--workspaces"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let finished_before_the_kill = child.try_wait().unwrap().is_some();
    let _ = child.kill();
    let _ = child.wait();
    assert!(!finished_before_the_kill, "the backup ended within {:?}: the kill tested nothing", started.elapsed());
    // choird gives up the archive nobody waits for (and opens its gate).
    choir_tests::observe::wait_for("the abandoned backup", std::time::Duration::from_secs(60), || {
        old.ctl_ok(&["--json", "audit", "--limit", "20"]).contains("its client went away")
    });
    std::fs::remove_file(ws.join("big.bin")).unwrap();
    let left: Vec<String> = std::fs::read_dir(out_dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "choir.tar.gz")
        .collect();
    assert!(left.is_empty(), "an interrupted backup left {left:?}");
    let audit = old.ctl_ok(&["audit"]);
    assert!(audit.contains("backup"), "{audit}");
    old.stop();

    // Restore refuses what is not a backup, and a home that is not empty.
    let new = TempHome::empty();
    let junk = out_dir.path().join("junk.tar.gz");
    std::fs::write(&junk, b"not an archive").unwrap();
    let refused = restore(new.path(), &junk);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is not a choirctl backup"), "{refused:?}");
    assert_eq!(std::fs::read_dir(new.path()).unwrap().count(), 0, "a refused restore leaves nothing behind");
    // A backup cut short fails part-way, and the home is empty again.
    let bytes = std::fs::read(&archive).unwrap();
    let cut = out_dir.path().join("cut.tar.gz");
    std::fs::write(&cut, &bytes[..bytes.len() * 3 / 4]).unwrap();
    let failed = restore(new.path(), &cut);
    assert!(!failed.status.success(), "{failed:?}");
    assert_eq!(std::fs::read_dir(new.path()).unwrap().count(), 0, "a failed restore leaves nothing behind");
    let busy = restore(old.home.path(), &archive);
    assert!(String::from_utf8_lossy(&busy.stderr).contains("is not empty"), "{busy:?}");

    let restored = restore(new.path(), &archive);
    assert!(restored.status.success(), "{}", String::from_utf8_lossy(&restored.stderr));
    let said = String::from_utf8_lossy(&restored.stdout);
    assert!(said.contains("restoring the database") && said.contains("restored into"), "{said}");
    let secrets = new.path().join("secrets.json");
    assert_eq!(std::fs::metadata(&secrets).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(new.path().join("remembered/demo.json")).unwrap(), remembered);
    let new_ws = new.path().join("workspaces/demo");
    assert_eq!(std::fs::read_to_string(new_ws.join("notes.txt")).unwrap(), "shopping: tea");
    assert_eq!(std::fs::read_link(new_ws.join("passwd-link")).unwrap(), std::path::Path::new("/etc/passwd"));
    assert!(
        !new_ws.join("trap.fifo").exists()
            || !std::fs::metadata(new_ws.join("trap.fifo")).unwrap().file_type().is_fifo()
    );

    assert!(said.contains("held until `choirctl resume`"), "{said}");

    // The new home runs: the agent finds its memory, and its conversation
    // came back with it. Telegram polling and the scheduler are held until
    // the operator resumes them (the old host may still run).
    let new = Choird::start_in(new);
    let status = new.ctl_ok(&["status"]);
    assert!(status.contains("HELD:") && status.contains("choirctl resume"), "{status}");
    assert!(new.stderr().contains("wait for `choirctl resume`"), "{}", new.stderr());
    new.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(new.ctl_ok(&["chat", "demo", "what is the pantry door code?"]).trim(), "it is 4711");
    let requests = llm.requests();
    let last = &requests.last().unwrap().body;
    let text = last["messages"].to_string();
    assert!(text.contains(ASKED), "the earlier conversation is in the new home's request: {text}");
    assert!(text.contains(FACT), "the memory query found the fact: {text}");
    let sessions = new.ctl_ok(&["sessions", "demo"]);
    assert!(sessions.lines().count() >= 3, "the old home's session is in the history: {sessions}");
    assert!(new.ctl_ok(&["resume"]).starts_with("resumed"));
    assert!(!new.ctl_ok(&["status"]).contains("HELD"));
    assert!(!new.home.path().join("held-after-restore").exists());
    assert!(new.ctl_ok(&["resume"]).starts_with("nothing was held"), "a second resume changes nothing");
    assert!(new.ctl_ok(&["audit"]).contains("choird.resume"));
}

fn restore_with(home: &std::path::Path, file: &std::path::Path, flags: &[&str]) -> std::process::Output {
    Command::new(bin("choirctl")).arg("--home").arg(home).arg("restore").arg(file).args(flags).output().unwrap()
}

/// Moving to a host whose PostgreSQL is elsewhere: `restore --database-url`
/// loads the backup of a managed home into that (empty) database and points
/// the restored config.json at it; choird then runs on it with the history.
/// A connection string that does not parse or names no database, both
/// choices at once, or a database that cannot be reached change nothing —
/// and the error never repeats the password the string holds.
#[test]
fn a_backup_restores_into_another_database_named_at_restore() {
    let Some(pg) = choir_tests::pg::TestPg::start() else { return };
    let llm = FakeLlm::start(vec![Step::Text("noted".into())]);
    let config = test_config(&llm.base_url(), None, &["demo"]);
    let mut old = Choird::start(&config, &json!({"llm_key": "k"}));
    old.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(old.ctl_ok(&["chat", "demo", ASKED]).trim(), "noted");
    // A destination an operator approved and asked to remember.
    let remembered = r#"{"remembered": [{"value": "bob@corp.test", "until_unix": 4102444800, "approval": 7,
                                          "tool": "choir.email.send", "by": "admin"}]}"#;
    std::fs::create_dir_all(old.home.path().join("remembered")).unwrap();
    std::fs::write(old.home.path().join("remembered/demo.json"), remembered).unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let archive = out_dir.path().join("choir.tar.gz");
    old.ctl_ok(&["backup", archive.to_str().unwrap()]);
    old.stop();

    let new = TempHome::empty();
    let refused = |flags: &[&str], why: &str| {
        let out = restore_with(new.path(), &archive, flags);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && stderr.contains(why), "{flags:?}: {stderr}");
        assert!(!stderr.contains("s3cret"), "the password is not repeated: {stderr}");
        assert_eq!(std::fs::read_dir(new.path()).unwrap().count(), 0, "{flags:?} left nothing behind");
    };
    refused(&["--database-url", "postgresql://u:s3cret@127.0.0.1:notaport/x"], "not a PostgreSQL connection string");
    refused(&["--database-url", " "], "--database-url is empty");
    refused(&["--managed", "--database-url", "postgresql://127.0.0.1/x"], "cannot be used with");
    refused(&["--database-url", "postgresql://u:s3cret@127.0.0.1"], "names no database");
    refused(&["--database-url", "postgresql://u:s3cret@127.0.0.1:1/x"], "cannot reach the external database");

    // The string from stdin (`-`): a password in it stays out of ps.
    let mut child = Command::new(bin("choirctl"))
        .arg("--home")
        .arg(new.path())
        .args(["restore", archive.to_str().unwrap(), "--database-url", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{}\n", pg.url()).as_bytes()).unwrap();
    let restored = child.wait_with_output().unwrap();
    assert!(restored.status.success(), "{}", String::from_utf8_lossy(&restored.stderr));
    assert!(String::from_utf8_lossy(&restored.stdout).contains("into the external cluster"), "{restored:?}");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(new.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(written["database_url"], json!(pg.url()));
    assert_eq!(written["agents"], config["agents"], "the rest of config.json is kept");
    let mut db = pg.client();
    let asked: i64 = db.query_one("SELECT count(*) FROM messages WHERE text = $1", &[&ASKED]).unwrap().get(0);
    assert_eq!(asked, 1, "the history is in the external database");
    // A second restore into the same database is refused: it holds choird's tables.
    let again = TempHome::empty();
    let out = restore_with(again.path(), &archive, &["--database-url", &pg.url()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds choird's tables"), "{out:?}");
    assert_eq!(std::fs::read_dir(again.path()).unwrap().count(), 0);

    let new = Choird::start_in(new);
    let sessions = new.ctl_ok(&["sessions", "demo"]);
    assert!(sessions.lines().count() >= 2, "the old home's session is in the history: {sessions}");
}

/// Upgrade and rollback: an older choird on a database a newer one migrated
/// refuses to start, naming both and the way back, and changes nothing.
#[test]
fn regression_an_older_choird_started_silently_on_a_database_a_newer_one_migrated() {
    let Some(pg) = choir_tests::pg::TestPg::start() else { return };
    let db = choird::db::Db::connect(&pg.url()).unwrap();
    db.migrate().unwrap();
    // The negative control: a database this choird migrated is migrated again with nothing to do.
    assert_eq!(db.migrate().unwrap(), Vec::<String>::new());
    let newest = choird::db::MIGRATIONS.last().unwrap().0;
    let future = newest + 1;
    pg.client()
        .execute("INSERT INTO schema_migrations (version, name) VALUES ($1, '9999_from_the_future.sql')", &[&future])
        .unwrap();
    let e = db.migrate().unwrap_err().to_string();
    for want in [
        "migrated by a newer choird".to_owned(),
        format!("{future} (9999_from_the_future.sql)"),
        format!("knows migrations up to {newest}"),
        "choirctl restore".to_owned(),
    ] {
        assert!(e.contains(&want), "{want:?} is not said: {e}");
    }
    // choird itself refuses to start on it, saying why.
    let home = TempHome::new(&test_config("http://127.0.0.1:9/v1", Some(&pg.url()), &["demo"]), &json!({}));
    #[allow(clippy::disallowed_methods)]
    let out = Command::new(bin("choird")).arg("--home").arg(home.path()).env("RUST_LOG", "warn").output().unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("migrated by a newer choird"), "{said}");
    let rows: i64 = pg.client().query_one("SELECT count(*) FROM schema_migrations", &[]).unwrap().get(0);
    assert_eq!(rows, i64::from(newest) + 1, "nothing was changed");
}
