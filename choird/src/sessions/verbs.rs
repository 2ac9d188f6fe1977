//! What the agent verbs change in a slot: hello, replication, the long
//! poll and what is handed out, status reports, wakes and cancels.

use super::*;

impl Sessions {
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
    /// the chats waiting for them (an answer to a message in `failed` as a
    /// failure carrying its text); returns the acknowledged head.
    pub fn replicated(
        &self,
        id: &AgentId,
        acked: Option<u64>,
        answers: &[(u64, String)],
        partials: &[(u64, String)],
        failed: &[u64],
    ) -> u64 {
        let mut t = self.table.lock();
        let Some(slot) = t.get_mut(id) else { return 0 };
        if let Some(seq) = acked {
            slot.replicated_seq = seq;
        }
        for (message, text) in answers {
            if let Some(w) = slot.waiters.remove(message) {
                let done = if failed.contains(message) { Err(text.clone()) } else { Ok(text.clone()) };
                let _ = w.send(ChatUpdate::Done(done));
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
            known: s.looked.as_ref().filter(|l| (l.wake, l.after) == (wake, after)).map(|l| l.known.clone()),
            decisions_due: std::mem::take(&mut slot.decisions_due),
            firings_due: std::mem::take(&mut slot.firings_due),
            cancels: std::mem::take(&mut slot.cancels),
            status: std::mem::replace(&mut slot.status_told, slot.status_asked) < slot.status_asked,
            wake,
        }
    }

    /// Marks that the agent may have scheduled firings to take, and wakes its poll.
    pub fn firing_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.firings_due = true;
            slot.wake_poll();
        }
    }

    /// Gives back a firings flag that could not be served.
    pub fn firings_still_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.firings_due = true;
        }
    }

    /// Hands out `messages` to `session`: keeps those not handed out yet (a
    /// concurrent poll may have taken some) and moves the mark past them.
    /// `every_one_at`: the wake count read before the query that found
    /// them, when it found every pending message (fewer than its limit);
    /// until the count moves, [`PollState::known`] tells polls no
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
            s.looked = Some(Looked { wake, after: s.delivered_upto, at: Instant::now(), known: Vec::new() });
        }
        Some(messages)
    }

    /// A long-poll of `session` ended without news at `now`: when its mark
    /// is [`LOOK_AGAIN_AFTER`] old, the next one queries again whatever
    /// the wake count (see `Session::looked`).
    pub fn look_again(&self, id: &AgentId, session: i64, now: Instant) {
        if let Some(s) =
            self.table.lock().get_mut(id).and_then(|slot| slot.session.as_mut()).filter(|s| s.id == session)
        {
            if s.looked.as_ref().is_some_and(|l| now.saturating_duration_since(l.at) >= LOOK_AGAIN_AFTER) {
                s.looked = None;
            }
        }
    }

    /// Waits until the agent's wake counter moves past `seen`, or `deadline`.
    /// Sleeps on the agent's own `woken`: no other agent's event, and no
    /// change but a wake of this one, ends the sleep.
    pub fn wait_wake(&self, id: &AgentId, seen: u64, deadline: Instant) {
        let mut t = self.table.lock();
        let Some(woken) = t.get(id).map(|s| Arc::clone(&s.woken)) else { return };
        while t.get(id).is_some_and(|s| s.wake == seen) && Instant::now() < deadline {
            if woken.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
    }

    /// A status report (REPORT_STATUS, or what a HEARTBEAT carries): keeps
    /// the latest of the current session; its first RUNNING report marks it
    /// running. `answers`: carried by the poller after an answer that asked
    /// for it, so it answers every ask told by then (see [`Sessions::ask_status`]).
    pub fn report(&self, id: &AgentId, session: i64, req: ReportStatusRequest, answers: bool) {
        let wake = match self.table.lock().get_mut(id) {
            Some(slot) if slot.session.as_ref().is_some_and(|s| s.id == session) => {
                let running = slot.phase == Phase::Starting && req.session_state == "RUNNING";
                if running {
                    slot.phase = Phase::Running;
                }
                slot.status = Some(req);
                let answered = answers && slot.status_answered < slot.status_told;
                if answers {
                    slot.status_answered = slot.status_told;
                    slot.status_at = Some(Instant::now());
                }
                running || answered
            }
            _ => false,
        };
        // A start waits for RUNNING, a status read for its answer.
        if wake {
            self.notify();
        }
    }

    /// Asks the running agent `only` (or every running agent) for its
    /// status: wakes its long-poll, whose answer says so, and the agent's
    /// next poll carries the report. An agent that answered within
    /// `max_age` is not asked again, nor is one starting or told to stop
    /// (its poll tells it nothing more). Returns the asks to wait for
    /// ([`Sessions::wait_status`]).
    ///
    /// **Invariant:** an ask costs the poll no query: it stores no
    /// message, so a poll that knew every pending message still knows
    /// them after the ask's wake (its [`Looked`] moves with the wake).
    pub fn ask_status(&self, only: Option<&AgentId>, max_age: Duration) -> Vec<(AgentId, u64)> {
        let mut t = self.table.lock();
        let mut asked = Vec::new();
        for (id, slot) in t.iter_mut().filter(|(id, _)| only.is_none_or(|o| o == *id)) {
            let wake = slot.wake;
            let fresh = slot.status_at.is_some_and(|at| at.elapsed() <= max_age);
            if slot.phase != Phase::Running || fresh {
                continue;
            }
            let Some(s) = slot.session.as_mut().filter(|s| !s.stop) else { continue };
            if let Some(l) = s.looked.as_mut().filter(|l| (l.wake, l.after) == (wake, s.delivered_upto)) {
                l.wake = wake + 1;
            }
            slot.status_asked += 1;
            slot.wake_poll();
            asked.push((id.clone(), slot.status_asked));
        }
        asked
    }

    /// Waits until every ask of `asked` is answered, its agent's session
    /// has ended, or `deadline` (an agent that does not answer shows what
    /// it said last); whether every one was answered.
    pub fn wait_status(&self, asked: &[(AgentId, u64)], deadline: Instant) -> bool {
        let mut t = self.table.lock();
        let open = |t: &BTreeMap<AgentId, AgentSlot>| {
            asked.iter().any(|(id, n)| t.get(id).is_some_and(|s| s.session.is_some() && s.status_answered < *n))
        };
        while open(&t) {
            if self.changed.wait_until(&mut t, deadline).timed_out() {
                return !open(&t);
            }
        }
        true
    }

    /// Gives back what a long-poll took ([`Sessions::poll`]) but could not
    /// hand over (its query failed): the decisions and firings flags, the
    /// cancel requests and the status ask go to the next poll.
    pub fn give_back(&self, id: &AgentId, poll: PollState) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.decisions_due |= poll.decisions_due;
            slot.firings_due |= poll.firings_due;
            let mut cancels = poll.cancels;
            cancels.append(&mut slot.cancels);
            slot.cancels = cancels;
            if poll.status {
                slot.status_told = slot.status_answered;
            }
        }
    }

    /// A message of the agent committed (`pending_before`: the highest id
    /// of its messages still unanswered before it, read once every earlier
    /// one had committed): wakes its long-poll, and when every pending
    /// message before it is known or handed out already, the poll is
    /// handed it from memory instead of asking PostgreSQL. Otherwise (an
    /// earlier message not reported yet, another wake since, a poll that
    /// has not looked, [`HAND_OUT_AT_ONCE`] known already) the wake alone
    /// makes the poll query, as [`Sessions::wake`] does.
    pub fn stored(&self, id: &AgentId, message: InboundMessage, pending_before: Option<u64>) {
        let mut t = self.table.lock();
        let Some(slot) = t.get_mut(id) else { return };
        let wake = slot.wake;
        if let Some(s) = slot.session.as_mut() {
            let after = s.delivered_upto;
            if let Some(l) = s.looked.as_mut().filter(|l| (l.wake, l.after) == (wake, after)) {
                let last = l.known.last().map_or(after, |m| m.id);
                if pending_before.is_none_or(|p| p <= last) && message.id > last && l.known.len() < HAND_OUT_AT_ONCE {
                    l.known.push(message);
                    l.wake = wake + 1;
                }
            }
        }
        slot.wake_poll();
    }

    /// Wakes the agent's long-poll (a message, a decision or a cancel waits).
    pub fn wake(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.wake_poll();
        }
    }

    /// Wakes every long-poll (shutdown, a new config version), and whoever
    /// waits on the table (a restart's back-off looks at shutdown).
    pub fn wake_all(&self) {
        for slot in self.table.lock().values_mut() {
            slot.wake_poll();
        }
        self.notify();
    }

    /// Marks that the agent has a decision to receive and wakes its poll.
    pub fn decision_due(&self, id: &AgentId) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.decisions_due = true;
            slot.wake_poll();
        }
    }

    /// Queues a cancel request for a running agent; `false` when it is not running.
    pub fn cancel(&self, id: &AgentId, lane: &str) -> Option<bool> {
        let mut t = self.table.lock();
        let slot = t.get_mut(id)?;
        if slot.session.is_none() {
            return Some(false);
        }
        slot.cancels.push(lane.to_owned());
        slot.wake_poll();
        Some(true)
    }
}
