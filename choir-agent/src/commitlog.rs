//! The agent's commit log (R-ARB-3): an append-only file of hash-chained JSON
//! lines under the agent's state directory, replicated to choird, which holds
//! the authoritative copy.
//!
//! Events are normalised before they are sealed, so that choird can always
//! store them: NUL characters are written as `\u0000` and strings that would
//! push an event over `MAX_EVENT_BYTES` are elided (the event's `escaped`
//! field says which was done).
//!
//! **Invariant:** an event returned by [`CommitLog::append`] is on disk.
//! **Invariant:** with [`Durability::Replicated`] (what agents run with), an
//! event returned by [`DurableLog::append`] is stored by choird: a result
//! reaches a model only once choird holds its record, so the local file (which
//! a shell in the workspace can edit) is only a cache.
//! **Invariant:** on open, only a torn *last* line (no trailing newline: a crash
//! mid-write) is dropped; any other damage refuses to start, naming the
//! sequence number, so a tampered log is never silently accepted.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use choir_common::commit::{verify_extension, ChainHead, CommitEvent, EventKind, Outcome};
use serde_json::Value;

/// The log cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Reading or writing the file failed.
    #[error("commit log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// A line is damaged or breaks the chain.
    #[error("commit log {path} is corrupt at sequence {seq}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The offending sequence number (or the line number when unparseable).
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// Another agent process holds the log (a previous instance still exiting).
    #[error(
        "commit log {path} is in use by another choir-agent (lock {lock} stayed held); at most one instance per agent"
    )]
    Busy {
        /// The file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The local log and choird's copy disagree.
    #[error("commit log {path} forked from choird's copy at sequence {seq}: refusing to continue")]
    Forked {
        /// The file.
        path: PathBuf,
        /// Where they disagree.
        seq: u64,
    },
    /// choird has not stored the event (it has been unreachable or refusing
    /// for longer than the fail-closed time, or refused this event's
    /// content). Its result must not reach a model; the agent carries on.
    #[error("event {seq} is not stored by choird: {why}")]
    NotReplicated {
        /// The event.
        seq: u64,
        /// Why.
        why: String,
    },
}

impl LogError {
    /// Whether the lane can carry on (the log itself is sound; choird is
    /// not storing it right now).
    pub fn is_transient(&self) -> bool {
        matches!(self, LogError::NotReplicated { .. })
    }
}

/// An event before it is numbered and chained.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Proposing lane.
    pub lane: String,
    /// Kind.
    pub kind: EventKind,
    /// Canonical tool name.
    pub tool: String,
    /// The model's call id.
    pub call_id: Option<String>,
    /// The inbound message whose turn this is.
    pub turn: Option<u64>,
    /// Active skill.
    pub skill: Option<String>,
    /// Active skill state.
    pub state: Option<String>,
    /// Input, secrets redacted.
    pub input: Value,
    /// Outcome.
    pub outcome: Outcome,
    /// Result returned to the model.
    pub result: Value,
    /// Execution time.
    pub duration_us: u64,
    /// A call of a `side_effect: external` tool that was executed (choird
    /// audits each such event it stores).
    pub external: bool,
}

/// The open log.
pub struct CommitLog {
    /// Held for the life of the log: one writer per state directory.
    _lock: File,
    path: PathBuf,
    file: File,
    head: ChainHead,
    /// Events choird has not acknowledged yet, in order.
    unacked: VecDeque<CommitEvent>,
    acked: u64,
    /// Everything read at open, kept until [`CommitLog::take_turns_after`].
    loaded: Vec<CommitEvent>,
}

/// What opening the log found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Events read.
    pub events: u64,
    /// Bytes of a torn last record that were truncated.
    pub truncated_bytes: u64,
}

impl CommitLog {
    /// Opens (creating) `dir/commit.log`, verifies it and truncates a torn tail.
    /// Waits up to 10 s for a previous instance to release the directory.
    pub fn open(dir: &Path) -> Result<(CommitLog, OpenReport), LogError> {
        CommitLog::open_waiting(dir, std::time::Duration::from_secs(10))
    }

    /// [`CommitLog::open`] with a chosen wait for the directory lock.
    pub fn open_waiting(dir: &Path, wait: std::time::Duration) -> Result<(CommitLog, OpenReport), LogError> {
        let path = dir.join("commit.log");
        let io = |source| LogError::Io { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = lock_dir(dir, &path, wait)?;
        let mut file = private(OpenOptions::new().read(true).append(true).create(true)).open(&path).map_err(io)?;
        // A log an older agent made readable to others is made private.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(io)?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io)?;

        let complete = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut report = OpenReport { events: 0, truncated_bytes: (data.len() - complete) as u64 };
        if report.truncated_bytes > 0 {
            log::warn!("commit log {}: dropping a torn last record ({} bytes)", path.display(), report.truncated_bytes);
            file.set_len(complete as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        let mut events = Vec::new();
        for (i, line) in data[..complete].split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let ev: CommitEvent = serde_json::from_slice(line).map_err(|e| LogError::Corrupt {
                path: path.clone(),
                seq: serde_json::from_slice::<Value>(line)
                    .ok()
                    .and_then(|v| v.get("seq").and_then(Value::as_u64))
                    .unwrap_or(i as u64 + 1),
                reason: format!("unreadable record: {e}"),
            })?;
            events.push(ev);
        }
        let head = match events.first() {
            None => ChainHead::genesis(),
            Some(first) => {
                let base = ChainHead { seq: first.seq.saturating_sub(1), hash: first.prev_hash.clone() };
                verify_extension(&base, &events).map_err(|e| LogError::Corrupt {
                    path: path.clone(),
                    seq: match e {
                        choir_common::commit::ChainError::BadHash { seq }
                        | choir_common::commit::ChainError::Gap { seq, .. }
                        | choir_common::commit::ChainError::Fork { seq, .. } => seq,
                    },
                    reason: e.to_string(),
                })?
            }
        };
        report.events = events.len() as u64;
        file.seek(SeekFrom::End(0)).map_err(io)?;
        let unacked = events.iter().cloned().collect();
        Ok((CommitLog { _lock: lock, path, file, head, unacked, acked: 0, loaded: events }, report))
    }

    /// Reconciles with choird's replicated head (from INIT_HELLO): events choird
    /// already holds are dropped from the replication queue; a local log that
    /// fell behind choird's (lost or wiped) is set aside and the chain continues
    /// from choird's head; disagreement at a shared position is a fork.
    pub fn reconcile(&mut self, replicated: &ChainHead) -> Result<(), LogError> {
        let local = self.head.clone();
        if local.seq < replicated.seq {
            log::warn!(
                "commit log {} ends at {} but choird holds {}; continuing from choird's copy",
                self.path.display(),
                local.seq,
                replicated.seq
            );
            if local.seq > 0 {
                let aside = self.path.with_extension(format!("log.behind-{}", local.seq));
                std::fs::rename(&self.path, &aside)
                    .map_err(|source| LogError::Io { path: self.path.clone(), source })?;
            }
            self.file = private(OpenOptions::new().read(true).append(true).create(true))
                .open(&self.path)
                .map_err(|source| LogError::Io { path: self.path.clone(), source })?;
            self.head = replicated.clone();
            self.unacked.clear();
        } else if replicated.seq > 0 {
            let ours = if local.seq == replicated.seq {
                Some(local.hash.clone())
            } else {
                self.unacked.iter().find(|e| e.seq == replicated.seq).map(|e| e.hash.clone())
            };
            if ours.as_deref() != Some(replicated.hash.as_str()) {
                return Err(LogError::Forked { path: self.path.clone(), seq: replicated.seq });
            }
        }
        self.ack(replicated.seq);
        Ok(())
    }

    /// Numbers, chains and durably appends an event (write, then fsync).
    pub fn append(&mut self, new: NewEvent) -> Result<CommitEvent, LogError> {
        let ev = self.write(new)?;
        self.file.sync_data().map_err(|source| LogError::Io { path: self.path.clone(), source })?;
        Ok(ev)
    }

    /// Numbers, chains and writes an event, without waiting for the disk:
    /// callers must make it durable ([`DurableLog`] does) before using it.
    fn write(&mut self, mut new: NewEvent) -> Result<CommitEvent, LogError> {
        let escaped = storable_content(&mut new);
        let ev = CommitEvent {
            seq: self.head.seq + 1,
            prev_hash: self.head.hash.clone(),
            ts_ms: now_ms(),
            lane: new.lane,
            kind: new.kind,
            tool: new.tool,
            call_id: new.call_id,
            turn: new.turn,
            skill: new.skill,
            state: new.state,
            input: new.input,
            outcome: new.outcome,
            result: new.result,
            duration_us: new.duration_us,
            escaped,
            external: new.external,
            hash: String::new(),
        }
        .seal();
        let mut line =
            serde_json::to_vec(&ev).map_err(|e| LogError::Io { path: self.path.clone(), source: e.into() })?;
        line.push(b'\n');
        let io = |source| LogError::Io { path: self.path.clone(), source };
        self.file.write_all(&line).map_err(io)?;
        self.head = ChainHead { seq: ev.seq, hash: ev.hash.clone() };
        self.unacked.push_back(ev.clone());
        Ok(ev)
    }

    /// Events not yet acknowledged by choird.
    pub fn unacked(&self) -> Vec<CommitEvent> {
        self.unacked.iter().cloned().collect()
    }

    /// The oldest unacknowledged events, at most `max` of them and `bytes`
    /// serialised bytes (always at least one, when there is one).
    pub fn unacked_batch(&self, max: usize, bytes: usize) -> Vec<CommitEvent> {
        let mut out = Vec::new();
        let mut size = 0;
        for ev in self.unacked.iter().take(max) {
            let n = serde_json::to_vec(ev).map(|v| v.len()).unwrap_or(0);
            if !out.is_empty() && size + n > bytes {
                break;
            }
            size += n;
            out.push(ev.clone());
        }
        out
    }

    /// Replaces the unacknowledged event `seq` with its placeholder (choird
    /// cannot store it). Returns whether there was such an event.
    pub fn quarantine(&mut self, seq: u64, reason: &str) -> bool {
        match self.unacked.iter_mut().find(|e| e.seq == seq) {
            Some(ev) if ev.kind != EventKind::Quarantined => {
                *ev = ev.quarantined(reason);
                true
            }
            _ => false,
        }
    }

    /// Records choird's acknowledgement up to `seq`.
    pub fn ack(&mut self, seq: u64) {
        self.acked = self.acked.max(seq);
        while self.unacked.front().is_some_and(|e| e.seq <= self.acked) {
            self.unacked.pop_front();
        }
    }

    /// The local head.
    pub fn head(&self) -> &ChainHead {
        &self.head
    }

    /// The events of turns (inbound message ids) above `processed`, by turn,
    /// from what was read at open; frees the rest. A restarted lane uses them
    /// to resume an interrupted turn instead of executing its calls again.
    pub fn take_turns_after(&mut self, processed: u64) -> std::collections::HashMap<u64, Vec<CommitEvent>> {
        let mut out: std::collections::HashMap<u64, Vec<CommitEvent>> = std::collections::HashMap::new();
        for ev in std::mem::take(&mut self.loaded) {
            if let Some(turn) = ev.turn.filter(|t| *t > processed) {
                out.entry(turn).or_default().push(ev);
            }
        }
        out
    }

    /// The intents read at open that no `tool_call` of the same lane and
    /// call id follows: calls a crash interrupted after they were announced
    /// (see [`EventKind::Intent`]), oldest first. Call before
    /// [`CommitLog::take_turns_after`], which hands the events over.
    pub fn dangling_intents(&self) -> Vec<CommitEvent> {
        let mut open: Vec<&CommitEvent> = Vec::new();
        for ev in &self.loaded {
            match ev.kind {
                EventKind::Intent => open.push(ev),
                EventKind::ToolCall => {
                    if let Some(i) = open.iter().position(|i| i.lane == ev.lane && i.call_id == ev.call_id) {
                        open.remove(i);
                    }
                }
                _ => {}
            }
        }
        open.into_iter().cloned().collect()
    }

    /// A second handle on the file, for fsync outside the log's lock.
    fn sync_handle(&self) -> Result<File, LogError> {
        self.file.try_clone().map_err(|source| LogError::Io { path: self.path.clone(), source })
    }
}

/// What [`DurableLog::append`] waits for before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The event is fsynced to the local file (group commit). For tests and
    /// benchmarks of the log alone.
    Local,
    /// choird has stored the event (acknowledged it on a HEARTBEAT). The
    /// local file is written, not fsynced: it is a cache.
    Replicated,
}

/// How long a failing replication is tolerated before appends stop waiting
/// and tools are refused, unless the dynamic config says otherwise.
pub const DEFAULT_FAIL_CLOSED: std::time::Duration = std::time::Duration::from_secs(30);

/// The commit log shared by every lane. Appends are written in order under a
/// short lock; then, depending on its [`Durability`], an append waits for one
/// fsync that covers every lane waiting on it (group commit), or for choird
/// to acknowledge a HEARTBEAT that carries every event written so far (one
/// round trip for concurrent lanes).
///
/// **Invariant:** [`DurableLog::append`] returns `Ok` only once the event and
/// every event before it are durable in the chosen sense.
pub struct DurableLog {
    log: parking_lot::Mutex<CommitLog>,
    sync_file: File,
    durability: Durability,
    /// Highest sequence number written to the file.
    written: std::sync::atomic::AtomicU64,
    sync: parking_lot::Mutex<SyncState>,
    synced_cv: parking_lot::Condvar,
    /// fsyncs issued (for benchmarks and status).
    fsyncs: std::sync::atomic::AtomicU64,
    repl: parking_lot::Mutex<ReplState>,
    repl_cv: parking_lot::Condvar,
    /// Wakes the replicator.
    poke: std::sync::OnceLock<crossbeam_channel::Sender<()>>,
}

#[derive(Default)]
struct SyncState {
    /// Highest sequence number known to be on disk.
    synced: u64,
    /// Whether some appender is running fsync right now (the leader).
    syncing: bool,
    /// A failed fsync poisons the log: nothing after it can be trusted.
    failed: Option<String>,
}

/// What the replicator has learned from choird.
struct ReplState {
    /// Highest sequence number choird acknowledged.
    acked: u64,
    /// Events replaced by placeholders, with why.
    quarantined: std::collections::BTreeMap<u64, String>,
    /// Since when replication has been failing, and the last reason.
    failing: Option<(std::time::Instant, String)>,
    /// When an attempt last found choird unavailable (unreachable, or a
    /// refusal worth retrying: its database gone, a rate limit) rather than
    /// refusing the events.
    unavailable_at: Option<std::time::Instant>,
    /// How long failing is tolerated.
    fail_closed: std::time::Duration,
    /// The lease is gone: nothing will ever be acknowledged again.
    closed: Option<String>,
    /// Highest sequence number whose append failed as not replicated (its
    /// result withheld from the model), or the head of an earlier run's
    /// events not yet acknowledged at start; link-reply ships no answer
    /// before choird holds it.
    withheld: u64,
}

impl DurableLog {
    /// Wraps an opened (and reconciled) log, waiting for the local disk.
    pub fn new(log: CommitLog) -> Result<DurableLog, LogError> {
        DurableLog::with_durability(log, Durability::Local)
    }

    /// Wraps an opened (and reconciled) log with the chosen durability.
    pub fn with_durability(log: CommitLog, durability: Durability) -> Result<DurableLog, LogError> {
        let sync_file = log.sync_handle()?;
        let head = log.head().seq;
        let acked = log.acked;
        // Events of an earlier run that choird may not hold yet: a resumed
        // turn shows the model their results, so an answer waits for them
        // as for a withheld result (see `wait_withheld_stored`).
        let withheld = match durability {
            Durability::Replicated if !log.unacked.is_empty() => head,
            _ => 0,
        };
        Ok(DurableLog {
            log: parking_lot::Mutex::new(log),
            sync_file,
            durability,
            written: std::sync::atomic::AtomicU64::new(head),
            sync: parking_lot::Mutex::new(SyncState { synced: head, ..SyncState::default() }),
            synced_cv: parking_lot::Condvar::new(),
            fsyncs: std::sync::atomic::AtomicU64::new(0),
            repl: parking_lot::Mutex::new(ReplState {
                acked,
                quarantined: std::collections::BTreeMap::new(),
                failing: None,
                unavailable_at: None,
                fail_closed: DEFAULT_FAIL_CLOSED,
                closed: None,
                withheld,
            }),
            repl_cv: parking_lot::Condvar::new(),
            poke: std::sync::OnceLock::new(),
        })
    }

    /// Where to poke the replicator after each append (set once).
    pub fn set_poke(&self, poke: crossbeam_channel::Sender<()>) {
        let _ = self.poke.set(poke);
    }

    /// Appends an event and waits until it is durable.
    pub fn append(&self, new: NewEvent) -> Result<CommitEvent, LogError> {
        crate::failpoints::hit("before_append");
        let ev = {
            let mut log = self.log.lock();
            let ev = log.write(new)?;
            self.written.store(ev.seq, std::sync::atomic::Ordering::SeqCst);
            ev
        };
        crate::failpoints::hit("after_write_before_fsync");
        if let Some(p) = self.poke.get() {
            let _ = p.try_send(());
        }
        match self.durability {
            Durability::Local => self.wait_durable(ev.seq)?,
            Durability::Replicated => self.wait_replicated(ev.seq)?,
        }
        crate::failpoints::hit("after_fsync_before_reply");
        Ok(ev)
    }

    /// Waits until choird acknowledged `seq`; fails (and marks `seq`
    /// withheld) when it refused the event, the lease is gone or
    /// replication has failed for the fail-closed time.
    fn wait_replicated(&self, seq: u64) -> Result<(), LogError> {
        let mut st = self.repl.lock();
        let why = loop {
            if let Some(why) = st.quarantined.get(&seq) {
                break format!("choird refused its content ({why})");
            }
            if st.acked >= seq {
                return Ok(());
            }
            if let Some(why) = &st.closed {
                break why.clone();
            }
            if let Some((since, why)) = &st.failing {
                if since.elapsed() >= st.fail_closed {
                    break format!("replication has failed for {} s: {why}", since.elapsed().as_secs());
                }
            }
            self.repl_cv.wait_for(&mut st, std::time::Duration::from_millis(200));
        };
        st.withheld = st.withheld.max(seq);
        Err(LogError::NotReplicated { seq, why })
    }

    /// Waits up to `wait` for choird to hold every event whose result was
    /// withheld ([`LogError::NotReplicated`]): `Ok(true)` once it does (at
    /// once while nothing was withheld), `Ok(false)` if it still does not,
    /// `Err(why)` if it never will (replication closed).
    ///
    /// **Invariant** (what link-reply keeps with it): an answer given after
    /// a withheld result reaches choird only after the events behind that
    /// result, as an answer given after a result the model saw always does
    /// (the append returned only once choird held the event). So choird
    /// never holds an answer without the tool calls it followed, and the
    /// acknowledgement that stores them also ends the fail-closed refusal
    /// before the answer is out.
    pub fn wait_withheld_stored(&self, wait: std::time::Duration) -> Result<bool, String> {
        let deadline = std::time::Instant::now() + wait;
        let mut st = self.repl.lock();
        loop {
            if st.acked >= st.withheld {
                return Ok(true);
            }
            if let Some(why) = &st.closed {
                return Err(why.clone());
            }
            if self.repl_cv.wait_until(&mut st, deadline).timed_out() {
                return Ok(st.acked >= st.withheld);
            }
        }
    }

    /// When a replication attempt last found choird unavailable (see
    /// [`DurableLog::replication_failed`]).
    pub fn last_unavailable(&self) -> Option<std::time::Instant> {
        self.repl.lock().unavailable_at
    }

    /// The highest event an answer waits for ([`DurableLog::wait_withheld_stored`]):
    /// it moves only up, with each result withheld.
    pub fn withheld(&self) -> u64 {
        self.repl.lock().withheld
    }

    fn wait_durable(&self, seq: u64) -> Result<(), LogError> {
        let mut st = self.sync.lock();
        loop {
            if let Some(e) = &st.failed {
                return Err(LogError::Io { path: self.path(), source: std::io::Error::other(e.clone()) });
            }
            if st.synced >= seq {
                return Ok(());
            }
            if st.syncing {
                self.synced_cv.wait(&mut st);
                continue;
            }
            // Become the leader: everything written so far rides on this fsync.
            st.syncing = true;
            let target = self.written.load(std::sync::atomic::Ordering::SeqCst);
            drop(st);
            let result = self.sync_file.sync_data();
            self.fsyncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            st = self.sync.lock();
            st.syncing = false;
            match result {
                Ok(()) => st.synced = st.synced.max(target),
                Err(e) => st.failed = Some(format!("fsync failed: {e}")),
            }
            self.synced_cv.notify_all();
        }
    }

    fn path(&self) -> PathBuf {
        self.log.lock().path.clone()
    }

    /// Events not yet acknowledged by choird.
    pub fn unacked(&self) -> Vec<CommitEvent> {
        self.log.lock().unacked()
    }

    /// The next batch to replicate (see [`CommitLog::unacked_batch`]).
    pub fn unacked_batch(&self, max: usize, bytes: usize) -> Vec<CommitEvent> {
        self.log.lock().unacked_batch(max, bytes)
    }

    /// Whether everything written has been acknowledged.
    pub fn all_acked(&self) -> bool {
        self.log.lock().unacked.is_empty()
    }

    /// How many fsyncs made appends durable so far.
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records choird's acknowledgement: replication works.
    pub fn ack(&self, seq: u64) {
        self.log.lock().ack(seq);
        let mut st = self.repl.lock();
        st.acked = st.acked.max(seq);
        st.failing = None;
        drop(st);
        self.repl_cv.notify_all();
    }

    /// choird cannot store event `seq`: a placeholder goes instead, and the
    /// append waiting for it fails (its result never reaches a model).
    pub fn quarantine(&self, seq: u64, reason: &str) -> bool {
        let replaced = self.log.lock().quarantine(seq, reason);
        if replaced {
            log::error!("event {seq} quarantined: choird cannot store it ({reason}); a placeholder keeps the chain");
            self.repl.lock().quarantined.insert(seq, reason.chars().take(300).collect());
            self.repl_cv.notify_all();
        }
        replaced
    }

    /// A replication attempt failed; `unavailable`: choird could not be
    /// reached or asked for a retry (not a refusal of the events).
    pub fn replication_failed(&self, why: &str, unavailable: bool) {
        let mut st = self.repl.lock();
        let now = std::time::Instant::now();
        let since = st.failing.as_ref().map_or(now, |(t, _)| *t);
        st.failing = Some((since, why.chars().take(300).collect()));
        if unavailable {
            st.unavailable_at = Some(now);
        }
        drop(st);
        self.repl_cv.notify_all();
    }

    /// The lease is gone: nothing waiting will be acknowledged.
    pub fn close_replication(&self, why: &str) {
        self.repl.lock().closed = Some(why.to_owned());
        self.repl_cv.notify_all();
    }

    /// Sets how long failing replication is tolerated.
    pub fn set_fail_closed(&self, d: std::time::Duration) {
        self.repl.lock().fail_closed = d;
        self.repl_cv.notify_all();
    }

    /// `Some(why)` while replication has been failing for longer than the
    /// fail-closed time (tools are refused meanwhile).
    pub fn failed_closed(&self) -> Option<String> {
        let st = self.repl.lock();
        if self.durability == Durability::Local {
            return None;
        }
        match &st.failing {
            Some((since, why)) if since.elapsed() >= st.fail_closed => {
                Some(format!("choird has not stored this agent's log for {} s ({why})", since.elapsed().as_secs()))
            }
            _ => None,
        }
    }

    /// The local head.
    pub fn head(&self) -> ChainHead {
        self.log.lock().head().clone()
    }
}

/// `options` creating a file only its owner reads (mode 0600).
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600)
}

/// Takes `dir/agent.lock` (flock), waiting up to `wait` for a previous
/// instance to finish exiting.
fn lock_dir(dir: &Path, log_path: &Path, wait: std::time::Duration) -> Result<File, LogError> {
    let lock_path = dir.join("agent.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| LogError::Io { path: lock_path.clone(), source })?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(100)),
            Err(_) => return Err(LogError::Busy { path: log_path.to_owned(), lock: lock_path }),
        }
    }
}

/// Strings longer than this are cut when an event would be over the limit.
const ELIDE_KEEP: [usize; 4] = [64 * 1024, 16 * 1024, 4 * 1024, 1024];

/// Makes an event's content storable by choird (see the module doc);
/// returns what was done, for the event's `escaped` field.
fn storable_content(new: &mut NewEvent) -> Option<String> {
    use choir_common::commit::{elide_long_strings, normalize, MAX_EVENT_BYTES};
    let mut done = Vec::new();
    let nul = normalize(&mut new.input) | normalize(&mut new.result);
    if nul {
        done.push("nul");
    }
    let size = |n: &NewEvent| {
        serde_json::to_vec(&n.input).map(|v| v.len()).unwrap_or(0)
            + serde_json::to_vec(&n.result).map(|v| v.len()).unwrap_or(0)
    };
    // Room for the other fields of the event.
    let budget = MAX_EVENT_BYTES - 16 * 1024;
    for keep in ELIDE_KEEP {
        if size(new) <= budget {
            break;
        }
        elide_long_strings(&mut new.input, keep);
        elide_long_strings(&mut new.result, keep);
        if !done.contains(&"elided") {
            done.push("elided");
        }
    }
    if size(new) > budget {
        // Wide rather than long (many short strings): keep a note of its size.
        let note = |v: &Value| serde_json::json!({"elided": true, "bytes": serde_json::to_vec(v).map(|b| b.len()).unwrap_or(0)});
        new.input = note(&new.input);
        new.result = note(&new.result);
    }
    (!done.is_empty()).then(|| done.join(","))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(tool: &str) -> NewEvent {
        NewEvent {
            lane: "edge".into(),
            kind: EventKind::ToolCall,
            tool: tool.into(),
            call_id: None,
            turn: None,
            skill: None,
            state: None,
            input: json!({}),
            outcome: Outcome::Ok,
            result: json!({}),
            duration_us: 1,
            external: false,
        }
    }

    #[test]
    fn an_intent_without_its_outcome_after_it_is_dangling() {
        let dir = tempfile::tempdir().unwrap();
        let mark = |kind: EventKind, lane: &str, id: &str| NewEvent {
            kind,
            lane: lane.into(),
            call_id: Some(id.into()),
            ..ev("x.send")
        };
        {
            let (mut log, _) = CommitLog::open(dir.path()).unwrap();
            // Completed; a call id used again later, interrupted; another
            // lane's call of the same id, completed; an outcome before its
            // intent does not complete it.
            for (kind, lane, id) in [
                (EventKind::Intent, "edge", "c1"),
                (EventKind::ToolCall, "edge", "c1"),
                (EventKind::Intent, "edge", "c1"),
                (EventKind::Intent, "core:a", "c1"),
                (EventKind::ToolCall, "core:a", "c1"),
                (EventKind::ToolCall, "edge", "c2"),
                (EventKind::Intent, "edge", "c2"),
            ] {
                log.append(mark(kind, lane, id)).unwrap();
            }
        }
        let (log, _) = CommitLog::open(dir.path()).unwrap();
        let dangling: Vec<(u64, String)> =
            log.dangling_intents().into_iter().map(|e| (e.seq, e.call_id.unwrap())).collect();
        assert_eq!(dangling, [(3, "c1".to_owned()), (7, "c2".to_owned())]);
    }

    #[test]
    fn regression_an_answer_after_a_restart_waits_for_the_earlier_runs_events() {
        // A restarted agent resumes its turns from its local log, showing
        // the model results of events choird may not hold yet (the earlier
        // run was cut off before replicating them). Its answer used to go
        // at once on link-reply's lane, so choird could hold the answer and
        // refuse the events it rests on (a fork), or store it before them.
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, _) = CommitLog::open(dir.path()).unwrap();
            log.append(ev("a.b")).unwrap();
            log.append(ev("a.c")).unwrap();
        }
        let (log, _) = CommitLog::open(dir.path()).unwrap();
        let log = DurableLog::with_durability(log, Durability::Replicated).unwrap();
        assert_eq!(log.withheld(), 2);
        assert_eq!(log.wait_withheld_stored(std::time::Duration::ZERO), Ok(false));
        log.ack(1);
        assert_eq!(log.wait_withheld_stored(std::time::Duration::ZERO), Ok(false));
        log.ack(2);
        assert_eq!(log.wait_withheld_stored(std::time::Duration::ZERO), Ok(true));
        // Everything acknowledged at start, or a log kept on the local
        // disk only: nothing to wait for.
        drop(log);
        let (mut log, _) = CommitLog::open(dir.path()).unwrap();
        log.ack(2);
        let log = DurableLog::with_durability(log, Durability::Replicated).unwrap();
        assert_eq!(log.withheld(), 0);
        drop(log);
        let (log, _) = CommitLog::open(dir.path()).unwrap();
        assert_eq!(DurableLog::with_durability(log, Durability::Local).unwrap().withheld(), 0);
    }

    #[test]
    fn appends_survive_reopen_and_torn_tails_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, report) = CommitLog::open(dir.path()).unwrap();
            assert_eq!(report, OpenReport::default());
            log.append(ev("a.b")).unwrap();
            log.append(ev("a.c")).unwrap();
        }
        let mut f = OpenOptions::new().append(true).open(dir.path().join("commit.log")).unwrap();
        f.write_all(b"{\"seq\":3,\"prev").unwrap();
        drop(f);
        let (mut log, report) = CommitLog::open(dir.path()).unwrap();
        assert_eq!(report, OpenReport { events: 2, truncated_bytes: 14 });
        assert_eq!(log.head().seq, 2);
        assert_eq!(log.append(ev("a.d")).unwrap().seq, 3);
        drop(log);
        let (log, _) = CommitLog::open(dir.path()).unwrap();
        assert_eq!(log.head().seq, 3);
    }

    #[test]
    fn a_tampered_record_is_refused_with_its_sequence() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, _) = CommitLog::open(dir.path()).unwrap();
            for t in ["a.b", "a.c", "a.d"] {
                log.append(ev(t)).unwrap();
            }
        }
        let path = dir.path().join("commit.log");
        let text = std::fs::read_to_string(&path).unwrap().replacen("\"a.c\"", "\"a.x\"", 1);
        std::fs::write(&path, text).unwrap();
        match CommitLog::open(dir.path()) {
            Err(LogError::Corrupt { seq, .. }) => assert_eq!(seq, 2),
            Err(other) => panic!("wrong error: {other}"),
            Ok(_) => panic!("a tampered log was accepted"),
        }
    }

    #[test]
    fn reconcile_drops_acked_and_detects_forks() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = CommitLog::open(dir.path()).unwrap();
        let first = log.append(ev("a.b")).unwrap();
        log.append(ev("a.c")).unwrap();
        log.reconcile(&ChainHead { seq: 1, hash: first.hash.clone() }).unwrap();
        assert_eq!(log.unacked().iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2]);
        let err = log.reconcile(&ChainHead { seq: 2, hash: "f".repeat(64) }).unwrap_err();
        assert!(matches!(err, LogError::Forked { seq: 2, .. }), "{err}");
    }

    #[test]
    fn a_second_writer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, _) = CommitLog::open(dir.path()).unwrap();
        let wait = std::time::Duration::from_millis(300);
        assert!(matches!(CommitLog::open_waiting(dir.path(), wait), Err(LogError::Busy { .. })));
    }

    #[test]
    fn a_log_behind_choird_continues_from_choird() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = CommitLog::open(dir.path()).unwrap();
        log.reconcile(&ChainHead { seq: 7, hash: "a".repeat(64) }).unwrap();
        let ev8 = log.append(ev("a.b")).unwrap();
        assert_eq!((ev8.seq, ev8.prev_hash.as_str()), (8, "a".repeat(64).as_str()));
        drop(log);
        let (log, _) = CommitLog::open(dir.path()).unwrap();
        assert_eq!(log.head().seq, 8);
    }
}
