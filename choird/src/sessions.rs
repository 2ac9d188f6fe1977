//! Agent slots, leases and rate buckets: which agents run, their sessions,
//! what has been handed to them, and who waits for their answers.
//!
//! Everything here sits behind one mutex with one condition variable
//! (`changed`, which long-polling HEARTBEATs and stopping admins wait on).
//!
//! **Invariant:** no I/O happens while the mutex is held — by construction:
//! the guard never leaves this module, every operation is a method that
//! locks, changes or copies plain data and returns it, and no method takes
//! a callback. A slow database or engine can never stall authentication or
//! another agent.
//! **Invariant (11):** at most one session per agent is live; a start while
//! one is live is refused ([`Sessions::begin_start`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use choir_common::admin::AgentSummary;
use choir_common::ids::AgentId;
use choir_common::rpc::{InboundMessage, ReportStatusRequest};
use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use crate::http::{Caller, ListenerKind};

/// The lease lapses when no HEARTBEAT arrives for this long.
pub const LEASE_TTL: Duration = Duration::from_secs(60);
/// Agent RPC rate limit: sustained requests per second, per agent and per
/// class (verbs, edge model calls, core model calls), so core jobs working
/// hard never slow the user-facing lane down; bursts of twice that.
const RATE_PER_S: f64 = 200.0;
/// HEARTBEATs have their own, larger bucket: every tool result waits for
/// one (replicate before acknowledging), so they come as fast as tools end;
/// concurrent lanes share one, and a slow choird makes batches larger, not
/// more frequent.
const HEARTBEAT_PER_S: f64 = 1000.0;

/// What a rate-limited request is, for its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateClass {
    /// One of the eight verbs, but HEARTBEAT.
    Verb = 0,
    /// A model call of the edge lane.
    EdgeModel = 1,
    /// A model call of a core job.
    CoreModel = 2,
    /// HEARTBEAT (replication, answers, the long-poll).
    Heartbeat = 3,
}

/// Lifecycle phase of an agent, as choird sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// No live session.
    #[default]
    Stopped,
    /// Started, waiting for INIT_HELLO.
    Starting,
    /// INIT_HELLO done.
    Running,
    /// Asked to stop, not gone yet.
    Stopping,
}

impl Phase {
    /// The word shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stopped => "stopped",
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
        }
    }
}

/// Quick crashes in a row (each within a minute of its start, see
/// `HEALTHY_AFTER`) after which an agent is no longer restarted: a crash
/// loop (a full disk, a broken image, a bad permission) ends, explained,
/// instead of repeating whatever the agent did before it crashed.
pub const MAX_QUICK_CRASHES: u32 = 5;

/// What [`Sessions::begin_restart`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restart {
    /// Restart, after the backoff for this many crashes in a row.
    After(u32),
    /// Not restarted: the crash loop is over (why, for the operator).
    GaveUp(String),
    /// The agent is not known.
    NotWanted,
}

/// A token bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
    rate: f64,
    burst: f64,
}

impl Bucket {
    fn new(rate: f64) -> Bucket {
        Bucket { tokens: 2.0 * rate, at: Instant::now(), rate, burst: 2.0 * rate }
    }

    /// Takes one token, or says how long until one is available.
    fn take(&mut self) -> Result<(), Duration> {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// What runs an agent's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instance {
    /// A child process (process runtime).
    Process {
        /// Its pid.
        pid: u32,
    },
    /// A container (docker runtime).
    Container {
        /// Its id.
        id: String,
        /// Its image.
        image: String,
    },
}

impl Instance {
    /// What it is, for the sessions table: `pid 123`, `container 0123456789ab`.
    pub fn label(&self) -> String {
        match self {
            Instance::Process { pid } => format!("pid {pid}"),
            Instance::Container { id, .. } => format!("container {}", &id[..12.min(id.len())]),
        }
    }
}

/// A live lease.
struct Session {
    id: i64,
    token_sha256: [u8; 32],
    instance: Option<Instance>,
    started: Instant,
    last_seen: Instant,
    /// Highest message id handed to this session.
    delivered_upto: u64,
    /// The agent's wake count and `delivered_upto` when a pending-messages
    /// query last found every pending message and they were handed out:
    /// while both are unchanged no message can be pending (every message
    /// is stored before the wake it causes), so a long-poll waits without
    /// asking PostgreSQL again. Cleared when a long-poll ends without
    /// news ([`Sessions::look_again`]): a message whose wake never came
    /// (its commit's acknowledgement lost, so its sender never woke the
    /// agent) is still found within one long-poll period.
    looked: Option<(u64, u64)>,
    /// How many long-polls said the agent had not received messages handed
    /// out (logged at the 1st, 2nd, 4th, 8th …: a hostile agent that says
    /// so on every poll does not flood the log).
    handed_again: u64,
    stop: bool,
    terminated: bool,
    /// Why the agent said it ended itself (TERMINATE_SELF), told with its exit.
    said: Option<String>,
    /// Its lapsed lease has been acted on.
    reaped: bool,
    buckets: [Bucket; 4],
}

impl Session {
    fn new(id: i64, token_sha256: [u8; 32], instance: Option<Instance>, delivered_upto: u64) -> Session {
        Session {
            id,
            token_sha256,
            instance,
            started: Instant::now(),
            last_seen: Instant::now(),
            delivered_upto,
            looked: None,
            handed_again: 0,
            stop: false,
            terminated: false,
            said: None,
            reaped: false,
            buckets: [
                Bucket::new(RATE_PER_S),
                Bucket::new(RATE_PER_S),
                Bucket::new(RATE_PER_S),
                Bucket::new(HEARTBEAT_PER_S),
            ],
        }
    }

    fn describe(&self) -> String {
        match &self.instance {
            Some(Instance::Container { id: c, .. }) => {
                format!("session {}, container {}", self.id, &c[..12.min(c.len())])
            }
            Some(Instance::Process { pid }) => format!("session {}, pid {pid}", self.id),
            None => format!("session {}", self.id),
        }
    }
}

/// What a waiting chat request hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatUpdate {
    /// The answer so far (of the current model step).
    Partial(String),
    /// The answer, or why there will be none now.
    Done(Result<String, String>),
}

#[derive(Default)]
struct AgentSlot {
    phase: Phase,
    /// Whether the operator wants it running (a crashed container is restarted).
    desired: bool,
    /// Consecutive failed starts or early crashes, for the restart backoff.
    crashes: u32,
    /// Bumped by every `agent start`: a supervisor serves one generation and
    /// quits when a newer one exists, so two never restart the same agent.
    generation: u64,
    session: Option<Session>,
    last_session: Option<i64>,
    last_exit: Option<String>,
    status: Option<ReportStatusRequest>,
    replicated_seq: u64,
    /// Chat requests waiting for the answer to a message id.
    waiters: HashMap<u64, Sender<ChatUpdate>>,
    /// Bumped before each HEARTBEAT carrying replies stores them (before its
    /// commit): a chat that reads the same count before its message is
    /// stored and when its waiter is registered knows no answer to it can
    /// have been stored unseen (`Sessions::wait_for_answer`).
    replies_begun: u64,
    /// Bumped whenever a long-poll of this agent should look again.
    wake: u64,
    /// Decisions on its proposals wait to be handed over.
    decisions_due: bool,
    /// Scheduled firings may wait to be offered.
    firings_due: bool,
    /// Lanes the operator asked to cancel, not yet handed over.
    cancels: Vec<String>,
    /// The config version its last HEARTBEAT said it runs with.
    config_version: Option<u64>,
}

/// Why an RPC was not authenticated.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthFailure {
    /// No session has this token.
    UnknownToken,
    /// The token is another agent's (on an agent's own socket).
    WrongSocket,
    /// Over the rate limit of its class: retry after this long.
    RateLimited {
        /// The agent.
        agent: AgentId,
        /// The bucket's rate.
        rate: f64,
        /// When a token is available again.
        retry_after: Duration,
    },
}

/// How a start ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// It reported RUNNING.
    Running,
    /// It stopped first (with its last exit, when known).
    Exited(Option<String>),
    /// There is no such agent.
    Unknown,
    /// It did not finish starting in time.
    TimedOut,
}

/// What the supervisor of a docker agent sees.
#[derive(Debug, Clone)]
pub enum Watch {
    /// A newer `agent start` has its own supervisor.
    Superseded,
    /// The current container: (container id, session, started at).
    Container(String, i64, Instant),
    /// No container right now (between restarts).
    None,
}

/// Where a long-polling HEARTBEAT stands.
#[derive(Debug, Default)]
pub struct PollState {
    /// The session is gone (the caller's lease ended).
    pub ended: bool,
    /// choird asks the agent to stop.
    pub stop: bool,
    /// Highest message id already handed out.
    pub after: u64,
    /// Decisions are due (taken: the caller must hand them over or give the flag back).
    pub decisions_due: bool,
    /// Firings may be due (taken: the caller offers them or gives the flag back).
    pub firings_due: bool,
    /// Cancel requests (taken).
    pub cancels: Vec<String>,
    /// The wake counter seen (to wait for a change).
    pub wake: u64,
    /// Nothing woke this agent since every pending message was handed out:
    /// no message can be pending, the query may be skipped.
    pub nothing_new: bool,
}

/// The table of agent slots.
#[derive(Default)]
pub struct Sessions {
    table: Mutex<BTreeMap<AgentId, AgentSlot>>,
    changed: Condvar,
}

impl Sessions {
    /// A table with a slot for each of `ids`.
    pub fn new<'a>(ids: impl IntoIterator<Item = &'a AgentId>) -> Sessions {
        let s = Sessions::default();
        s.ensure(ids);
        s
    }

    /// Makes a slot for each of `ids` (agents added to config).
    pub fn ensure<'a>(&self, ids: impl IntoIterator<Item = &'a AgentId>) {
        let mut t = self.table.lock();
        for id in ids {
            t.entry(id.clone()).or_default();
        }
    }

    fn notify(&self) {
        self.changed.notify_all();
    }

    // ----- authentication -------------------------------------------------

    /// The live session whose token has this sha256, checked against the
    /// listener (an agent's own socket serves only that agent) and charged to
    /// its rate bucket; refreshes its lease.
    pub fn authenticate(
        &self,
        kind: &ListenerKind,
        digest: &[u8; 32],
        class: RateClass,
    ) -> Result<Caller, AuthFailure> {
        let mut t = self.table.lock();
        // Comparing digests, not tokens: timing reveals nothing useful about the token.
        let found = t.iter_mut().find_map(|(id, slot)| {
            let s = slot.session.as_mut()?;
            (&s.token_sha256 == digest && !s.terminated).then_some((id.clone(), s))
        });
        let Some((agent, session)) = found else { return Err(AuthFailure::UnknownToken) };
        if let ListenerKind::Agent(owner) = kind {
            if *owner != agent {
                return Err(AuthFailure::WrongSocket);
            }
        }
        let bucket = &mut session.buckets[class as usize];
        if let Err(retry_after) = bucket.take() {
            return Err(AuthFailure::RateLimited { agent, rate: bucket.rate, retry_after });
        }
        session.last_seen = Instant::now();
        Ok(Caller { agent, session: session.id })
    }

    /// Whether `session` is the agent's live session.
    pub fn is_current(&self, agent: &AgentId, session: i64) -> bool {
        self.table.lock().get(agent).and_then(|s| s.session.as_ref()).is_some_and(|s| s.id == session)
    }

    /// Sessions whose lease lapsed (no RPC for [`LEASE_TTL`]); each is
    /// reported once.
    pub fn stale(&self) -> Vec<(AgentId, i64)> {
        let mut t = self.table.lock();
        t.iter_mut()
            .filter_map(|(id, slot)| {
                let s = slot.session.as_mut()?;
                let lapsed = s.last_seen.elapsed() > LEASE_TTL && !s.reaped;
                s.reaped |= lapsed;
                lapsed.then(|| (id.clone(), s.id))
            })
            .collect()
    }

    // ----- start, stop, supervise ------------------------------------------

    /// Claims the agent for a start: refused (with what runs, and the phase)
    /// unless it is stopped; else it is wanted, starting, and a new generation.
    pub fn begin_start(&self, id: &AgentId) -> Result<(), (String, &'static str)> {
        let mut t = self.table.lock();
        let slot = t.entry(id.clone()).or_default();
        if slot.phase != Phase::Stopped {
            let what = slot.session.as_ref().map(Session::describe).unwrap_or_else(|| "restarting".into());
            return Err((what, slot.phase.as_str()));
        }
        slot.phase = Phase::Starting;
        slot.desired = true;
        slot.crashes = 0;
        slot.generation += 1;
        Ok(())
    }

    /// A start failed: no longer wanted; stopped unless a session lives.
    pub fn start_failed(&self, id: &AgentId, why: &str) {
        {
            let mut t = self.table.lock();
            if let Some(slot) = t.get_mut(id) {
                slot.desired = false;
                if slot.session.is_none() {
                    slot.phase = Phase::Stopped;
                }
                slot.last_exit.get_or_insert_with(|| format!("failed to start: {why}"));
            }
        }
        self.notify();
    }

    /// Waits until a just-started agent is running, or says why not.
    pub fn wait_ready(&self, id: &AgentId, timeout: Duration) -> Ready {
        let deadline = Instant::now() + timeout;
        let mut t = self.table.lock();
        loop {
            match t.get(id).map(|s| (s.phase, s.session.is_some(), s.last_exit.clone())) {
                Some((Phase::Running, _, _)) => return Ready::Running,
                Some((Phase::Starting, true, _)) => {}
                Some((_, _, exit)) => return Ready::Exited(exit),
                None => return Ready::Unknown,
            }
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                return Ready::TimedOut;
            }
        }
    }

    /// A new session (lease) for a launch, handed `processed` messages so far.
    pub fn open(&self, id: &AgentId, session: i64, digest: [u8; 32], processed: u64) {
        let mut t = self.table.lock();
        let slot = t.entry(id.clone()).or_default();
        slot.last_session = Some(session);
        slot.phase = Phase::Starting;
        slot.session = Some(Session::new(session, digest, None, processed));
    }

    /// Records what runs the current session.
    pub fn set_instance(&self, id: &AgentId, instance: Instance) {
        if let Some(s) = self.table.lock().get_mut(id).and_then(|slot| slot.session.as_mut()) {
            s.instance = Some(instance);
        }
    }

    /// The launch of a session failed: no session, stopped.
    pub fn launch_failed(&self, id: &AgentId, why: &str) {
        {
            let mut t = self.table.lock();
            if let Some(slot) = t.get_mut(id) {
                slot.session = None;
                slot.phase = Phase::Stopped;
                slot.last_exit = Some(format!("failed to start: {why}"));
            }
        }
        self.notify();
    }

    /// An adopted container's session (after a choird restart).
    pub fn adopt(&self, id: &AgentId, session: i64, digest: [u8; 32], instance: Instance, processed: u64) {
        let mut t = self.table.lock();
        let slot = t.entry(id.clone()).or_default();
        slot.phase = Phase::Running;
        slot.desired = true;
        slot.last_session = Some(session);
        slot.session = Some(Session::new(session, digest, Some(instance), processed));
    }

    /// The generation of the agent's latest start.
    pub fn generation(&self, id: &AgentId) -> u64 {
        self.table.lock().get(id).map(|s| s.generation).unwrap_or(0)
    }

    /// What a supervisor of `generation` watches.
    pub fn watch(&self, id: &AgentId, generation: u64) -> Watch {
        let t = self.table.lock();
        match t.get(id) {
            Some(slot) if slot.generation == generation => match slot.session.as_ref() {
                Some(Session { id: sid, started, instance: Some(Instance::Container { id: cid, .. }), .. }) => {
                    Watch::Container(cid.clone(), *sid, *started)
                }
                _ => Watch::None,
            },
            _ => Watch::Superseded,
        }
    }

    /// The agent ran long enough: its restart backoff starts over.
    pub fn healthy(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.crashes = 0;
        }
    }

    /// Whether the agent should still run under `generation`.
    pub fn wanted(&self, id: &AgentId, generation: u64) -> bool {
        self.table.lock().get(id).is_some_and(|s| s.desired && s.generation == generation)
    }

    /// Counts a crash and marks the agent starting; the crash count. Past
    /// [`MAX_QUICK_CRASHES`] quick crashes in a row the agent is not
    /// restarted: it is stopped, no longer wanted, and its last exit says
    /// why ([`Restart::GaveUp`] carries the text).
    pub fn begin_restart(&self, id: &AgentId) -> Restart {
        let mut t = self.table.lock();
        let Some(slot) = t.get_mut(id) else { return Restart::NotWanted };
        slot.crashes += 1;
        if slot.crashes > MAX_QUICK_CRASHES {
            let last = slot.last_exit.clone().unwrap_or_else(|| "no reason recorded".into());
            let why = format!(
                "not restarted: it failed {} times in a row within a minute of starting; the last time: {last}",
                slot.crashes
            );
            slot.last_exit = Some(why.clone());
            slot.desired = false;
            if slot.session.is_none() {
                slot.phase = Phase::Stopped;
            }
            drop(t);
            self.notify();
            return Restart::GaveUp(why);
        }
        slot.phase = Phase::Starting;
        Restart::After(slot.crashes)
    }

    /// Waits until `deadline` unless the agent stops being wanted (or choird
    /// shuts down) first; true when it should be restarted now.
    pub fn wait_backoff(&self, id: &AgentId, generation: u64, deadline: Instant, shutting_down: &AtomicBool) -> bool {
        let mut t = self.table.lock();
        let wanted =
            |t: &BTreeMap<AgentId, AgentSlot>| t.get(id).is_some_and(|s| s.desired && s.generation == generation);
        while wanted(&t) && !shutting_down.load(Ordering::SeqCst) {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
        if !wanted(&t) || shutting_down.load(Ordering::SeqCst) {
            if let Some(slot) = t.get_mut(id).filter(|s| s.session.is_none()) {
                slot.phase = Phase::Stopped;
            }
            return false;
        }
        true
    }

    /// The instance of a session ended. Waiting chats are told; returns
    /// whether it was the current session (so the caller records its end).
    pub fn ended(&self, id: &AgentId, session: i64, reason: &str, may_restart: bool) -> bool {
        let ended = {
            let mut t = self.table.lock();
            match t.get_mut(id) {
                Some(slot) if slot.session.as_ref().is_some_and(|s| s.id == session) => {
                    // What the agent said of its end, with how it ended.
                    let reason = match slot.session.as_ref().and_then(|s| s.said.as_deref()) {
                        Some(said) if said != "stopped" => format!("{reason}; the agent said: {said}"),
                        _ => reason.to_owned(),
                    };
                    let reason = reason.as_str();
                    // An exit before the operator's start finished is that
                    // start failing (`agent start` reports it), not a crash
                    // to restart from: restarting raced the failing start,
                    // which then found the agent "already starting".
                    let failed_first_start = slot.phase == Phase::Starting && slot.crashes == 0;
                    let will_restart =
                        slot.desired && may_restart && slot.phase != Phase::Stopping && !failed_first_start;
                    slot.session = None;
                    slot.phase = if will_restart { Phase::Starting } else { Phase::Stopped };
                    if !will_restart {
                        slot.desired = false;
                    }
                    slot.last_exit = Some(reason.to_owned());
                    let later = if will_restart { "; it is being restarted and will answer" } else { "" };
                    for (_, w) in slot.waiters.drain() {
                        let _ = w.send(ChatUpdate::Done(Err(format!(
                            "agent {id} stopped before answering ({reason}){later}"
                        ))));
                    }
                    slot.wake += 1;
                    true
                }
                _ => false,
            }
        };
        self.notify();
        ended
    }

    /// Asks the agent to stop (through its HEARTBEAT); no longer wanted.
    /// `false` when it is not running at all.
    pub fn request_stop(&self, id: &AgentId) -> bool {
        let r = {
            let mut t = self.table.lock();
            let slot = t.entry(id.clone()).or_default();
            let was_desired = std::mem::replace(&mut slot.desired, false);
            match slot.session.as_mut() {
                Some(session) => {
                    session.stop = true;
                    slot.phase = Phase::Stopping;
                    slot.wake += 1;
                    true
                }
                None if was_desired => {
                    // Between restarts: wanting it stopped is enough.
                    slot.phase = Phase::Stopped;
                    true
                }
                None => false,
            }
        };
        self.notify();
        r
    }

    /// Ends the lease at once (the token stops working) and asks the agent to
    /// stop; whether a session was live.
    pub fn revoke(&self, id: &AgentId) -> bool {
        let live = {
            let mut t = self.table.lock();
            match t.get_mut(id) {
                Some(slot) => {
                    slot.desired = false;
                    match slot.session.as_mut() {
                        Some(s) => {
                            s.terminated = true;
                            s.stop = true;
                            slot.phase = Phase::Stopping;
                            slot.wake += 1;
                            true
                        }
                        None => false,
                    }
                }
                None => false,
            }
        };
        self.notify();
        live
    }

    /// TERMINATE_SELF: the token stops working at once; the agent's reason
    /// is told with its exit (cut to 300 characters: the agent's words).
    pub fn terminate(&self, id: &AgentId, reason: &str) {
        if let Some(s) = self.table.lock().get_mut(id).and_then(|slot| slot.session.as_mut()) {
            s.terminated = true;
            s.stop = true;
            s.said = Some(choir_common::text::one_line(&reason.chars().take(300).collect::<String>()));
        }
        self.notify();
    }

    /// What runs the agent's session now.
    pub fn instance(&self, id: &AgentId) -> Option<Instance> {
        self.table.lock().get(id).and_then(|s| s.session.as_ref()).and_then(|s| s.instance.clone())
    }

    /// Waits until the agent has no session; whether it has none.
    pub fn wait_stopped(&self, id: &AgentId, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut t = self.table.lock();
        loop {
            if t.get(id).is_none_or(|s| s.session.is_none()) {
                return true;
            }
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                return t.get(id).is_none_or(|s| s.session.is_none());
            }
        }
    }

    /// Agents with a live session: (id, whether it is a container).
    pub fn live(&self) -> Vec<(AgentId, bool)> {
        self.table
            .lock()
            .iter()
            .filter_map(|(id, s)| {
                let container = matches!(s.session.as_ref()?.instance, Some(Instance::Container { .. }));
                Some((id.clone(), container))
            })
            .collect()
    }

    /// Whether the agent is starting or running (takes messages).
    pub fn accepting(&self, id: &AgentId) -> bool {
        self.table.lock().get(id).is_some_and(|s| matches!(s.phase, Phase::Starting | Phase::Running))
    }

    // ----- the verbs --------------------------------------------------------

    /// INIT_HELLO: what choird holds of the agent; decisions its predecessor
    /// missed become due.
    pub fn hello(&self, id: &AgentId, replicated_seq: u64, processed: u64) {
        let mut t = self.table.lock();
        if let Some(slot) = t.get_mut(id) {
            slot.replicated_seq = replicated_seq;
            slot.decisions_due = true;
            slot.firings_due = true;
            if let Some(s) = slot.session.as_mut() {
                s.delivered_upto = processed;
            }
        }
    }

    /// The config version the agent's HEARTBEAT said it runs with.
    pub fn config_seen(&self, id: &AgentId, version: u64) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.config_version = Some(version);
        }
    }

    /// Records a replication ack and hands answers and partial answers to
    /// the chats waiting for them; returns the acknowledged head.
    pub fn replicated(
        &self,
        id: &AgentId,
        acked: Option<u64>,
        answers: &[(u64, String)],
        partials: &[(u64, String)],
    ) -> u64 {
        let mut t = self.table.lock();
        let Some(slot) = t.get_mut(id) else { return 0 };
        if let Some(seq) = acked {
            slot.replicated_seq = seq;
        }
        for (message, text) in answers {
            if let Some(w) = slot.waiters.remove(message) {
                let _ = w.send(ChatUpdate::Done(Ok(text.clone())));
            }
        }
        for (message, text) in partials {
            if let Some(w) = slot.waiters.get(message) {
                let _ = w.send(ChatUpdate::Partial(text.clone()));
            }
        }
        slot.replicated_seq
    }

    /// Where a long-poll of `session` stands; takes the due decisions and
    /// cancel requests (when `receive`). `received`: the highest message id
    /// the agent says it has taken delivery of; below the hand-out position
    /// (an answer to an earlier poll was lost on the way), the position goes
    /// back to it, so the messages after it are handed out again.
    pub fn poll(&self, id: &AgentId, session: i64, receive: bool, received: Option<u64>) -> PollState {
        let mut t = self.table.lock();
        let Some(slot) = t.get_mut(id) else { return PollState { ended: true, ..PollState::default() } };
        let wake = slot.wake;
        let Some(s) = slot.session.as_mut().filter(|s| s.id == session) else {
            return PollState { ended: true, ..PollState::default() };
        };
        if let Some(received) = received.filter(|r| receive && *r < s.delivered_upto) {
            s.handed_again += 1;
            if s.handed_again.is_power_of_two() {
                log::warn!(
                    "agent {id}: messages {}..={} were handed out but not received; handing them out again ({} time(s) this session)",
                    received + 1,
                    s.delivered_upto,
                    s.handed_again
                );
            }
            s.delivered_upto = received;
            s.looked = None;
        }
        let (after, stop) = (s.delivered_upto, s.stop);
        if stop || !receive {
            return PollState { stop, after, wake, ..PollState::default() };
        }
        PollState {
            ended: false,
            stop,
            after,
            nothing_new: s.looked == Some((wake, after)),
            decisions_due: std::mem::take(&mut slot.decisions_due),
            firings_due: std::mem::take(&mut slot.firings_due),
            cancels: std::mem::take(&mut slot.cancels),
            wake,
        }
    }

    /// Marks that the agent may have scheduled firings to take, and wakes its poll.
    pub fn firing_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.firings_due = true;
            slot.wake += 1;
        }
        self.notify();
    }

    /// Gives back a firings flag that could not be served.
    pub fn firings_still_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.firings_due = true;
        }
    }

    /// Gives back a decisions flag that could not be served.
    pub fn decisions_still_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.decisions_due = true;
        }
    }

    /// Hands out `messages` to `session`: keeps those not handed out yet (a
    /// concurrent poll may have taken some) and moves the mark past them.
    /// `every_one_at`: the wake count read before the query that found
    /// them, when it found every pending message (fewer than its limit);
    /// until the count moves, [`PollState::nothing_new`] tells polls no
    /// message can be pending.
    pub fn hand_out(
        &self,
        id: &AgentId,
        session: i64,
        mut messages: Vec<InboundMessage>,
        every_one_at: Option<u64>,
    ) -> Option<Vec<InboundMessage>> {
        let mut t = self.table.lock();
        let s = t.get_mut(id)?.session.as_mut().filter(|s| s.id == session)?;
        messages.retain(|m| m.id > s.delivered_upto);
        if let Some(last) = messages.last() {
            s.delivered_upto = last.id;
        }
        if let Some(wake) = every_one_at {
            s.looked = Some((wake, s.delivered_upto));
        }
        Some(messages)
    }

    /// A long-poll of `session` ended without news: the next one queries
    /// again whatever the wake count (see `Session::looked`).
    pub fn look_again(&self, id: &AgentId, session: i64) {
        if let Some(s) =
            self.table.lock().get_mut(id).and_then(|slot| slot.session.as_mut()).filter(|s| s.id == session)
        {
            s.looked = None;
        }
    }

    /// Waits until the agent's wake counter moves past `seen`, or `deadline`.
    pub fn wait_wake(&self, id: &AgentId, seen: u64, deadline: Instant) {
        let mut t = self.table.lock();
        while t.get(id).is_some_and(|s| s.wake == seen) && Instant::now() < deadline {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
    }

    /// REPORT_STATUS: keeps the latest report; the first RUNNING report of
    /// the current session marks it running.
    pub fn report(&self, id: &AgentId, session: i64, req: ReportStatusRequest) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            let current = slot.session.as_ref().is_some_and(|s| s.id == session);
            if current && slot.phase == Phase::Starting && req.session_state == "RUNNING" {
                slot.phase = Phase::Running;
            }
            slot.status = Some(req);
        }
        self.notify();
    }

    /// Wakes the agent's long-poll (a message, a decision or a cancel waits).
    pub fn wake(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.wake += 1;
        }
        self.notify();
    }

    /// Wakes every long-poll (shutdown, a new config version).
    pub fn wake_all(&self) {
        for slot in self.table.lock().values_mut() {
            slot.wake += 1;
        }
        self.notify();
    }

    /// Marks that the agent has a decision to receive and wakes its poll.
    pub fn decision_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.decisions_due = true;
            slot.wake += 1;
        }
        self.notify();
    }

    /// Queues a cancel request for a running agent; `false` when it is not running.
    pub fn cancel(&self, id: &AgentId, lane: &str) -> Option<bool> {
        let r = {
            let mut t = self.table.lock();
            let slot = t.get_mut(id)?;
            if slot.session.is_none() {
                Some(false)
            } else {
                slot.cancels.push(lane.to_owned());
                slot.wake += 1;
                Some(true)
            }
        };
        self.notify();
        r
    }

    // ----- chats ------------------------------------------------------------

    /// Registers a chat waiting for the answer to `message` and wakes the
    /// agent. `seen` is [`Sessions::replies_begun`] read before the message
    /// was stored. Returns whether the answer may already be stored, unseen
    /// by [`Sessions::replicated`] (the caller then reads it from the store):
    /// true when a HEARTBEAT with replies began storing since `seen`, or the
    /// agent has no slot. When false, no answer to `message` had begun
    /// storing (it cannot begin before the message is stored), so the one
    /// that will be stored passes through `replicated`, which finds this
    /// waiter — the chat needs no query of its own.
    pub fn wait_for_answer(&self, id: &AgentId, message: u64, tx: Sender<ChatUpdate>, seen: Option<u64>) -> bool {
        let missed = match self.table.lock().get_mut(id) {
            Some(slot) => {
                slot.waiters.insert(message, tx);
                slot.wake += 1;
                seen != Some(slot.replies_begun)
            }
            None => true,
        };
        self.notify();
        missed
    }

    /// Which of `messages` chats of `id` still wait for.
    pub fn waiting_among(&self, id: &AgentId, messages: &[u64]) -> Vec<u64> {
        match self.table.lock().get(id) {
            Some(slot) => messages.iter().copied().filter(|m| slot.waiters.contains_key(m)).collect(),
            None => Vec::new(),
        }
    }

    /// Counts a HEARTBEAT about to store replies; call it before their
    /// transaction begins (see [`Sessions::wait_for_answer`]).
    pub fn storing_replies(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.replies_begun += 1;
        }
    }

    /// How many HEARTBEATs with replies began storing them (`None`: no slot);
    /// read before a chat's message is stored.
    pub fn replies_begun(&self, id: &AgentId) -> Option<u64> {
        self.table.lock().get(id).map(|slot| slot.replies_begun)
    }

    /// Forgets a chat's waiter (answered already, or given up).
    pub fn forget_waiter(&self, id: &AgentId, message: u64) {
        if let Some(s) = self.table.lock().get_mut(id) {
            s.waiters.remove(&message);
        }
    }

    // ----- status -----------------------------------------------------------

    /// The summary of one agent (`None`: no slot).
    pub fn summary(&self, id: &AgentId, runtime: &str) -> Option<AgentSummary> {
        self.table.lock().get(id).map(|slot| summary(id, slot, runtime))
    }

    /// Summaries of the agents `keep` selects, or that have a live session.
    pub fn summaries(&self, runtime: &str, keep: impl Fn(&AgentId) -> bool) -> Vec<AgentSummary> {
        let t = self.table.lock();
        t.iter()
            .filter(|(id, slot)| keep(id) || slot.session.is_some())
            .map(|(id, s)| summary(id, s, runtime))
            .collect()
    }
}

fn summary(id: &AgentId, slot: &AgentSlot, runtime: &str) -> AgentSummary {
    let s = slot.session.as_ref();
    AgentSummary {
        id: id.to_string(),
        runtime: runtime.to_owned(),
        state: slot.phase.as_str().to_owned(),
        session_id: s.map(|s| s.id).or(slot.last_session),
        pid: s.and_then(|s| match &s.instance {
            Some(Instance::Process { pid }) => Some(*pid),
            _ => None,
        }),
        container: s.and_then(|s| match &s.instance {
            Some(Instance::Container { id, .. }) => Some(id.clone()),
            _ => None,
        }),
        image: s.and_then(|s| match &s.instance {
            Some(Instance::Container { image, .. }) => Some(image.clone()),
            _ => None,
        }),
        last_heartbeat_ms: s.map(|s| s.last_seen.elapsed().as_millis() as u64),
        replicated_seq: slot.replicated_seq,
        session_state: slot.status.as_ref().map(|s| s.session_state.clone()),
        lanes: slot.status.as_ref().map(|s| s.lanes.clone()).unwrap_or_default(),
        last_exit: slot.last_exit.clone(),
        config_version: s.and(slot.config_version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_reads_its_answer_from_the_store_only_if_replies_began_storing_since_its_message() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        let (tx, rx) = crossbeam_channel::unbounded();
        // Nothing stored since the message: the answer will pass through
        // `replicated`, which finds the waiter.
        let seen = sessions.replies_begun(&a);
        assert!(!sessions.wait_for_answer(&a, 1, tx.clone(), seen));
        sessions.replicated(&a, None, &[(1, "one".to_owned())], &[]);
        assert_eq!(rx.try_recv().unwrap(), ChatUpdate::Done(Ok("one".to_owned())));
        // A HEARTBEAT with replies began storing between the message and the
        // waiter: its answer may be in the store already.
        let seen = sessions.replies_begun(&a);
        sessions.storing_replies(&a);
        assert!(sessions.wait_for_answer(&a, 2, tx.clone(), seen));
        // An agent without a slot, or a count read before its slot existed:
        // always read.
        let b = AgentId::parse("beta").unwrap();
        assert!(sessions.wait_for_answer(&b, 3, tx.clone(), sessions.replies_begun(&b)));
        sessions.ensure([&b]);
        assert!(sessions.wait_for_answer(&b, 4, tx, None));
    }

    /// Hostile: the reason an agent gives in TERMINATE_SELF is its own
    /// words, shown to the operator with its exit: cut to 300 characters,
    /// newlines and bidi controls escaped (one line in any terminal); the
    /// agent's plain "stopped" adds nothing.
    #[test]
    fn the_reason_an_agent_gives_for_its_end_is_cut_and_kept_on_one_line() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        let exit_of = |said: &str, session: i64| {
            sessions.open(&a, session, [0; 32], 0);
            sessions.terminate(&a, said);
            sessions.ended(&a, session, "process exited (exit status: 1)", false);
            sessions.summary(&a, "process").and_then(|s| s.last_exit).unwrap()
        };
        let hostile = format!("disk full\nFAKE: all good\u{202e}{}", "x".repeat(10_000));
        let exit = exit_of(&hostile, 1);
        assert!(exit.starts_with("process exited (exit status: 1); the agent said: disk full"), "{exit}");
        assert!(!exit.contains('\n') && !exit.contains('\u{202e}'), "{exit}");
        assert!(exit.chars().count() < 400, "cut: {} characters", exit.chars().count());
        // Negative control: the same words without hostile characters come through as they are.
        assert_eq!(
            exit_of("commit log failure: ENOSPC", 2),
            "process exited (exit status: 1); the agent said: commit log failure: ENOSPC"
        );
        assert_eq!(exit_of("stopped", 3), "process exited (exit status: 1)");
    }

    /// A crash loop ends: MAX_QUICK_CRASHES restarts are allowed, the next
    /// is refused with the last exit in its reason, and the agent is no
    /// longer wanted; a healthy run starts the count over.
    #[test]
    fn restarts_stop_after_max_quick_crashes_and_a_healthy_run_starts_the_count_over() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        sessions.begin_start(&a).unwrap();
        let generation = sessions.generation(&a);
        for n in 1..=MAX_QUICK_CRASHES {
            assert_eq!(sessions.begin_restart(&a), Restart::After(n));
        }
        sessions.healthy(&a);
        for n in 1..=MAX_QUICK_CRASHES {
            assert_eq!(sessions.begin_restart(&a), Restart::After(n));
        }
        match sessions.begin_restart(&a) {
            Restart::GaveUp(why) => assert!(why.starts_with("not restarted: it failed 6 times"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(!sessions.wanted(&a, generation));
        assert_eq!(sessions.begin_restart(&AgentId::parse("nobody").unwrap()), Restart::NotWanted);
    }

    fn message(id: u64) -> InboundMessage {
        InboundMessage { id, conversation: "c".into(), sender: "admin".into(), text: "hi".into(), earlier: false }
    }

    #[test]
    fn a_long_poll_skips_the_pending_query_only_while_nothing_woke_the_agent_since_all_were_handed_out() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        sessions.open(&a, 7, [0; 32], 0);
        // A new session has never looked: it queries.
        let poll = sessions.poll(&a, 7, true, None);
        assert!(!poll.nothing_new);
        // The query found every pending message (fewer than its limit):
        // until something wakes the agent, its next poll need not ask.
        let out = sessions.hand_out(&a, 7, vec![message(3)], Some(poll.wake)).unwrap();
        assert_eq!(out.len(), 1);
        let again = sessions.poll(&a, 7, true, None);
        assert!(again.nothing_new);
        assert_eq!(again.after, 3);
        // A message stored since wakes the agent: the next poll queries.
        sessions.wake(&a);
        assert!(!sessions.poll(&a, 7, true, None).nothing_new);
        // A query that hit its limit (more may wait) sets no mark.
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(4)], None).unwrap();
        assert!(!sessions.poll(&a, 7, true, None).nothing_new);
        // The mark holds the hand-out position too: a concurrent poll
        // handing out more after the mark was set means look again.
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        assert!(sessions.poll(&a, 7, true, None).nothing_new);
        sessions.hand_out(&a, 7, vec![message(5)], None).unwrap();
        assert!(!sessions.poll(&a, 7, true, None).nothing_new);
        // A long-poll that ended without news clears the mark: a message
        // whose wake was lost is found by the next poll.
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        assert!(sessions.poll(&a, 7, true, None).nothing_new);
        sessions.look_again(&a, 7);
        assert!(!sessions.poll(&a, 7, true, None).nothing_new);
        // A new session (a restart) starts without a mark.
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        sessions.open(&a, 8, [0; 32], 5);
        assert!(!sessions.poll(&a, 8, true, None).nothing_new);
    }

    #[test]
    fn a_long_poll_whose_answer_was_lost_is_handed_its_messages_again() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        sessions.open(&a, 7, [0; 32], 2);
        let poll = sessions.poll(&a, 7, true, Some(2));
        let out = sessions.hand_out(&a, 7, vec![message(3), message(4)], Some(poll.wake)).unwrap();
        assert_eq!(out.len(), 2);
        // The agent took delivery: the next poll goes on after them, and
        // need not ask PostgreSQL.
        let poll = sessions.poll(&a, 7, true, Some(4));
        assert_eq!((poll.after, poll.nothing_new), (4, true));
        // The answer to the poll that handed out 5 was lost: the agent
        // still says 4, so 5 is looked for and handed out again.
        sessions.hand_out(&a, 7, vec![message(5)], Some(poll.wake)).unwrap();
        let poll = sessions.poll(&a, 7, true, Some(4));
        assert_eq!((poll.after, poll.nothing_new), (4, false));
        let again = sessions.hand_out(&a, 7, vec![message(5)], Some(poll.wake)).unwrap();
        assert_eq!(again.iter().map(|m| m.id).collect::<Vec<_>>(), [5]);
        // Not said, or said by a HEARTBEAT that takes no delivery: the
        // position stays.
        assert_eq!(sessions.poll(&a, 7, true, None).after, 5);
        assert_eq!(sessions.poll(&a, 7, false, Some(1)).after, 5);
        // A position above the hand-out (the agent's word alone) moves nothing.
        assert_eq!(sessions.poll(&a, 7, true, Some(90)).after, 5);
        // Hostile: said on every poll, each one is handed its messages
        // again (its own, no other agent's), and the log hears of it at
        // the 1st, 2nd, 4th … time only.
        for _ in 0..1000 {
            let poll = sessions.poll(&a, 7, true, Some(2));
            assert_eq!((poll.after, poll.nothing_new), (2, false));
            sessions.hand_out(&a, 7, vec![message(3), message(4), message(5)], Some(poll.wake)).unwrap();
        }
        let again = sessions.table.lock().get(&a).and_then(|slot| slot.session.as_ref()).map(|s| s.handed_again);
        assert_eq!(again, Some(1001));
    }
}
