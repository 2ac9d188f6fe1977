//! Wiring of a running agent: handshake, recovery, threads, and the orderly
//! exit. Threads: `edge` (the lane), `link-poll`, `link-push`, `link-reply`
//! and `signals`;
//! all named, all joined before the process exits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use choir_common::rpc::{
    Ack, GetSecretsRequest, GetSecretsResponse, InitHelloRequest, InitHelloResponse, TerminateSelfRequest, Verb,
};
use crossbeam_channel::{bounded, unbounded};
use parking_lot::RwLock;

use crate::arbiter::approvals::Approvals;
use crate::arbiter::Arbiter;
use crate::board::{SessionState, StatusBoard};
use crate::commitlog::{CommitLog, Durability, DurableLog};
use crate::lanes::core::{CoreLimits, CorePool, CoreSetup};
use crate::lanes::edge::EdgeLane;
use crate::lanes::inbox::EdgeEvent;
use crate::lanes::llm::Llm;
use crate::lanes::prompt::Identity;
use crate::lanes::reasoning::Mind;
use crate::lanes::skills::SkillBook;
use crate::link::Link;
use crate::rpc::{Endpoint, Rpc, RpcError};
use crate::secrets::SecretStore;
use crate::tools::Registry;
use crate::workspace::Workspace;

/// How the agent was started.
#[derive(Debug, Clone)]
pub struct Args {
    /// The agent's id.
    pub agent: String,
    /// Where choird is.
    pub endpoint: Endpoint,
    /// The lease token.
    pub token: String,
    /// The workspace root.
    pub workspace: PathBuf,
    /// Agent state (commit log); default `<workspace>/.choir`.
    pub state_dir: Option<PathBuf>,
    /// The baked-in identity, tools and skills (`/choir` in a container).
    pub choir_dir: PathBuf,
}

/// Idle connections the core jobs' client keeps at most: choird serves an
/// agent's socket at most 64 connections at once (`AGENT_CONNECTIONS` in
/// its `serve.rs`) and the main client keeps up to 12; kept core
/// connections past this would crowd out the edge's and the link's.
const MAX_IDLE_CORE_CONNECTIONS: usize = 32;

/// Runs the agent until choird stops it, the lease is lost, or SIGTERM.
pub fn run(args: Args) -> anyhow::Result<()> {
    // For the core jobs' client, made once their number is known (below).
    let core_token = args.token.clone();
    let rpc = Arc::new(Rpc::new(&args.endpoint, args.token));
    let workspace = Workspace::open(&args.workspace)
        .with_context(|| format!("cannot open the workspace {}", args.workspace.display()))?;
    let state_dir = args.state_dir.clone().unwrap_or_else(|| args.workspace.join(crate::workspace::STATE_DIR));
    crate::failpoints::arm_from(&state_dir);
    // The agent's own directories stay out of any git repository in the workspace.
    for dir in [state_dir.clone(), args.workspace.join(".choirtmp")] {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let ignore = dir.join(".gitignore");
        if !ignore.exists() {
            std::fs::write(&ignore, "# Choir's private files.\n*\n")
                .with_context(|| format!("cannot write {}", ignore.display()))?;
        }
    }
    // The agent's state (its commit log: every tool input and result) is
    // its own: no other local user reads it, whatever the umask.
    std::fs::set_permissions(&state_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", state_dir.display()))?;
    let (mut log, report) = CommitLog::open(&state_dir)?;
    log::info!("commit log: {} events, head {}", report.events, log.head().seq);

    let hello: InitHelloResponse = call_with_retry(|| {
        rpc.call(
            Verb::InitHello,
            &InitHelloRequest {
                agent_id: args.agent.clone(),
                protocol_version: choir_common::PROTOCOL_VERSION,
                agent_version: env!("CARGO_PKG_VERSION").into(),
                local_head: log.head().clone(),
            },
            Duration::from_secs(30),
        )
    })?;
    log.reconcile(&hello.recovery.replicated_head)?;
    log::info!(
        "session {}: replicated head {}, local head {}, messages processed up to {}",
        hello.session_id,
        hello.recovery.replicated_head.seq,
        log.head().seq,
        hello.recovery.processed_upto
    );

    let secrets = if hello.bindings.secrets.is_empty() {
        SecretStore::default()
    } else {
        let req = GetSecretsRequest { names: hello.bindings.secrets.clone() };
        match rpc.call::<_, GetSecretsResponse>(Verb::GetSecrets, &req, Duration::from_secs(10)) {
            Ok(r) => SecretStore::new(r.secrets),
            Err(e) => {
                log::warn!("secrets unavailable, tools that need them will fail: {e}");
                SecretStore::default()
            }
        }
    };

    let interrupted = log.dangling_intents();
    let resume = log.take_turns_after(hello.recovery.processed_upto);
    let host_manifests: Vec<_> = hello.bindings.host_tool_manifests.iter().map(|b| b.manifest.clone()).collect();
    let registry = Registry::load(
        &args.choir_dir,
        &hello.bindings.secrets,
        rpc.clone(),
        &hello.bindings.host_tools,
        &host_manifests,
        Some(crate::tools::McpSetup {
            workspace: workspace.root().to_owned(),
            secrets: secrets.clone(),
            host: Some(Arc::new(crate::tools::mcp::AgentHost::new(rpc.clone())) as Arc<dyn crate::tools::mcp::McpHost>),
        }),
    )?;
    // Each MCP server is started and its catalog checked now, so a change
    // since approval is found (and filed) before a model is offered its tools.
    // One holding secrets is checked before any lane runs (nothing the model
    // starts may run beside it); the others meanwhile, on threads.
    for server in registry.mcp_servers() {
        let server = server.clone();
        if server.holds_secrets() {
            if let Err(e) = server.check_now(std::time::Instant::now() + Duration::from_secs(10)) {
                log::warn!("MCP server {}: {e}", server.name());
            }
            continue;
        }
        std::thread::Builder::new().name("mcp-check".into()).spawn(move || {
            if let Err(e) = server.check_now(std::time::Instant::now() + Duration::from_secs(30)) {
                log::warn!("MCP server {}: {e}", server.name());
            }
        })?;
    }
    for (name, status) in registry.statuses() {
        if let crate::tools::ToolStatus::Available(why) = status {
            log::warn!("tool {name} is not offered: {why}");
        }
    }
    // A result reaches a model only once choird holds its record.
    let log = Arc::new(DurableLog::with_durability(log, Durability::Replicated)?);
    // Bounded(1): a pending poke already means "ship what is committed (or changed)".
    let (committed_tx, committed_rx) = bounded(1);
    let floor = Arc::new(crate::lanes::floor::Floor::default());
    let board = StatusBoard::with_poke(committed_tx.clone());
    let recovering = !resume.is_empty() || !interrupted.is_empty();
    board.set_session(if recovering { SessionState::Recovering } else { SessionState::Starting });
    board.add_lane("edge", Some(u64::from(hello.config.max_steps_per_turn)), None, None);
    let arguments = Arc::new(crate::arbiter::arg_check::ArgumentPolicy::default());
    let config = Arc::new(RwLock::new(hello.config.clone()));

    // Skills are checked against the registry before anything runs: a bad
    // skill file fails start-up with the file, the state and the reason.
    let skills = Arc::new(SkillBook::load(&args.choir_dir, &registry)?);
    log::info!("skills: {}", skills.names().join(", "));
    let approvals = Arc::new(Approvals::new(Some(rpc.clone())));
    let identity = Identity::load(&args.choir_dir, &args.agent);
    let arbiter = Arc::new(Arbiter::new(crate::arbiter::Parts {
        registry,
        workspace,
        state_dir: state_dir.clone(),
        log: log.clone(),
        committed: committed_tx,
        secrets,
        proposals: Some(approvals.clone()),
        policies: policies(&state_dir, arguments.clone()),
        board: Some(board.clone()),
        operator_words: identity.operator_words(),
    }));
    // Unbounded: choird hands out at most a small batch per poll, plus one
    // event per finished core job or decision.
    let (edge_tx, edge_rx) = unbounded::<EdgeEvent>();
    // What the edge says (link-reply ships it) and the core pool's firing
    // reports (link-push ships them). Unbounded: one reply per turn, a
    // few partials a second, one report per firing.
    let (out_tx, out_rx) = unbounded();
    let (firings_tx, firings_rx) = unbounded();

    let llm = Arc::new(Llm::new(rpc.clone()));
    let limits = CoreLimits::of(&config.read());
    // Core jobs' model calls go over connections of their own: choird runs
    // a connection that relayed a core call below the edge from then on
    // (see choird's relay), so the edge's calls must never be pooled with
    // them. One kept connection per core job that may run at once, up to
    // MAX_IDLE_CORE_CONNECTIONS (a later config raising the limit only makes
    // the extra jobs' connections short-lived).
    let core_rpc = Rpc::with_idle(&args.endpoint, core_token, limits.max_jobs.clamp(1, MAX_IDLE_CORE_CONNECTIONS));
    let core_llm = Arc::new(Llm::new(Arc::new(core_rpc)));
    let pool = Arc::new(CorePool::new(
        CoreSetup {
            arbiter: arbiter.clone(),
            llm: core_llm,
            model: hello.bindings.models.core.clone(),
            identity: identity.clone(),
            board: board.clone(),
            edge: edge_tx.clone(),
            skills: skills.clone(),
            approvals: approvals.clone(),
            firings: firings_tx,
            floor: floor.clone(),
        },
        limits,
    ));
    let edge_cancel = Arc::new(crate::cancel::Cancel::new());
    let link = Arc::new(Link {
        rpc: rpc.clone(),
        log,
        processed: AtomicU64::new(hello.recovery.processed_upto),
        config_version: AtomicU64::new(hello.config.version),
        lease_lost: crate::cancel::Cancel::new(),
        closing: AtomicBool::new(false),
        arbiter: arbiter.clone(),
        config: config.clone(),
        board: board.clone(),
        approvals,
        edge_cancel: edge_cancel.clone(),
        pool: Arc::downgrade(&pool),
        arguments,
        floor: floor.clone(),
        withheld_wait: crate::link::WITHHELD_WAIT,
    });
    link.apply(&hello.config);
    // Recalls go through link-reply's queue, behind the answers before them.
    let recall = Arc::new(crate::link::RecallThroughReply::new(out_tx.clone()));
    let lane = EdgeLane {
        mind: Mind {
            arbiter,
            llm,
            llm_lane: "edge",
            model: hello.bindings.models.edge.clone(),
            stream: true,
            job: None,
            floor,
            fallback: Default::default(),
        },
        identity,
        config,
        out: out_tx,
        resume,
        interrupted,
        recovered: hello.recovery.conversations.clone(),
        board: board.clone(),
        pool,
        skills,
        cancel: edge_cancel,
        discovered: Arc::default(),
        recall,
    };
    // Set-up is complete: tell choird, which counts the agent as running from here.
    board.set_session(SessionState::Running);
    rpc.call::<_, Ack>(Verb::ReportStatus, &board.report(), Duration::from_secs(10))?;
    let edge = std::thread::Builder::new().name("edge".into()).spawn(move || lane.run(edge_rx))?;
    let poll = {
        let (link, edge_tx) = (link.clone(), edge_tx.clone());
        std::thread::Builder::new().name("link-poll".into()).spawn(move || link.poll(edge_tx))?
    };
    let push = {
        let link = link.clone();
        std::thread::Builder::new().name("link-push".into()).spawn(move || link.push(firings_rx, committed_rx))?
    };
    let speak = {
        let link = link.clone();
        std::thread::Builder::new().name("link-reply".into()).spawn(move || link.speak(out_rx))?
    };
    let mut signals = signal_hook::iterator::SignalsInfo::<signal_hook::iterator::exfiltrator::WithOrigin>::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    let signal_handle = signals.handle();
    let sig = std::thread::Builder::new().name("signals".into()).spawn(move || {
        for origin in signals.forever() {
            let sender = origin.process.map(|p| p.pid);
            let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
            let descendant =
                sender.and_then(|s| choir_common::proc_tree::is_descendant_of(s, std::process::id() as i32));
            if stop_signal_from_supervisor(sender, parent, descendant) {
                log::info!("signal received: finishing the current message, then stopping");
                let _ = edge_tx.send(EdgeEvent::Stop);
                return;
            }
            log::warn!(
                "ignored signal {} from process {} (only the supervisor stops the agent; a tool may not)",
                origin.signal,
                sender.unwrap_or(0)
            );
        }
    })?;
    // Start-up is done (SIGTERM handled from here on): the code only it ran
    // need not stay resident.
    choir_common::code_pages::give_back_logged();

    let lane_result = edge.join();
    board.set_session(SessionState::Draining);
    let reason = match &lane_result {
        Ok(Ok(())) if link.lease_lost.is_set() => "lease lost".to_owned(),
        Ok(Ok(())) => "stopped".to_owned(),
        Ok(Err(e)) => format!("commit log failure: {e}"),
        Err(_) => "edge lane panicked".to_owned(),
    };
    // The edge's senders are gone (and the core pool's, with the lane):
    // link-reply and link-push drain, ship and return.
    let _ = speak.join();
    let _ = push.join();
    link.closing.store(true, Ordering::SeqCst);
    if !link.lease_lost.is_set() {
        let bye = TerminateSelfRequest { reason: reason.clone() };
        if let Err(e) = rpc.call::<_, Ack>(Verb::TerminateSelf, &bye, Duration::from_secs(10)) {
            log::warn!("TERMINATE_SELF failed: {e}");
        }
    }
    let _ = poll.join();
    signal_handle.close();
    let _ = sig.join();
    // Nothing a tool started outlives the agent.
    crate::process::reaper::kill_all();
    log::info!("agent exiting: {reason}");
    match lane_result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => anyhow::bail!("the edge lane panicked"),
    }
}

/// Whether a stop signal may stop the agent: not when a tool sent it. A
/// tool's processes are all below the agent (it is their subreaper, so even
/// one that left its session is), so a signal is a tool's when its sender is
/// the agent's descendant — or is gone by the time it is looked at (a tool
/// that signalled and exited). It is honoured from the agent's parent
/// (choird, for the process runtime), from outside its PID namespace (the
/// engine's `docker stop`, which the kernel shows as pid 0; the agent is the
/// container's PID 1), from the kernel (no sender), and from any live process
/// outside the agent's tree (an operator's `kill`, systemd).
fn stop_signal_from_supervisor(sender: Option<i32>, parent: Option<i32>, descendant: Option<bool>) -> bool {
    match sender {
        None | Some(0) => true,
        Some(pid) if Some(pid) == parent => true,
        Some(_) => descendant == Some(false),
    }
}

/// The call policies of this build: the argument policy (choird's merged
/// rules: the built-in default and the operator's); the test build adds the
/// one `<state dir>/confirm.json` asks for.
fn policies(
    state_dir: &std::path::Path,
    arguments: Arc<crate::arbiter::arg_check::ArgumentPolicy>,
) -> Vec<Arc<dyn crate::arbiter::policy::CallPolicy>> {
    #[allow(unused_mut)]
    let mut policies: Vec<Arc<dyn crate::arbiter::policy::CallPolicy>> = vec![arguments];
    #[cfg(feature = "failpoints")]
    if let Some(p) = crate::arbiter::policy::ConfirmListed::from_dir(state_dir) {
        policies.push(Arc::new(p));
    }
    let _ = state_dir;
    policies
}

/// Retries transport failures (choird restarting) for about half a minute.
fn call_with_retry<T>(mut f: impl FnMut() -> Result<T, RpcError>) -> Result<T, RpcError> {
    let mut wait = Duration::from_millis(100);
    let mut left = 12;
    loop {
        match f() {
            Err(e) if e.retryable() && left > 0 => {
                log::warn!("{e}; retrying in {wait:?}");
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
                left -= 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stop_signal_from_supervisor;

    #[test]
    fn a_stop_signal_stops_the_agent_unless_a_tool_sent_it() {
        // choird, the process runtime's parent.
        assert!(stop_signal_from_supervisor(Some(4242), Some(4242), Some(false)));
        // docker stop: from outside the container's PID namespace (pid 0),
        // where the agent is PID 1 and has no parent.
        assert!(stop_signal_from_supervisor(Some(0), None, None));
        assert!(stop_signal_from_supervisor(None, Some(4242), None), "the kernel's own (no sender)");
        // An operator's kill, or systemd, after choird is gone.
        assert!(stop_signal_from_supervisor(Some(1), Some(1), Some(false)));
        assert!(stop_signal_from_supervisor(Some(900), Some(1), Some(false)));
        // A tool's process, in either runtime, alive or already gone.
        assert!(!stop_signal_from_supervisor(Some(4300), Some(4242), Some(true)));
        assert!(!stop_signal_from_supervisor(Some(17), None, Some(true)));
        assert!(!stop_signal_from_supervisor(Some(4301), Some(4242), None));
    }
}
