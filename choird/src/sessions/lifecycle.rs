//! Start, stop and supervise: a slot's session from `begin_start` to
//! `ended`, restarts with back-off and the crash-loop bound.

use super::*;

impl Sessions {
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
        slot.status_at = None;
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
        slot.status = None;
        slot.phase = Phase::Running;
        slot.desired = true;
        slot.last_session = Some(session);
        slot.session = Some(Session::new(session, digest, Some(instance), processed));
        slot.status_at = None;
    }

    /// How far the agent's commit log is stored (from the database at
    /// choird's start and on adoption; HEARTBEATs move it on).
    pub fn set_replicated(&self, id: &AgentId, seq: u64) {
        if let Some(slot) = self.table.lock().get_mut(id) {
            slot.replicated_seq = slot.replicated_seq.max(seq);
        }
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
                    slot.wake_poll();
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
                    slot.wake_poll();
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
                            slot.wake_poll();
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

    /// The agents running as processes of choird's (process runtime), with
    /// their pids.
    pub fn processes(&self) -> Vec<(AgentId, u32)> {
        self.table
            .lock()
            .iter()
            .filter_map(|(id, s)| match s.session.as_ref()?.instance {
                Some(Instance::Process { pid }) => Some((id.clone(), pid)),
                _ => None,
            })
            .collect()
    }

    /// Whether the agent is starting or running (takes messages).
    pub fn accepting(&self, id: &AgentId) -> bool {
        self.table.lock().get(id).is_some_and(|s| matches!(s.phase, Phase::Starting | Phase::Running))
    }
}
