//! Postgres access: a small blocking connection pool and the migration runner.
//! Postgres is choird's system of record (sessions, replicated commit events,
//! audit, messages); the managed cluster lives in [`cluster`].
//!
//! **Invariant:** migrations are applied in order, each exactly once, inside one
//! transaction holding an advisory lock, so two choirds cannot interleave them.

pub mod cluster;
pub mod keeper;
pub mod keeping;
pub mod slots;
pub mod upkeep;

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use postgres::{Client, NoTls, Statement};

/// Migrations, in order. A tidy test checks this matches the files in `sql/`.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "0001_foundation.sql", include_str!("../../../sql/0001_foundation.sql")),
    (2, "0002_policy.sql", include_str!("../../../sql/0002_policy.sql")),
    (3, "0003_notices.sql", include_str!("../../../sql/0003_notices.sql")),
    (4, "0004_approvals.sql", include_str!("../../../sql/0004_approvals.sql")),
    (5, "0005_telegram.sql", include_str!("../../../sql/0005_telegram.sql")),
    (6, "0006_memory.sql", include_str!("../../../sql/0006_memory.sql")),
    (7, "0007_quotas.sql", include_str!("../../../sql/0007_quotas.sql")),
    (8, "0008_host_calls.sql", include_str!("../../../sql/0008_host_calls.sql")),
    (9, "0009_confirmations.sql", include_str!("../../../sql/0009_confirmations.sql")),
    (10, "0010_sessions.sql", include_str!("../../../sql/0010_sessions.sql")),
    (11, "0011_costs.sql", include_str!("../../../sql/0011_costs.sql")),
    (12, "0012_job_ledger.sql", include_str!("../../../sql/0012_job_ledger.sql")),
    (13, "0013_schedules.sql", include_str!("../../../sql/0013_schedules.sql")),
    (14, "0014_schedule_fingerprints.sql", include_str!("../../../sql/0014_schedule_fingerprints.sql")),
    (15, "0015_conversation_tails.sql", include_str!("../../../sql/0015_conversation_tails.sql")),
    (16, "0016_firing_wall_time.sql", include_str!("../../../sql/0016_firing_wall_time.sql")),
    (17, "0017_processed_position.sql", include_str!("../../../sql/0017_processed_position.sql")),
    (18, "0018_message_order.sql", include_str!("../../../sql/0018_message_order.sql")),
    (19, "0019_cache_tokens.sql", include_str!("../../../sql/0019_cache_tokens.sql")),
    (20, "0020_mcp_proposals.sql", include_str!("../../../sql/0020_mcp_proposals.sql")),
    (21, "0021_messages_before.sql", include_str!("../../../sql/0021_messages_before.sql")),
];

/// Per-agent migrations (templates with `{schema}` and `{dims}`), applied to
/// each agent's own schema on its first use and recorded in
/// `agent_migrations`. A tidy test checks this matches `sql/agent/`.
pub const AGENT_MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "0001_items.sql", include_str!("../../../sql/agent/0001_items.sql")),
    (2, "0002_fresh.sql", include_str!("../../../sql/agent/0002_fresh.sql")),
];

/// The per-agent migration that adds the `fresh` column (vectors waiting
/// outside the HNSW index); agents whose memory predates it get it at start.
pub const FRESH_MIGRATION: i32 = 2;

/// Key of the advisory lock serialising migrations ("choir" in ASCII).
const MIGRATION_LOCK: i64 = 0x63686f6972;

/// Database errors as choird reports them.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database holds migrations this choird does not know.
    #[error(
        "the database was migrated by a newer choird: it holds migration(s) {newer}, and this choird ({}) knows \
         migrations up to {newest}. Starting would run old code on a newer schema: install the newer choird \
         again, or restore the backup taken before the upgrade into a new home (choirctl restore)",
        env!("CARGO_PKG_VERSION")
    )]
    NewerSchema {
        /// The newest migration this choird knows.
        newest: i32,
        /// The ones it does not.
        newer: String,
    },
    /// Could not connect (retried by callers that can wait).
    #[error("cannot connect to Postgres ({target}): {source}")]
    Connect {
        /// Where we tried (no password).
        target: String,
        /// Driver error.
        source: postgres::Error,
    },
    /// A query failed.
    #[error("database error: {0}")]
    Query(#[from] postgres::Error),
    /// An agent's memory schema was made for another embedding dimension.
    #[error(
        "agent {agent}'s memory was made for {schema}-dimensional embeddings, but memory.embeddings.dimensions is \
         {configured}; vectors are never truncated: set dimensions back to {schema}, or export and drop the \
         agent's memory to start afresh"
    )]
    Dimensions {
        /// The agent.
        agent: String,
        /// The dimension of its schema.
        schema: u32,
        /// The configured dimension.
        configured: u32,
    },
    /// Every connection choird may hold, or every one the agent's requests
    /// may, was in use for longer than a request waits ([`slots`]).
    #[error("{}", match agent {
        Some(a) => format!("agent {a}'s requests hold all the database connections they may; try again"),
        None => "all of choird's database connections are in use; try again".to_owned(),
    })]
    Busy {
        /// The agent whose share was full (none: all of choird's).
        agent: Option<String>,
    },
    /// Work stopped because choird is stopping (a cancelled index build).
    #[error("stopped: choird is shutting down")]
    Stopped,
    /// A migration failed; the message names it.
    #[error("migration {name} failed: {source}{hint}")]
    Migration {
        /// File name.
        name: String,
        /// Driver error.
        source: postgres::Error,
        /// Extra advice (e.g. how to install pgvector).
        hint: String,
    },
}

impl DbError {
    /// Whether PostgreSQL refused the data itself (SQLSTATE class 22, "data
    /// exception": e.g. a character it cannot store): sending the same again
    /// fails the same way, so it is not a reason to retry.
    pub fn is_data_error(&self) -> bool {
        match self {
            DbError::Query(e) => e.code().is_some_and(|c| c.code().starts_with("22")),
            _ => false,
        }
    }
}

/// Takes out of `idle` (oldest first) the connections unused since
/// [`IDLE_CLOSE`] before `now`, leaving those newer — so the pool shrinks to
/// what a quiet choird uses. The caller drops them (closing each) after
/// releasing the pool's lock.
fn unused_too_long<C>(idle: &mut Vec<(C, Instant)>, now: Instant) -> Vec<(C, Instant)> {
    let fresh = idle.iter().position(|(_, at)| now.duration_since(*at) < IDLE_CLOSE).unwrap_or(idle.len());
    idle.drain(..fresh).collect()
}

/// A pool of blocking connections. Connections are created on demand; a
/// broken connection is dropped rather than returned.
///
/// **Invariant:** every connection is used under a slot ([`slots`]): at most
/// [`slots::MAX_OPEN`] are open at once (a new one is opened only when
/// none waits in the pool), and one agent's requests hold at most
/// [`slots::PER_AGENT`].
/// **Invariant:** at most [`MAX_IDLE`] connections wait in the pool, and one
/// unused for [`IDLE_CLOSE`] is closed — at the pool's next use, or by
/// [`Db::close_unused`], which choird's main loop calls every second. Each
/// server process holds its own catalog caches (the one a quiet choird
/// kept was about 9 MB of the whole system's PSS); nothing of an idle
/// choird uses a connection (the scheduler and the long-polls read only
/// when woken), so a quiet choird holds none, and the first turn after a
/// quiet minute connects again (about 10 ms, `bench-footprint`).
pub struct Db {
    config: postgres::Config,
    target: String,
    /// Idle connections, the most recently used last, with when each came back.
    idle: Mutex<Vec<(Conn, Instant)>>,
    /// Who may hold how many connections.
    slots: slots::Slots,
}

/// The most connections the pool keeps open while unused.
pub const MAX_IDLE: usize = 8;
/// How long an unused connection stays open.
pub const IDLE_CLOSE: Duration = Duration::from_secs(60);

/// A pooled connection with the statements prepared on it. Derefs to the
/// driver's [`Client`], so a statement given as text still works (the
/// driver then prepares it anew: one more round trip per statement).
///
/// **Invariant:** only `&'static str` SQL is cached, so the cache is bounded
/// by the statements compiled into choird (SQL built at run time, such as
/// an agent's memory schema, is never cached and cannot grow it).
pub struct Conn {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

impl Conn {
    /// `sql` prepared on this connection, once: a turn's statements then
    /// cost one round trip each instead of two (parse, then execute).
    pub fn prepared(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.prepared.get(sql) {
            return Ok(s.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.prepared.insert(sql, statement.clone());
        Ok(statement)
    }
}

impl Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

impl Db {
    /// Parses `url` (URL or key=value form) and checks one connection.
    pub fn connect(url: &str) -> Result<Db, DbError> {
        let config: postgres::Config = url
            .parse()
            .map_err(|e| DbError::Connect { target: "a connection string that does not parse".into(), source: e })?;
        let db = Db { target: describe(&config), config, idle: Mutex::new(Vec::new()), slots: slots::Slots::default() };
        let client = db.open()?;
        db.idle.lock().push((Conn { client, prepared: HashMap::new() }, Instant::now()));
        Ok(db)
    }

    fn open(&self) -> Result<Client, DbError> {
        let mut config = self.config.clone();
        config.connect_timeout(Duration::from_secs(10));
        // The server's notices ("relation … already exists, skipping" from
        // an idempotent migration) are no news for the operator's journal.
        config.notice_callback(|n| log::debug!("postgres notice: {}", n.message()));
        config.connect(NoTls).map_err(|e| DbError::Connect { target: self.target.clone(), source: e })
    }

    /// Runs `f` with a pooled connection. A connection that reports itself closed
    /// after `f` is discarded, and so is one whose prepared statements no
    /// longer fit the tables (SQLSTATE 0A000, "cached plan must not change
    /// result type", after a table changed under it): the next use opens a
    /// fresh connection instead of failing the same way forever.
    #[track_caller]
    pub fn with<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T, postgres::Error>) -> Result<T, DbError> {
        log::trace!(target: "choird::db::uses", "{}", std::panic::Location::caller());
        // Taken first and given back last (declared before the connection).
        let _slot = self.slot()?;
        let (pooled, closing) = {
            let mut idle = self.idle.lock();
            let pooled = idle.pop().map(|(c, _)| c);
            (pooled, unused_too_long(&mut idle, Instant::now()))
        };
        drop(closing); // closed outside the lock
        let mut client = match pooled {
            Some(c) if !c.is_closed() => c,
            _ => Conn { client: self.open()?, prepared: HashMap::new() },
        };
        let out = f(&mut client);
        let stale = matches!(&out, Err(e) if e.code() == Some(&postgres::error::SqlState::FEATURE_NOT_SUPPORTED));
        if !client.is_closed() && !stale {
            let mut idle = self.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push((client, Instant::now()));
            }
        }
        Ok(out?)
    }

    /// Closes every pooled connection unused for [`IDLE_CLOSE`], the most
    /// recently used too (outside the pool's lock); cheap when there is
    /// none.
    pub fn close_unused(&self) {
        let closing = unused_too_long(&mut self.idle.lock(), Instant::now());
        if !closing.is_empty() {
            log::debug!("closing {} database connection(s) unused for {:?}", closing.len(), IDLE_CLOSE);
        }
        drop(closing);
    }

    /// How many connections wait in the pool (for the footprint benchmark
    /// and tests).
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().len()
    }

    /// Runs `f` on a connection of its own, opened now and closed after:
    /// for work that sets session state (settings, session advisory locks)
    /// or runs long, so none of it reaches a pooled connection.
    pub fn dedicated<T>(&self, f: impl FnOnce(&mut Client) -> Result<T, DbError>) -> Result<T, DbError> {
        let _slot = self.slot()?;
        let mut client = self.open()?;
        f(&mut client)
    }

    /// A slot for a connection ([`slots`]), or why there is none.
    fn slot(&self) -> Result<slots::Slot<'_>, DbError> {
        self.slots.take().map_err(|busy| DbError::Busy { agent: busy.agent.map(|a| a.to_string()) })
    }

    /// Applies pending migrations; returns the names applied now.
    pub fn migrate(&self) -> Result<Vec<String>, DbError> {
        let mut client = self.open()?;
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )?;
        // A database a newer choird migrated: this one would run old code
        // on a schema it does not know. Refused, naming both and the way back.
        let newest = MIGRATIONS.last().map_or(0, |m| m.0);
        let newer: Vec<String> = tx
            .query("SELECT version, name FROM schema_migrations WHERE version > $1 ORDER BY version", &[&newest])?
            .iter()
            .map(|r| format!("{} ({})", r.get::<_, i32>(0), r.get::<_, String>(1)))
            .collect();
        if !newer.is_empty() {
            return Err(DbError::NewerSchema { newest, newer: newer.join(", ") });
        }
        // Which are applied, in one round trip (a restart applies none).
        let done: std::collections::BTreeSet<i32> =
            tx.query("SELECT version FROM schema_migrations", &[])?.iter().map(|r| r.get(0)).collect();
        let mut applied = Vec::new();
        for (version, name, sql) in MIGRATIONS {
            if done.contains(version) {
                continue;
            }
            tx.batch_execute(sql).map_err(|e| {
                let hint = if e.to_string().contains("vector") {
                    "; pgvector is not installed for this PostgreSQL: run `make build-deps` (scripts/install-deps.sh build)"
                        .to_owned()
                } else {
                    String::new()
                };
                DbError::Migration { name: name.to_string(), source: e, hint }
            })?;
            tx.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", &[version, name])?;
            applied.push(name.to_string());
        }
        tx.commit()?;
        Ok(applied)
    }
}

impl Db {
    /// Brings `agent`'s schema (`agent_<id>`) up to date for embeddings of
    /// `dims` dimensions; returns the migrations applied now. A schema made
    /// for another dimension is refused with a clear error: vectors are never
    /// truncated or padded.
    pub fn migrate_agent(&self, agent: &choir_common::ids::AgentId, dims: u32) -> Result<Vec<String>, DbError> {
        let schema = agent_schema(agent);
        let mut client = self.open()?;
        let mut tx = client.transaction()?;
        // One lock per agent: two choirds never interleave its migrations.
        tx.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", &[&(MIGRATION_LOCK as i32), &agent.as_str()])?;
        let made: Option<i32> = tx
            .query_opt(
                "SELECT dimensions FROM agent_migrations WHERE agent_id = $1 ORDER BY version LIMIT 1",
                &[&agent.as_str()],
            )?
            .map(|r| r.get(0));
        if let Some(d) = made.filter(|d| *d as u32 != dims) {
            return Err(DbError::Dimensions { agent: agent.to_string(), schema: d as u32, configured: dims });
        }
        let mut applied = Vec::new();
        for (version, name, template) in AGENT_MIGRATIONS {
            let done = tx.query_opt(
                "SELECT 1 FROM agent_migrations WHERE agent_id = $1 AND version = $2",
                &[&agent.as_str(), version],
            )?;
            if done.is_some() {
                continue;
            }
            // Identifiers cannot be parameters: the schema name comes from a
            // validated agent id ([a-z][a-z0-9_]{0,31}) and is quoted besides.
            let sql = template.replace("{schema}", &schema).replace("{dims}", &dims.to_string());
            tx.batch_execute(&sql).map_err(|e| DbError::Migration {
                name: format!("{schema}/{name}"),
                source: e,
                hint: String::new(),
            })?;
            tx.execute(
                "INSERT INTO agent_migrations (agent_id, version, name, dimensions) VALUES ($1, $2, $3, $4)",
                &[&agent.as_str(), version, name, &(dims as i32)],
            )?;
            applied.push(format!("{schema}/{name}"));
        }
        tx.commit()?;
        Ok(applied)
    }
}

/// The quoted name of an agent's schema: `"agent_<id>"`.
pub fn agent_schema(agent: &choir_common::ids::AgentId) -> String {
    format!("\"agent_{}\"", agent.as_str())
}

/// How a connection string is named in messages: its hosts, port, user and
/// database as parsed — never its password, wherever the string put it (in
/// the URL's user info, a `?password=` parameter, or a quoted key=value).
fn describe(config: &postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "host {} port {} user {} database {}",
        if hosts.is_empty() { "(default)".to_owned() } else { hosts.join(",") },
        if ports.is_empty() { "(default)".to_owned() } else { ports.join(",") },
        config.get_user().unwrap_or("(default)"),
        config.get_dbname().unwrap_or("(the user's)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_unused_past_the_idle_limit_are_closed_and_newer_ones_kept() {
        let now = Instant::now();
        let ago = |s: u64| now - Duration::from_secs(s);
        // Oldest first, as the pool keeps them.
        let mut idle = vec![("a", ago(300)), ("b", ago(61)), ("c", ago(59)), ("d", ago(1))];
        let closed: Vec<&str> = unused_too_long(&mut idle, now).into_iter().map(|(c, _)| c).collect();
        assert_eq!(closed, ["a", "b"]);
        assert_eq!(idle.iter().map(|(c, _)| *c).collect::<Vec<_>>(), ["c", "d"]);
        // Control: nothing past the limit, nothing closed; an empty pool stays empty.
        assert!(unused_too_long(&mut idle, now).is_empty());
        assert_eq!(idle.len(), 2);
        assert!(unused_too_long(&mut Vec::<(u8, Instant)>::new(), now).is_empty());
    }

    #[test]
    fn passwords_never_reach_messages() {
        for url in [
            "postgres://u:s3cret@h/db",
            "postgresql://h:5433/db?user=u&password=s3cret",
            "host=/tmp user=u password=s3cret",
            "host=/tmp user=u password = 's3cret and more'",
        ] {
            let config: postgres::Config = url.parse().unwrap();
            let said = describe(&config);
            assert!(!said.contains("s3cret") && said.contains("user u"), "{url}: {said}");
        }
        assert_eq!(
            describe(&"postgresql://u:s3cret@h:5433/db".parse().unwrap()),
            "host h port 5433 user u database db"
        );
        // Strings that do not parse: the error names none of it.
        for url in ["postgresql://u:s3cret@h:notaport/x", "host=/tmp password='s3cret", "s3cret=x"] {
            let err = Db::connect(url).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!err.is_empty() && !err.contains("s3cret"), "{url}: {err}");
        }
    }

    #[test]
    fn every_sql_file_is_a_migration() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../sql");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let listed: Vec<String> = MIGRATIONS.iter().map(|m| m.1.to_owned()).collect();
        assert_eq!(files, listed);
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.0 as usize, i + 1);
        }
        let mut agent: Vec<String> = std::fs::read_dir(format!("{dir}/agent"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        agent.sort();
        let listed: Vec<String> = AGENT_MIGRATIONS.iter().map(|m| m.1.to_owned()).collect();
        assert_eq!(agent, listed);
        for (i, m) in AGENT_MIGRATIONS.iter().enumerate() {
            assert_eq!(m.0 as usize, i + 1);
            assert!(m.2.contains("{schema}"), "{} must use the {{schema}} placeholder", m.1);
        }
    }
}
