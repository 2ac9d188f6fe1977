//! `link-reply`: ships what the edge says (answers, partial answers and the
//! processed position with them) and the edge's recalls of a conversation,
//! one HEARTBEAT at a time in the order the edge queued them; an answer
//! given after a withheld result waits (bounded) until link-push has stored
//! the events behind it.
//!
//! **Invariant:** answers, partials and recalls reach choird in the order
//! the edge queued them, so a partial is never stored after its message's
//! answer, and a recall never misses the agent's own last answer.

use super::*;

/// How long an answer given after a withheld result waits for link-push to
/// store the events behind it. Long enough to outlast link-push's backoff
/// (at most 5 s) after choird or its database comes back; bounded because
/// choird may refuse the events for good (a forked log) while it still
/// stores answers, and the model's "I cannot act right now" must reach the
/// user then.
pub const WITHHELD_WAIT: Duration = Duration::from_secs(30);

/// How long the edge waits for a recall (link-reply may first have answers
/// to ship, and retries while choird cannot be reached).
const RECALL_WAIT: Duration = Duration::from_secs(10);

/// The edge's way to recall a conversation: through link-reply's queue,
/// behind the answers queued before it ([`Outbound::Recall`]).
pub struct RecallThroughReply {
    out: Sender<Outbound>,
}

impl RecallThroughReply {
    /// Recalls sent on `out`, link-reply's queue.
    pub fn new(out: Sender<Outbound>) -> RecallThroughReply {
        RecallThroughReply { out }
    }
}

impl crate::lanes::held::Recall for RecallThroughReply {
    fn recall(&self, conversation: &str) -> Result<ConversationTail, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let deadline = Instant::now() + RECALL_WAIT;
        let ask = crate::lanes::outbound::RecallAsk { conversation: conversation.to_owned(), deadline, answer: tx };
        self.out.send(Outbound::Recall(ask)).map_err(|_| "the link to choird is closed".to_owned())?;
        match rx.recv_timeout(RECALL_WAIT) {
            Ok(answer) => answer,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                Err(format!("choird did not answer within {} s", RECALL_WAIT.as_secs()))
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err("the link to choird closed".to_owned()),
        }
    }
}

/// link-reply's wait for withheld events: what the edge says after a
/// withheld result waits for link-push to store the events behind it
/// ([`DurableLog::wait_withheld_stored`]), until `limit` has passed both
/// since the wait began and since link-push last found choird unavailable;
/// then it goes without them (choird refuses them: a forked log), until a
/// later result is withheld.
///
/// **Invariant:** time in which choird is unavailable does not count
/// (while link-push finds it unreachable, or asking for a retry, the wait
/// does not run out; a failed shipment starts it again, even for a mark
/// given up on), so after an outage of any length link-push, whose retries
/// come at most 5 s apart, stores the events before the wait can end and
/// the answer go; and a wait given up on keeps no later withheld result
/// from its own wait.
///
/// [`DurableLog::wait_withheld_stored`]: crate::commitlog::DurableLog::wait_withheld_stored
#[derive(Debug)]
pub(super) struct WithheldWait {
    limit: Duration,
    /// Since when the current wait runs.
    since: Option<Instant>,
    /// The withheld mark given up on: not waited for again.
    gave_up_on: u64,
}

impl WithheldWait {
    pub(super) fn new(limit: Duration) -> WithheldWait {
        WithheldWait { limit, since: None, gave_up_on: 0 }
    }

    /// How long to wait now for the events up to `mark` (at most
    /// [`PERIOD`], so the caller notices a close; zero only once the wait
    /// is over); `None`: not at all. `unavailable`: when link-push last
    /// found choird unavailable.
    pub(super) fn patience(&mut self, mark: u64, now: Instant, unavailable: Option<Instant>) -> Option<Duration> {
        if mark <= self.gave_up_on {
            return None;
        }
        let since = *self.since.get_or_insert(now);
        Some(self.limit.saturating_sub(now.saturating_duration_since(counted_from(since, unavailable))).min(PERIOD))
    }

    /// The events are stored: a later withheld result gets a wait of its own.
    pub(super) fn stored(&mut self) {
        self.since = None;
    }

    /// The events up to `mark` are still not stored at `now`: whether the
    /// wait is over (then `mark` is not waited for again): `limit` has
    /// passed since it began and since `unavailable`.
    pub(super) fn over(&mut self, mark: u64, now: Instant, unavailable: Option<Instant>) -> bool {
        let over = self
            .since
            .is_some_and(|since| now.saturating_duration_since(counted_from(since, unavailable)) >= self.limit);
        if over {
            (self.gave_up_on, self.since) = (mark, None);
        }
        over
    }

    /// A shipment failed: choird took no answer, so the wait starts again.
    pub(super) fn choird_took_nothing(&mut self) {
        (self.gave_up_on, self.since) = (0, None);
    }
}

/// Where a withheld wait's time counts from: its start, or link-push's last
/// finding choird unavailable if that came later.
fn counted_from(since: Instant, unavailable: Option<Instant>) -> Instant {
    unavailable.map_or(since, |u| u.max(since))
}

/// What link-reply has yet to ship (and the recalls to make after it).
#[derive(Default)]
struct Said {
    replies: Vec<OutboundReply>,
    partials: Vec<PartialReply>,
    recalls: Vec<crate::lanes::outbound::RecallAsk>,
}

impl Said {
    fn is_empty(&self) -> bool {
        self.replies.is_empty() && self.partials.is_empty() && self.recalls.is_empty()
    }

    /// Sorts what the edge handed over: replies queue; a partial replaces
    /// an older partial of the same message.
    fn take(&mut self, m: Outbound) {
        match m {
            Outbound::Recall(ask) => self.recalls.push(ask),
            Outbound::Reply(r) => self.replies.push(r),
            Outbound::Partial(p) => {
                self.partials.retain(|q| q.in_reply_to != p.in_reply_to);
                self.partials.push(p);
            }
        }
    }
}

/// Text choird can store: NUL written as `\u0000`.
fn storable_text(text: &str) -> String {
    if text.contains('\0') {
        text.replace('\0', "\\u0000")
    } else {
        text.to_owned()
    }
}

fn storable_reply(mut r: OutboundReply) -> OutboundReply {
    r.text = storable_text(&r.text);
    r
}

impl Link {
    /// A HEARTBEAT that only asks for a conversation's tail (like every
    /// bare HEARTBEAT it reports no position, so choird stores nothing for it).
    fn recall_heartbeat(&self, conversation: &str) -> HeartbeatRequest {
        let mut req = self.bare_heartbeat(0, false, Vec::new());
        req.recall = Some(conversation.to_owned());
        req
    }

    /// Asks choird for a conversation's tail (link-reply, once the answers
    /// queued before the ask are stored), within what is left of `wait`.
    fn recall_now(&self, conversation: &str, wait: Duration) -> Result<ConversationTail, String> {
        let req = self.recall_heartbeat(conversation);
        let resp = self.rpc.call::<_, HeartbeatResponse>(Verb::Heartbeat, &req, wait);
        match resp {
            Ok(r) => r.recalled.ok_or_else(|| "choird sent no tail".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// `link-reply`: ships what the edge says (its answers and partial
    /// answers) and makes its recalls, in the order the edge queued them,
    /// on HEARTBEATs of their own; runs until `said` closes and everything
    /// is shipped (or the lease is lost, or choird stays unreachable while
    /// the agent stops).
    ///
    /// A thread of its own (and its own connection from the client's pool
    /// for each HEARTBEAT), so an answer never waits behind link-push's
    /// replication of core events (the reply used to
    /// wait out a core HEARTBEAT's round trip and commit). It sends no events: in production
    /// ([`Durability::Replicated`]) every event an answer rests on was
    /// acknowledged before the edge saw the result it answers from, so
    /// choird holds them before the answer arrives; after a result withheld
    /// because replication failed, the answer waits until link-push has
    /// stored the events behind it ([`DurableLog::wait_withheld_stored`]),
    /// which also reopens the tools, or [`WITHHELD_WAIT`] has passed (choird
    /// may refuse them for good). It alone reports the
    /// processed position, with the answers that move it (choird keeps the
    /// position in a row of its own, which no core HEARTBEAT locks).
    ///
    /// [`Durability::Replicated`]: crate::commitlog::Durability::Replicated
    pub fn speak(&self, said: Receiver<Outbound>) {
        let mut out = Said::default();
        let mut open = true;
        let mut closed_at: Option<Instant> = None;
        let mut failures = 0;
        let mut held = WithheldWait::new(self.withheld_wait);
        loop {
            if open && out.is_empty() {
                // Until the edge says something or the lease is lost (the
                // receiver is dropped on return, so the edge's next answer
                // fails): woken by either, never by a clock.
                let lost = self.lease_lost.listen();
                if !self.lease_lost.is_set() {
                    select! {
                        recv(said) -> m => match m {
                            Ok(m) => out.take(m),
                            Err(_) => open = false,
                        },
                        recv(lost.woken()) -> _ => {}
                    }
                }
            }
            // Drained to the end, noticing the close: an answer that keeps
            // failing must not keep a stopping agent from giving up.
            while open {
                match said.try_recv() {
                    Ok(m) => out.take(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if !open && closed_at.is_none() {
                closed_at = Some(Instant::now());
            }
            if self.lease_lost.is_set() {
                return;
            }
            if !out.replies.is_empty() || !out.partials.is_empty() {
                // After a withheld result, what the edge said waits for
                // link-push to store the events behind it (`WithheldWait`).
                let mark = self.log.withheld();
                if let Some(patience) = held.patience(mark, Instant::now(), self.log.last_unavailable()) {
                    match self.log.wait_withheld_stored(patience) {
                        Ok(true) => held.stored(),
                        Ok(false) if held.over(mark, Instant::now(), self.log.last_unavailable()) => log::warn!(
                            "choird has not stored the events behind a withheld result for {} s; answers go without them",
                            self.withheld_wait.as_secs()
                        ),
                        Ok(false) => {
                            if closed_at.is_some_and(|t| t.elapsed() >= GIVE_UP_WHEN_STOPPING) {
                                log::warn!(
                                    "choird has not stored the agent's withheld events while it stops; {} answer(s) not shipped",
                                    out.replies.len()
                                );
                                return;
                            }
                            continue;
                        }
                        Err(why) => {
                            log::warn!("{} answer(s) not shipped: {why}", out.replies.len());
                            return;
                        }
                    }
                }
                let req = self.said_heartbeat(&mut out);
                let _hold = (!req.replies.is_empty()).then(|| {
                    choir_common::hop::mark("agent.push");
                    self.floor.hold()
                });
                match self.rpc.call::<_, HeartbeatResponse>(Verb::Heartbeat, &req, Duration::from_secs(30)) {
                    Ok(_) => {
                        failures = 0;
                        self.processed.fetch_max(req.processed_upto, Ordering::SeqCst);
                        out.replies.clear();
                    }
                    Err(RpcError::Unauthorized(msg)) => {
                        self.lose_lease(&msg);
                        return;
                    }
                    Err(e) => {
                        failures += 1;
                        held.choird_took_nothing();
                        // Stopping and choird unreachable: the answers go
                        // with the agent; their messages stay unanswered in
                        // choird, and the next start answers them.
                        if closed_at.is_some_and(|t| t.elapsed() >= GIVE_UP_WHEN_STOPPING) {
                            log::warn!(
                                "choird unreachable while stopping ({e}); {} answer(s) not shipped",
                                out.replies.len()
                            );
                            return;
                        }
                        log::warn!("shipping answers failed ({e}); retrying");
                        std::thread::sleep(backoff(failures));
                        continue;
                    }
                }
            }
            // Every answer queued before these asks is stored now (a failed
            // shipment went round the loop again above, asks still waiting).
            // An ask whose asker stopped waiting is dropped unasked.
            for ask in std::mem::take(&mut out.recalls) {
                let left = ask.deadline.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    let _ = ask.answer.send(self.recall_now(&ask.conversation, left));
                }
            }
            if !open && out.is_empty() {
                return;
            }
        }
    }

    /// The HEARTBEAT of what the edge said: its answers, the latest partial
    /// of each message not answered (taken: a partial superseded while it
    /// is on its way is not sent again), and the processed position the
    /// answers move (0 without answers).
    fn said_heartbeat(&self, out: &mut Said) -> HeartbeatRequest {
        let Said { replies, partials, .. } = out;
        let processed = replies
            .iter()
            .map(|r| r.in_reply_to)
            .max()
            .map_or(0, |answered| answered.max(self.processed.load(Ordering::SeqCst)));
        let mut req = self.bare_heartbeat(0, false, Vec::new());
        req.replies = replies.iter().cloned().map(storable_reply).collect();
        // Only the latest text of each message matters; none once it is answered.
        req.partials = std::mem::take(partials)
            .into_iter()
            .filter(|p| !replies.iter().any(|r| r.in_reply_to == p.in_reply_to || r.covers.contains(&p.in_reply_to)))
            .map(|mut p| {
                p.text = storable_text(&p.text);
                p
            })
            .collect();
        req.processed_upto = processed;
        log::debug!("reply: HEARTBEAT with {} repl(ies), {} partial(s)", req.replies.len(), req.partials.len());
        req
    }
}
