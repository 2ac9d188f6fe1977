//! choird's control plane: the verbs agents call ([`verbs`]), the agents'
//! lifecycle ([`lifecycle`]), the approval desk ([`approvals`]),
//! authentication, and what operators ask of agents (status, chat, cancel).
//!
//! The daemon is the verbs over two things it does not own the insides of:
//! [`Shared`] (config, secrets, store, upstream, budgets, audit, events — it
//! derefs to it) and [`Sessions`] (slots, leases, rate buckets, waiters,
//! behind one lock that no I/O can happen under). It never calls into the
//! Telegram gateway: it tells it what happened through [`crate::events`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::admin::{AgentSummary, AgentUsage, ChatResponse, ReloadReport, Use};
use choir_common::ids::AgentId;
use choir_common::rpc::InboundMessage;
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;
use serde_json::json;
use sha2::{Digest, Sha256};

mod approvals;
mod backup;
mod host_calls;
mod lifecycle;
mod log_reader;
pub mod prune;
mod rollout;
pub mod schedule;
mod secrets;
mod verbs;

use crate::arg_policies::{ArgPolicies, Reloaded};
use crate::config::Config;
use crate::error::Error;
use crate::host_tools::memory::Memory;
use crate::host_tools::Registry;
pub use crate::http::Caller as Authed;
use crate::http::ListenerKind;
use crate::secrets::Secrets;
use crate::sessions::{AuthFailure, Sessions};
pub use crate::sessions::{ChatUpdate, RateClass, LEASE_TTL};
use crate::shared::Shared;
use crate::store::{Delivery, Queued};

/// A HEARTBEAT may be held at most this long waiting for messages.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// How long `agent start` waits for the agent to report RUNNING.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Unauthenticated requests recorded per listener per minute.
const UNAUTH_AUDITS_PER_MIN: u32 = 20;

/// The last `n` lines of a text file (for error messages).
/// The last `n` lines of a log file, each in the human form.
fn tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| crate::logs::query::parse_line(l).human())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paces audit records of a recurring event per key: at most
/// [`UNAUTH_AUDITS_PER_MIN`] a minute, the next one carrying how many were
/// not recorded.
#[derive(Default)]
struct AuditPace {
    keys: HashMap<String, (Instant, u32, u64)>,
}

impl AuditPace {
    /// `Some(unrecorded so far)` when this one is to be recorded.
    fn admit(&mut self, key: &str) -> Option<u64> {
        if self.keys.len() > 1024 {
            self.keys.retain(|_, (t, _, _)| t.elapsed() < Duration::from_secs(60));
        }
        let e = self.keys.entry(key.to_owned()).or_insert((Instant::now(), 0, 0));
        if e.0.elapsed() >= Duration::from_secs(60) {
            *e = (Instant::now(), 0, e.2);
        }
        if e.1 < UNAUTH_AUDITS_PER_MIN {
            e.1 += 1;
            Some(std::mem::take(&mut e.2))
        } else {
            e.2 += 1;
            None
        }
    }
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// 256 random bits from the kernel, hex: lease tokens, console codes and sessions.
pub fn random_token() -> Result<String, Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    Ok(hex::encode(buf))
}

/// What the daemon is built from (see [`Daemon::new`]).
pub struct Parts {
    /// The shared services.
    pub shared: Arc<Shared>,
    /// The host tools it serves.
    pub host_tools: Registry,
    /// Agent memory, when configured (also a registrant of `host_tools`).
    pub memory: Option<Arc<Memory>>,
    /// How answers reach chats outside choird (the Telegram outbox).
    pub delivery: Arc<dyn Delivery>,
    /// How the database is provided, for `status`.
    pub database: String,
    /// The managed cluster's health, as its keeper finds it (None: an
    /// external database).
    pub db_health: Option<Arc<crate::db::keeper::Health>>,
    /// The agent binary of the process runtime and of image builds.
    pub agent_binary: PathBuf,
    /// The kill switch as persisted.
    pub kill_switch: bool,
    /// The scheduler's clock.
    pub clock: Arc<dyn crate::schedule::clock::Clock>,
}

/// choird's control plane.
pub struct Daemon {
    shared: Arc<Shared>,
    /// Agent slots and leases.
    pub sessions: Sessions,
    /// The host tools served to agents.
    pub host_tools: Registry,
    /// Agent memory, when configured.
    pub memory: Option<Arc<Memory>>,
    delivery: Arc<dyn Delivery>,
    /// How the database is provided, for `status`.
    database: String,
    db_health: Option<Arc<crate::db::keeper::Health>>,
    /// Read-held while an approval is applied (repos and database change
    /// together), write-held while a backup is taken.
    state_gate: parking_lot::RwLock<()>,
    /// Rollouts of approved tools and skills.
    rollouts: crate::rollouts::Rollouts,
    started: Instant,
    /// Set once shutdown begins.
    pub shutting_down: AtomicBool,
    kill_switch: AtomicBool,
    agent_binary: PathBuf,
    /// Supervisor threads of docker agents, joined at shutdown.
    supervisors: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Held while `config.json` is rewritten (approved changes, pairings).
    config_write: Mutex<()>,
    /// Paces audit records of unauthenticated requests.
    unauth_audit: Mutex<AuditPace>,
    /// The argument policy in force per agent.
    arg_policies: ArgPolicies,
    /// The scheduler's clock and its thread's wake-up.
    pub schedule: crate::schedule::Scheduling,
    /// Reloads asked through the admin API, each with where its report
    /// goes; the signal loop does them as it does SIGHUP's.
    reloads: (Sender<Sender<ReloadReport>>, Receiver<Sender<ReloadReport>>),
    /// Why Telegram polling and the scheduler are held (a home restored
    /// from a backup, until `choirctl resume`); none when they run.
    held: Mutex<Option<String>>,
    /// Set by a resume: the signal loop starts the gateway.
    pub resumed: AtomicBool,
    /// The signal loop's wake-up: a reload or a resume asked through the
    /// admin API pokes it, so the loop acts at once and otherwise sleeps.
    wake: (Sender<()>, Receiver<()>),
    /// When the backup being taken began (none: no backup runs).
    backup_since: Mutex<Option<jiff::Timestamp>>,
}

impl std::ops::Deref for Daemon {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl Daemon {
    /// How the database is provided and, for the managed cluster, whether
    /// it is up (or since when it is down, and why), for `status`.
    pub fn database_status(&self) -> String {
        match &self.db_health {
            Some(h) => format!("{}: {}", self.database, h.describe()),
            None => self.database.clone(),
        }
    }

    /// The control plane over `parts`.
    pub fn new(parts: Parts) -> Daemon {
        let sessions = Sessions::new(parts.shared.config().agents.keys());
        Daemon {
            shared: parts.shared,
            sessions,
            host_tools: parts.host_tools,
            memory: parts.memory,
            delivery: parts.delivery,
            database: parts.database,
            db_health: parts.db_health,
            state_gate: parking_lot::RwLock::new(()),
            rollouts: crate::rollouts::Rollouts::default(),
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            kill_switch: AtomicBool::new(parts.kill_switch),
            agent_binary: parts.agent_binary,
            supervisors: Mutex::new(Vec::new()),
            config_write: Mutex::new(()),
            unauth_audit: Mutex::new(AuditPace::default()),
            arg_policies: ArgPolicies::default(),
            schedule: crate::schedule::Scheduling::new(parts.clock),
            reloads: crossbeam_channel::bounded(4),
            held: Mutex::new(None),
            resumed: AtomicBool::new(false),
            wake: crossbeam_channel::bounded(1),
            backup_since: Mutex::new(None),
        }
    }

    /// How long a change waits for a backup in progress before it is
    /// refused, saying so (rather than hanging for as long as the backup).
    const GATE_WAIT: Duration = Duration::from_secs(2);

    fn busy_with_backup(&self) -> Error {
        let since = self.backup_since.lock().map(|t| t.to_string()).unwrap_or_else(|| "a moment ago".into());
        Error::Unavailable(format!(
            "waiting for the backup in progress (since {since}): config, secret and approval changes wait until it \
             is written; try again when `choirctl backup` is done"
        ))
    }

    /// The config-rewrite lock, or a refusal naming the backup that holds it.
    fn config_gate(&self) -> Result<parking_lot::MutexGuard<'_, ()>, Error> {
        self.config_write.try_lock_for(Self::GATE_WAIT).ok_or_else(|| self.busy_with_backup())
    }

    /// The approval gate (read), or a refusal naming the backup that holds it.
    fn approval_gate(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>, Error> {
        self.state_gate.try_read_for(Self::GATE_WAIT).ok_or_else(|| self.busy_with_backup())
    }

    /// Holds Telegram polling and the scheduler for `why` (see
    /// [`Home::restore_hold`](crate::home::Home::restore_hold)).
    pub fn hold(&self, why: String) {
        *self.held.lock() = Some(why);
    }

    /// Why polling and the scheduler are held, if they are.
    pub fn held(&self) -> Option<String> {
        self.held.lock().clone()
    }

    /// Ends the hold after a restore: the note is removed, the scheduler
    /// fires again and the signal loop starts Telegram polling. Audited.
    pub fn resume(&self, actor: &str) -> Result<String, Error> {
        let Some(why) = self.held.lock().take() else {
            return Ok("nothing was held: Telegram polling and the scheduler run".into());
        };
        match std::fs::remove_file(self.home.restore_hold()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                *self.held.lock() = Some(why);
                return Err(Error::Internal(format!("cannot remove {}: {e}", self.home.restore_hold().display())));
            }
        }
        self.resumed.store(true, Ordering::SeqCst);
        self.wake_main();
        self.schedule.poke();
        self.schedule.poke_looks();
        self.audit(actor, None, "choird.resume", "ok", json!({"was": why.trim()}));
        log::info!("resumed by {actor}: Telegram polling and the scheduler run");
        Ok("resumed: Telegram polling starts and scheduled jobs fire again".into())
    }

    /// Asks the signal loop for a reload (the one SIGHUP does) and waits
    /// for its report.
    pub fn request_reload(&self) -> Result<ReloadReport, Error> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.reloads.0.try_send(tx).map_err(|_| Error::Unavailable("reloads are already queued; try again".into()))?;
        self.wake_main();
        rx.recv_timeout(Duration::from_secs(120))
            .map_err(|_| Error::Timeout("the reload did not finish within 120 s; see choirctl logs".into()))
    }

    /// Wakes the signal loop to look at reloads and resumes now.
    pub fn wake_main(&self) {
        let _ = self.wake.0.try_send(()); // a wake-up already waiting is enough
    }

    /// What wakes the signal loop besides signals and its clock.
    pub fn woken(&self) -> &Receiver<()> {
        &self.wake.1
    }

    /// A reload asked through the admin API, if one waits.
    pub fn reload_asked(&self) -> Option<Sender<ReloadReport>> {
        self.reloads.1.try_recv().ok()
    }

    /// Why config.json on disk is not the configuration in force (none:
    /// it is), for `status`.
    pub fn config_on_disk(&self) -> Option<String> {
        match Config::load(&self.home.config()) {
            Ok(c) if c == *self.config() => None,
            Ok(_) => Some("config.json has changed since it was loaded: `choirctl reload` applies it".into()),
            Err(e) => Some(format!("config.json on disk is not valid ({e}); choird runs with the last valid one")),
        }
    }

    /// The shared services (for handles given to other parts).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Seconds since start.
    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Replaces config and secrets (SIGHUP). Agents that were added become
    /// startable (their sockets are opened by `serve`); removed agents are
    /// revoked there. Bumps the config version so agents refetch their
    /// dynamic config.
    pub fn reload(&self, config: Config, secrets: Secrets) {
        self.sessions.ensure(config.agents.keys());
        self.logs().set_limits(config.logs.limits());
        self.shared.replace(config, secrets);
        self.reload_policies("choird");
        self.warn_unmatched_tool_policies();
        self.sessions.wake_all();
    }

    /// Says, for every agent, each pattern of `agents.<id>.tools` in
    /// config.json that matches none of its tools (a mistyped deny leaves
    /// the tool allowed), with the nearest name. Patterns set with
    /// `choirctl policy tools` were checked then; these are hand edits.
    pub fn warn_unmatched_tool_policies(&self) {
        let config = self.config();
        for (agent, a) in &config.agents {
            if a.tools == choir_common::tool_policy::ToolPolicy::default() {
                continue;
            }
            let Ok((_, known)) = crate::tool_list::known_names(&self.shared, &self.host_tools, agent) else { continue };
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            for u in a.tools.unmatched(&known, &choir_common::tool_policy::ToolPolicy::default()) {
                log::warn!("config.json agents.{agent}.tools.{u} (a tool not installed yet is fine; a typo is not)");
            }
        }
    }

    /// The argument policy in force for agent `id`.
    pub fn argument_policy(&self, id: &AgentId) -> Arc<choir_common::arg_policy::PolicySet> {
        self.arg_policies.get(id)
    }

    /// The process's log manager.
    pub fn logs(&self) -> std::sync::Arc<crate::logs::LogManager> {
        crate::logs::global(&self.home.logs())
    }

    /// Reloads every configured agent's argument policy from `repos/`; a
    /// refused file keeps the policy in force (named in the result, logged
    /// and audited). Agents whose policy changed refetch their config.
    pub fn reload_policies(&self, actor: &str) -> Vec<(AgentId, Reloaded)> {
        let config = self.config();
        let results = self.arg_policies.reload(&self.home, &self.host_tools, config.agents.keys());
        for (agent, r) in &results {
            match r {
                Reloaded::Loaded { rules, changed: true } => {
                    self.audit(actor, Some(agent), "policy.reload", "loaded", json!({"rules": rules}));
                }
                Reloaded::Loaded { .. } => {}
                Reloaded::Refused(e) => {
                    self.audit(actor, Some(agent), "policy.reload", "refused", json!({"error": e.to_string()}));
                }
            }
        }
        if results.iter().any(|(_, r)| matches!(r, Reloaded::Loaded { changed: true, .. })) {
            self.bump_config_version();
            self.sessions.wake_all();
        }
        results
    }

    /// Rewrites `config.json` with `edit` (old text → new text; see
    /// [`crate::config::edit`]: only what changed), refuses a result that
    /// does not validate, keeps the text it replaces as `config.json.prev`,
    /// replaces the file atomically with its mode kept, and reloads it. One
    /// rewrite at a time.
    pub fn rewrite_config(&self, edit: impl FnOnce(&str) -> Result<String, String>) -> Result<(), String> {
        let _one = self.config_gate().map_err(|e| e.to_string())?;
        let path = self.home.config();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let new = edit(&text)?;
        Config::parse(&new)
            .map_err(|(field, reason)| format!("the changed config.json is invalid: {field}: {reason}"))?;
        let mode = std::fs::metadata(&path).map(|m| m.permissions()).map_err(|e| format!("{}: {e}", path.display()))?;
        let prev = path.with_extension("json.prev");
        let tmp = path.with_extension("json.choir-tmp");
        for (file, content) in [(&prev, &text), (&tmp, &new)] {
            std::fs::write(file, content)
                .and_then(|()| std::fs::set_permissions(file, mode.clone()))
                .map_err(|e| format!("{}: {e}", file.display()))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config = Config::load(&path).map_err(|e| e.to_string())?;
        self.reload(config, (*self.secrets()).clone());
        Ok(())
    }

    /// A configured agent's id, or a clear error.
    pub fn known_agent(&self, id: &str) -> Result<AgentId, Error> {
        self.known(id)
    }

    fn known(&self, id: &str) -> Result<AgentId, Error> {
        let config = self.config();
        let names = || config.agents.keys().map(AgentId::as_str).collect::<Vec<_>>().join(", ");
        let id = AgentId::parse(id).map_err(|e| Error::Malformed(e.to_string()))?;
        if !config.agents.contains_key(&id) {
            return Err(Error::NotFound(format!(
                "no agent {:?} in config.json (configured: {})",
                id.as_str(),
                if config.agents.is_empty() { "none".to_owned() } else { names() }
            )));
        }
        Ok(id)
    }

    /// Checks a lease token and the per-agent rate limit of `class`.
    /// Failures are audited (paced: a few records a minute per listener).
    pub fn authenticate(
        &self,
        kind: &ListenerKind,
        bearer: Option<&str>,
        what: &str,
        class: RateClass,
    ) -> Result<Authed, Error> {
        let deny = |reason: &str| {
            let listener = match kind {
                ListenerKind::Admin => "choird.sock".to_owned(),
                ListenerKind::Agent(id) => format!("agents/{id}"),
                ListenerKind::Tcp => "tcp".to_owned(),
                ListenerKind::Metrics => "metrics".to_owned(),
                ListenerKind::Console => "console".to_owned(),
            };
            // A flood of bad tokens must not flood the audit table.
            if let Some(suppressed) = self.unauth_audit.lock().admit(&listener) {
                self.audit(
                    "agent-rpc",
                    None,
                    what,
                    "unauthorized",
                    json!({"listener": listener, "reason": reason, "unrecorded_before": suppressed}),
                );
            }
            Error::Unauthorized(format!("{reason}: every agent RPC needs the lease token of a live session"))
        };
        let Some(token) = bearer else {
            return Err(deny("missing bearer token"));
        };
        match self.sessions.authenticate(kind, &sha256(token.as_bytes()), class) {
            Ok(caller) => Ok(caller),
            Err(AuthFailure::UnknownToken) => Err(deny("unknown or expired lease token")),
            Err(AuthFailure::WrongSocket) => Err(deny("token belongs to another agent's socket")),
            Err(AuthFailure::RateLimited { agent, rate, retry_after }) => Err(Error::RateLimited {
                message: format!("agent {agent} is over its RPC rate limit ({rate}/s)"),
                retry_after_s: Some(retry_after.as_secs().max(1)),
            }),
        }
    }

    /// Whether the operator's kill switch is on.
    pub fn kill_switch(&self) -> bool {
        self.kill_switch.load(Ordering::SeqCst)
    }

    /// Turns the global kill switch on or off: persisted, audited, and pushed to
    /// every agent at once (their long-polls are woken with a new config version).
    pub fn set_kill_switch(&self, on: bool, actor: &str) -> Result<(), Error> {
        self.store.set_policy("kill_switch", &json!(on), actor)?;
        self.kill_switch.store(on, Ordering::SeqCst);
        self.bump_config_version();
        self.sessions.wake_all();
        log::warn!("kill switch turned {} by {actor}", if on { "ON" } else { "off" });
        self.audit(actor, None, "policy.kill_switch", if on { "on" } else { "off" }, json!({}));
        Ok(())
    }

    // ----- admin ----------------------------------------------------------

    /// Summaries of every configured agent (and of any still running).
    pub fn summaries(&self) -> Vec<AgentSummary> {
        let config = self.config();
        self.sessions.summaries(config.runtime.as_str(), |id| config.agents.contains_key(id))
    }

    /// Summary of one agent.
    pub fn summary(&self, id: &str) -> Result<AgentSummary, Error> {
        let id = self.known(id)?;
        let mut summary = self
            .sessions
            .summary(&id, self.config().runtime.as_str())
            .ok_or_else(|| Error::NotFound(format!("no agent {id}")))?;
        summary.fallbacks = self.shared.upstream.fallbacks_of(id.as_str());
        Ok(summary)
    }

    /// [`Daemon::summaries`] with what each running agent's lanes are doing
    /// now: asked first ([`Daemon::refresh_status`]). For readers of lanes;
    /// lanes are not reported unasked.
    pub fn summaries_now(&self) -> Vec<AgentSummary> {
        self.refresh_status(None, crate::sessions::STATUS_FRESH);
        self.summaries()
    }

    /// [`Daemon::summary`] with what the agent's lanes are doing now.
    pub fn summary_now(&self, id: &str) -> Result<AgentSummary, Error> {
        let known = self.known(id)?;
        self.refresh_status(Some(&known), crate::sessions::STATUS_FRESH);
        self.summary(id)
    }

    /// Every configured agent's use of its quotas and budget (for `status`).
    /// A figure the database cannot give now is left unknown.
    pub fn usage(&self) -> Vec<AgentUsage> {
        let config = self.config();
        config
            .agents
            .iter()
            .map(|(id, a)| {
                let q = a.quotas;
                let tokens = self.budgets.standing(&self.store, id);
                let memory = self.memory.as_ref().and_then(|m| m.count(id).ok());
                let spool = crate::home::dir_bytes(&self.home.spool(id));
                let (workspace_bytes, workspace_inodes) = self.workspace_use(&config, id, &q);
                AgentUsage {
                    id: id.to_string(),
                    tokens_today: Use { used: Some(tokens.today + tokens.reserved), limit: a.token_budget.per_day },
                    tokens_total: Use { used: Some(tokens.total + tokens.reserved), limit: a.token_budget.total },
                    memory_items: Use { used: memory, limit: Some(q.memory_items) },
                    pending_proposals: Use {
                        used: self.store.pending_count(id).ok(),
                        limit: Some(q.pending_proposals),
                    },
                    notices_this_hour: Use {
                        used: Some(self.hourly_count(id, "notices")),
                        limit: Some(q.notices_per_hour),
                    },
                    spool_bytes: Use { used: Some(spool), limit: Some(q.spool_mb * 1024 * 1024) },
                    audit_this_hour: Use { used: Some(self.hourly_count(id, "audit")), limit: Some(q.audit_per_hour) },
                    workspace_bytes,
                    workspace_inodes,
                }
            })
            .collect()
    }

    /// An agent's workspace use: its file system's figures while its image
    /// is mounted, else the configured quota with the use unknown.
    fn workspace_use(&self, config: &Config, id: &AgentId, q: &crate::config::Quotas) -> (Use, Use) {
        if q.workspace_mb == 0 {
            return (Use::default(), Use::default());
        }
        let image = self.home.workspace_image(id);
        let workspace = config.workspace(&self.home, id);
        match crate::runtime::workspace::is_mounted(&image, &workspace)
            .then(|| crate::disk::Space::of(&workspace).ok())
            .flatten()
        {
            Some(s) => (
                Use { used: Some(s.total.saturating_sub(s.free)), limit: Some(s.total) },
                Use { used: Some(s.total_inodes.saturating_sub(s.free_inodes)), limit: Some(s.total_inodes) },
            ),
            None => (
                Use { used: None, limit: Some(q.workspace_mb * 1024 * 1024) },
                Use { used: None, limit: Some(q.workspace_inodes) },
            ),
        }
    }

    /// Wakes the agent's long-poll: a message for it was queued.
    pub fn wake_agent(&self, id: &AgentId) {
        self.sessions.wake(id);
    }

    /// Wakes the agent's long-poll for a message just queued, and hands
    /// it over from memory when nothing earlier is unknown
    /// ([`crate::sessions::Sessions::stored`]).
    pub fn message_stored(&self, id: &AgentId, queued: Queued, conversation: &str, sender: &str, text: &str) {
        let message = InboundMessage {
            id: queued.id,
            conversation: conversation.to_owned(),
            sender: sender.to_owned(),
            text: text.to_owned(),
            earlier: queued.earlier,
        };
        self.sessions.stored(id, message, queued.pending_before);
    }

    /// Wakes every long-poll (shutdown).
    pub fn wake_all(&self) {
        self.sessions.wake_all();
    }

    /// Queues a user message and waits for the agent's answer.
    pub fn chat(
        &self,
        id: &str,
        text: &str,
        conversation: &str,
        sender: &str,
        timeout: Duration,
    ) -> Result<ChatResponse, Error> {
        let (message_id, updates) = self.chat_send(id, text, conversation, sender)?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.chat_next(id, message_id, &updates, deadline)? {
                ChatUpdate::Partial(_) => continue,
                ChatUpdate::Done(Ok(reply)) => {
                    choir_common::hop::mark("admin.answer");
                    return Ok(ChatResponse { message_id, reply });
                }
                ChatUpdate::Done(Err(why)) => return Err(Error::Unavailable(why)),
            }
        }
    }

    /// Queues a user message and registers for its answer; returns the message
    /// id and the channel its partial and final answers arrive on.
    pub fn chat_send(
        &self,
        id: &str,
        text: &str,
        conversation: &str,
        sender: &str,
    ) -> Result<(u64, Receiver<ChatUpdate>), Error> {
        let id = self.known(id)?;
        if text.trim().is_empty() {
            return Err(Error::Malformed("the message is empty".into()));
        }
        if text.len() > 64 * 1024 {
            return Err(Error::TooLarge("a message may be at most 64 KiB".into()));
        }
        if text.contains('\0') || conversation.contains('\0') {
            return Err(Error::Malformed("a message cannot hold a NUL character".into()));
        }
        if conversation.len() > choir_common::rpc::MAX_CONVERSATION_KEY {
            return Err(Error::Malformed(format!(
                "a conversation key is at most {} bytes",
                choir_common::rpc::MAX_CONVERSATION_KEY
            )));
        }
        if !self.sessions.accepting(&id) {
            return Err(Error::Conflict(format!(
                "agent {id} is not running; start it with `choirctl agent start {id}`"
            )));
        }
        if let Some(why) = self.disk_refusal(&id, crate::disk::Look::Recent) {
            return Err(Error::Unavailable(why));
        }
        choir_common::hop::mark("message.in");
        let replies_begun = self.sessions.replies_begun(&id);
        let queued = self.store.insert_message(&id, conversation, sender, text).inspect_err(|_| {
            // It may have been stored all the same (its commit's answer
            // lost): the agent looks (see `Session::looked`).
            self.sessions.wake(&id);
        })?;
        choir_common::hop::mark("message.stored");
        let message_id = queued.id;
        // Unbounded: a handful of throttled partials, then one answer (the
        // agent's partials are coalesced to a few a second).
        let (tx, rx) = unbounded();
        // The answer may have been recorded before the waiter was
        // registered: only possible if replies began storing meanwhile.
        let missed = self.sessions.wait_for_answer(&id, message_id, tx.clone(), replies_begun);
        self.message_stored(&id, queued, conversation, sender, text);
        if missed {
            if let Some(reply) = self.store.reply_of(&id, message_id)? {
                self.sessions.forget_waiter(&id, message_id);
                let _ = tx.send(ChatUpdate::Done(Ok(reply)));
            }
        }
        Ok((message_id, rx))
    }

    /// The next update of a chat, or a timeout error (the message stays queued).
    pub fn chat_next(
        &self,
        id: &str,
        message_id: u64,
        updates: &Receiver<ChatUpdate>,
        deadline: Instant,
    ) -> Result<ChatUpdate, Error> {
        match updates.recv_deadline(deadline) {
            Ok(u) => Ok(u),
            Err(_) => {
                if let Ok(agent) = AgentId::parse(id) {
                    self.sessions.forget_waiter(&agent, message_id);
                }
                Err(Error::Timeout(format!(
                    "no answer from agent {id} in time; message {message_id} stays queued and will be answered"
                )))
            }
        }
    }

    /// Sessions whose lease lapsed (no RPC for [`LEASE_TTL`]); each is
    /// reported once.
    pub fn stale_sessions(&self) -> Vec<(AgentId, i64)> {
        self.sessions.stale()
    }
}
