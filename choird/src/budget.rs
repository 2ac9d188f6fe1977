//! The token budget of each agent (R-RPC-5): tokens its model calls may
//! spend per UTC day and in total, whatever the session, kept in
//! PostgreSQL (`token_usage`) and cached here.
//!
//! A call *reserves* its estimated cost before it goes upstream and is
//! *settled* with what it really cost (the endpoint's `usage`, or an
//! estimate when the endpoint reports none); a budget is checked against
//! spent + reserved, so calls made in parallel cannot overshoot it together.
//!
//! The call whose settlement takes a budget past [`WARN_AT_PERCENT`] returns
//! a warning (once per crossing), which the relay logs, audits and sends to
//! the agent's Telegram admins.
//!
//! The operator's `token_budget` (top level of config.json) bounds all
//! agents together the same way, next to each agent's own.
//!
//! **Invariant:** no model call goes upstream for an agent whose spent and
//! reserved tokens already reach its daily or total budget, or while all
//! agents' together reach the host's.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use choir_common::ids::AgentId;
use parking_lot::Mutex;

pub use crate::config::TokenBudget;
use crate::error::Error;
use crate::store::Store;

/// Roughly four bytes of text per token (for estimates).
pub const BYTES_PER_TOKEN: u64 = 4;
/// Completion tokens reserved for a call that names no `max_tokens`.
pub const DEFAULT_COMPLETION_RESERVE: u64 = 4096;

fn today() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() / 86_400).unwrap_or(0)
}

#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    day: u64,
    today: u64,
    total: u64,
    reserved: u64,
}

/// Whose spending: one agent's, or all agents' together (the host's
/// `token_budget`).
type Key = Option<AgentId>;

/// Spent and reserved tokens per agent, and of all agents together.
#[derive(Default)]
pub struct Budgets {
    usage: Mutex<HashMap<Key, Usage>>,
}

/// An agent's standing, for `choirctl status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Spent today (UTC).
    pub today: u64,
    /// Spent in all.
    pub total: u64,
    /// Reserved by calls in flight.
    pub reserved: u64,
}

/// Tokens held for a call in flight; settle it with what the call cost.
/// Dropped unsettled (the call failed before any answer), it is released.
#[must_use]
pub struct Reservation {
    budgets: std::sync::Arc<Budgets>,
    agent: AgentId,
    tokens: u64,
    budget: TokenBudget,
    host: TokenBudget,
}

/// Share of a budget at which the agent's admins are warned (percent).
pub const WARN_AT_PERCENT: u64 = 80;

/// Whether spending went from under [`WARN_AT_PERCENT`] of `limit` to at or
/// over it.
fn crossed(before: u64, after: u64, limit: Option<u64>) -> Option<u64> {
    let limit = limit.filter(|l| *l > 0)?;
    (before * 100 < limit * WARN_AT_PERCENT && after * 100 >= limit * WARN_AT_PERCENT).then_some(limit)
}

impl Budgets {
    fn load(&self, store: &Store, key: &Key) -> Result<Usage, Error> {
        let day = today();
        if let Some(u) = self.usage.lock().get(key).filter(|u| u.day == day) {
            return Ok(*u);
        }
        let (spent_today, total) = match key {
            Some(agent) => store.token_usage(agent)?,
            None => store.token_usage_all()?,
        };
        let mut usage = self.usage.lock();
        let u = usage.entry(key.clone()).or_default();
        if u.day != day {
            // A new day (or first use): what the database says, plus what is in flight.
            *u = Usage { day, today: spent_today, total, reserved: u.reserved };
        }
        Ok(*u)
    }

    /// Reserves `estimate` tokens for a call of `agent`, against its own
    /// `budget` and the `host` budget of all agents together, or refuses
    /// with 429 `budget_exhausted` naming the budget and when it renews.
    pub fn reserve(
        self: &std::sync::Arc<Self>,
        store: &Store,
        agent: &AgentId,
        budget: TokenBudget,
        host: TokenBudget,
        estimate: u64,
    ) -> Result<Reservation, Error> {
        let key = Some(agent.clone());
        self.load(store, &key)?;
        if host != TokenBudget::default() {
            self.load(store, &None)?;
        }
        let mut usage = self.usage.lock();
        let refuse = |message: String| Error::RateLimited { message, retry_after_s: None };
        let u = usage.get(&key).copied().unwrap_or_default();
        if let Some(b) = budget.per_day.filter(|b| u.today + u.reserved >= *b) {
            return Err(refuse(format!(
                "agent {agent} has spent its token budget for today ({} spent, {} in flight, of {b}); it renews at \
                 00:00 UTC",
                u.today, u.reserved
            )));
        }
        if let Some(b) = budget.total.filter(|b| u.total + u.reserved >= *b) {
            return Err(refuse(format!(
                "agent {agent} has spent its total token budget ({} spent, {} in flight, of {b}); the operator can \
                 raise agents.{agent}.token_budget.total",
                u.total, u.reserved
            )));
        }
        if host != TokenBudget::default() {
            let h = usage.get(&None).copied().unwrap_or_default();
            if let Some(b) = host.per_day.filter(|b| h.today + h.reserved >= *b) {
                return Err(refuse(format!(
                    "all agents together have spent the host's token budget for today ({} spent, {} in flight, of \
                     {b}; token_budget.per_day); it renews at 00:00 UTC",
                    h.today, h.reserved
                )));
            }
            if let Some(b) = host.total.filter(|b| h.total + h.reserved >= *b) {
                return Err(refuse(format!(
                    "all agents together have spent the host's total token budget ({} spent, {} in flight, of {b}); \
                     the operator can raise token_budget.total",
                    h.total, h.reserved
                )));
            }
            usage.entry(None).or_default().reserved += estimate;
        }
        usage.entry(key).or_default().reserved += estimate;
        Ok(Reservation { budgets: self.clone(), agent: agent.clone(), tokens: estimate, budget, host })
    }

    /// An agent's spent and reserved tokens.
    pub fn standing(&self, store: &Store, agent: &AgentId) -> Standing {
        match self.load(store, &Some(agent.clone())) {
            Ok(u) => Standing { today: u.today, total: u.total, reserved: u.reserved },
            Err(_) => Standing::default(),
        }
    }
}

impl Reservation {
    /// Replaces the reservation by what the call cost (already recorded in
    /// the database by the caller). Returns a warning for each budget this
    /// call took past [`WARN_AT_PERCENT`] (once per crossing: a day's budget
    /// warns once a day).
    pub fn settle(mut self, tokens: u64) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut usage = self.budgets.usage.lock();
        let agent = self.agent.clone();
        let keys: Vec<(Key, TokenBudget)> = if self.host == TokenBudget::default() {
            vec![(Some(agent.clone()), self.budget)]
        } else {
            vec![(Some(agent.clone()), self.budget), (None, self.host)]
        };
        for (key, budget) in keys {
            let Some(u) = usage.get_mut(&key) else { continue };
            u.reserved = u.reserved.saturating_sub(self.tokens);
            let day = today();
            if u.day != day {
                *u = Usage { day, today: 0, total: u.total, reserved: u.reserved };
            }
            let (today_before, total_before) = (u.today, u.total);
            u.today += tokens;
            u.total += tokens;
            let (who, whose, field) = match &key {
                Some(_) => (format!("agent {agent} has"), "its", format!("agents.{agent}.token_budget.total")),
                None => ("all agents together have".to_owned(), "the host's", "token_budget.total".to_owned()),
            };
            if let Some(limit) = crossed(today_before, u.today, budget.per_day) {
                warnings.push(format!(
                    "{who} used {} of {whose} {limit} tokens for today ({}%); at the limit model calls are refused \
                     until 00:00 UTC",
                    u.today,
                    u.today * 100 / limit
                ));
            }
            if let Some(limit) = crossed(total_before, u.total, budget.total) {
                warnings.push(format!(
                    "{who} used {} of {whose} {limit} tokens in total ({}%); at the limit model calls are refused \
                     until {field} is raised",
                    u.total,
                    u.total * 100 / limit
                ));
            }
        }
        self.tokens = 0;
        warnings
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.tokens > 0 {
            let mut usage = self.budgets.usage.lock();
            let host = self.host != TokenBudget::default();
            for key in [Some(self.agent.clone()), None] {
                if key.is_some() || host {
                    if let Some(u) = usage.get_mut(&key) {
                        u.reserved = u.reserved.saturating_sub(self.tokens);
                    }
                }
            }
        }
    }
}

/// What a request may cost: its prompt (from its size) and its completion
/// (its `max_tokens`/`max_completion_tokens`, else a default).
pub fn estimate(request_bytes: usize, body: &serde_json::Value) -> u64 {
    let asked = COMPLETION_FIELDS.iter().find_map(|k| body.get(*k).and_then(serde_json::Value::as_u64));
    estimate_with(request_bytes, asked)
}

/// The request fields that bound a completion's tokens, in order of
/// precedence.
pub const COMPLETION_FIELDS: [&str; 2] = ["max_completion_tokens", "max_tokens"];

/// [`estimate`] from the request's size and the completion bound it asked
/// for (none: the default reserve).
pub fn estimate_with(request_bytes: usize, asked: Option<u64>) -> u64 {
    request_bytes as u64 / BYTES_PER_TOKEN + asked.unwrap_or(DEFAULT_COMPLETION_RESERVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_share_is_crossed_once() {
        assert_eq!(crossed(30, 45, Some(40)), Some(40));
        assert_eq!(crossed(32, 45, Some(40)), None, "already past");
        assert_eq!(crossed(10, 31, Some(40)), None, "still under 80 %");
        assert_eq!(crossed(10, 32, Some(40)), Some(40), "exactly 80 %");
        assert_eq!(crossed(0, 100, None), None);
        assert_eq!(crossed(0, 100, Some(0)), None);
    }
}
