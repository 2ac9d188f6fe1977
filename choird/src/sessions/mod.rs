//! Agent slots, leases and rate buckets: which agents run, their sessions,
//! what has been handed to them, and who waits for their answers.
//!
//! Everything here sits behind one mutex. Two kinds of condition variable
//! go with it: each slot's own `woken`, signalled only when that agent's
//! wake counter moves (its long-polling HEARTBEAT waits on it), and the
//! table's `changed`, signalled on the rarer changes that starts, stops and
//! restart back-offs wait for.
//! The table and its types are here; its operations are in one file per
//! facet: [`auth`] (tokens and rate buckets), [`lifecycle`] (start, stop,
//! supervise), [`verbs`] (what the agent's verbs change), [`chats`] (who
//! waits for an answer) and [`status`] (summaries).
//!
//! **Invariant:** no I/O happens while the mutex is held — by construction:
//! the guard never leaves this module and its facet files, every operation is a method that
//! locks, changes or copies plain data and returns it, and no method takes
//! a callback. A slow database or engine can never stall authentication or
//! another agent.
//! **Invariant (11):** at most one session per agent is live; a start while
//! one is live is refused ([`Sessions::begin_start`]).
//! **Invariant:** one agent's events wake no other agent's long-poll, and
//! nothing wakes a long-poll but a move of its own agent's wake counter
//! (`AgentSlot::wake_poll`, the only place it moves): a turn costs the same
//! thread wake-ups whether one agent runs or a hundred.
//! **Invariant:** a long-poll hands out from memory only what it can prove
//! is every pending message (`Looked`): what a query found, plus messages
//! whose store read, under the agent's message lock, that nothing pending
//! came before them but what is known ([`Sessions::stored`]). The proof
//! rests on choird's own statements, never on the agent's word; any other
//! wake, a session change or the agent saying it missed a hand-out makes
//! the next poll ask PostgreSQL.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::admin::AgentSummary;
use choir_common::ids::AgentId;
use choir_common::rpc::{InboundMessage, ReportStatusRequest};
use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use crate::http::{Caller, ListenerKind};

mod auth;
mod chats;
mod lifecycle;
mod status;
mod verbs;

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

/// How old a long-poll's "nothing pending" mark may grow before a
/// long-poll that ended without news asks PostgreSQL again.
pub const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// A live lease.
struct Session {
    id: i64,
    token_sha256: [u8; 32],
    instance: Option<Instance>,
    started: Instant,
    last_seen: Instant,
    /// Highest message id handed to this session.
    delivered_upto: u64,
    /// What choird knows of the agent's pending messages without asking
    /// PostgreSQL ([`Looked`]): a backstop clears it when a long-poll ends
    /// without news and it is [`LOOK_AGAIN_AFTER`] old
    /// ([`Sessions::look_again`]), for a wake that never came. Every store
    /// of a message wakes its agent, also one that failed (its commit may
    /// have happened, its acknowledgement lost), so the backstop is for
    /// what nothing foresaw; an idle agent's long-polls leave PostgreSQL
    /// alone (and choird's connection closes).
    looked: Option<Looked>,
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
    /// Long-polls it holds open now, whether it ever held one, when the
    /// last one ended and whether that one failed on choird's side (the
    /// agent then backs off before polling again): what tells a live agent
    /// from one that stopped answering ([`Sessions::silent`]).
    polls: u32,
    polled: bool,
    poll_ended: Option<Instant>,
    poll_failed: bool,
    /// Found silent and acted on.
    silenced: bool,
    buckets: [Bucket; 4],
}

/// A long-poll's knowledge of the agent's pending messages: at wake count
/// `wake` and hand-out position `after`, the messages past `after` still
/// waiting for an answer are exactly `known` (none, after a query found
/// every pending message and they were handed out). While both are
/// unchanged a long-poll hands out `known` without a query: every message
/// is stored before the wake it causes, so one stored since moved the
/// count, unless its store said it followed only what this knew
/// ([`Sessions::stored`], which then adds it and moves `wake` along).
#[derive(Debug)]
struct Looked {
    wake: u64,
    after: u64,
    /// When a query or a hand-out set it.
    at: Instant,
    known: Vec<InboundMessage>,
}

/// The most messages a long-poll is handed from memory at once; past it
/// the poll queries (and its query's limit is this too).
pub const HAND_OUT_AT_ONCE: usize = 32;

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
            polls: 0,
            polled: false,
            poll_ended: None,
            poll_failed: false,
            silenced: false,
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
    /// Status asks ([`Sessions::ask_status`]); each counts one.
    status_asked: u64,
    /// The asks a long-poll's answer has told the agent of.
    status_told: u64,
    /// The asks the latest status the agent's poller carried answers: it
    /// was built after they were told.
    status_answered: u64,
    /// When the poller last carried a status.
    status_at: Option<Instant>,
    replicated_seq: u64,
    /// Chat requests waiting for the answer to a message id.
    waiters: HashMap<u64, Sender<ChatUpdate>>,
    /// Bumped before each HEARTBEAT carrying replies stores them (before its
    /// commit): a chat that reads the same count before its message is
    /// stored and when its waiter is registered knows no answer to it can
    /// have been stored unseen (`Sessions::wait_for_answer`).
    replies_begun: u64,
    /// Bumped whenever a long-poll of this agent should look again (only by
    /// [`AgentSlot::wake_poll`]).
    wake: u64,
    /// Signalled when `wake` moves; what the agent's long-poll waits on.
    /// Shared out so a waiter holds it while the table's guard is lent to
    /// the wait (slots are never removed, so it is always this slot's).
    woken: Arc<Condvar>,
    /// Decisions on its proposals wait to be handed over.
    decisions_due: bool,
    /// Scheduled firings may wait to be offered.
    firings_due: bool,
    /// Lanes the operator asked to cancel, not yet handed over.
    cancels: Vec<String>,
    /// The config version its last HEARTBEAT said it runs with.
    config_version: Option<u64>,
}

impl AgentSlot {
    /// Moves the wake counter and wakes this agent's long-poll, and no
    /// other thread.
    fn wake_poll(&mut self) {
        self.wake += 1;
        self.woken.notify_all();
    }
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
    /// Someone asks for the agent's status (taken: the answer says so).
    pub status: bool,
    /// The wake counter seen (to wait for a change).
    pub wake: u64,
    /// Every message pending past `after`, known without a query: nothing
    /// woke this agent since every pending message was handed out but
    /// stores that reported what they stored ([`Sessions::stored`]). The
    /// query is skipped; `Some` of nothing: no message can be pending.
    pub known: Option<Vec<InboundMessage>>,
}

/// How long a read of lanes waits for the agents asked to answer (one
/// long-poll round trip each, a fraction of a millisecond when they are well).
pub const STATUS_WAIT: Duration = Duration::from_millis(500);

/// A status younger than this answers a reader without asking again (two
/// `choirctl status` in a row, several console pages at once).
pub const STATUS_FRESH: Duration = Duration::from_millis(100);

/// The table of agent slots.
#[derive(Default)]
pub struct Sessions {
    table: Mutex<BTreeMap<AgentId, AgentSlot>>,
    /// Starts, stops and back-offs wait on it; long-polls do not.
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
        sessions.replicated(&a, None, &[(1, "one".to_owned())], &[], &[]);
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

    /// How often a thread of this process was switched out because it
    /// waited (`voluntary_ctxt_switches`): a thread asleep on a condition
    /// variable adds one each time something wakes it.
    fn waits_of(tid: i32) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Whether the thread is asleep (`S` in its stat).
    fn asleep(tid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S'))
    }

    /// With one condition variable for the whole table, every wake of any
    /// agent (a message, a chat, a decision, a firing, a cancel) woke every
    /// agent's waiting long-poll, so a turn cost a thread wake-up per agent
    /// running: at 100 agents a turn's p50 was twice that at 10. Agent b's
    /// long-poll sleeps through 200 of each of agent a's wakes without once
    /// being switched in (a thread woken for nothing sleeps again, and each
    /// sleep counts); its own wake ends its sleep (the controls: the wait
    /// returns, and its next sleep is counted).
    #[test]
    fn a_wake_of_one_agent_leaves_every_other_agents_long_poll_asleep() {
        let (a, b) = (AgentId::parse("alpha").unwrap(), AgentId::parse("beta").unwrap());
        let sessions = Sessions::new([&a, &b]);
        sessions.open(&a, 1, [0; 32], 0);
        sessions.open(&b, 2, [0; 32], 0);
        let seen = sessions.poll(&b, 2, true, None).wake;
        let (tid_tx, tid_rx) = crossbeam_channel::bounded(1);
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get()).unwrap();
                sessions.wait_wake(&b, seen, Instant::now() + Duration::from_secs(10));
                // One more sleep, which the count must show (the control
                // that it counts this thread's sleeps at all).
                sessions.wait_wake(&b, seen + 1, Instant::now() + Duration::from_millis(20));
                let tid = rustix::thread::gettid().as_raw_nonzero().get();
                done_tx.send(waits_of(tid)).unwrap();
            });
            let tid = tid_rx.recv().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !asleep(tid) {
                assert!(Instant::now() < deadline, "the long-poll never went to sleep");
                std::thread::sleep(Duration::from_millis(5));
            }
            let before = waits_of(tid);
            let (tx, _rx) = crossbeam_channel::unbounded();
            for i in 0..200 {
                sessions.wake(&a);
                sessions.wait_for_answer(&a, i, tx.clone(), None);
                sessions.stored(&a, message(i), None);
                sessions.decision_due(&a);
                sessions.firing_due(&a);
                sessions.cancel(&a, "edge");
                // Time for a woken thread to run before the next wake.
                std::thread::sleep(Duration::from_micros(500));
            }
            assert_eq!(waits_of(tid), before, "agent b's long-poll was woken by agent a's events");
            assert!(done_rx.try_recv().is_err(), "agent b's long-poll ended without a wake of its own");
            sessions.wake(&b);
            let after = done_rx.recv_timeout(Duration::from_secs(10)).expect("agent b's own wake ended its long-poll");
            assert!(after > before, "the count of b's wake-ups did not move when it was woken");
        });
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
        assert!(poll.known.is_none());
        // The query found every pending message (fewer than its limit):
        // until something wakes the agent, its next poll need not ask.
        let out = sessions.hand_out(&a, 7, vec![message(3)], Some(poll.wake)).unwrap();
        assert_eq!(out.len(), 1);
        let again = sessions.poll(&a, 7, true, None);
        assert!(again.known.is_some());
        assert_eq!(again.after, 3);
        // A message stored since wakes the agent: the next poll queries.
        sessions.wake(&a);
        assert!(sessions.poll(&a, 7, true, None).known.is_none());
        // A query that hit its limit (more may wait) sets no mark.
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(4)], None).unwrap();
        assert!(sessions.poll(&a, 7, true, None).known.is_none());
        // The mark holds the hand-out position too: a concurrent poll
        // handing out more after the mark was set means look again.
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        assert!(sessions.poll(&a, 7, true, None).known.is_some());
        sessions.hand_out(&a, 7, vec![message(5)], None).unwrap();
        assert!(sessions.poll(&a, 7, true, None).known.is_none());
        // A long-poll that ended without news keeps a young mark (an idle
        // agent's polls leave PostgreSQL alone) and clears an old one: a
        // message whose wake was lost is found by the next poll.
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        assert!(sessions.poll(&a, 7, true, None).known.is_some());
        sessions.look_again(&a, 7, Instant::now());
        assert!(sessions.poll(&a, 7, true, None).known.is_some(), "a young mark holds");
        sessions.look_again(&a, 7, Instant::now() + LOOK_AGAIN_AFTER);
        assert!(sessions.poll(&a, 7, true, None).known.is_none(), "an old mark is cleared");
        // A new session (a restart) starts without a mark.
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        sessions.open(&a, 8, [0; 32], 5);
        assert!(sessions.poll(&a, 8, true, None).known.is_none());
    }

    fn status(state: &str) -> ReportStatusRequest {
        ReportStatusRequest { session_state: state.into(), lanes: Vec::new() }
    }

    #[test]
    fn a_status_read_asks_the_agent_through_its_long_poll_and_costs_the_poll_no_query() {
        let a = AgentId::parse("alpha").unwrap();
        let b = AgentId::parse("beta").unwrap();
        let sessions = Sessions::new([&a, &b]);
        sessions.open(&a, 7, [0; 32], 0);
        assert!(sessions.ask_status(None, Duration::ZERO).is_empty(), "an agent still starting is not asked");
        sessions.report(&a, 7, status("RUNNING"), false);
        // The poll looked and handed out every pending message.
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(3)], Some(poll.wake)).unwrap();
        let before = sessions.poll(&a, 7, true, None);
        assert!(!before.status, "nobody asked");
        // An ask wakes the poll, which is told once, and still knows that
        // nothing is pending (an ask stores no message): no query.
        let asked = sessions.ask_status(None, Duration::ZERO);
        assert_eq!(asked, [(a.clone(), 1)], "only agents with a session are asked");
        let told = sessions.poll(&a, 7, true, None);
        assert!(told.status && told.wake > before.wake);
        assert_eq!(known_ids(&told), Some(vec![]), "the ask cost the poll no query");
        assert!(!sessions.poll(&a, 7, true, None).status, "told once");
        // A poll that could not hand over what it took (its query failed)
        // gives it back: the next poll tells the agent again.
        sessions.give_back(&a, told);
        assert!(sessions.poll(&a, 7, true, None).status, "told again after a failed poll");
        // A report that did not come from the poll after the ask (link-push's
        // report of a session state) answers no ask; the poller's does.
        let wait = || {
            let t0 = Instant::now();
            sessions.wait_status(&asked, Instant::now() + Duration::from_millis(200));
            t0.elapsed()
        };
        sessions.report(&a, 7, status("RUNNING"), false);
        assert!(wait() >= Duration::from_millis(200), "an unasked report answers nothing");
        sessions.report(&a, 7, status("RUNNING"), true);
        assert!(wait() < Duration::from_millis(200), "the poller's report answers the ask");
        assert!(sessions.ask_status(None, Duration::from_secs(60)).is_empty(), "a fresh answer is not asked again");
        // An ask not yet told when a report came is not answered by it.
        let second = sessions.ask_status(Some(&a), Duration::ZERO);
        sessions.report(&a, 7, status("RUNNING"), true);
        assert!(
            {
                let t0 = Instant::now();
                sessions.wait_status(&second, Instant::now() + Duration::from_millis(100));
                t0.elapsed() >= Duration::from_millis(100)
            },
            "a report built before the ask reached the agent does not answer it"
        );
        // A report from another session (a stale token's) is not kept.
        sessions.report(&a, 6, status("STOPPING"), true);
        assert_eq!(sessions.summary(&a, "process").unwrap().session_state.as_deref(), Some("RUNNING"));
        // An agent told to stop is not asked (its poll tells it nothing more).
        sessions.request_stop(&a);
        assert!(sessions.ask_status(None, Duration::ZERO).is_empty(), "an agent told to stop is not asked");
        // An agent that never answers costs a reader its deadline, no more;
        // an ended session ends the wait at once.
        sessions.ended(&a, 7, "stopped", false);
        let t0 = Instant::now();
        sessions.wait_status(&second, Instant::now() + Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// A long-poll takes the operator's cancel requests and the decisions
    /// and firings flags before it queries the pending messages; when that
    /// query failed, what it took was lost (a cancel never reached the
    /// agent). It now gives them back to the next poll.
    #[test]
    fn regression_a_long_poll_whose_query_failed_lost_the_operators_cancel() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        sessions.open(&a, 7, [0; 32], 0);
        assert_eq!(sessions.cancel(&a, "edge"), Some(true));
        sessions.decision_due(&a);
        let took = sessions.poll(&a, 7, true, None);
        assert_eq!((took.cancels.as_slice(), took.decisions_due), (["edge".to_owned()].as_slice(), true));
        let empty = sessions.poll(&a, 7, true, None);
        assert!(empty.cancels.is_empty() && !empty.decisions_due, "taken by the first poll");
        assert_eq!(sessions.cancel(&a, "core:x"), Some(true));
        sessions.give_back(&a, took);
        let next = sessions.poll(&a, 7, true, None);
        assert_eq!(next.cancels, ["edge", "core:x"], "given back, in the order asked");
        assert!(next.decisions_due);
    }

    fn stored_as(id: u64, conversation: &str) -> InboundMessage {
        InboundMessage { conversation: conversation.into(), ..message(id) }
    }

    fn known_ids(poll: &PollState) -> Option<Vec<u64>> {
        poll.known.as_ref().map(|k| k.iter().map(|m| m.id).collect())
    }

    #[test]
    fn a_stored_message_is_handed_out_from_memory_only_when_nothing_before_it_is_unknown() {
        let a = AgentId::parse("alpha").unwrap();
        let sessions = Sessions::new([&a]);
        sessions.open(&a, 7, [0; 32], 0);
        // Before the poll has looked, a store's word does not suffice: the
        // poll has never seen what was pending before.
        sessions.stored(&a, message(1), None);
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(1)], Some(poll.wake)).unwrap();
        // Every pending message handed out; a store that followed only
        // them (the highest pending before it: 1) is handed over at once,
        // and the next one after it, in order.
        sessions.stored(&a, stored_as(2, "x"), Some(1));
        sessions.stored(&a, stored_as(3, "y"), Some(2));
        let poll = sessions.poll(&a, 7, true, None);
        assert_eq!(known_ids(&poll), Some(vec![2, 3]));
        assert_eq!(poll.known.as_ref().unwrap()[1].conversation, "y");
        let out = sessions.hand_out(&a, 7, poll.known.unwrap(), Some(poll.wake)).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), Some(vec![]));
        // Hostile orders of events, each of which makes the poll ask
        // PostgreSQL instead:
        // - a message before it not reported yet (5 committed first, its
        //   store has not told; 6 says 5 was pending before it);
        sessions.stored(&a, message(6), Some(5));
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        // - and 5's report, arriving after, cannot mend it;
        sessions.stored(&a, message(5), Some(3));
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(5), message(6)], Some(poll.wake)).unwrap();
        // - a wake that said nothing of what it stored (a Telegram batch,
        //   or a store whose acknowledgement was lost), before or after a
        //   reporting store;
        sessions.wake(&a);
        sessions.stored(&a, message(8), Some(6));
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(7), message(8)], Some(poll.wake)).unwrap();
        sessions.stored(&a, message(9), Some(8));
        sessions.wake(&a);
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(9)], Some(poll.wake)).unwrap();
        // - a store whose id is not past what is known (a resend);
        sessions.stored(&a, message(9), Some(8));
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, Vec::new(), Some(poll.wake)).unwrap();
        // - more than a poll hands out at once: the rest is queried.
        for id in 10..10 + HAND_OUT_AT_ONCE as u64 + 1 {
            sessions.stored(&a, message(id), Some(id - 1).filter(|p| *p > 9));
        }
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), None);
        // - the agent says it did not receive what was handed out: the
        //   position goes back, and so does the knowledge.
        let poll = sessions.poll(&a, 7, true, None);
        let all: Vec<InboundMessage> = (10..10 + HAND_OUT_AT_ONCE as u64 + 1).map(message).collect();
        sessions.hand_out(&a, 7, all, Some(poll.wake)).unwrap();
        let top = 10 + HAND_OUT_AT_ONCE as u64;
        sessions.stored(&a, message(top + 1), Some(top));
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), Some(vec![top + 1]));
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, Some(top - 1))), None);
        // - another agent's store tells this one nothing.
        let b = AgentId::parse("beta").unwrap();
        sessions.stored(&b, message(99), None);
        let poll = sessions.poll(&a, 7, true, None);
        sessions.hand_out(&a, 7, vec![message(top), message(top + 1)], Some(poll.wake)).unwrap();
        sessions.stored(&b, message(100), None);
        assert_eq!(known_ids(&sessions.poll(&a, 7, true, None)), Some(vec![]));
        // A new session starts knowing nothing.
        sessions.stored(&a, message(top + 2), Some(top + 1));
        sessions.open(&a, 8, [0; 32], top + 1);
        assert_eq!(known_ids(&sessions.poll(&a, 8, true, None)), None);
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
        assert_eq!((poll.after, poll.known.is_some()), (4, true));
        // The answer to the poll that handed out 5 was lost: the agent
        // still says 4, so 5 is looked for and handed out again.
        sessions.hand_out(&a, 7, vec![message(5)], Some(poll.wake)).unwrap();
        let poll = sessions.poll(&a, 7, true, Some(4));
        assert_eq!((poll.after, poll.known.is_some()), (4, false));
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
            assert_eq!((poll.after, poll.known.is_some()), (2, false));
            sessions.hand_out(&a, 7, vec![message(3), message(4), message(5)], Some(poll.wake)).unwrap();
        }
        let again = sessions.table.lock().get(&a).and_then(|slot| slot.session.as_ref()).map(|s| s.handed_again);
        assert_eq!(again, Some(1001));
    }
}
