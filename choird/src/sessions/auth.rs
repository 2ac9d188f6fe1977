//! Authentication: a request's lease token checked against the live
//! session of the listener's agent, and charged to its rate bucket.

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
