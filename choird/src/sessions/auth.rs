//! Authentication and liveness: a request's lease token checked against
//! the live session of the listener's agent, and charged to its rate
//! bucket; a lease lapses after [`LEASE_TTL`] without a request, and an
//! agent that holds no long-poll and says nothing for a few seconds has
//! stopped answering ([`Sessions::silent`]).

use super::*;

impl Sessions {
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

    /// Notes that the agent opened a long-poll; the guard notes its end.
    pub fn polling(&self, agent: &AgentId, session: i64) -> Polling<'_> {
        if let Some(s) = self.table.lock().get_mut(agent).and_then(|s| s.session.as_mut()).filter(|s| s.id == session) {
            s.polls += 1;
            s.polled = true;
        }
        Polling { sessions: self, agent: agent.clone(), session, ok: false }
    }

    /// Running agents that stopped answering: an agent's `link-poll` keeps
    /// a long-poll open at all times but for a moment between two, and
    /// every other thread of it speaks through RPCs too; so an agent that
    /// holds no poll, whose last poll ended more than `after` ago, and that
    /// made no request since is hung (a deadlock, a frozen process, a
    /// stuck container). After a poll choird failed, the agent backs off up
    /// to 5 s first: three times `after` then. An agent that never polled
    /// yet (starting) is not judged. Each is reported once, with its
    /// instance.
    pub fn silent(&self, after: Duration) -> Vec<(AgentId, i64, Instance)> {
        let mut t = self.table.lock();
        t.iter_mut()
            .filter(|(_, slot)| slot.phase == Phase::Running)
            .filter_map(|(id, slot)| {
                let s = slot.session.as_mut()?;
                let wait = if s.poll_failed { after * 3 } else { after };
                let quiet = s.polled
                    && s.polls == 0
                    && s.poll_ended.is_some_and(|t| t.elapsed() > wait)
                    && s.last_seen.elapsed() > wait;
                let silent = quiet && !s.stop && !s.terminated && !s.reaped && !s.silenced;
                s.silenced |= silent;
                silent.then(|| Some((id.clone(), s.id, s.instance.clone()?))).flatten()
            })
            .collect()
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
}

/// An open long-poll of an agent's ([`Sessions::polling`]): its end is noted
/// when dropped, as failed unless [`Polling::answered`] was called.
pub struct Polling<'a> {
    sessions: &'a Sessions,
    agent: AgentId,
    session: i64,
    ok: bool,
}

impl Polling<'_> {
    /// The poll is being answered (not failed on choird's side).
    pub fn answered(&mut self) {
        self.ok = true;
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        let mut t = self.sessions.table.lock();
        if let Some(s) = t.get_mut(&self.agent).and_then(|s| s.session.as_mut()).filter(|s| s.id == self.session) {
            s.polls = s.polls.saturating_sub(1);
            s.poll_ended = Some(Instant::now());
            s.poll_failed = !self.ok;
        }
    }
}
