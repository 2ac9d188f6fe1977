//! The link to choird: three named threads speaking HEARTBEAT, a file each
//! (`poll.rs`, `push.rs`, `reply.rs`); the state they share is [`Link`].
//!
//! * `link-poll` long-polls HEARTBEAT for user messages and stop requests and
//!   feeds the edge lane's inbox.
//! * `link-push` ships committed events (as soon as they are committed, and
//!   again until acknowledged), firing reports and status reports, and
//!   heartbeats every few seconds to keep the lease.
//! * `link-reply` ships what the edge says (answers, partial answers, and
//!   the processed position with them) and asks choird for the tail of a
//!   conversation the edge recalls (only once every answer queued before
//!   the ask is stored, so a recall never misses the agent's own last
//!   answer).
//!
//! Three threads, because a long-poll in flight must not delay
//! replication, and an answer must not wait behind the replication of core
//! jobs' events.
//! **Invariants:** an event leaves the replication queue only once choird
//! has acknowledged a sequence number at or above it; answers, partials
//! and recalls reach choird in the order the edge queued them, one
//! HEARTBEAT at a time, so a partial is never stored after its message's
//! answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use choir_common::rpc::{
    Ack, ConversationTail, DynamicConfig, FetchDynamicConfigRequest, HeartbeatRequest, HeartbeatResponse,
    OutboundReply, PartialReply, Verb,
};
use choir_common::rpc::{FiringOffer, FiringReport};
use crossbeam_channel::{select, Receiver, Sender, TryRecvError};

use crate::arbiter::approvals::Approvals;
use crate::arbiter::Arbiter;
use crate::board::StatusBoard;
use crate::commitlog::DurableLog;
use crate::lanes::core::CorePool;
use crate::lanes::inbox::EdgeEvent;
use crate::lanes::outbound::Outbound;
use crate::rpc::{Rpc, RpcError};

mod poll;
mod push;
mod reply;

pub use reply::{RecallThroughReply, WITHHELD_WAIT};

/// The longest link-reply waits before it looks again at a lost lease or a
/// close.
const PERIOD: Duration = Duration::from_secs(5);
/// How long a stopping agent keeps trying to reach choird before it leaves
/// (its committed events are safe in the local log either way).
const GIVE_UP_WHEN_STOPPING: Duration = Duration::from_secs(10);

/// State shared by the two link threads.
pub struct Link {
    /// The RPC client.
    pub rpc: Arc<Rpc>,
    /// The commit log (for unacknowledged events).
    pub log: Arc<DurableLog>,
    /// Highest message id answered.
    pub processed: AtomicU64,
    /// Config version in use.
    pub config_version: AtomicU64,
    /// Set when choird no longer accepts our lease; wakes link-reply, which
    /// sleeps until the edge says something or this.
    pub lease_lost: crate::cancel::Cancel,
    /// Set when the agent is shutting down.
    pub closing: AtomicBool,
    /// Where the kill switch is applied.
    pub arbiter: Arc<Arbiter>,
    /// The hot-reloadable config the lanes read.
    pub config: Arc<parking_lot::RwLock<DynamicConfig>>,
    /// Lane states, reported when they change.
    pub board: Arc<StatusBoard>,
    /// Where human decisions on proposals go.
    pub approvals: Arc<Approvals>,
    /// The edge lane's cancel flag (its current turn or skill).
    pub edge_cancel: Arc<crate::cancel::Cancel>,
    /// The edge's core pool (owned by the edge lane; not kept alive by us).
    pub pool: Weak<CorePool>,
    /// The argument policy the arbiter asks (replaced with each config).
    pub arguments: Arc<crate::arbiter::arg_check::ArgumentPolicy>,
    /// Who has the floor: held while replies are pushed, so core jobs wait.
    pub floor: Arc<crate::lanes::floor::Floor>,
    /// How long an answer waits for choird to store the events behind a
    /// withheld result before it goes without them ([`WITHHELD_WAIT`]).
    pub withheld_wait: Duration,
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis((200u64 << failures.min(5)).min(5_000))
}

impl Link {
    /// A HEARTBEAT carrying no events or answers (the poller's long-poll
    /// with `receive`, a report on firings; the base the other HEARTBEATs
    /// fill in). It reports no position (`processed_upto` 0): the position
    /// moves with the replies that move it (link-reply), so a long-poll
    /// writes nothing to choird's database.
    fn bare_heartbeat(&self, wait_ms: u64, receive: bool, firings: Vec<FiringReport>) -> HeartbeatRequest {
        HeartbeatRequest {
            events: Vec::new(),
            replies: Vec::new(),
            partials: Vec::new(),
            processed_upto: 0,
            config_version: self.config_version.load(Ordering::SeqCst),
            wait_ms,
            receive,
            received_upto: None,
            firings,
            recall: None,
            status: None,
        }
    }

    /// Applies a dynamic config (at start and whenever choird's version moves).
    pub fn apply(&self, config: &DynamicConfig) {
        self.arbiter.set_kill_switch(config.kill_switch);
        self.arbiter.registry().set_policy(&config.tool_policy);
        self.log.set_fail_closed(Duration::from_secs(config.fail_closed_s.max(1)));
        self.arguments.set(&config.argument_policy);
        *self.config.write() = config.clone();
        self.config_version.store(config.version, Ordering::SeqCst);
    }

    fn refresh_config(&self) {
        let req = FetchDynamicConfigRequest {};
        match self.rpc.call::<_, DynamicConfig>(Verb::FetchDynamicConfig, &req, Duration::from_secs(10)) {
            Ok(c) => {
                log::info!(
                    "dynamic config version {}: kill switch {}, {} steps per turn",
                    c.version,
                    c.kill_switch,
                    c.max_steps_per_turn
                );
                self.apply(&c);
            }
            Err(e) => log::warn!("FETCH_DYNAMIC_CONFIG failed (will retry): {e}"),
        }
    }

    /// choird no longer accepts this session: tools stop, replication
    /// closes, and the lanes end.
    fn lose_lease(&self, msg: &str) {
        log::error!("lease lost: {msg}");
        self.lease_lost.set();
        self.arbiter.set_lease_lost();
        self.log.close_replication("choird no longer accepts this agent's lease");
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Write};
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::{Arc, Weak};

    use choir_common::rpc::{ConversationTail, OutboundReply};
    use parking_lot::Mutex;
    use serde_json::{json, Value};

    use super::reply::WithheldWait;
    use super::{Link, RecallThroughReply};
    use crate::board::{LaneMachine, LaneState, SessionState};
    use crate::commitlog::{Durability, LogError};
    use crate::lanes::held::Recall;
    use crate::lanes::outbound::Outbound;
    use choir_common::lane::Lane;

    /// How the choird stand-in behaves.
    #[derive(Default, Clone)]
    struct Standin {
        /// How long storing a HEARTBEAT's answers takes.
        store: std::time::Duration,
        /// Events are stored only once an answer is (or after 10 s): an
        /// answer queued behind them would wait that long.
        events_after_answer: bool,
        /// While set, a HEARTBEAT with events fails (503), as when
        /// choird's database is gone; answers are still taken.
        events_down: Arc<AtomicBool>,
        /// What each long-poll (a HEARTBEAT that receives and waits) is
        /// answered, in turn (recorded as "poll <received_upto>"); once
        /// they are used up, `stop`.
        polls: Arc<Mutex<std::collections::VecDeque<Value>>>,
    }

    /// A choird stand-in on `path`: records what reaches it, in order;
    /// stores a HEARTBEAT's answers (records "stored") and events
    /// ("events stored") as `how` says; answers a recall with an empty tail.
    fn choird(path: std::path::PathBuf, how: Standin) -> Arc<Mutex<Vec<String>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        let record = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let record = record.clone();
                let how = how.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut conn = conn;
                    while let Some((target, body)) = crate::rpc::read_request(&mut reader) {
                        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let with_events = req["events"].as_array().is_some_and(|e| !e.is_empty());
                        let answer = if target.ends_with("/HEARTBEAT")
                            && with_events
                            && how.events_down.load(std::sync::atomic::Ordering::SeqCst)
                        {
                            record.lock().push("events refused".to_owned());
                            None
                        } else if target.ends_with("/HEARTBEAT") {
                            let mut resp = json!({"acked_seq": 0, "messages": [], "config_version": 0, "stop": false});
                            if let Some(st) = req.get("status").filter(|s| !s.is_null()) {
                                record.lock().push(status_line("status", st));
                            }
                            if req["receive"] != false && req["wait_ms"].as_u64().is_some_and(|w| w > 0) {
                                record.lock().push(format!("poll {}", req["received_upto"]));
                                let next = how.polls.lock().pop_front().unwrap_or(json!({"stop": true}));
                                for (k, v) in next.as_object().into_iter().flatten() {
                                    resp[k] = v.clone();
                                }
                            }
                            if let Some(conversation) = req["recall"].as_str() {
                                record.lock().push(format!("recall {conversation}"));
                                resp["recalled"] = json!({"conversation": conversation, "turns": []});
                            }
                            if req["replies"].as_array().is_some_and(|r| !r.is_empty()) {
                                std::thread::sleep(how.store);
                                record.lock().push(format!("stored {}", req["replies"][0]["conversation"]));
                            }
                            if let Some(events) = req["events"].as_array().filter(|e| !e.is_empty()) {
                                // Events are stored only once an answer
                                // is (or after 10 s): an answer queued
                                // behind them would wait that long.
                                record.lock().push(format!("events {} in", events.len()));
                                let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
                                while how.events_after_answer
                                    && !record.lock().iter().any(|r| r.starts_with("stored"))
                                    && std::time::Instant::now() < until
                                {
                                    std::thread::sleep(std::time::Duration::from_millis(5));
                                }
                                record.lock().push("events stored".to_owned());
                                resp["acked_seq"] = events.last().map_or(json!(0), |e| e["seq"].clone());
                            }
                            Some(resp)
                        } else {
                            if target.ends_with("/REPORT_STATUS") {
                                record.lock().push(status_line("report", &req));
                            }
                            Some(json!({"ok": true}))
                        };
                        let (status, text) = match answer {
                            Some(answer) => ("200 OK", answer.to_string()),
                            None => ("503 Service Unavailable", json!({"error": "database unavailable"}).to_string()),
                        };
                        let out = format!(
                            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
                            text.len()
                        );
                        if conn.write_all(out.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        seen
    }

    /// A status report as the stand-in records it: "`what` STATE lane=STATE ...".
    fn status_line(what: &str, status: &Value) -> String {
        let lanes = status["lanes"].as_array().into_iter().flatten();
        let lanes: Vec<String> = lanes
            .map(|l| format!("{}={}", l["lane"].as_str().unwrap_or("?"), l["state"].as_str().unwrap_or("?")))
            .collect();
        format!("{what} {} {}", status["session_state"].as_str().unwrap_or("?"), lanes.join(" ")).trim_end().to_owned()
    }

    /// The edge's answer to message `id` in `conversation`.
    fn answer(id: u64, conversation: &str, text: &str) -> OutboundReply {
        OutboundReply {
            in_reply_to: id,
            covers: vec![id],
            key: String::new(),
            conversation: conversation.into(),
            text: text.into(),
            failed: false,
        }
    }

    /// A core job's tool call, to commit.
    fn event() -> crate::commitlog::NewEvent {
        crate::commitlog::NewEvent {
            lane: "core:job".into(),
            kind: choir_common::commit::EventKind::ToolCall,
            tool: "choir.fs.read".into(),
            call_id: None,
            turn: None,
            skill: None,
            state: None,
            input: json!({}),
            outcome: choir_common::commit::Outcome::Ok,
            result: json!({}),
            duration_us: 1,
            external: false,
        }
    }

    fn link(dir: &std::path::Path) -> Arc<Link> {
        link_with(dir, Durability::Local)
    }

    fn link_with(dir: &std::path::Path, durability: Durability) -> Arc<Link> {
        let endpoint = crate::rpc::Endpoint::Unix(dir.join("agent.sock"));
        let rpc = Arc::new(crate::rpc::Rpc::new(&endpoint, "t".into()));
        // The arbiter keeps its own log in `dir/state`; link-push's is here.
        let (log, _) = crate::commitlog::CommitLog::open(&dir.join("link")).unwrap();
        let log = Arc::new(crate::commitlog::DurableLog::with_durability(log, durability).unwrap());
        let arbiter = Arc::new(crate::arbiter::arbiter_with(dir, &[]));
        let config =
            serde_json::from_value(json!({"version": 0, "kill_switch": false, "max_steps_per_turn": 8})).unwrap();
        Arc::new(Link {
            rpc,
            log,
            processed: AtomicU64::new(0),
            config_version: AtomicU64::new(0),
            lease_lost: crate::cancel::Cancel::new(),
            closing: AtomicBool::new(false),
            arbiter,
            config: Arc::new(parking_lot::RwLock::new(config)),
            board: crate::board::StatusBoard::new(),
            approvals: Arc::new(crate::arbiter::approvals::Approvals::new(None)),
            edge_cancel: Arc::new(crate::cancel::Cancel::new()),
            pool: Weak::new(),
            arguments: Arc::new(crate::arbiter::arg_check::ArgumentPolicy::default()),
            floor: Arc::default(),
            withheld_wait: super::WITHHELD_WAIT,
        })
    }

    /// link-reply woke every 5 s, for ever, to look at the lease (an idle
    /// agent's link-reply was on a CPU 12 times a minute), and noticed a
    /// lost lease only at that look. Now it sleeps until the edge says
    /// something or the lease is lost, and a lost lease ends it at once
    /// (what this asserts; its wake-ups are printed, as another test's
    /// fork can add one).
    #[test]
    fn regression_link_reply_woke_every_5_s_to_look_at_the_lease() {
        let dir = tempfile::tempdir().unwrap();
        let link = link(dir.path());
        let (_said, queue) = crossbeam_channel::unbounded();
        let speaker = {
            let link = link.clone();
            std::thread::spawn(move || {
                let before = crate::cancel::wake_ups();
                link.speak(queue);
                crate::cancel::wake_ups() - before
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(5_500));
        let lost = std::time::Instant::now();
        link.lose_lease("test");
        let woke = speaker.join().unwrap();
        assert!(
            lost.elapsed() < std::time::Duration::from_secs(2),
            "a lost lease ended link-reply after {:?}",
            lost.elapsed()
        );
        eprintln!("link-reply woke {woke} times in 5.5 s with nothing to say");
    }

    #[test]
    fn a_recall_is_asked_only_after_the_answers_queued_before_it_are_stored() {
        // The edge answered in conversation a, dropped it (other
        // conversations came in) and a speaks again: the recall must not
        // reach choird before that answer is stored, or the tail misses it.
        let dir = tempfile::tempdir().unwrap();
        let how = Standin { store: std::time::Duration::from_millis(300), ..Standin::default() };
        let seen = choird(dir.path().join("agent.sock"), how);
        let link = link(dir.path());
        let (out, queue) = crossbeam_channel::unbounded();
        let speak = {
            let link = link.clone();
            std::thread::spawn(move || link.speak(queue))
        };
        let reply = answer(7, "a", "the answer");
        out.send(Outbound::Reply(reply)).unwrap();
        let tail = RecallThroughReply::new(out.clone()).recall("a").unwrap();
        assert_eq!(tail, ConversationTail { conversation: "a".into(), summary: None, turns: Vec::new() });
        assert_eq!(*seen.lock(), ["stored \"a\"", "recall a"]);
        // An ask whose asker stopped waiting is dropped, not made.
        let (answer, gave_up) = crossbeam_channel::bounded(1);
        let ask = crate::lanes::outbound::RecallAsk {
            conversation: "gone".into(),
            deadline: std::time::Instant::now(),
            answer,
        };
        out.send(Outbound::Recall(ask)).unwrap();
        RecallThroughReply::new(out.clone()).recall("b").unwrap();
        assert!(gave_up.try_recv().is_err());
        assert_eq!(*seen.lock(), ["stored \"a\"", "recall a", "recall b"]);
        drop(out);
        speak.join().unwrap();
    }

    #[test]
    fn regression_a_stopping_agent_gives_up_on_answers_choird_cannot_take() {
        // choird unreachable (no socket), an answer queued, the edge gone:
        // link-reply gives up after GIVE_UP_WHEN_STOPPING instead of
        // retrying for ever (it used to miss the close while an answer was
        // pending, and the agent's exit waited on it).
        let dir = tempfile::tempdir().unwrap();
        let link = link(dir.path());
        let (out, said) = crossbeam_channel::unbounded();
        let (done, returned) = crossbeam_channel::bounded(1);
        let speak = {
            let link = link.clone();
            std::thread::spawn(move || {
                link.speak(said);
                let _ = done.send(());
            })
        };
        let reply = answer(3, "a", "never stored");
        out.send(Outbound::Reply(reply)).unwrap();
        drop(out);
        // A hang detector, not a timing bound: it gives up 10 s after the close.
        returned.recv_timeout(std::time::Duration::from_secs(60)).expect("link-reply never gave up");
        speak.join().unwrap();
        assert_eq!(link.processed.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn an_answer_is_not_held_behind_a_heartbeat_of_core_events() {
        // A core job's event is on its way to choird (which is slow to
        // store it) when the edge answers: the answer goes at once, on its
        // own HEARTBEAT, not after the events' round trip. The stand-in stores events only once an answer is stored, so
        // an answer queued behind them would be stored 10 s later, after.
        let dir = tempfile::tempdir().unwrap();
        let how = Standin { events_after_answer: true, ..Standin::default() };
        let seen = choird(dir.path().join("agent.sock"), how);
        let link = link(dir.path());
        let (firings, reports) = crossbeam_channel::unbounded();
        let (poke, committed) = crossbeam_channel::bounded::<()>(1);
        link.log.set_poke(poke);
        let push = {
            let link = link.clone();
            std::thread::spawn(move || link.push(reports, committed))
        };
        let (out, said) = crossbeam_channel::unbounded();
        let speak = {
            let link = link.clone();
            std::thread::spawn(move || link.speak(said))
        };
        let appending = {
            let log = link.log.clone();
            std::thread::spawn(move || log.append(event()).unwrap())
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !seen.lock().iter().any(|r| r == "events 1 in") {
            assert!(std::time::Instant::now() < until, "the event never reached choird: {:?}", seen.lock());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let reply = answer(9, "b", "the answer");
        out.send(Outbound::Reply(reply)).unwrap();
        drop(out);
        speak.join().unwrap();
        assert_eq!(appending.join().unwrap().seq, 1);
        // link-push returns once its channel closed and the event is acknowledged.
        drop(firings);
        push.join().unwrap();
        assert_eq!(*seen.lock(), ["events 1 in", "stored \"b\"", "events stored"]);
        assert_eq!(link.processed.load(std::sync::atomic::Ordering::SeqCst), 9);
    }

    #[test]
    fn regression_an_answer_after_a_withheld_result_is_stored_only_after_its_events() {
        // choird cannot store events (its database is gone): the tool
        // call's event is not acknowledged within the fail-closed time, its
        // result is withheld, and the model answers anyway. The answer used
        // to reach choird at once on link-reply's lane, before the event,
        // while link-push was still backing off, so the next message's
        // tools were refused as if replication were still down
        // (hostile::regression_replication_down_fails_closed_withholds_results_and_recovers
        // failed in CI). It waits for the event now.
        let dir = tempfile::tempdir().unwrap();
        let how = Standin::default();
        how.events_down.store(true, std::sync::atomic::Ordering::SeqCst);
        let seen = choird(dir.path().join("agent.sock"), how.clone());
        let link = link_with(dir.path(), Durability::Replicated);
        link.log.set_fail_closed(std::time::Duration::from_millis(300));
        let (firings, reports) = crossbeam_channel::unbounded();
        let (poke, committed) = crossbeam_channel::bounded::<()>(1);
        link.log.set_poke(poke);
        let push = {
            let link = link.clone();
            std::thread::spawn(move || link.push(reports, committed))
        };
        let (out, said) = crossbeam_channel::unbounded();
        let speak = {
            let link = link.clone();
            std::thread::spawn(move || link.speak(said))
        };
        let withheld = link.log.append(event());
        assert!(matches!(withheld, Err(LogError::NotReplicated { seq: 1, .. })), "{withheld:?}");
        assert!(link.log.failed_closed().is_some(), "tools are refused meanwhile");
        out.send(Outbound::Reply(answer(5, "c", "I cannot act right now"))).unwrap();
        // choird would take the answer now; the answer must not go.
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(!seen.lock().iter().any(|r| r.starts_with("stored")), "{:?}", seen.lock());
        how.events_down.store(false, std::sync::atomic::Ordering::SeqCst);
        drop(out);
        speak.join().unwrap();
        // The acknowledgement that stored the event reopened the tools
        // before the answer was out.
        assert_eq!(link.log.failed_closed(), None);
        assert_eq!(link.processed.load(std::sync::atomic::Ordering::SeqCst), 5);
        drop(firings);
        push.join().unwrap();
        let order: Vec<String> = seen.lock().iter().filter(|r| *r != "events refused").cloned().collect();
        assert_eq!(order, ["events 1 in", "events stored", "stored \"c\""]);
        assert!(seen.lock().first().is_some_and(|r| r == "events refused"), "{:?}", seen.lock());
    }

    #[test]
    fn an_answer_goes_without_withheld_events_that_choird_keeps_refusing() {
        // choird refuses the agent's events for good (a forked log, say) but
        // stores answers: the model's "I cannot act right now" must still
        // reach the user once the wait for those events is over, not wait
        // for ever.
        let dir = tempfile::tempdir().unwrap();
        let seen = choird(dir.path().join("agent.sock"), Standin::default());
        let mut link = link_with(dir.path(), Durability::Replicated);
        Arc::get_mut(&mut link).unwrap().withheld_wait = std::time::Duration::from_millis(500);
        link.log.set_fail_closed(std::time::Duration::from_millis(100));
        link.log.replication_failed("choird refused the commit log", false);
        let withheld = link.log.append(event());
        assert!(matches!(withheld, Err(LogError::NotReplicated { seq: 1, .. })), "{withheld:?}");
        let (out, said) = crossbeam_channel::unbounded();
        let (done, returned) = crossbeam_channel::bounded(1);
        let speak = {
            let link = link.clone();
            std::thread::spawn(move || {
                link.speak(said);
                let _ = done.send(());
            })
        };
        out.send(Outbound::Reply(answer(4, "d", "I cannot act right now"))).unwrap();
        drop(out);
        // A hang detector, not a timing bound.
        returned.recv_timeout(std::time::Duration::from_secs(60)).expect("link-reply held the answer for ever");
        speak.join().unwrap();
        assert_eq!(*seen.lock(), ["stored \"d\""]);
        assert_eq!(link.processed.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert!(link.log.failed_closed().is_some(), "the tools stay refused");
    }

    #[test]
    fn the_wait_for_withheld_events_is_bounded_then_given_up_until_a_later_result_is_withheld() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let mut held = WithheldWait::new(std::time::Duration::from_secs(30));
        // Nothing withheld (mark 0): no wait.
        assert_eq!(held.patience(0, at(0), None), None);
        // Mark 3: waits in periods of at most 5 s, 30 s in all.
        assert_eq!(held.patience(3, at(0), None), Some(super::PERIOD));
        assert!(!held.over(3, at(5_000), None));
        assert_eq!(held.patience(3, at(28_000), None), Some(std::time::Duration::from_secs(2)));
        assert!(held.over(3, at(30_000), None));
        // Given up on 3: answers go at once while nothing later is withheld.
        assert_eq!(held.patience(3, at(31_000), None), None);
        // Regression: a later withheld result used to find the old wait
        // over and went at once; it gets a wait of its own.
        assert_eq!(held.patience(7, at(100_000), None), Some(super::PERIOD));
        assert!(!held.over(7, at(129_000), None));
        // Stored: the next wait starts afresh.
        held.stored();
        assert_eq!(held.patience(9, at(200_000), None), Some(super::PERIOD));
        assert!(!held.over(9, at(229_000), None));
    }

    #[test]
    fn regression_time_in_which_choird_takes_no_answer_does_not_count_against_the_wait() {
        // A long outage: the wait for mark 4 is over while choird is gone,
        // and every shipment fails. The answer used to go without waiting
        // once choird was back, racing link-push's events (and winning:
        // the next message's tools were refused as replication down). A
        // failed shipment starts the wait again, even for a mark given up on.
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let mut held = WithheldWait::new(std::time::Duration::from_secs(30));
        assert!(held.patience(4, at(0), None).is_some());
        assert!(held.over(4, at(30_000), None));
        assert_eq!(held.patience(4, at(30_000), None), None);
        held.choird_took_nothing();
        assert_eq!(held.patience(4, at(60_000), None), Some(super::PERIOD));
        assert!(!held.over(4, at(89_000), None));
        assert!(held.over(4, at(90_000), None));
    }

    #[test]
    fn regression_the_wait_does_not_run_out_while_link_push_finds_choird_unavailable() {
        // The wait used to count time in which choird was still gone: the
        // wait, restarted by a failed shipment at 31 s, ran out at 61 s,
        // just after choird came back at 60 s, and the answer went while
        // link-push was still in its backoff (up to 5 s), before the events.
        // Now it runs out only `limit` after link-push last found choird
        // unavailable; a refusal of the events (a fork) lets it run out.
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let mut held = WithheldWait::new(std::time::Duration::from_secs(30));
        assert!(held.patience(4, at(0), Some(at(0))).is_some());
        assert!(!held.over(4, at(30_000), Some(at(29_000))));
        // link-push's last failure at 59 s: no end before 89 s, and the
        // waits in between are never zero (no spinning).
        for ms in [60_000, 61_000, 75_000, 88_999] {
            assert!(!held.over(4, at(ms), Some(at(59_000))), "{ms}");
            assert!(held.patience(4, at(ms), Some(at(59_000))).is_some_and(|p| !p.is_zero()), "{ms}");
        }
        assert!(held.over(4, at(89_000), Some(at(59_000))));
        // A failure before the wait began does not lengthen it.
        let mut held = WithheldWait::new(std::time::Duration::from_secs(30));
        assert!(held.patience(5, at(100_000), Some(at(50_000))).is_some());
        assert!(held.over(5, at(130_000), Some(at(50_000))));
    }

    #[test]
    fn a_poll_says_which_messages_the_agent_has_taken_delivery_of() {
        // choird goes back to that position if an answer to a poll was lost
        // on the way (sessions::tests::a_long_poll_whose_answer_was_lost_is_handed_its_messages_again);
        // a message handed out twice reaches the edge once.
        let dir = tempfile::tempdir().unwrap();
        let how = Standin::default();
        let five = json!({"messages": [{"id": 5, "conversation": "a", "sender": "u", "text": "hi"}]});
        how.polls.lock().extend([five.clone(), five]);
        let seen = choird(dir.path().join("agent.sock"), how);
        let link = link(dir.path());
        link.processed.store(3, std::sync::atomic::Ordering::SeqCst);
        let (edge, inbox) = crossbeam_channel::unbounded();
        link.poll(edge);
        let got: Vec<String> = inbox
            .try_iter()
            .map(|e| match e {
                crate::lanes::inbox::EdgeEvent::Message(m) => format!("message {}", m.id),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(got, ["message 5", "Stop"]);
        assert_eq!(*seen.lock(), ["poll 3", "poll 5", "poll 5"]);
    }

    /// choird asks for the lanes through a long-poll's answer: the next
    /// poll carries them, and no other does.
    #[test]
    fn the_poll_after_choird_asks_carries_the_lanes_and_no_other_does() {
        let dir = tempfile::tempdir().unwrap();
        let how = Standin::default();
        how.polls.lock().extend([json!({"report_status": true}), json!({}), json!({"report_status": true})]);
        let seen = choird(dir.path().join("agent.sock"), how);
        let link = link(dir.path());
        link.board.add_lane("edge", None, None, None);
        link.board.set_session(SessionState::Running);
        let mut lane = LaneMachine::new("edge", Lane::Edge, link.board.clone());
        lane.go(LaneState::Reasoning).unwrap();
        let (edge, _inbox) = crossbeam_channel::unbounded();
        link.poll(edge);
        let status = "status RUNNING edge=REASONING";
        assert_eq!(*seen.lock(), ["poll 0", status, "poll 0", "poll 0", status, "poll 0"]);
    }

    /// Every lane change made link-push report the lanes (coalesced to
    /// one report per 250 ms): with a model that thinks, two or three
    /// round trips to choird a turn that nobody had asked for. It reports
    /// changes of the session state only (choird counts an agent running
    /// from its first RUNNING).
    #[test]
    fn regression_link_push_reported_every_change_of_a_lane_unasked() {
        let dir = tempfile::tempdir().unwrap();
        let seen = choird(dir.path().join("agent.sock"), Standin::default());
        let link = link(dir.path());
        let reports = || seen.lock().iter().filter(|l| l.starts_with("report")).cloned().collect::<Vec<_>>();
        link.board.add_lane("edge", None, None, None);
        link.board.set_session(SessionState::Running);
        let (firings_tx, firings) = crossbeam_channel::unbounded();
        let (_poke, committed) = crossbeam_channel::bounded::<()>(1);
        let pusher = {
            let link = link.clone();
            std::thread::spawn(move || link.push(firings, committed))
        };
        let t0 = std::time::Instant::now();
        while reports().is_empty() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut lane = LaneMachine::new("edge", Lane::Edge, link.board.clone());
        for steps in 1..=3 {
            lane.go(LaneState::Reasoning).unwrap();
            link.board.usage("edge", steps, 10 * steps);
            lane.go(LaneState::Idle).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        link.board.set_session(SessionState::Draining);
        drop(firings_tx);
        pusher.join().unwrap();
        assert_eq!(reports(), ["report RUNNING edge=IDLE", "report DRAINING edge=IDLE"]);
    }
}
