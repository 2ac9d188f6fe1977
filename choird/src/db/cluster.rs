//! The managed PostgreSQL cluster (R-MEM-3): with no `database_url`, choird
//! runs a private cluster under `<home>/pg` with the system's PostgreSQL
//! binaries — `initdb` once, started on a private Unix socket with TCP off,
//! stopped on shutdown. The test support code uses the same type for its
//! disposable clusters.
//!
//! PostgreSQL refuses to run as root, so when choird is root the cluster runs
//! as the `postgres` system user (via `runuser`), which must be able to reach
//! the directory.
//!
//! **Invariant:** the socket directory is private (0700) and TCP is off, so
//! `trust` authentication admits only users who can already read choird's home.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::spawn::{Cmd, SpawnError};

/// The port number only names the socket file (`.s.PGSQL.<port>`): TCP is off.
const PORT: u16 = 5432;
/// The managed cluster's settings for one small host, where it shares a
/// couple of cores and little memory with choird and its agents. Each is a
/// choice against PostgreSQL's general-purpose defaults (docs/benchmarks.md
/// measures what they save):
/// - `shared_buffers` 16 MB (default 128): Choir's working set — the commit
///   log's tail, the ledger, memories — fits many times over, and a smaller
///   pool means fewer shared pages touched and counted to every process.
/// - no logical replication launcher, no WAL sender, `wal_level = minimal`:
///   Choir replicates nothing and backs up with `pg_dump`; two processes
///   fewer, and less WAL for bulk writes.
/// - no parallel query workers and no JIT: Choir's queries are small and
///   indexed; a parallel worker is a fork per query and JIT compiles for
///   longer than these queries run.
/// - no autovacuum launcher (`autovacuum = off`; one worker at most, for
///   the wraparound protection the postmaster still starts on its own):
///   an always-running process (3.3 MB idle) for a few tables that change
///   little; the cluster's keeper tends them every 5 minutes (the old
///   naptime) by autovacuum's own rules instead (`db/upkeep.rs`).
/// - checkpoints at most every 15 minutes unless WAL grows: fewer writes
///   when little happens, recovery still bounded by `max_wal_size`.
///
/// - `max_connections` 30 (default 100; [`max_connections`]).
const SMALL_HOST: &str = "shared_buffers = 16MB\n\
     max_logical_replication_workers = 0\n\
     max_wal_senders = 0\n\
     wal_level = minimal\n\
     max_parallel_workers_per_gather = 0\n\
     max_parallel_maintenance_workers = 0\n\
     jit = off\n\
     autovacuum = off\n\
     autovacuum_max_workers = 1\n\
     checkpoint_timeout = 15min\n";

/// The managed cluster's `max_connections`: the most choird holds at once
/// ([`crate::db::slots::MAX_OPEN`], 20) and room for the keeper's upkeep, a
/// backup's `pg_dump` and an operator's `psql` (of which PostgreSQL keeps
/// three for superusers). Each connection allowed is shared memory the
/// postmaster sets up and touches: 2.2 MB of the whole system's PSS
/// between PostgreSQL's default of 100 and 30.
pub fn max_connections() -> usize {
    crate::db::slots::MAX_OPEN + 10
}

/// Database created for choird inside the cluster.
pub const DATABASE: &str = "choir";

/// The managed cluster could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No PostgreSQL server binaries were found.
    #[error("no PostgreSQL server binaries found (looked for {looked}); install them with `sudo make runtime-deps`, or set postgres_bin_dir or database_url in config.json")]
    NoBinaries {
        /// Where we looked.
        looked: String,
    },
    /// A directory could not be prepared.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// Running as root, but the `postgres` user cannot reach the cluster directory.
    #[error("choird runs as root, so the managed PostgreSQL runs as user 'postgres', which cannot enter {dir} (mode {mode:o}); use a home outside /root (--home or CHOIR_HOME), run choird as a normal user, or set database_url")]
    NotTraversable {
        /// The blocking directory.
        dir: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// Running as root, but there is no `postgres` user.
    #[error("choird runs as root and needs the 'postgres' system user for the managed cluster; install the postgresql-15 package (`sudo make runtime-deps`)")]
    NoPostgresUser,
    /// A PostgreSQL tool failed.
    #[error("{0}")]
    Tool(#[from] SpawnError),
    /// The server did not start again (with the server's own complaints).
    #[error("{0}")]
    Start(String),
    /// The path contains a character we will not put in postgresql.conf.
    #[error("{0}: the managed cluster's path must not contain quotes or newlines")]
    BadPath(PathBuf),
}

/// A running private cluster.
#[derive(Debug)]
pub struct ManagedCluster {
    dir: PathBuf,
    bin: PathBuf,
}

impl ManagedCluster {
    /// Finds the server binaries: `configured`, else the newest
    /// `/usr/lib/postgresql/<major>/bin` that has `initdb`.
    pub fn find_bin_dir(configured: Option<&Path>) -> Result<PathBuf, ClusterError> {
        if let Some(dir) = configured {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return Ok(dir.to_owned());
            }
            return Err(ClusterError::NoBinaries { looked: dir.display().to_string() });
        }
        let root = Path::new("/usr/lib/postgresql");
        let mut best: Option<(u32, PathBuf)> = None;
        if let Ok(entries) = fs::read_dir(root) {
            for entry in entries.flatten() {
                let major: Option<u32> = entry.file_name().to_str().and_then(|s| s.parse().ok());
                let bin = entry.path().join("bin");
                if let Some(major) = major {
                    if bin.join("initdb").is_file() && best.as_ref().is_none_or(|(m, _)| major > *m) {
                        best = Some((major, bin));
                    }
                }
            }
        }
        best.map(|(_, b)| b).ok_or_else(|| ClusterError::NoBinaries { looked: "/usr/lib/postgresql/*/bin".into() })
    }

    /// Creates (once) and starts the cluster in `dir`, or adopts it if a server
    /// from an earlier run is still up. Returns once it accepts connections and
    /// the `choir` database exists.
    pub fn start(dir: &Path, bin: &Path) -> Result<ManagedCluster, ClusterError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| ClusterError::Io { path, source }
        };
        let dir_str = dir.display().to_string();
        if dir_str.contains(['\'', '\n', '"']) {
            return Err(ClusterError::BadPath(dir.to_owned()));
        }
        let cluster = ManagedCluster { dir: dir.to_owned(), bin: bin.to_owned() };
        fs::create_dir_all(dir).map_err(io(dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        let run = cluster.socket_dir();
        fs::create_dir_all(&run).map_err(io(&run))?;
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).map_err(io(&run))?;
        if rustix::process::geteuid().is_root() {
            let (uid, gid) = postgres_ids().ok_or(ClusterError::NoPostgresUser)?;
            check_traversable(dir, uid)?;
            for p in [dir.to_owned(), run.clone()] {
                let (u, g) = (rustix::fs::Uid::from_raw(uid), rustix::fs::Gid::from_raw(gid));
                rustix::fs::chown(&p, Some(u), Some(g))
                    .map_err(|e| ClusterError::Io { path: p.clone(), source: e.into() })?;
            }
        }

        let data = cluster.data_dir();
        if !data.join("PG_VERSION").exists() {
            log::info!("initialising the managed PostgreSQL cluster in {}", data.display());
            Cmd::as_user_if_root(bin.join("initdb"), "postgres")
                .args(["-D".into(), data.clone().into_os_string()])
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-instructions"])
                .run()?;
            let conf = data.join("postgresql.conf");
            let mut text = fs::read_to_string(&conf).map_err(io(&conf))?;
            text.push_str("\ninclude_if_exists = 'choir.conf'\n");
            fs::write(&conf, text).map_err(io(&conf))?;
        }
        // Rewritten on every start so a moved home still gets the right socket dir.
        // The include file must be readable by the server's user: written as a
        // fresh file in the data dir through a postgres-owned copy is overkill;
        // the data dir is 0700 postgres, so write it as that user when root.
        let settings = format!(
            "listen_addresses = ''\nport = {PORT}\nunix_socket_directories = '{}'\nunix_socket_permissions = 0700\nlogging_collector = off\nmax_connections = {}\n{SMALL_HOST}",
            run.display(),
            max_connections()
        );
        write_as_server_user(&data.join("choir.conf"), &settings)?;

        if cluster.postmaster_alive() {
            log::info!("adopting the managed PostgreSQL already running in {}", data.display());
        } else {
            cluster.start_server(60)?;
        }
        cluster.ensure_database()?;
        Ok(cluster)
    }

    /// Adopts the cluster in `dir` that another process keeps (`choird
    /// cluster`, a unit of its own): waits at most `timeout` for its pid
    /// file to say a live postmaster accepts connections (that process may
    /// be running initdb or recovery). Never starts or initialises the
    /// server itself, and never connects: the keeper made the `choir`
    /// database before it said READY.
    pub fn adopt(dir: &Path, bin: &Path, timeout: std::time::Duration) -> Result<ManagedCluster, ClusterError> {
        let cluster = ManagedCluster { dir: dir.to_owned(), bin: bin.to_owned() };
        let until = std::time::Instant::now() + timeout;
        while !PidFile::read(dir).is_some_and(|pm| pm.ready && is_postmaster(pm.pid)) {
            if std::time::Instant::now() >= until {
                return Err(ClusterError::Start(format!(
                    "the managed PostgreSQL in {} is kept by another process (`choird cluster`), but it did not accept connections within {} s; see {}",
                    dir.display(),
                    timeout.as_secs(),
                    dir.join("postgres.log").display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // No connection here: the keeper made the database before it said
        // READY, and choird's pool connects next (one connection, not two).
        Ok(cluster)
    }

    /// The directory holding the socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// The connection string of the `choir` database of the cluster in
    /// `dir` and whether its server's socket is there (a running server),
    /// without starting anything (for `choirctl doctor`).
    pub fn probe(dir: &Path) -> (String, bool) {
        let run = dir.join("run");
        let up = run.join(format!(".s.PGSQL.{PORT}")).exists();
        (format!("host={} port={PORT} user=postgres dbname={DATABASE}", run.display()), up)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Connection string for the `choir` database.
    pub fn url(&self) -> String {
        format!("host={} port={PORT} user=postgres dbname={DATABASE}", self.socket_dir().display())
    }

    /// Connection string for an arbitrary database of the cluster.
    pub fn url_for(&self, dbname: &str) -> String {
        format!("host={} port={PORT} user=postgres dbname={dbname}", self.socket_dir().display())
    }

    /// Creates choird's database unless it is there: one connection to it
    /// when it is (no `psql` process, as a restart wants), one to
    /// `postgres` to create it on the first start.
    fn ensure_database(&self) -> Result<(), ClusterError> {
        let connect = |db: &str| {
            let mut config: postgres::Config = self.url_for(db).parse()?;
            config.connect_timeout(std::time::Duration::from_secs(10));
            config.connect(postgres::NoTls)
        };
        match connect(DATABASE) {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&postgres::error::SqlState::INVALID_CATALOG_NAME) => {
                let mut admin = connect("postgres").map_err(|e| ClusterError::Start(e.to_string()))?;
                admin
                    .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
                    .map_err(|e| ClusterError::Start(format!("creating the {DATABASE} database: {e}")))
            }
            Err(e) => Err(ClusterError::Start(e.to_string())),
        }
    }

    /// `pg_ctl start`, waiting at most `timeout_s`. pg_ctl looks whether the
    /// server is up only every 100 ms; the server's own pid file says
    /// `ready` the moment it accepts connections, so this reads that file
    /// every 5 ms while pg_ctl runs on a thread of its own, and returns at
    /// whichever comes first: the file saying ready (for a server started
    /// now, not a stale file a crash left), or pg_ctl's verdict — its
    /// failure carries the last complaints of the server's own log (a full
    /// disk, a stale lock) after pg_ctl's words.
    fn start_server(&self, timeout_s: u32) -> Result<(), ClusterError> {
        let logfile = self.dir.join("postgres.log");
        let mut pg_ctl = Cmd::as_user_if_root(self.bin.join("pg_ctl"), "postgres");
        pg_ctl
            .args(["-D".into(), self.data_dir().into_os_string(), "-l".into(), logfile.clone().into_os_string()])
            .args(["-w", "-t", &timeout_s.to_string(), "start"]);
        let since = std::time::SystemTime::now();
        let (tx, verdict) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name("pg-start".into())
            .spawn(move || {
                let _ = tx.send(pg_ctl.run().map(drop));
            })
            .map_err(|e| ClusterError::Start(format!("cannot start a thread: {e}")))?;
        loop {
            if self.ready_since(since) {
                return Ok(());
            }
            match verdict.recv_timeout(std::time::Duration::from_millis(5)) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => {
                    let said = last_complaints(&logfile, 3);
                    return Err(ClusterError::Start(if said.is_empty() {
                        e.to_string()
                    } else {
                        format!("{e}; the server said: {said}")
                    }));
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(ClusterError::Start("pg_ctl ended without a word".into()))
                }
            }
        }
    }

    /// Whether the data directory's pid file says a postmaster started at
    /// or after `since` (less two seconds, as pg_ctl allows for clock
    /// granularity) accepts connections, and that postmaster is alive.
    fn ready_since(&self, since: std::time::SystemTime) -> bool {
        let Some(pm) = PidFile::read(&self.dir) else { return false };
        let since = since.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        pm.ready && pm.started + 2 >= since && is_postmaster(pm.pid)
    }

    /// Stops the server (fast shutdown: active sessions are ended, data is safe).
    pub fn stop(&self) -> Result<(), ClusterError> {
        self.pg_ctl_stop("fast")
    }

    /// Stops the server without a checkpoint (crash-like; recovery on next start).
    pub fn stop_immediate(&self) -> Result<(), ClusterError> {
        self.pg_ctl_stop("immediate")
    }

    /// Restarts the server crash-like (`pg_ctl restart -m immediate`): every
    /// connection breaks at once, and recovery runs before it accepts new ones.
    pub fn restart_immediate(&self) -> Result<(), ClusterError> {
        let logfile = self.dir.join("postgres.log");
        Cmd::as_user_if_root(self.bin.join("pg_ctl"), "postgres")
            .args(["-D".into(), self.data_dir().into_os_string(), "-l".into(), logfile.into_os_string()])
            .args(["-m", "immediate", "-w", "-t", "60", "restart"])
            .run()?;
        Ok(())
    }

    /// Whether the postmaster named in the data directory's pid file runs
    /// (no connection made: a connection forks a backend).
    pub fn postmaster_alive(&self) -> bool {
        PidFile::read(&self.dir).is_some_and(|pm| is_postmaster(pm.pid))
    }

    /// The pid of the postmaster the pid file of the cluster in `dir`
    /// names, if that process runs (for benchmarks counting the cluster's
    /// processes).
    pub fn postmaster_pid(dir: &Path) -> Option<u32> {
        PidFile::read(dir).map(|pm| pm.pid).filter(|pid| is_postmaster(*pid))
    }

    /// Starts the server again after it stopped under choird (killed, or
    /// died): `pg_ctl start`, waiting at most 20 s. When it does not start,
    /// the error carries the last complaints of the server's own log (a full
    /// disk, a stale lock) after pg_ctl's words.
    pub fn start_again(&self) -> Result<(), ClusterError> {
        self.start_server(20)
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), ClusterError> {
        Cmd::as_user_if_root(self.bin.join("pg_ctl"), "postgres")
            .args(["-D".into(), self.data_dir().into_os_string()])
            .args(["-m", mode, "-w", "-t", "60", "stop"])
            .run()?;
        Ok(())
    }
}

/// What the data directory's `postmaster.pid` says: the postmaster's pid
/// (line 1), when it started (line 3, seconds since the epoch) and whether
/// it accepts connections (line 8, `ready`).
struct PidFile {
    pid: u32,
    started: u64,
    ready: bool,
}

impl PidFile {
    /// The pid file of the cluster in `dir`, if there is one that parses.
    fn read(dir: &Path) -> Option<PidFile> {
        let text = fs::read_to_string(dir.join("data").join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        Some(PidFile {
            pid: lines.first()?.trim().parse().ok()?,
            started: lines.get(2).and_then(|l| l.trim().parse().ok()).unwrap_or(0),
            ready: lines.get(7).is_some_and(|s| s.trim() == "ready"),
        })
    }
}

/// Whether `pid` is alive, not a zombie, and a PostgreSQL process (not a
/// reused pid).
fn is_postmaster(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let (head, rest) = stat.rsplit_once(')').unwrap_or_default();
    let comm = head.split_once('(').map(|(_, c)| c).unwrap_or_default();
    !rest.trim_start().starts_with('Z') && (comm.starts_with("postgres") || comm.starts_with("postmaster"))
}

/// The last `n` FATAL, PANIC or ERROR lines of the server's log (its end
/// only: at most 64 KiB read), joined, each cut to 300 characters.
fn last_complaints(log: &Path, n: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = fs::File::open(log) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut tail = Vec::new();
    let _ = f.take(64 * 1024).read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    let mut found: Vec<String> = text
        .lines()
        .rev()
        .filter(|l| l.contains("FATAL:") || l.contains("PANIC:") || l.contains("ERROR:"))
        .take(n)
        .map(|l| l.chars().take(300).collect())
        .collect();
    found.reverse();
    found.join(" / ")
}

/// Writes a file inside the data directory, as the server's user when root.
fn write_as_server_user(path: &Path, content: &str) -> Result<(), ClusterError> {
    fs::write(path, content).map_err(|e| ClusterError::Io { path: path.to_owned(), source: e })?;
    if rustix::process::geteuid().is_root() {
        let (uid, gid) = postgres_ids().ok_or(ClusterError::NoPostgresUser)?;
        rustix::fs::chown(path, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
            .map_err(|e| ClusterError::Io { path: path.to_owned(), source: e.into() })?;
    }
    Ok(())
}

/// uid and gid of the `postgres` user, from `/etc/passwd`.
fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() > 3 && f[0] == "postgres").then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Checks that user `uid` (not root, not the owner of choird's files) can
/// traverse every ancestor of `dir`.
fn check_traversable(dir: &Path, uid: u32) -> Result<(), ClusterError> {
    let mut cur = dir.parent();
    while let Some(d) = cur {
        if let Ok(meta) = fs::metadata(d) {
            let mode = meta.mode() & 0o7777;
            let ok = if meta.uid() == uid { mode & 0o100 != 0 } else { mode & 0o001 != 0 };
            if !ok {
                return Err(ClusterError::NotTraversable { dir: d.to_owned(), mode });
            }
        }
        cur = d.parent();
    }
    Ok(())
}
