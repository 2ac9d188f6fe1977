//! The log manager (R-CTL-3). Every record — choird's own (through the `log`
//! facade, [`facade`]) and every line an agent writes ([`lines`]) — becomes
//! one JSON object per line in `logs/choird.log` or `logs/<agent>.log`,
//! written by one writer thread. A file that reaches its size limit is moved
//! to `logs/archive/` and compressed there (gzip) by a second thread; old
//! archives go by age and by total size ([`files`]). [`query`] reads it all
//! back for `choirctl logs`, archives included, and follows it live.
//!
//! **Invariants.** A thread that logs never blocks on the disk: choird's own
//! records go through a bounded channel with `try_send` (what does not fit
//! is counted and the count written as soon as there is room); an agent's
//! output is read by a thread of its own, which waits when the writer is
//! behind, so a flooding agent is slowed, not its records dropped. The
//! agents share one channel: while one floods, every agent's reader waits
//! its turn (their records are slowed too, never dropped). The two
//! channels are separate, so an agent's flood cannot crowd out choird's own
//! records. Records reach a file in the order the writer took them, and a reader sees
//! each written record exactly once: a snapshot (last record, size of each
//! live file) and a follower's registration are taken under the lock the
//! writer holds while it writes.

pub mod facade;
pub mod files;
pub mod lines;
pub mod query;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use choir_common::admin::LogRecord;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use parking_lot::Mutex;

/// The name of choird's own log stream (and file, `choird.log`); no agent may
/// have this id.
pub const CHOIRD: &str = "choird";
/// choird's own records that may wait for the writer; past it a record is
/// dropped and counted. A bounded channel allocates and writes every slot
/// up front (16 bytes each, boxed entries), so this is paid from the start:
/// 64 KiB (at 16 Ki slots, the two channels were half a megabyte of
/// choird's heap). The writer takes up to 1,024 of each
/// channel per write.
const OWN_QUEUE: usize = 4 * 1024;
/// Agents' records that may wait for the writer; past it an agent's reader
/// thread waits (nothing is dropped): 32 KiB.
const AGENT_QUEUE: usize = 2 * 1024;
/// Records a follower may lag behind before it is cut off.
const FOLLOW_QUEUE: usize = 4 * 1024;
/// Followers at once.
pub const MAX_FOLLOWERS: usize = 16;

pub use files::Limits;

/// The current time as records carry it (RFC 3339, UTC, microseconds).
pub fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// One queued record and the stream (file) it belongs to.
struct Entry {
    stream: String,
    record: LogRecord,
}

/// What a reader takes under the writer's lock and the archive lock: each
/// live file (open, so a later rotation does not move it away) and how far
/// it was written, and the names in the archive (a listing no compression
/// or deletion was changing).
#[derive(Debug)]
pub struct Snapshot {
    /// Each live file (by stream), open for reading, and its size then.
    pub live: BTreeMap<String, (std::fs::File, u64)>,
    /// The archive's file names then.
    pub archives: Vec<String>,
}

/// A live follower: records written after its snapshot, as they are written.
pub struct Follower {
    /// The records; disconnected when the follower fell too far behind.
    pub rx: Receiver<Arc<(String, LogRecord)>>,
    /// The snapshot it started from.
    pub snapshot: Snapshot,
}

/// State the writer changes under the lock.
struct Writer {
    live: files::LiveFiles,
    followers: Vec<Sender<Arc<(String, LogRecord)>>>,
}

/// The manager: cheap to share; one per process.
pub struct LogManager {
    dir: PathBuf,
    own: Sender<Box<Entry>>,
    agents: Sender<Box<Entry>>,
    dropped_own: AtomicU64,
    dropped_agents: AtomicU64,
    writer: Mutex<Writer>,
    /// Held while the archive directory changes (a compressed file replaces
    /// its original, retention deletes) and while a reader lists it.
    archive_lock: Arc<Mutex<()>>,
    limits: Mutex<Limits>,
    archiver: Sender<files::Job>,
    flushes: Sender<Sender<()>>,
}

static GLOBAL: OnceLock<Arc<LogManager>> = OnceLock::new();

/// The files of `dir` as they are now, for a reader while no choird writes
/// them (`choird logs`, which `choirctl logs` runs when choird is down).
pub fn snapshot_of_files(dir: &Path) -> Snapshot {
    snapshot_at(dir, files::LiveFiles::new(dir).sizes())
}

fn snapshot_at(dir: &Path, sizes: BTreeMap<String, u64>) -> Snapshot {
    let mut live = BTreeMap::new();
    for (stream, size) in sizes {
        if let Ok(f) = std::fs::File::open(files::live_path(dir, &stream)) {
            live.insert(stream, (f, size));
        }
    }
    let archives = std::fs::read_dir(dir.join("archive"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    Snapshot { live, archives }
}

/// The process's manager for `logs_dir`, started on first use (later calls
/// return the first one, whatever directory they name).
pub fn global(logs_dir: &Path) -> Arc<LogManager> {
    GLOBAL.get_or_init(|| LogManager::start(logs_dir)).clone()
}

impl LogManager {
    /// Starts the writer and archiver threads for `dir` (created if missing).
    pub fn start(dir: &Path) -> Arc<LogManager> {
        let _ = std::fs::create_dir_all(dir.join("archive"));
        // Boxed: a bounded channel allocates and writes every slot up front,
        // so its memory is capacity × slot size from the start (unboxed
        // entries made these two 2.5 MB each, half of choird's heap).
        let (own, own_rx) = bounded(OWN_QUEUE);
        let (agents, agents_rx) = bounded(AGENT_QUEUE);
        let (archiver, archive_rx) = bounded(64);
        let (flushes, flush_rx) = bounded(64);
        let me = Arc::new(LogManager {
            dir: dir.to_owned(),
            own,
            agents,
            dropped_own: AtomicU64::new(0),
            dropped_agents: AtomicU64::new(0),
            writer: Mutex::new(Writer { live: files::LiveFiles::new(dir), followers: Vec::new() }),
            archive_lock: Arc::default(),
            limits: Mutex::new(Limits::default()),
            archiver,
            flushes,
        });
        let weak = Arc::downgrade(&me);
        let spawned = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer_loop(&weak, &own_rx, &agents_rx, &flush_rx));
        if let Err(e) = spawned {
            eprintln!("choird: cannot start the log writer: {e}");
        }
        let (adir, weak, lock) = (dir.to_owned(), Arc::downgrade(&me), me.archive_lock.clone());
        let spawned = std::thread::Builder::new().name("log-archiver".into()).spawn(move || {
            for job in archive_rx {
                if let files::Job::Sync(done) = job {
                    let _ = done.send(());
                    continue;
                }
                let limits = match weak.upgrade() {
                    Some(m) => *m.limits.lock(),
                    None => return,
                };
                files::archive(&adir, job, &limits, &lock);
            }
        });
        if let Err(e) = spawned {
            eprintln!("choird: cannot start the log archiver: {e}");
        }
        me
    }

    /// The logs directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits (at most `timeout`) until the archiver has done everything asked
    /// of it before (compression, retention).
    pub fn settle(&self, timeout: Duration) -> bool {
        let (tx, rx) = bounded(1);
        self.archiver.send_timeout(files::Job::Sync(tx), timeout).is_ok() && rx.recv_timeout(timeout).is_ok()
    }

    /// Applies new limits (from config); retention runs at once with them.
    pub fn set_limits(&self, limits: Limits) {
        *self.limits.lock() = limits;
        let _ = self.archiver.try_send(files::Job::Retention);
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        *self.limits.lock()
    }

    /// Queues one of choird's own records; never blocks.
    pub fn own(&self, record: LogRecord) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.own.try_send(Box::new(Entry { stream: CHOIRD.to_owned(), record }))
        {
            self.dropped_own.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues a record of `agent`'s output. Called only by the thread that
    /// reads that agent's output, so when the writer is behind it waits: the
    /// agent's own writes block (back-pressure on whoever floods), nothing is
    /// dropped, and no thread serving agents is held.
    pub fn agent(&self, agent: &str, record: LogRecord) {
        if self.agents.send(Box::new(Entry { stream: agent.to_owned(), record })).is_err() {
            self.dropped_agents.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Starts a thread that turns what `agent` writes on `r` (its stdout or
    /// stderr pipe) into records, until end of file; `done` is dropped when
    /// it ends.
    pub fn pump(
        self: &Arc<Self>,
        agent: &str,
        stream: &'static str,
        mut r: impl std::io::Read + Send + 'static,
        done: Sender<()>,
    ) -> std::io::Result<()> {
        let (me, agent) = (self.clone(), agent.to_owned());
        std::thread::Builder::new().name(format!("out-{agent}")).spawn(move || {
            let _done = done;
            let mut splitter = lines::LineSplitter::default();
            let mut emit = |l: String| me.agent(&agent, lines::agent_record(&agent, stream, &l, now()));
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => splitter.push(&buf[..n], &mut emit),
                }
            }
            splitter.flush(&mut emit);
        })?;
        Ok(())
    }

    /// Waits (at most `timeout`) until everything queued before this call is
    /// in its file.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = bounded(1);
        self.flushes.send_timeout(tx, timeout).is_ok() && rx.recv_timeout(timeout).is_ok()
    }

    /// How far each live file is written, for a reader.
    pub fn snapshot(&self) -> Snapshot {
        let w = self.writer.lock();
        self.snapshot_locked(&w)
    }

    fn snapshot_locked(&self, w: &Writer) -> Snapshot {
        let _archive = self.archive_lock.lock();
        snapshot_at(&self.dir, w.live.sizes())
    }

    /// Registers a follower: everything written after its snapshot reaches
    /// it. Refused when [`MAX_FOLLOWERS`] follow already.
    pub fn follow(&self) -> Option<Follower> {
        let mut w = self.writer.lock();
        if w.followers.len() >= MAX_FOLLOWERS {
            return None;
        }
        let (tx, rx) = bounded(FOLLOW_QUEUE);
        w.followers.push(tx);
        let snapshot = self.snapshot_locked(&w);
        Some(Follower { rx, snapshot })
    }

    /// Writes a batch (the writer thread only).
    fn write(&self, batch: Vec<Entry>) {
        let limits = *self.limits.lock();
        let mut w = self.writer.lock();
        let mut rotated = Vec::new();
        for e in &batch {
            let mut line = serde_json::to_vec(&e.record).unwrap_or_default();
            line.push(b'\n');
            match w.live.append(&e.stream, &line, limits.max_file_bytes) {
                Ok(Some(moved)) => rotated.push(moved),
                Ok(None) => {}
                Err(err) => eprintln!("choird: cannot write logs/{}.log: {err}", e.stream),
            }
        }
        let shared: Vec<_> = batch.into_iter().map(|e| Arc::new((e.stream, e.record))).collect();
        w.followers.retain(|f| shared.iter().all(|r| f.try_send(r.clone()).is_ok()));
        drop(w);
        for moved in rotated {
            if self.archiver.try_send(files::Job::Compress(moved)).is_err() {
                // The archiver is behind: the file stays uncompressed in the
                // archive until its next pass, which compresses leftovers.
            }
        }
    }

    /// Records for the lines dropped since the last call.
    fn dropped_records(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        for (counter, what) in [(&self.dropped_own, "choird"), (&self.dropped_agents, "agents'")] {
            let n = counter.swap(0, Ordering::Relaxed);
            if n > 0 {
                out.push(Entry {
                    stream: CHOIRD.to_owned(),
                    record: LogRecord {
                        ts: now(),
                        level: "WARN".into(),
                        component: "choird::logs".into(),
                        agent: None,
                        msg: format!("{n} of {what} log records were dropped: the log writer fell behind"),
                    },
                });
            }
        }
        out
    }
}

/// What the writer thread woke up for.
enum Got {
    Entry(Box<Entry>),
    Flush(Sender<()>),
    Closed,
}

fn writer_loop(
    me: &std::sync::Weak<LogManager>,
    own: &Receiver<Box<Entry>>,
    agents: &Receiver<Box<Entry>>,
    flushes: &Receiver<Sender<()>>,
) {
    loop {
        let got = crossbeam_channel::select! {
            recv(own) -> e => e.map_or(Got::Closed, Got::Entry),
            recv(agents) -> e => e.map_or(Got::Closed, Got::Entry),
            recv(flushes) -> f => f.map_or(Got::Closed, Got::Flush),
        };
        let Some(m) = me.upgrade() else { return };
        // Choird's own records first, then agents', up to a bounded batch.
        let mut batch = m.dropped_records();
        let mut flush = Vec::new();
        match got {
            Got::Entry(e) => batch.push(*e),
            Got::Flush(f) => flush.push(f),
            Got::Closed => return,
        }
        batch.extend(own.try_iter().take(1024).map(|e| *e));
        batch.extend(agents.try_iter().take(1024).map(|e| *e));
        m.write(batch);
        flush.extend(flushes.try_iter());
        if !flush.is_empty() {
            // What was queued before a flush was asked is in the channels
            // now: write exactly that much, then answer.
            let mut rest: Vec<Entry> = own.try_iter().take(own.len()).map(|e| *e).collect();
            rest.extend(agents.try_iter().take(agents.len()).map(|e| *e));
            m.write(rest);
            for f in flush {
                let _ = f.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(agent: Option<&str>, msg: String) -> LogRecord {
        LogRecord { ts: now(), level: "INFO".into(), component: "test".into(), agent: agent.map(str::to_owned), msg }
    }

    fn disk_use(dir: &Path) -> u64 {
        let mut total = 0;
        for d in [dir.to_owned(), dir.join("archive")] {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                total += e.metadata().map(|m| if m.is_file() { m.len() } else { 0 }).unwrap_or(0);
            }
        }
        total
    }

    #[test]
    fn a_flood_rotates_compresses_and_stays_under_the_total_keeping_the_newest() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = tmp.path().join("logs");
        let m = LogManager::start(&dir);
        let limits = Limits { max_file_bytes: 20_000, max_total_bytes: 200_000, max_age: Duration::from_secs(3600) };
        m.set_limits(limits);
        m.own(record(None, "choird started".into()));
        let pad = "x".repeat(150);
        for i in 0..20_000 {
            m.agent("a1", record(Some("a1"), format!("flood {i:05} {pad}")));
            if i % 5000 == 0 {
                m.own(record(Some("a1"), format!("agent a1: checkpoint {i}")));
            }
        }
        assert!(m.flush(Duration::from_secs(10)));
        assert!(m.settle(Duration::from_secs(30)));
        let used = disk_use(&dir);
        assert!(used <= limits.max_total_bytes, "{used} bytes on disk");
        let archives: Vec<String> = std::fs::read_dir(dir.join("archive"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(archives.iter().any(|a| a.starts_with("a1.") && a.ends_with(".log.gz")), "{archives:?}");
        assert!(!archives.iter().any(|a| a.ends_with(".log")), "left uncompressed: {archives:?}");
        // What is kept is a contiguous run of the newest records, ending at
        // the last one: nothing within retention is missing.
        let filter = query::Filter { agent: Some("a1".into()), max_rank: 5, ..query::Filter::default() };
        let page = query::read(&dir, &m.snapshot(), &filter, 1_000_000);
        let floods: Vec<u32> =
            page.records.iter().filter_map(|r| r.msg.strip_prefix("flood ")?.get(..5)?.parse().ok()).collect();
        assert!(
            floods.len() > 1000,
            "only {} kept (first {:?}) of {} records; archives {archives:?}; {used} bytes",
            floods.len(),
            floods.first(),
            page.records.len()
        );
        assert_eq!(floods.last(), Some(&19_999));
        assert!(floods.windows(2).all(|w| w[1] == w[0] + 1), "a gap in what was kept");
        // The daemon's own records are not what the agent's flood cost.
        let checkpoints = page.records.iter().filter(|r| r.msg.starts_with("agent a1: checkpoint")).count();
        assert_eq!(checkpoints, 4);
        let own = query::read(&dir, &m.snapshot(), &query::Filter { max_rank: 5, ..Default::default() }, 100);
        assert!(own.records.iter().any(|r| r.msg == "choird started"));
    }

    #[test]
    fn a_follower_sees_each_record_after_its_snapshot_once() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let m = LogManager::start(&tmp.path().join("logs"));
        m.own(record(None, "before".into()));
        assert!(m.flush(Duration::from_secs(5)));
        let f = m.follow().unwrap_or_else(|| panic!("no follower"));
        let filter = query::Filter { max_rank: 5, ..Default::default() };
        let before = query::read(m.dir(), &f.snapshot, &filter, 100);
        m.own(record(None, "after".into()));
        let got = f.rx.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.1.msg, "after");
        assert_eq!(before.records.iter().map(|r| r.msg.as_str()).collect::<Vec<_>>(), ["before"]);
        // The follower limit holds.
        let extra: Vec<_> = (0..MAX_FOLLOWERS).map(|_| m.follow()).collect();
        assert!(extra.last().is_some_and(Option::is_none));
    }
}
