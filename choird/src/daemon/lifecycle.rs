//! Agent lifecycle (R-LIFE-3..5): start, stop, image builds, and — for the
//! docker runtime — one supervisor thread per agent that watches the engine's
//! events, restarts a container that died unexpectedly (with backoff), and
//! adoption of running containers after a choird restart.
//!
//! **Invariant (11):** at most one live session, and so one container or
//! process, per agent: `start_agent` refuses while a session exists, and the
//! container name is fixed per (home, agent), so the engine refuses a second.
//! **Invariant (8):** a container's configuration comes only from
//! [`crate::runtime::docker::hardened`]; secrets are never part of it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use choir_common::admin::AgentSummary;
use choir_common::ids::AgentId;
use choir_common::rpc::OutboundReply;
use serde_json::json;

use super::{random_token, sha256, tail, Daemon, START_TIMEOUT};
use crate::config::{Config, RuntimeKind};
use crate::docker::{build, Engine, EngineError};
use crate::error::Error;
use crate::runtime::docker::{self as rt, ContainerSpec};
use crate::sessions::{Instance, Ready, Watch};

/// Longest wait between restarts of a crashing container.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A container that ran this long is considered healthy (resets the backoff).
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// How long a running agent may hold no long-poll and make no request
/// before choird ends it as hung (its `link-poll` re-polls at once, so a
/// live agent is never quiet that long).
pub const SILENT_AFTER: Duration = Duration::from_secs(4);

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NoSocket(_) | EngineError::Transport { .. } => Error::Unavailable(e.to_string()),
            EngineError::Permission(_) | EngineError::NoImage(..) | EngineError::Conflict(_) => {
                Error::Conflict(e.to_string())
            }
            EngineError::NotFound(_) => Error::NotFound(e.to_string()),
            EngineError::Api { .. } | EngineError::Build(_) => Error::Upstream(e.to_string()),
        }
    }
}

impl From<build::BuildError> for Error {
    fn from(e: build::BuildError) -> Self {
        match e {
            build::BuildError::Invalid { .. } | build::BuildError::NoBase(_) => Error::Malformed(e.to_string()),
            build::BuildError::Engine(e) => e.into(),
        }
    }
}

impl Daemon {
    /// The engine client of the configured socket.
    pub fn engine(&self) -> Engine {
        Engine::new(&self.config().docker.socket)
    }

    /// Starts an agent (at most one live session per agent) and waits until it
    /// reports RUNNING.
    pub fn start_agent(self: &Arc<Self>, id: &str, actor: &str) -> Result<AgentSummary, Error> {
        let id = self.known(id)?;
        let config = self.config();
        if let Some(why) = self.disk_refusal(&id, crate::disk::Look::Now) {
            self.audit(actor, Some(&id), "agent.start", "refused", json!({"reason": why}));
            return Err(Error::Unavailable(format!("agent {id} is not started: {why}")));
        }
        if let Err((what, phase)) = self.sessions.begin_start(&id) {
            self.audit(
                actor,
                Some(&id),
                "agent.start",
                "refused",
                json!({"reason": "already running", "detail": what}),
            );
            return Err(Error::Conflict(format!("agent {id} is already {phase} ({what}); stop it first")));
        }
        let launched = self.launch(&id, &config).and_then(|()| {
            if config.runtime == RuntimeKind::Docker {
                self.spawn_supervisor(&id)?;
            }
            self.wait_ready(&id)
        });
        match launched {
            Ok(()) => {
                let runtime = config.runtime.as_str();
                self.audit(
                    actor,
                    Some(&id),
                    "agent.start",
                    "ok",
                    json!({"runtime": runtime, "sandboxed": runtime == "docker"}),
                );
                self.summary(id.as_str())
            }
            Err(e) => {
                self.sessions.start_failed(&id, &e.to_string());
                self.audit(actor, Some(&id), "agent.start", "error", json!({"error": e.to_string()}));
                // A half-started instance must not linger.
                let _ = self.stop_instance(&id);
                Err(e)
            }
        }
    }

    /// Waits until a just-started agent reports RUNNING; if it exits instead,
    /// the error carries the end of its log (why it could not start).
    fn wait_ready(&self, id: &AgentId) -> Result<(), Error> {
        match self.sessions.wait_ready(id, START_TIMEOUT) {
            Ready::Running => Ok(()),
            Ready::Exited(exit) => {
                let log = self.home.logs().join(format!("{id}.log"));
                Err(Error::Conflict(format!(
                    "agent {id} failed to start ({}); the end of {}:\n{}",
                    exit.unwrap_or_else(|| "stopped".into()),
                    log.display(),
                    tail(&log, 6)
                )))
            }
            Ready::Unknown => Err(Error::NotFound(format!("no agent {id}"))),
            Ready::TimedOut => Err(Error::Timeout(format!(
                "agent {id} did not finish starting within {} s; see {}",
                START_TIMEOUT.as_secs(),
                self.home.logs().join(format!("{id}.log")).display()
            ))),
        }
    }

    /// Creates a session and starts its instance (process or container).
    fn launch(self: &Arc<Self>, id: &AgentId, config: &Config) -> Result<(), Error> {
        let token = random_token()?;
        let digest = sha256(token.as_bytes());
        let workspace = config.workspace(&self.home, id);
        std::fs::create_dir_all(&workspace)
            .map_err(|e| Error::Internal(format!("cannot create workspace {}: {e}", workspace.display())))?;
        // The workspace is a file system of its own, sized by its quota,
        // before anything of the agent's runs in it.
        let quotas = config.agents.get(id).map(|a| a.quotas).unwrap_or_default();
        let owner = match config.runtime {
            RuntimeKind::Docker => rt::agent_ids(),
            RuntimeKind::Process => (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw()),
        };
        crate::runtime::workspace::prepare(&self.home, id, &workspace, &quotas, owner).map_err(Error::Conflict)?;
        // Private to the user the agent runs as, whichever runtime made its
        // files before (through descriptors: no link followed).
        let handed = crate::runtime::handover::hand_over(&workspace, owner.0, owner.1).map_err(Error::Conflict)?;
        if handed.reowned > 0 {
            log::info!("agent {id}: {} workspace entries handed to uid {}", handed.reowned, owner.0);
        }
        let resume_from = self.store.agent_position(id)?.resume_from;
        let session_id = self.store.create_session(id, config.runtime.as_str(), &digest)?;
        self.sessions.open(id, session_id, digest, resume_from);
        let instance = match config.runtime {
            RuntimeKind::Process => self.launch_process(id, session_id, &token, &workspace),
            RuntimeKind::Docker => self.launch_container(id, session_id, &token, &workspace, config),
        };
        match instance {
            Ok(instance) => {
                if let Err(e) = self.store.set_session_instance(session_id, &instance.label()) {
                    log::warn!("agent {id}: cannot record what session {session_id} runs in: {e}");
                }
                self.sessions.set_instance(id, instance);
                Ok(())
            }
            Err(e) => {
                self.sessions.launch_failed(id, &e.to_string());
                let _ = self.store.end_session(session_id, "failed to start");
                Err(e)
            }
        }
    }

    fn launch_process(
        self: &Arc<Self>,
        id: &AgentId,
        session_id: i64,
        token: &str,
        workspace: &std::path::Path,
    ) -> Result<Instance, Error> {
        log::warn!(
            "agent {id}: starting with the process runtime: UNSANDBOXED (it runs with choird's user and network)"
        );
        let choir_dir = crate::runtime::process::prepare_choir_dir(&self.home, id)
            .map_err(|e| Error::Internal(format!("cannot prepare the agent's tool directory: {e}")))?;
        let config = self.config();
        let connect = match (config.agents.get(id).map(|a| a.transport), &config.http_listen) {
            (Some(crate::config::Transport::Http), Some(addr)) => format!("http://{addr}"),
            _ => format!("unix:{}", self.home.agent_socket(id).display()),
        };
        let mut child = crate::runtime::process::spawn(&self.agent_binary, id, &connect, workspace, &choir_dir, token)
            .map_err(|e| Error::Internal(format!("cannot start the agent: {e}")))?;
        let pid = child.id();
        // Its output, line by line, into logs/<id>.log; `pumped` closes when
        // both pipes are at end of file.
        let (pump_done, pumped) = crossbeam_channel::bounded::<()>(0);
        let logs = self.logs();
        let pumps = [
            child.stdout.take().map(|r| logs.pump(id.as_str(), "stdout", r, pump_done.clone())),
            child.stderr.take().map(|r| logs.pump(id.as_str(), "stderr", r, pump_done.clone())),
        ];
        drop(pump_done);
        if let Some(Err(e)) = pumps.into_iter().flatten().find(Result::is_err) {
            log::warn!("agent {id}: its output is not logged: {e}");
        }
        let me = self.clone();
        let agent = id.clone();
        let generation = self.sessions.generation(id);
        let started = Instant::now();
        self.tasks
            .spawn(format!("wait-{id}"), move || {
                let reason = match child.wait() {
                    Ok(status) => format!("process exited ({status})"),
                    Err(e) => format!("lost the process: {e}"),
                };
                // The agent leads a session of its own, which its tools stay
                // in: an agent that died without ending them (SIGKILL, OOM)
                // left them running, reparented. They end here, before a
                // restarted agent resumes the turn that started them (which
                // would run them a second time beside the first).
                let left = choir_common::proc_tree::kill_session(pid as i32);
                if left > 0 {
                    log::warn!("agent {agent}: ended {left} process(es) its tools left running when it exited");
                }
                // Its last words reach the log before the exit is told (a
                // tool process that kept a pipe open is not waited for long).
                let _ = pumped.recv_timeout(Duration::from_secs(2));
                logs.flush(Duration::from_secs(2));
                me.on_exit(&agent, session_id, &reason);
                me.after_process_exit(&agent, generation, started, &reason);
            })
            .map_err(|e| Error::Internal(format!("cannot start a supervisor thread: {e}")))?;
        Ok(Instance::Process { pid })
    }

    fn launch_container(
        &self,
        id: &AgentId,
        session_id: i64,
        token: &str,
        workspace: &std::path::Path,
        config: &Config,
    ) -> Result<Instance, Error> {
        let engine = self.engine();
        engine.ping()?;
        rt::check_seccomp(&engine.info()?).map_err(Error::Conflict)?;
        let docker = &config.docker;
        let image =
            build::build(&engine, &self.home, id, &self.agent_binary, &docker.base_image, &docker.image_prefix, |l| {
                log::info!("build {id}: {l}")
            })?;
        // The socket directory stays choird's (mounted read-only); the socket
        // itself was handed to the agent's user when it was bound; the
        // workspace was handed over in `launch`.
        let socket_dir = self.home.agent_socket_dir(id);
        let label = rt::home_label(&self.home);
        let name = rt::container_name(&label, id);
        if let Some(old) = engine.inspect(&name)? {
            if old["State"]["Running"].as_bool() == Some(true) {
                return Err(Error::Conflict(format!(
                    "agent {id} already runs in container {} (not started by this choird); stop it first",
                    old["Id"].as_str().unwrap_or_default()
                )));
            }
            engine.remove(&name)?;
        }
        let agent_cfg = config.agents.get(id).cloned().unwrap_or_default();
        let spec = rt::hardened(&ContainerSpec {
            image: &image,
            agent: id,
            session: session_id,
            workspace,
            socket_dir: &socket_dir,
            resources: &agent_cfg.resources,
            network: agent_cfg.network,
            home_label: &label,
            tmp_mb: docker.tmp_mb,
        });
        self.audit("choird", Some(id), "agent.container.create", "ok", json!({"image": image, "template": spec}));
        let cid = engine.create(&name, &spec)?;
        let started = engine.start(&cid).and_then(|()| engine.write_stdin(&cid, format!("{token}\n").as_bytes()));
        if let Err(e) = started {
            let _ = engine.remove(&cid);
            return Err(e.into());
        }
        log::info!("agent {id}: container {} from {image}", &cid[..12.min(cid.len())]);
        Ok(Instance::Container { id: cid, image })
    }

    /// Starts the supervisor thread of a docker agent (one per agent).
    fn spawn_supervisor(self: &Arc<Self>, id: &AgentId) -> Result<(), Error> {
        let me = self.clone();
        let agent = id.clone();
        let generation = self.sessions.generation(id);
        let handle = std::thread::Builder::new()
            .name(format!("supervise-{id}"))
            .spawn(move || me.supervise(&agent, generation))
            .map_err(|e| Error::Internal(format!("cannot start a supervisor thread: {e}")))?;
        self.supervisors.lock().push(handle);
        Ok(())
    }

    /// The supervisor: watches the current container until it exits, records
    /// the exit, and restarts it with backoff while the agent is wanted.
    fn supervise(self: &Arc<Self>, id: &AgentId, generation: u64) {
        loop {
            let current = match self.sessions.watch(id, generation) {
                Watch::Superseded => return, // A later start has its own supervisor.
                Watch::Container(cid, session, started) => Some((cid, session, started)),
                Watch::None => None,
            };
            let Some((cid, session, started)) = current else {
                if self.shutting_down.load(Ordering::SeqCst) || !self.wanted(id, generation) {
                    return;
                }
                // Between a failed restart and the next attempt.
                if !self.restart_after_backoff(id, generation) {
                    return;
                }
                continue;
            };
            let streamed = self.stream_container_output(id, &cid);
            let Some(reason) = self.watch(&cid) else {
                return; // Shutting down; the container keeps running for adoption.
            };
            // Its last words reach the log before the exit is told.
            if let Some(done) = streamed {
                let _ = done.recv_timeout(Duration::from_secs(2));
            }
            self.logs().flush(Duration::from_secs(2));
            let engine = self.engine();
            // Disposable: the container goes before the exit is announced, so a
            // returned `agent stop` means it is gone.
            if let Err(e) = engine.remove(&cid) {
                log::warn!("agent {id}: cannot remove container {cid}: {e}");
            }
            self.on_exit(id, session, &reason);
            if started.elapsed() >= HEALTHY_AFTER {
                self.sessions.healthy(id);
            }
            if self.shutting_down.load(Ordering::SeqCst) || !self.wanted(id, generation) {
                return;
            }
            log::warn!("agent {id}: {reason}; restarting");
            if !self.restart_after_backoff(id, generation) {
                return;
            }
        }
    }

    /// After a process-runtime agent exited: restarted with the same backoff
    /// as a container while it is wanted (R-LIFE-4 parity); the new process
    /// has its own waiting thread.
    fn after_process_exit(self: &Arc<Self>, id: &AgentId, generation: u64, started: Instant, reason: &str) {
        if started.elapsed() >= HEALTHY_AFTER {
            self.sessions.healthy(id);
        }
        loop {
            if self.shutting_down.load(Ordering::SeqCst) || !self.wanted(id, generation) {
                return;
            }
            log::warn!("agent {id}: {reason}; restarting");
            if !self.restart_after_backoff(id, generation) || self.sessions.instance(id).is_some() {
                return;
            }
        }
    }

    /// Streams a container's output into `logs/<id>.log` while it runs, from
    /// where the file ends (an adopted container's earlier output was written
    /// by the choird before); the receiver closes when the stream ends.
    fn stream_container_output(&self, id: &AgentId, cid: &str) -> Option<crossbeam_channel::Receiver<()>> {
        let logs = self.logs();
        let live = crate::logs::files::live_path(logs.dir(), id.as_str());
        let since = std::fs::metadata(&live)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        let reader = match self.engine().follow_logs(cid, since) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("agent {id}: cannot follow its container's output: {e}");
                return None;
            }
        };
        let (done, ended) = crossbeam_channel::bounded::<()>(0);
        let agent = id.as_str().to_owned();
        let spawned = std::thread::Builder::new().name(format!("out-{id}")).spawn(move || {
            let _done = done;
            crate::logs::lines::read_frames(reader, |stream, line| {
                logs.agent(&agent, crate::logs::lines::agent_record(&agent, stream, &line, crate::logs::now()));
            });
        });
        match spawned {
            Ok(_) => Some(ended),
            Err(e) => {
                log::warn!("agent {id}: cannot follow its container's output: {e}");
                None
            }
        }
    }

    /// Whether the agent should still run under this supervisor's generation.
    fn wanted(&self, id: &AgentId, generation: u64) -> bool {
        self.sessions.wanted(id, generation)
    }

    /// Waits out the backoff (interrupted by stop or shutdown) and launches a
    /// new instance; false when the agent should no longer run.
    fn restart_after_backoff(self: &Arc<Self>, id: &AgentId, generation: u64) -> bool {
        let crashes = match self.sessions.begin_restart(id) {
            crate::sessions::Restart::After(n) => n,
            crate::sessions::Restart::NotWanted => return false,
            crate::sessions::Restart::GaveUp(why) => {
                log::error!("agent {id}: {why}");
                self.audit("choird", Some(id), "agent.gave_up", "error", json!({"reason": why}));
                self.tell_waiting_users(id);
                self.events.send(crate::events::Event::AgentDown {
                    agent: id.clone(),
                    text: format!(
                        "Agent {id} was stopped: {why}. Fix the cause, then `choirctl agent start {id}`; \
                         unanswered messages are answered then."
                    ),
                });
                return false;
            }
        };
        let backoff = crate::pace::restart_delay(crashes, MAX_BACKOFF);
        if !self.sessions.wait_backoff(id, generation, Instant::now() + backoff, &self.shutting_down) {
            return false;
        }
        let config = self.config();
        match self.launch(id, &config) {
            Ok(()) => {
                self.audit("choird", Some(id), "agent.restart", "ok", json!({"attempt": crashes}));
                true
            }
            Err(e) => {
                log::error!("agent {id}: restart failed: {e}");
                self.audit(
                    "choird",
                    Some(id),
                    "agent.restart",
                    "error",
                    json!({"attempt": crashes, "error": e.to_string()}),
                );
                true
            }
        }
    }

    /// After choird stopped restarting the agent: each conversation with a
    /// message still unanswered is told (once per conversation) that its
    /// answer waits for the operator. The words carry no reason: the
    /// reason (paths, errors) is the operator's, in `agent status`.
    fn tell_waiting_users(&self, id: &AgentId) {
        let conversations = match self.store.conversations_waiting(id, 1_000) {
            Ok(c) => c,
            Err(e) => {
                log::error!("agent {id}: the users waiting for an answer are not told it is stopped: {e}");
                return;
            }
        };
        let at = unix_now() as u64;
        let notices: Vec<OutboundReply> = conversations
            .into_iter()
            .enumerate()
            .map(|(n, conversation)| OutboundReply {
                in_reply_to: 0,
                covers: Vec::new(),
                key: format!("stopped-{at}-{n}"),
                conversation,
                text: "Sorry, I cannot answer your message now: I stopped after failing several times in a row, and \
                       the operator has been told. I will answer it once I run again."
                    .into(),
                failed: false,
            })
            .collect();
        if notices.is_empty() {
            return;
        }
        log::warn!("agent {id}: telling {} conversation(s) that their messages wait for the operator", notices.len());
        // A few notices per transaction: never one statement of a thousand rows.
        for chunk in notices.chunks(32) {
            match self.store.record_replies(id, chunk, 0, self.delivery.as_ref()) {
                Ok(r) => {
                    for conversation in r.delivered {
                        self.events.send(crate::events::Event::Answered { agent: id.clone(), conversation });
                    }
                }
                Err(e) => log::error!("agent {id}: the users waiting for an answer are not told it is stopped: {e}"),
            }
        }
    }

    /// Watches the engine's `die` events for a container (in short windows, so
    /// shutdown is noticed); returns why it stopped, or `None` on shutdown.
    fn watch(&self, cid: &str) -> Option<String> {
        let filters = json!({"type": ["container"], "event": ["die"], "container": [cid]});
        let mut since = unix_now() - 1.0;
        let mut failures = 0u32;
        loop {
            if self.shutting_down.load(Ordering::SeqCst) {
                return None;
            }
            let engine = self.engine();
            // Catch an exit that happened while we were not listening.
            match engine.inspect(cid) {
                Ok(None) => return Some("container vanished".into()),
                Ok(Some(c)) if c["State"]["Running"].as_bool() != Some(true) => return Some(exit_reason(&c)),
                Ok(Some(_)) => failures = 0,
                Err(e) => {
                    failures += 1;
                    log::warn!("cannot inspect container {cid} ({e}); retrying");
                    std::thread::sleep(Duration::from_millis(500 * u64::from(failures.min(10))));
                    continue;
                }
            }
            let until = since + 2.0;
            let mut died = false;
            let _ = engine.events_between(&filters, since, until, |_| {
                died = true;
                false
            });
            if died {
                return match engine.inspect(cid) {
                    Ok(Some(c)) => Some(exit_reason(&c)),
                    _ => Some("container died".into()),
                };
            }
            since = until;
        }
    }

    /// Called when an agent's instance is gone (both runtimes).
    pub(super) fn on_exit(&self, id: &AgentId, session_id: i64, reason: &str) {
        self.sessions.ended(id, session_id, reason, true);
        log::info!("agent {id}: session {session_id} ended: {reason}");
        if let Err(e) = self.store.end_session(session_id, reason) {
            log::error!("cannot record the end of session {session_id}: {e}");
        }
        self.audit("choird", Some(id), "agent.exit", "ok", json!({"session": session_id, "reason": reason}));
    }

    /// Stops an agent: asks it (through its HEARTBEAT), then has the process or
    /// container stopped.
    /// Stopping an agent that is not running is done already (as
    /// `systemctl stop` of an inactive unit): its summary, nothing else.
    pub fn stop_agent(&self, id: &str, actor: &str) -> Result<AgentSummary, Error> {
        let id = self.known(id)?;
        if !self.sessions.request_stop(&id) {
            return self.summary(id.as_str());
        }
        let polite = self.wait_stopped(&id, Duration::from_secs(10));
        if !polite {
            log::warn!("agent {id} did not stop within 10 s; stopping it");
            self.stop_instance(&id)?;
            self.wait_stopped(&id, Duration::from_secs(15));
        }
        self.audit(actor, Some(&id), "agent.stop", "ok", json!({"graceful": polite}));
        self.summary(id.as_str())
    }

    /// Ends an agent's lease at once (its token stops working) and stops its
    /// instance; for an agent removed from config.json, which `stop_agent`
    /// no longer knows.
    pub fn revoke_agent(&self, id: &AgentId, actor: &str) {
        let live = self.sessions.revoke(id);
        if live {
            if let Err(e) = self.stop_instance(id) {
                log::warn!("agent {id}: stopping its instance: {e}");
            }
            if !self.wait_stopped(id, Duration::from_secs(15)) {
                log::warn!("agent {id}: still not gone 15 s after its lease was revoked");
            }
        }
        self.release_workspace(id);
        self.audit(actor, Some(id), "agent.revoke", "ok", json!({"was_running": live}));
    }

    /// Unmounts a stopped (or removed) agent's workspace image (see
    /// `runtime::workspace`: lazily, so a process left inside keeps it).
    fn release_workspace(&self, id: &AgentId) {
        let workspace = self.config().workspace(&self.home, id);
        match crate::runtime::workspace::release(&self.home, id, &workspace) {
            Ok(true) => log::info!("agent {id}: workspace {} unmounted", workspace.display()),
            Ok(false) => {}
            Err(e) => log::warn!("agent {id}: {e}"),
        }
    }

    /// Ends every process-runtime agent found stopped (`T` in
    /// `/proc/<pid>/stat`): nothing but a tool's `kill -STOP` freezes one,
    /// and a frozen agent neither supervises its tools nor answers. Its whole
    /// tree is killed (the supervisor thread then restarts it as after any
    /// exit). A container's agent is its PID 1, which the kernel keeps from
    /// being stopped from inside. Returns who was ended.
    pub fn end_frozen_agents(&self) -> Vec<AgentId> {
        let mut ended = Vec::new();
        for (id, pid) in self.sessions.processes() {
            if choir_common::proc_tree::is_stopped(pid as i32) {
                let n = choir_common::proc_tree::kill_trees(&[pid as i32]);
                log::warn!(
                    "agent {id}: found stopped (a signal froze it, e.g. a tool's kill -STOP); killed its process \
                     tree ({n} process(es))"
                );
                self.audit("choird", Some(&id), "agent.frozen", "killed", json!({"pid": pid}));
                ended.push(id);
            }
        }
        ended
    }

    /// Ends every running agent that stopped answering
    /// (`Sessions::silent`: no long-poll open and no request for
    /// [`SILENT_AFTER`]): its process tree is killed, or its container, and
    /// its supervisor restarts it as after any exit. A frozen, deadlocked
    /// or wedged agent is so found within seconds, not when its lease
    /// lapses. Returns who was ended.
    pub fn end_silent_agents(self: &Arc<Self>) -> Vec<AgentId> {
        let mut ended = Vec::new();
        for (id, session, instance) in self.sessions.silent(SILENT_AFTER) {
            log::warn!(
                "agent {id}: stopped answering (no long-poll and no request for {} s); ending it so it is restarted",
                SILENT_AFTER.as_secs()
            );
            self.audit("choird", Some(&id), "agent.silent", "killed", json!({"session": session}));
            match instance {
                Instance::Process { pid } => {
                    choir_common::proc_tree::kill_trees(&[pid as i32]);
                }
                Instance::Container { id: cid, .. } => {
                    let me = self.clone();
                    let _ = self.tasks.spawn(format!("kill-{id}"), move || {
                        if let Err(e) = me.engine().kill(&cid, "KILL") {
                            log::warn!("cannot kill container {cid}: {e}");
                        }
                    });
                }
            }
            ended.push(id);
        }
        ended
    }

    /// Terminates the instance without asking the agent.
    fn stop_instance(&self, id: &AgentId) -> Result<(), Error> {
        let instance = self.sessions.instance(id);
        match instance {
            Some(Instance::Process { pid }) => {
                choir_common::proc_tree::signal(pid as i32, rustix::process::Signal::TERM);
                if !self.wait_stopped(id, Duration::from_secs(5)) {
                    // The agent and everything below it (its tool processes
                    // are reparented to it): frozen, then killed, so none
                    // outlives it on the host.
                    let n = choir_common::proc_tree::kill_trees(&[pid as i32]);
                    log::warn!("agent {id}: killed its process tree ({n} process(es))");
                }
            }
            Some(Instance::Container { id: cid, .. }) => self.engine().stop(&cid, Duration::from_secs(5))?,
            None => {}
        }
        Ok(())
    }

    fn wait_stopped(&self, id: &AgentId, timeout: Duration) -> bool {
        self.sessions.wait_stopped(id, timeout)
    }

    /// Shutdown: stops process-runtime agents; docker agents are stopped too
    /// unless `docker.keep_agents_on_shutdown` (then they wait for the next
    /// choird, which adopts them).
    pub fn stop_all(&self) {
        let config = self.config();
        let keep = config.docker.keep_agents_on_shutdown;
        let running = self.sessions.live();
        let mut kept = Vec::new();
        // Who ran is written down first: the next choird starts them again,
        // as `docker` restarts containers that were running (a restart of
        // choird to apply a setting does not take agents down).
        let stopped: Vec<String> = running
            .iter()
            .filter(|(_, container)| !(*container && keep))
            .map(|(id, _)| id.as_str().to_owned())
            .collect();
        if !stopped.is_empty() {
            let list = self.home.agents_to_resume();
            let tmp = list.with_extension("new");
            let written =
                std::fs::write(&tmp, format!("{}\n", stopped.join("\n"))).and_then(|()| std::fs::rename(&tmp, &list));
            if let Err(e) = written {
                log::warn!("cannot note which agents to start again at the next start ({}): {e}", list.display());
            }
        }
        for (id, container) in running {
            if container && keep {
                log::info!("agent {id}: left running; the next choird adopts it");
                kept.push(id);
                continue;
            }
            if let Err(e) = self.stop_agent(id.as_str(), "choird") {
                log::warn!("stopping {id}: {e}");
            }
        }
        // A stopped agent's workspace stays mounted while choird runs (the
        // operator can look in it); at shutdown it is unmounted, but for an
        // agent left running.
        for id in config.agents.keys().filter(|id| !kept.contains(id)) {
            self.release_workspace(id);
        }
    }

    /// The agents the previous choird stopped at its shutdown (its note is
    /// removed): each still configured, not started by `autostart` anyway,
    /// and not adopted running, is started again.
    pub fn resume_agents(self: &Arc<Self>) {
        let list = self.home.agents_to_resume();
        let Ok(text) = std::fs::read_to_string(&list) else { return };
        let _ = std::fs::remove_file(&list);
        let config = self.config();
        for id in text.lines().filter_map(|l| AgentId::parse(l.trim()).ok()) {
            let Some(agent) = config.agents.get(&id) else { continue };
            if agent.autostart || self.sessions.live().iter().any(|(live, _)| *live == id) {
                continue;
            }
            match self.start_agent(id.as_str(), "choird") {
                Ok(_) => log::info!("agent {id}: was running when choird stopped; started again"),
                Err(e) => log::error!("agent {id} was running when choird stopped and cannot start again: {e}"),
            }
        }
    }

    /// After a restart of choird: adopts the running containers of this home
    /// whose session is still open (they keep their lease), removes the others,
    /// and closes every other session left open. Runs before the listeners,
    /// so no adopted agent is refused in between.
    pub fn adopt_containers(self: &Arc<Self>) -> Result<(), Error> {
        let config = self.config();
        // COMMITS shows what is stored from the start, not 0 until the
        // agent's first HEARTBEAT.
        for id in config.agents.keys() {
            match self.store.agent_position(id) {
                Ok(p) => self.sessions.set_replicated(id, p.head.seq),
                Err(e) => log::warn!("agent {id}: cannot read how far its log is stored: {e}"),
            }
        }
        let mut adopted = Vec::new();
        if config.runtime == RuntimeKind::Docker {
            let engine = self.engine();
            let label = rt::home_label(&self.home);
            let found = match engine.containers_with_label(&format!("{}={label}", rt::LABEL_HOME)) {
                Ok(f) => f,
                Err(e) => {
                    log::warn!("cannot look for agent containers to adopt: {e}");
                    Vec::new()
                }
            };
            for c in found {
                let cid = c["Id"].as_str().unwrap_or_default().to_owned();
                let labels = &c["Labels"];
                let agent = labels[rt::LABEL_AGENT].as_str().and_then(|a| AgentId::parse(a).ok());
                let session: Option<i64> = labels[rt::LABEL_SESSION].as_str().and_then(|s| s.parse().ok());
                let running = c["State"].as_str() == Some("running");
                let lease = match (&agent, session) {
                    (Some(a), Some(s)) if running && config.agents.contains_key(a) => self.store.open_session(s)?,
                    _ => None,
                };
                match (agent, session, lease) {
                    (Some(agent), Some(session), Some((owner, digest)))
                        if owner == agent.as_str() && digest.len() == 32 =>
                    {
                        let mut token_sha256 = [0u8; 32];
                        token_sha256.copy_from_slice(&digest);
                        // The running agent drops what it was handed before.
                        let resume_from = self.store.agent_position(&agent)?.resume_from;
                        let image = c["Image"].as_str().unwrap_or_default().to_owned();
                        let instance = Instance::Container { id: cid.clone(), image };
                        self.sessions.adopt(&agent, session, token_sha256, instance, resume_from);
                        self.spawn_supervisor(&agent)?;
                        log::info!(
                            "agent {agent}: adopted running container {} (session {session})",
                            &cid[..12.min(cid.len())]
                        );
                        self.audit(
                            "choird",
                            Some(&agent),
                            "agent.adopt",
                            "ok",
                            json!({"session": session, "container": cid}),
                        );
                        adopted.push(session);
                    }
                    _ => {
                        log::info!("removing leftover agent container {}", &cid[..12.min(cid.len())]);
                        if let Err(e) = engine.remove(&cid) {
                            log::warn!("cannot remove container {cid}: {e}");
                        }
                    }
                }
            }
        }
        let orphans = self.store.end_orphaned_sessions(&adopted)?;
        if orphans > 0 {
            log::warn!("closed {orphans} session(s) left open by a previous choird");
        }
        Ok(())
    }

    /// Joins the supervisor threads (they notice shutdown within seconds).
    pub fn join_supervisors(&self) {
        let handles: Vec<_> = std::mem::take(&mut *self.supervisors.lock());
        for h in handles {
            let _ = h.join();
        }
    }

    /// Checks an agent's image inputs (manifests, skills, the agent binary)
    /// without touching the engine.
    pub fn validate_image_inputs(&self, id: &str) -> Result<(), Error> {
        let id = self.known(id)?;
        build::validate(&self.home, &id, &self.agent_binary)?;
        Ok(())
    }

    /// Builds an agent's image for its current inputs (validating first),
    /// sending progress lines to `progress`; returns the tag.
    pub fn build_image(&self, id: &str, progress: impl FnMut(&str)) -> Result<String, Error> {
        let id = self.known(id)?;
        let config = self.config();
        let docker = &config.docker;
        // Validation does not need the engine: report bad inputs first.
        build::validate(&self.home, &id, &self.agent_binary)?;
        let engine = self.engine();
        engine.ping()?;
        let tag = build::build(
            &engine,
            &self.home,
            &id,
            &self.agent_binary,
            &docker.base_image,
            &docker.image_prefix,
            progress,
        )?;
        self.audit("admin", Some(&id), "agent.build", "ok", json!({"image": tag}));
        Ok(tag)
    }

    /// Rolls a running agent onto the image of its current inputs: build, then
    /// stop and start (the new session gets the recovery snapshot).
    /// Under the process runtime there is no image: the agent is restarted
    /// on the installed `choir-agent` and the current config.
    pub fn update_agent(self: &Arc<Self>, id: &str, mut progress: impl FnMut(&str)) -> Result<AgentSummary, Error> {
        if self.config().runtime == RuntimeKind::Process {
            progress("process runtime: no image to build");
            return self.restart_on(id, None, &mut progress);
        }
        let tag = self.build_image(id, &mut progress)?;
        self.restart_on(id, Some(&tag), &mut progress)
    }

    /// Restarts a running agent (on image `tag` under docker); a stopped
    /// agent is left stopped, and one already on `tag` is left alone.
    pub fn restart_on(
        self: &Arc<Self>,
        id: &str,
        tag: Option<&str>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<AgentSummary, Error> {
        let summary = self.summary(id)?;
        let on = tag.map(|t| format!(" on {t}")).unwrap_or_default();
        if summary.state == "stopped" {
            progress(&format!("agent {id} is not running; it will start{on}"));
            return Ok(summary);
        }
        if tag.is_some() && summary.image.as_deref() == tag {
            progress(&format!("agent {id} already runs{on}"));
            return Ok(summary);
        }
        progress(&format!("stopping agent {id}"));
        self.stop_agent(id, "admin")?;
        progress(&format!("starting agent {id}{on}"));
        let summary = self.start_agent(id, "admin")?;
        self.audit("admin", summary_id(&summary).as_ref(), "agent.update", "ok", json!({"image": tag}));
        // The image it ran before is no longer needed (one stays per agent).
        if let (Some(tag), Some(agent)) = (tag, summary_id(&summary)) {
            self.prune_superseded(&agent, tag);
        }
        Ok(summary)
    }
}

fn summary_id(s: &AgentSummary) -> Option<AgentId> {
    AgentId::parse(&s.id).ok()
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Why a container stopped, from its inspect output.
fn exit_reason(c: &serde_json::Value) -> String {
    let state = &c["State"];
    let code = state["ExitCode"].as_i64().unwrap_or(-1);
    if state["OOMKilled"].as_bool() == Some(true) {
        format!("container ran out of memory (exit code {code})")
    } else if code == 137 {
        "container was killed (SIGKILL, exit code 137)".to_owned()
    } else {
        format!("container exited with code {code}")
    }
}
