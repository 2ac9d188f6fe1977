//! What every part of choird reads and writes besides agent sessions: the
//! state directory, the current config and secrets, the database, the
//! upstream LLM client, token budgets, the audit trail with its quotas, and
//! the event channel to the Telegram gateway.
//!
//! The daemon, the host tools and the gateway each hold an `Arc<Shared>`:
//! none of them needs another's internals to reach these.
//!
//! **Invariant:** audit details never hold an attacker-controlled string
//! longer than 200 characters or with control characters (they are clipped
//! and escaped), and an agent's own requests write at most its
//! `audit_per_hour` records an hour (then one record an hour says how many
//! were not written).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};

use crate::budget::Budgets;
use crate::config::Config;
use crate::events::Events;
use crate::home::Home;
use crate::secrets::Secrets;
use crate::store::Store;
use crate::tasks::Tasks;
use crate::upstream::Upstream;

/// One hour of a counted thing.
struct Window {
    start: Instant,
    count: u64,
    dropped: u64,
}

/// What [`Shared::hourly`] says.
pub enum Hourly {
    /// Counted; `dropped_before` were refused in the hour that just ended.
    Within {
        /// Refused in the previous hour (to be reported once).
        dropped_before: u64,
    },
    /// Over the limit: refuse it.
    Over,
}

/// The services shared by every part of choird.
pub struct Shared {
    /// The state directory.
    pub home: Home,
    config: RwLock<Arc<Config>>,
    secrets: RwLock<Arc<Secrets>>,
    config_version: AtomicU64,
    /// The database.
    pub store: Store,
    /// The client of the upstream LLM endpoints.
    pub upstream: Upstream,
    /// Tokens spent and reserved per agent (the token budget).
    pub budgets: Arc<Budgets>,
    /// What the daemon tells the gateway.
    pub events: Events,
    /// Threads started for one piece of work, joined at shutdown.
    pub tasks: Tasks,
    /// The MCP tools choird switched off per agent (their server changed
    /// them since approval), by wire name: the relay leaves them out of the
    /// agent's model requests.
    pub mcp_disabled: RwLock<HashMap<AgentId, std::collections::BTreeSet<String>>>,
    hourly: Mutex<HashMap<(AgentId, &'static str), Window>>,
    /// The free-space guard's recent readings.
    disk: crate::disk::Guard,
}

impl Shared {
    /// Why new work for agent `id` is refused because a disk it needs is
    /// nearly full (see [`crate::disk`]), if it is, looking at the disks as
    /// `look` says (a disk seen not nearly full within the last second is
    /// not asked again for [`crate::disk::Look::Recent`]).
    pub fn disk_refusal(&self, id: &choir_common::ids::AgentId, look: crate::disk::Look) -> Option<String> {
        let workspace = self.config().workspace(&self.home, id);
        self.disk.refuse_new_work(self.home.root(), &workspace, look)
    }

    /// The shared services for a loaded config.
    pub fn new(home: Home, config: Config, secrets: Secrets, store: Store, events: Events) -> Shared {
        Shared {
            home,
            config: RwLock::new(Arc::new(config)),
            secrets: RwLock::new(Arc::new(secrets)),
            config_version: AtomicU64::new(1),
            store,
            upstream: Upstream::new(),
            budgets: Arc::default(),
            events,
            tasks: Tasks::default(),
            mcp_disabled: RwLock::default(),
            hourly: Mutex::new(HashMap::new()),
            disk: crate::disk::Guard::default(),
        }
    }

    /// The current config.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().clone()
    }

    /// The current secrets.
    pub fn secrets(&self) -> Arc<Secrets> {
        self.secrets.read().clone()
    }

    /// The version agents compare to refetch their dynamic config.
    pub fn config_version(&self) -> u64 {
        self.config_version.load(Ordering::SeqCst)
    }

    /// Bumps the config version (a reload, the kill switch).
    pub fn bump_config_version(&self) {
        self.config_version.fetch_add(1, Ordering::SeqCst);
    }

    /// Replaces config and secrets and bumps the version.
    pub fn replace(&self, config: Config, secrets: Secrets) {
        *self.config.write() = Arc::new(config);
        *self.secrets.write() = Arc::new(secrets);
        self.bump_config_version();
    }

    /// Writes an audit record; a database failure is logged, not propagated,
    /// so auditing never turns an answer into an error. See the module's
    /// invariant for clipping and the quota.
    pub fn audit(&self, actor: &str, agent: Option<&AgentId>, action: &str, outcome: &str, detail: Value) {
        let mut detail = detail;
        clip_strings(&mut detail);
        if let (Some(agent), "agent-rpc") = (agent, actor) {
            let quota = self.config().agents.get(agent).map(|a| a.quotas.audit_per_hour).unwrap_or_default();
            match self.hourly(agent, "audit", quota) {
                Hourly::Within { dropped_before: 0 } => {}
                Hourly::Within { dropped_before } => {
                    let note = json!({"not_written": dropped_before, "quota_per_hour": quota});
                    if let Err(e) = self.store.audit("choird", Some(agent), "audit.over_quota", "dropped", &note) {
                        log::error!("audit record lost (audit.over_quota): {e}");
                    }
                }
                Hourly::Over => return,
            }
        }
        if let Err(e) = self.store.audit(actor, agent, action, outcome, &detail) {
            log::error!("audit record lost ({action} {outcome}): {e}");
        }
    }

    /// An audit record of an agent's request that no quota drops (an
    /// action on the outside world): strings clipped as in [`Shared::audit`].
    pub fn audit_always(&self, agent: Option<&AgentId>, action: &str, outcome: &str, detail: Value) {
        let mut detail = detail;
        clip_strings(&mut detail);
        if let Err(e) = self.store.audit("agent-rpc", agent, action, outcome, &detail) {
            log::error!("audit record lost ({action} {outcome}): {e}");
        }
    }

    /// Counts one `what` of `agent` in the current hour against `limit`.
    pub fn hourly(&self, agent: &AgentId, what: &'static str, limit: u64) -> Hourly {
        let mut windows = self.hourly.lock();
        let w = windows.entry((agent.clone(), what)).or_insert_with(|| Window {
            start: Instant::now(),
            count: 0,
            dropped: 0,
        });
        let mut dropped_before = 0;
        if w.start.elapsed() >= Duration::from_secs(3600) {
            dropped_before = w.dropped;
            *w = Window { start: Instant::now(), count: 0, dropped: 0 };
        }
        if w.count >= limit {
            w.dropped += 1;
            return Hourly::Over;
        }
        w.count += 1;
        Hourly::Within { dropped_before }
    }

    /// How many `what` of `agent` were counted this hour (for `status`).
    pub fn hourly_count(&self, agent: &AgentId, what: &'static str) -> u64 {
        self.hourly
            .lock()
            .get(&(agent.clone(), what))
            .filter(|w| w.start.elapsed() < Duration::from_secs(3600))
            .map_or(0, |w| w.count)
    }
}

/// An attacker-controlled string as messages and audit details keep it: at
/// most 200 characters, control characters escaped.
pub fn clip(s: &str) -> String {
    choir_common::text::clipped(s, 200)
}

/// Clips every string in an audit record's detail (see [`clip`]).
fn clip_strings(v: &mut Value) {
    match v {
        Value::String(s) if s.chars().count() > 200 || s.chars().any(char::is_control) => *s = clip(s),
        Value::Array(items) => items.iter_mut().for_each(clip_strings),
        Value::Object(map) => map.values_mut().for_each(clip_strings),
        _ => {}
    }
}
