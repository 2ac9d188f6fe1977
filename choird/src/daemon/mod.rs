//! choird's shared state and the agent lifecycle: which agents run, their
//! sessions (leases), message queues and the waiters for their answers.
//!
//! One mutex (`agents`) guards all per-agent state, with one condition variable
//! (`changed`) that long-polling HEARTBEATs and stopping admins wait on.
//! **Invariant:** no database call is made while `agents` is held, so a slow
//! database never stalls authentication or other agents.
//! **Invariant:** at most one session per agent is live (invariant 11); a start
//! while one is live is refused.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::admin::{AgentSummary, ChatResponse};
use choir_common::ids::AgentId;
use choir_common::rpc::{
    Bindings, ConversationTail, DynamicConfig, HeartbeatRequest, HeartbeatResponse, InitHelloRequest,
    InitHelloResponse, LaneModels, OutboundReply, RecoverySnapshot, ReportStatusRequest,
};
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::{Condvar, Mutex, RwLock};
use serde_json::json;
use sha2::{Digest, Sha256};

mod approvals;
mod lifecycle;

use crate::config::{Config, Lane, RuntimeKind};
use crate::home::Home;
use crate::http::{ApiError, ListenerKind};
use crate::secrets::Secrets;
use crate::store::{ReplicationError, Store};

/// A HEARTBEAT may be held at most this long waiting for messages.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// The lease lapses when no HEARTBEAT arrives for this long.
pub const LEASE_TTL: Duration = Duration::from_secs(60);
/// Agent RPC rate limit: sustained requests per second, per agent and per
/// class (verbs, edge model calls, core model calls), so core jobs working
/// hard never slow the user-facing lane down.
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
/// Messages handed out per HEARTBEAT.
const BATCH: i64 = 32;
/// Answered exchanges per conversation handed to a (re)started agent.
const RECOVERED_EXCHANGES: i64 = 10;
/// How long `agent start` waits for the agent to report RUNNING.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// An attacker-controlled string as audit details keep it: at most 200
/// characters, control characters escaped.
pub(crate) fn clip(s: &str) -> String {
    crate::http::printable(s)
}

/// The last `n` lines of a text file (for error messages).
fn tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
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
    fn as_str(self) -> &'static str {
        match self {
            Phase::Stopped => "stopped",
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
        }
    }
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
pub(crate) enum Instance {
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

/// A live lease.
pub(crate) struct Session {
    id: i64,
    token_sha256: [u8; 32],
    instance: Option<Instance>,
    started: Instant,
    last_seen: Instant,
    /// Highest message id handed to this session.
    delivered_upto: u64,
    stop: bool,
    terminated: bool,
    /// Its lapsed lease has been acted on.
    reaped: bool,
    buckets: [Bucket; 4],
}

impl Session {
    /// A fresh lease: handed nothing yet beyond `delivered_upto`.
    fn new(id: i64, token_sha256: [u8; 32], instance: Option<Instance>, delivered_upto: u64) -> Session {
        Session {
            id,
            token_sha256,
            instance,
            started: Instant::now(),
            last_seen: Instant::now(),
            delivered_upto,
            stop: false,
            terminated: false,
            reaped: false,
            buckets: [
                Bucket::new(RATE_PER_S),
                Bucket::new(RATE_PER_S),
                Bucket::new(RATE_PER_S),
                Bucket::new(HEARTBEAT_PER_S),
            ],
        }
    }
}

#[derive(Default)]
pub(crate) struct AgentSlot {
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
    replicated_seq: u64,
    /// Chat requests waiting for the answer to a message id.
    waiters: HashMap<u64, Sender<ChatUpdate>>,
    /// Bumped whenever a long-poll of this agent should look again.
    wake: u64,
    /// Decisions on its proposals wait to be handed over.
    decisions_due: bool,
    /// Lanes the operator asked to cancel, not yet handed over.
    cancels: Vec<String>,
}

/// What a waiting chat request hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatUpdate {
    /// The answer so far (of the current model step).
    Partial(String),
    /// The answer, or why there will be none now.
    Done(Result<String, String>),
}

/// The caller of an agent RPC, once its token checked out.
pub use crate::http::Caller as Authed;

/// choird's state, shared by every thread.
pub struct Daemon {
    /// The state directory.
    pub home: Home,
    config: RwLock<Arc<Config>>,
    secrets: RwLock<Arc<Secrets>>,
    /// The database.
    pub store: Store,
    /// How the database is provided, for `status`.
    pub database: String,
    started: Instant,
    config_version: AtomicU64,
    agents: Mutex<BTreeMap<AgentId, AgentSlot>>,
    changed: Condvar,
    /// Set once shutdown begins.
    pub shutting_down: AtomicBool,
    /// HTTP client for upstream LLM calls.
    pub upstream: ureq::Agent,
    kill_switch: AtomicBool,
    agent_binary: PathBuf,
    /// Supervisor threads of docker agents, joined at shutdown.
    supervisors: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The Telegram gateway's pokes and counters.
    pub telegram: crate::telegram::Link,
    /// Held while `config.json` is rewritten (approved changes, pairings).
    config_write: Mutex<()>,
    /// Agent memory, when configured (set once at start).
    pub memory: std::sync::OnceLock<Arc<crate::memory::Memory>>,
    /// Paces audit records of unauthenticated requests.
    unauth_audit: Mutex<AuditPace>,
    /// Tokens spent and reserved per agent (the token budget).
    pub budgets: Arc<crate::budget::Budgets>,
    /// Hourly counters of what agents make choird keep (quotas).
    hourly: Mutex<HashMap<(AgentId, &'static str), Window>>,
}

/// One hour of a counted thing.
struct Window {
    start: Instant,
    count: u64,
    dropped: u64,
}

/// What [`Daemon::hourly`] says.
pub(crate) enum Hourly {
    /// Counted; `dropped_before` were refused in the hour that just ended.
    Within {
        /// Refused in the previous hour (to be reported once).
        dropped_before: u64,
    },
    /// Over the limit: refuse it.
    Over,
}

/// Clips every string in an audit record's detail (see [`clip`]).
fn clip_strings(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) if s.chars().count() > 200 || s.chars().any(char::is_control) => *s = clip(s),
        serde_json::Value::Array(items) => items.iter_mut().for_each(clip_strings),
        serde_json::Value::Object(map) => map.values_mut().for_each(clip_strings),
        _ => {}
    }
}

/// Unauthenticated requests recorded per listener per minute.
const UNAUTH_AUDITS_PER_MIN: u32 = 20;

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

fn random_token() -> Result<String, ApiError> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).map_err(|e| ApiError::Internal(format!("no randomness: {e}")))?;
    Ok(hex::encode(buf))
}

impl Daemon {
    /// Builds the state for a loaded config.
    pub fn new(
        home: Home,
        config: Config,
        secrets: Secrets,
        store: Store,
        database: String,
        agent_binary: PathBuf,
        kill_switch: bool,
    ) -> Daemon {
        let agents = config.agents.keys().map(|id| (id.clone(), AgentSlot::default())).collect();
        let upstream =
            ureq::Agent::new_with_config(ureq::config::Config::builder().http_status_as_error(false).build());
        Daemon {
            home,
            config: RwLock::new(Arc::new(config)),
            secrets: RwLock::new(Arc::new(secrets)),
            store,
            database,
            started: Instant::now(),
            config_version: AtomicU64::new(1),
            agents: Mutex::new(agents),
            changed: Condvar::new(),
            shutting_down: AtomicBool::new(false),
            upstream,
            agent_binary,
            kill_switch: AtomicBool::new(kill_switch),
            supervisors: Mutex::new(Vec::new()),
            telegram: crate::telegram::Link::default(),
            config_write: Mutex::new(()),
            memory: std::sync::OnceLock::new(),
            unauth_audit: Mutex::new(AuditPace::default()),
            budgets: Arc::default(),
            hourly: Mutex::new(HashMap::new()),
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

    /// Seconds since start.
    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Replaces config and secrets (SIGHUP). Agents that were added become
    /// startable; removed agents keep running until stopped. Bumps the config
    /// version so agents refetch their dynamic config.
    pub fn reload(&self, config: Config, secrets: Secrets) {
        let mut agents = self.agents.lock();
        for id in config.agents.keys() {
            agents.entry(id.clone()).or_default();
        }
        drop(agents);
        *self.config.write() = Arc::new(config);
        *self.secrets.write() = Arc::new(secrets);
        self.config_version.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// Rewrites `config.json` with `edit` (old text → new text), refuses a
    /// result that does not validate, replaces the file atomically and
    /// reloads it. One rewrite at a time.
    pub fn rewrite_config(&self, edit: impl FnOnce(&str) -> Result<String, String>) -> Result<(), String> {
        let _one = self.config_write.lock();
        let path = self.home.config();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let new = edit(&text)?;
        Config::parse(&new)
            .map_err(|(field, reason)| format!("the changed config.json is invalid: {field}: {reason}"))?;
        let tmp = path.with_extension("json.choir-tmp");
        std::fs::write(&tmp, &new).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config = Config::load(&path).map_err(|e| e.to_string())?;
        self.reload(config, (*self.secrets()).clone());
        Ok(())
    }

    /// Writes an audit record; a database failure is logged, not propagated,
    /// so auditing never turns an answer into an error. Strings in `detail`
    /// are clipped (an agent chooses many of them); records of an agent's own
    /// requests (`agent-rpc`) count against its `audit_per_hour` quota, and
    /// past it one record per hour says how many were not written.
    pub fn audit(&self, actor: &str, agent: Option<&AgentId>, action: &str, outcome: &str, detail: serde_json::Value) {
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

    /// Counts one `what` of `agent` in the current hour against `limit`.
    pub(crate) fn hourly(&self, agent: &AgentId, what: &'static str, limit: u64) -> Hourly {
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

    /// Every configured agent's use of its quotas and budget (for `status`).
    /// A figure the database cannot give now is left unknown.
    pub fn usage(&self) -> Vec<choir_common::admin::AgentUsage> {
        use choir_common::admin::{AgentUsage, Use};
        let config = self.config();
        config
            .agents
            .iter()
            .map(|(id, a)| {
                let q = a.quotas;
                let tokens = self.budgets.standing(&self.store, id);
                let memory = self.memory.get().and_then(|m| m.count(self, id).ok());
                let spool = crate::telegram::files::dir_bytes(
                    &self.home.root().join("telegram").join("spool").join(id.as_str()),
                );
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
                }
            })
            .collect()
    }

    /// How many `what` of `agent` were counted this hour (for `status`).
    pub(crate) fn hourly_count(&self, agent: &AgentId, what: &'static str) -> u64 {
        self.hourly
            .lock()
            .get(&(agent.clone(), what))
            .filter(|w| w.start.elapsed() < Duration::from_secs(3600))
            .map_or(0, |w| w.count)
    }

    /// A configured agent's id, or a clear error.
    pub fn known_agent(&self, id: &str) -> Result<AgentId, ApiError> {
        self.known(id)
    }

    fn known(&self, id: &str) -> Result<AgentId, ApiError> {
        let config = self.config();
        let names = || config.agents.keys().map(AgentId::as_str).collect::<Vec<_>>().join(", ");
        let id = AgentId::parse(id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        if !config.agents.contains_key(&id) {
            return Err(ApiError::NotFound(format!(
                "no agent {:?} in config.json (configured: {})",
                id.as_str(),
                if config.agents.is_empty() { "none".to_owned() } else { names() }
            )));
        }
        Ok(id)
    }

    // ----- agent RPC -------------------------------------------------------

    /// Checks a lease token, and the per-agent rate limit. Failures are audited.
    pub fn authenticate(
        &self,
        kind: &ListenerKind,
        bearer: Option<&str>,
        what: &str,
        class: RateClass,
    ) -> Result<Authed, ApiError> {
        let deny = |reason: &str| {
            let listener = match kind {
                ListenerKind::Admin => "choird.sock".to_owned(),
                ListenerKind::Agent(id) => format!("agents/{id}"),
                ListenerKind::Tcp => "tcp".to_owned(),
            };
            // A flood of bad tokens must not flood the audit table: a few
            // records per minute per listener, each counting what it stands for.
            if let Some(suppressed) = self.unauth_audit.lock().admit(&listener) {
                self.audit(
                    "agent-rpc",
                    None,
                    what,
                    "unauthorized",
                    json!({"listener": listener, "reason": reason, "unrecorded_before": suppressed}),
                );
            }
            ApiError::Unauthorized(format!("{reason}: every agent RPC needs the lease token of a live session"))
        };
        let Some(token) = bearer else {
            return Err(deny("missing bearer token"));
        };
        let digest = sha256(token.as_bytes());
        let mut agents = self.agents.lock();
        // Comparing digests, not tokens: timing reveals nothing useful about the token.
        let found = agents.iter_mut().find_map(|(id, slot)| {
            let s = slot.session.as_mut()?;
            (s.token_sha256 == digest && !s.terminated).then_some((id.clone(), s))
        });
        let Some((agent, session)) = found else {
            drop(agents);
            return Err(deny("unknown or expired lease token"));
        };
        if let ListenerKind::Agent(owner) = kind {
            if *owner != agent {
                drop(agents);
                return Err(deny("token belongs to another agent's socket"));
            }
        }
        if let Err(wait) = session.buckets[class as usize].take() {
            return Err(ApiError::RateLimited {
                message: format!(
                    "agent {agent} is over its RPC rate limit ({}/s)",
                    session.buckets[class as usize].rate
                ),
                retry_after_s: Some(wait.as_secs().max(1)),
            });
        }
        session.last_seen = Instant::now();
        Ok(Authed { agent, session: session.id })
    }

    /// INIT_HELLO: binds the session and hands out the recovery snapshot.
    pub fn init_hello(&self, who: &Authed, req: &InitHelloRequest) -> Result<InitHelloResponse, ApiError> {
        if req.agent_id != who.agent.as_str() {
            self.audit("agent-rpc", Some(&who.agent), "INIT_HELLO", "refused", json!({"claimed": req.agent_id}));
            return Err(ApiError::Forbidden(format!(
                "this lease belongs to agent {}, not {:?}",
                who.agent, req.agent_id
            )));
        }
        if req.protocol_version != choir_common::PROTOCOL_VERSION {
            return Err(ApiError::BadRequest(format!(
                "protocol version {} not supported (choird speaks {}); rebuild the agent",
                req.protocol_version,
                choir_common::PROTOCOL_VERSION
            )));
        }
        let (head, processed) = self.store.agent_position(&who.agent)?;
        self.store.session_hello(who.session)?;
        // The agent's memory schema is made (or checked) before it runs.
        let host_tools = match self.memory.get() {
            Some(m) => {
                m.ensure(self, &who.agent)?;
                crate::memory::SERVED.iter().map(|s| (*s).to_owned()).collect()
            }
            None => Vec::new(),
        };
        let config = self.config();
        // An agent removed from config while running still gets a valid answer.
        let agent_cfg = config.agents.get(&who.agent).cloned().unwrap_or_default();
        {
            let mut agents = self.agents.lock();
            if let Some(slot) = agents.get_mut(&who.agent) {
                slot.replicated_seq = head.seq;
                // A new session receives any decision its predecessor missed.
                slot.decisions_due = true;
                if let Some(s) = slot.session.as_mut() {
                    s.delivered_upto = processed;
                }
            }
        }
        self.audit(
            "agent-rpc",
            Some(&who.agent),
            "INIT_HELLO",
            "ok",
            json!({"session": who.session, "agent_version": req.agent_version, "local_head": req.local_head.seq, "replicated_head": head.seq}),
        );
        Ok(InitHelloResponse {
            session_id: who.session,
            agent_id: who.agent.to_string(),
            bindings: Bindings {
                secrets: agent_cfg.secrets.clone(),
                models: LaneModels {
                    edge: config.model(&who.agent, Lane::Edge),
                    core: config.model(&who.agent, Lane::Core),
                },
                host_tools,
            },
            recovery: RecoverySnapshot {
                replicated_head: head,
                processed_upto: processed,
                conversations: self.recovered_conversations(&who.agent, processed)?,
            },
            config: self.dynamic_config(&who.agent),
            lease_ttl_ms: LEASE_TTL.as_millis() as u64,
        })
    }

    /// What a (re)started agent needs to keep its conversations: the latest
    /// compaction summary of each, then the answered exchanges after it.
    fn recovered_conversations(&self, agent: &AgentId, processed: u64) -> Result<Vec<ConversationTail>, ApiError> {
        let mut tails = self.store.recent_exchanges(agent, processed, RECOVERED_EXCHANGES)?;
        for (conversation, summary, upto) in self.store.compactions(agent)? {
            let idx = match tails.iter().position(|t| t.conversation == conversation) {
                Some(i) => i,
                None => {
                    tails.push(ConversationTail {
                        conversation: conversation.clone(),
                        summary: None,
                        turns: Vec::new(),
                    });
                    tails.len() - 1
                }
            };
            let tail = &mut tails[idx];
            tail.summary = Some(summary);
            // Exchanges already folded into the summary are not repeated.
            let kept = self.store.exchanges_after(agent, &conversation, upto, processed, RECOVERED_EXCHANGES)?;
            tail.turns = kept;
        }
        Ok(tails)
    }

    /// The hot-reloadable config of one agent.
    pub fn dynamic_config(&self, id: &AgentId) -> DynamicConfig {
        let config = self.config();
        let agent = config.agents.get(id).cloned().unwrap_or_default();
        DynamicConfig {
            version: self.config_version.load(Ordering::SeqCst),
            kill_switch: self.kill_switch(),
            max_steps_per_turn: agent.max_steps_per_turn,
            retry_budget: agent.retry_budget,
            context_tokens: agent.context_tokens,
            max_core_jobs: agent.max_core_jobs,
            core_budget: agent.core_budget,
            tool_exposure: agent.tool_exposure.as_str().to_owned(),
            fail_closed_s: agent.fail_closed_s,
        }
    }

    /// GET_SECRETS: values of secrets bound to the agent, and nothing else.
    pub fn get_secrets(&self, who: &Authed, names: &[String]) -> Result<BTreeMap<String, String>, ApiError> {
        let config = self.config();
        let bound = config.agents.get(&who.agent).map(|a| a.secrets.clone()).unwrap_or_default();
        let secrets = self.secrets();
        let mut out = BTreeMap::new();
        for name in names {
            if !bound.contains(name) {
                self.audit("agent-rpc", Some(&who.agent), "GET_SECRETS", "refused", json!({"name": name}));
                return Err(ApiError::Forbidden(format!("secret {name:?} is not bound to agent {}", who.agent)));
            }
            match secrets.get(name) {
                Some(v) => {
                    out.insert(name.clone(), v.to_owned());
                }
                None => {
                    return Err(ApiError::NotFound(format!(
                        "secret {name:?} is bound to agent {} but not set in secrets.json",
                        who.agent
                    )))
                }
            }
        }
        self.audit("agent-rpc", Some(&who.agent), "GET_SECRETS", "ok", json!({"names": names}));
        Ok(out)
    }

    /// HEARTBEAT: stores replicated events and replies, then hands out new
    /// messages, waiting up to `wait_ms` for some to arrive.
    pub fn heartbeat(&self, who: &Authed, req: &HeartbeatRequest) -> Result<HeartbeatResponse, ApiError> {
        // Content PostgreSQL cannot store is refused, naming the event, so the
        // agent quarantines it instead of retrying it forever.
        for ev in &req.events {
            if let Err(reason) = ev.storable() {
                self.audit(
                    "agent-rpc",
                    Some(&who.agent),
                    "HEARTBEAT",
                    "event_refused",
                    json!({"seq": ev.seq, "reason": reason}),
                );
                return Err(ApiError::EventRefused { seq: ev.seq, reason });
            }
        }
        let acked = if req.events.is_empty() {
            None
        } else {
            match self.store.append_events(&who.agent, who.session, &req.events) {
                Ok(seq) => {
                    self.note_memory_sources(&who.agent, &req.events);
                    Some(seq)
                }
                Err(ReplicationError::Chain(e)) => {
                    log::error!("ALERT: agent {}: {e}; replication refused", who.agent);
                    self.audit(
                        "agent-rpc",
                        Some(&who.agent),
                        "HEARTBEAT",
                        "chain_refused",
                        json!({"error": e.to_string()}),
                    );
                    return Err(ApiError::Conflict(format!("commit log refused: {e}")));
                }
                Err(ReplicationError::Db(e)) if e.is_data_error() => {
                    let seq = req.events.first().map_or(0, |e| e.seq);
                    log::error!("agent {}: the database refused event {seq}: {e}", who.agent);
                    return Err(ApiError::EventRefused { seq, reason: "the database refused its content".into() });
                }
                Err(ReplicationError::Db(e)) => return Err(e.into()),
            }
        };
        let replies = self.speakable_replies(who, &req.replies);
        let recorded = if req.replies.is_empty() && req.processed_upto == 0 && req.partials.is_empty() {
            crate::store::Recorded::default()
        } else {
            self.store.record_replies(&who.agent, &replies, req.processed_upto)?
        };
        for conversation in &recorded.refused {
            self.audit(
                "agent-rpc",
                Some(&who.agent),
                "HEARTBEAT",
                "notice_refused",
                json!({"conversation": clip(conversation), "reason": "the agent was never addressed there"}),
            );
        }
        if !recorded.telegram.is_empty() {
            // Files the agent left to send go after its answer, to the same chat.
            for (bot, chat) in &recorded.telegram {
                crate::telegram::collect_files(self, &who.agent, bot, *chat);
            }
            self.telegram.wake_senders();
        }
        let new_replies = recorded.new;

        let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_WAIT);
        let mut agents = self.agents.lock();
        let slot = agents.get_mut(&who.agent).ok_or_else(|| ApiError::Internal("agent slot vanished".into()))?;
        if let Some(seq) = acked {
            slot.replicated_seq = seq;
        }
        for (id, text) in new_replies {
            if let Some(w) = slot.waiters.remove(&id) {
                let _ = w.send(ChatUpdate::Done(Ok(text)));
            }
        }
        for p in &req.partials {
            if let Some(w) = slot.waiters.get(&p.in_reply_to) {
                let _ = w.send(ChatUpdate::Partial(p.text.clone()));
            }
        }
        let acked_seq = slot.replicated_seq;
        loop {
            let slot = agents.get_mut(&who.agent).ok_or_else(|| ApiError::Internal("agent slot vanished".into()))?;
            let seen_wake = slot.wake;
            let Some(session) = slot.session.as_ref().filter(|s| s.id == who.session) else {
                return Err(ApiError::Unauthorized("the session ended".into()));
            };
            let (after, stop) = (session.delivered_upto, session.stop);
            if stop {
                return Ok(self.heartbeat_reply(acked_seq, Vec::new(), true));
            }
            if !req.receive {
                return Ok(self.heartbeat_reply(acked_seq, Vec::new(), false));
            }
            let want_decisions = std::mem::take(&mut slot.decisions_due);
            let cancel = std::mem::take(&mut slot.cancels);
            drop(agents);
            let mut messages = self.store.pending_messages(&who.agent, after, BATCH)?;
            let decisions = if want_decisions {
                match self.store.take_decisions(&who.agent) {
                    Ok(d) => d,
                    Err(e) => {
                        if let Some(slot) = self.agents.lock().get_mut(&who.agent) {
                            slot.decisions_due = true;
                        }
                        return Err(e.into());
                    }
                }
            } else {
                Vec::new()
            };
            agents = self.agents.lock();
            let slot = agents.get_mut(&who.agent).ok_or_else(|| ApiError::Internal("agent slot vanished".into()))?;
            if let Some(session) = slot.session.as_mut().filter(|s| s.id == who.session) {
                // A concurrent HEARTBEAT may have handed some of these out already.
                messages.retain(|m| m.id > session.delivered_upto);
                if let Some(last) = messages.last() {
                    session.delivered_upto = last.id;
                }
                if !messages.is_empty() || !decisions.is_empty() || !cancel.is_empty() {
                    let mut reply = self.heartbeat_reply(acked_seq, messages, false);
                    reply.decisions = decisions;
                    reply.cancel = cancel;
                    return Ok(reply);
                }
            }
            if Instant::now() >= deadline || self.shutting_down.load(Ordering::SeqCst) {
                return Ok(self.heartbeat_reply(acked_seq, Vec::new(), false));
            }
            while agents.get(&who.agent).is_some_and(|s| s.wake == seen_wake) && Instant::now() < deadline {
                if self.changed.wait_until(&mut agents, deadline).timed_out() {
                    break;
                }
            }
        }
    }

    /// The replies of a HEARTBEAT as choird stores them: text PostgreSQL
    /// cannot hold escaped, and notices to a Telegram chat this agent does not
    /// serve (through that bot, under the current config) dropped and audited.
    fn speakable_replies(&self, who: &Authed, replies: &[OutboundReply]) -> Vec<OutboundReply> {
        let config = self.config();
        let mut out = Vec::with_capacity(replies.len());
        for r in replies {
            let mut r = r.clone();
            for s in [&mut r.text, &mut r.conversation, &mut r.key] {
                if s.contains('\0') {
                    *s = s.replace('\0', "\\u0000");
                }
            }
            if r.in_reply_to == 0 {
                let refuse = |reason: &str| {
                    self.audit(
                        "agent-rpc",
                        Some(&who.agent),
                        "HEARTBEAT",
                        "notice_refused",
                        json!({"conversation": clip(&r.conversation), "reason": reason}),
                    );
                };
                if let Some((bot, chat)) = crate::telegram::chat_of(&r.conversation) {
                    if !crate::telegram::may_reach(&config, &bot, chat, &who.agent) {
                        refuse("not a chat this agent serves");
                        continue;
                    }
                }
                if !self.store.addressed(&who.agent, &r.conversation).unwrap_or(false) {
                    refuse("the agent was never addressed there");
                    continue;
                }
                let quota = config.agents.get(&who.agent).map(|a| a.quotas.notices_per_hour).unwrap_or_default();
                if let Hourly::Over = self.hourly(&who.agent, "notices", quota) {
                    refuse("over quotas.notices_per_hour");
                    continue;
                }
            }
            out.push(r);
        }
        out
    }

    fn heartbeat_reply(
        &self,
        acked_seq: u64,
        messages: Vec<choir_common::rpc::InboundMessage>,
        stop: bool,
    ) -> HeartbeatResponse {
        HeartbeatResponse {
            acked_seq,
            messages,
            config_version: self.config_version.load(Ordering::SeqCst),
            stop,
            decisions: Vec::new(),
            cancel: Vec::new(),
        }
    }

    /// REPORT_STATUS: keeps the latest report for `choirctl agent status`.
    /// The first RUNNING report marks the end of the agent's set-up: from then
    /// on it counts as running (and a waiting `agent start` returns).
    pub fn report_status(&self, who: &Authed, req: ReportStatusRequest) {
        if let Some(slot) = self.agents.lock().get_mut(&who.agent) {
            let current = slot.session.as_ref().is_some_and(|s| s.id == who.session);
            if current && slot.phase == Phase::Starting && req.session_state == "RUNNING" {
                slot.phase = Phase::Running;
            }
            slot.status = Some(req);
        }
        self.changed.notify_all();
    }

    /// Whether the operator's kill switch is on.
    pub fn kill_switch(&self) -> bool {
        self.kill_switch.load(Ordering::SeqCst)
    }

    /// Turns the global kill switch on or off: persisted, audited, and pushed to
    /// every agent at once (their long-polls are woken with a new config version).
    pub fn set_kill_switch(&self, on: bool, actor: &str) -> Result<(), ApiError> {
        self.store.set_policy("kill_switch", &json!(on), actor)?;
        self.kill_switch.store(on, Ordering::SeqCst);
        self.config_version.fetch_add(1, Ordering::SeqCst);
        self.wake_all();
        log::warn!("kill switch turned {} by {actor}", if on { "ON" } else { "off" });
        self.audit(actor, None, "policy.kill_switch", if on { "on" } else { "off" }, json!({}));
        Ok(())
    }

    /// TERMINATE_SELF: the session ends; the token stops working at once.
    pub fn terminate_self(&self, who: &Authed, reason: &str) -> Result<(), ApiError> {
        {
            let mut agents = self.agents.lock();
            if let Some(s) = agents.get_mut(&who.agent).and_then(|slot| slot.session.as_mut()) {
                s.terminated = true;
                s.stop = true;
            }
        }
        self.changed.notify_all();
        self.store.end_session(who.session, &format!("terminated by agent: {reason}"))?;
        self.audit(
            "agent-rpc",
            Some(&who.agent),
            "TERMINATE_SELF",
            "ok",
            json!({"session": who.session, "reason": reason}),
        );
        Ok(())
    }

    // ----- admin ----------------------------------------------------------

    /// Summaries of every configured agent.
    pub fn summaries(&self) -> Vec<AgentSummary> {
        let config = self.config();
        let agents = self.agents.lock();
        agents
            .iter()
            .filter(|(id, slot)| config.agents.contains_key(*id) || slot.session.is_some())
            .map(|(id, slot)| summary(id, slot, config.runtime))
            .collect()
    }

    /// Summary of one agent.
    pub fn summary(&self, id: &str) -> Result<AgentSummary, ApiError> {
        let id = self.known(id)?;
        let runtime = self.config().runtime;
        let agents = self.agents.lock();
        let slot = agents.get(&id).ok_or_else(|| ApiError::NotFound(format!("no agent {id}")))?;
        Ok(summary(&id, slot, runtime))
    }

    /// Records, on the items a memory upsert stored, the commit sequence of
    /// the call that stored them (known only once the event replicates).
    fn note_memory_sources(&self, agent: &AgentId, events: &[choir_common::commit::CommitEvent]) {
        if self.memory.get().is_none() {
            return;
        }
        for e in
            events.iter().filter(|e| e.tool == "choir.memory.upsert" && e.outcome == choir_common::commit::Outcome::Ok)
        {
            if let Some(call) = &e.call_id {
                if let Err(err) = self.store.memory_set_commit_seq(agent, call, e.seq as i64) {
                    log::warn!("memory: commit sequence of {call} not recorded: {err}");
                }
            }
        }
    }

    /// EXECUTE_HOST_TOOL: runs a host tool for the authenticated agent (its
    /// own memory only), audited.
    pub fn execute_host_tool(
        &self,
        who: &Authed,
        req: &choir_common::rpc::ExecuteHostToolRequest,
    ) -> Result<choir_common::rpc::ExecuteHostToolResponse, ApiError> {
        let Some(memory) = self.memory.get() else {
            return Err(ApiError::NotImplemented(format!(
                "{} is not served: memory is not configured (add \"memory\" to config.json)",
                req.tool
            )));
        };
        let started = Instant::now();
        let result = memory.execute(self, who, req);
        let outcome = match &result {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.status_and_code().1.to_owned(),
        };
        self.audit(
            "agent-rpc",
            Some(&who.agent),
            "EXECUTE_HOST_TOOL",
            &outcome,
            json!({"tool": req.tool, "lane": req.lane, "call_id": req.call_id, "ms": started.elapsed().as_millis() as u64}),
        );
        Ok(choir_common::rpc::ExecuteHostToolResponse { result: result? })
    }

    /// Wakes the agent's long-poll: a message for it was queued.
    pub fn wake_agent(&self, id: &AgentId) {
        if let Some(slot) = self.agents.lock().get_mut(id) {
            slot.wake += 1;
        }
        self.changed.notify_all();
    }

    /// Wakes every long-poll (shutdown).
    pub fn wake_all(&self) {
        let mut agents = self.agents.lock();
        for slot in agents.values_mut() {
            slot.wake += 1;
        }
        drop(agents);
        self.changed.notify_all();
    }

    /// Queues a user message and waits for the agent's answer.
    pub fn chat(
        &self,
        id: &str,
        text: &str,
        conversation: &str,
        sender: &str,
        timeout: Duration,
    ) -> Result<ChatResponse, ApiError> {
        let (message_id, updates) = self.chat_send(id, text, conversation, sender)?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.chat_next(id, message_id, &updates, deadline)? {
                ChatUpdate::Partial(_) => continue,
                ChatUpdate::Done(Ok(reply)) => return Ok(ChatResponse { message_id, reply }),
                ChatUpdate::Done(Err(why)) => return Err(ApiError::Unavailable(why)),
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
    ) -> Result<(u64, Receiver<ChatUpdate>), ApiError> {
        let id = self.known(id)?;
        if text.trim().is_empty() {
            return Err(ApiError::BadRequest("the message is empty".into()));
        }
        if text.len() > 64 * 1024 {
            return Err(ApiError::PayloadTooLarge("a message may be at most 64 KiB".into()));
        }
        let running = self.agents.lock().get(&id).is_some_and(|s| matches!(s.phase, Phase::Starting | Phase::Running));
        if !running {
            return Err(ApiError::Conflict(format!(
                "agent {id} is not running; start it with `choirctl agent start {id}`"
            )));
        }
        let message_id = self.store.insert_message(&id, conversation, sender, text)?;
        // Unbounded: a handful of throttled partials, then one answer.
        let (tx, rx) = unbounded();
        {
            let mut agents = self.agents.lock();
            if let Some(slot) = agents.get_mut(&id) {
                slot.waiters.insert(message_id, tx.clone());
                slot.wake += 1;
            }
        }
        self.changed.notify_all();
        // The answer may have been recorded before the waiter was registered.
        if let Some(reply) = self.store.reply_of(&id, message_id)? {
            self.agents.lock().get_mut(&id).map(|s| s.waiters.remove(&message_id));
            let _ = tx.send(ChatUpdate::Done(Ok(reply)));
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
    ) -> Result<ChatUpdate, ApiError> {
        match updates.recv_deadline(deadline) {
            Ok(u) => Ok(u),
            Err(_) => {
                if let Ok(agent) = AgentId::parse(id) {
                    self.agents.lock().get_mut(&agent).map(|s| s.waiters.remove(&message_id));
                }
                Err(ApiError::Timeout(format!(
                    "no answer from agent {id} in time; message {message_id} stays queued and will be answered"
                )))
            }
        }
    }

    /// Agent ids with a live session, for the lease reaper and shutdown.
    /// Sessions whose lease lapsed (no RPC for [`LEASE_TTL`]); each is
    /// reported once.
    pub fn stale_sessions(&self) -> Vec<(AgentId, i64)> {
        let mut agents = self.agents.lock();
        agents
            .iter_mut()
            .filter_map(|(id, slot)| {
                let s = slot.session.as_mut()?;
                let lapsed = s.last_seen.elapsed() > LEASE_TTL && !s.reaped;
                s.reaped |= lapsed;
                lapsed.then(|| (id.clone(), s.id))
            })
            .collect()
    }
}

fn summary(id: &AgentId, slot: &AgentSlot, runtime: RuntimeKind) -> AgentSummary {
    AgentSummary {
        id: id.to_string(),
        runtime: runtime.as_str().to_owned(),
        state: slot.phase.as_str().to_owned(),
        session_id: slot.session.as_ref().map(|s| s.id).or(slot.last_session),
        pid: slot.session.as_ref().and_then(|s| match &s.instance {
            Some(Instance::Process { pid }) => Some(*pid),
            _ => None,
        }),
        container: slot.session.as_ref().and_then(|s| match &s.instance {
            Some(Instance::Container { id, .. }) => Some(id.clone()),
            _ => None,
        }),
        image: slot.session.as_ref().and_then(|s| match &s.instance {
            Some(Instance::Container { image, .. }) => Some(image.clone()),
            _ => None,
        }),
        last_heartbeat_ms: slot.session.as_ref().map(|s| s.last_seen.elapsed().as_millis() as u64),
        replicated_seq: slot.replicated_seq,
        session_state: slot.status.as_ref().map(|s| s.session_state.clone()),
        lanes: slot.status.as_ref().map(|s| s.lanes.clone()).unwrap_or_default(),
        last_exit: slot.last_exit.clone(),
    }
}
