//! Start-up, the listeners, the signal loop and shutdown: the order in which
//! choird brings its pieces up and takes them down.
//!
//! Start: layout → instance lock → secrets (mode check) → config → TCP
//! listeners (bound first: a port in use fails at once) → database (managed
//! cluster or URL) → migrations → admin and agent sockets → READY to systemd
//! (`Type=notify`) → autostart agents.
//! Shutdown (SIGTERM/SIGINT): stop agents → stop listeners → stop the managed
//! cluster → remove sockets. SIGHUP reloads config.json and secrets.json.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use choir_common::admin::ReloadReport;
use choir_common::ids::AgentId;

use crate::api::Router;
use crate::config::Config;
use crate::daemon::{Daemon, Parts};
use crate::db::cluster::ManagedCluster;
use crate::db::keeping;
use crate::db::Db;
use crate::error::Error;
use crate::home::Home;
use crate::http::server::{Limits, Server, Socket};
use crate::http::ListenerKind;
use crate::secrets::Secrets;
use crate::shared::Shared;
use crate::store::Queued;
use crate::store::Store;

/// What `choird` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The state directory.
    pub home: PathBuf,
    /// The `choir-agent` binary to use when config does not name one.
    pub default_agent_binary: PathBuf,
    /// A file the scheduler reads the time from instead of the system
    /// clock (tests only: `CHOIR_TEST_CLOCK_FILE`).
    pub clock_file: Option<PathBuf>,
    /// systemd's `NOTIFY_SOCKET` (see [`crate::notify`]).
    pub notify_socket: Option<std::ffi::OsString>,
}

/// The control plane as the Telegram gateway sees it.
struct DaemonControl(Arc<Daemon>);

impl crate::telegram::Control for DaemonControl {
    fn wake_agent(&self, agent: &AgentId) {
        self.0.wake_agent(agent);
    }
    fn message_stored(&self, agent: &AgentId, queued: Queued, conversation: &str, sender: &str, text: &str) {
        self.0.message_stored(agent, queued, conversation, sender, text);
    }
    fn summary(&self, agent: &str) -> Result<choir_common::admin::AgentSummary, Error> {
        self.0.summary_now(agent)
    }
    fn cancel_lane(&self, agent: &str, lane: &str, actor: &str) -> Result<(), Error> {
        self.0.cancel_lane(agent, lane, actor)
    }
    fn approve(
        &self,
        id: i64,
        req: &choir_common::admin::ApproveRequest,
    ) -> Result<choir_common::admin::ApprovalInfo, Error> {
        self.0.approve(id, req)
    }
    fn reject(&self, id: i64, reason: &str, by: Option<&str>) -> Result<choir_common::admin::ApprovalInfo, Error> {
        self.0.reject(id, reason, by)
    }
    fn approval(&self, id: i64) -> Result<choir_common::admin::ApprovalDetail, Error> {
        self.0.approval(id)
    }
    fn rewrite_config(&self, edit: crate::telegram::ConfigEdit<'_>) -> Result<(), String> {
        self.0.rewrite_config(edit)
    }
}

/// Connections an agent's socket serves at once: its long-poll, replication,
/// streamed model calls of the edge and of its core jobs, host tools and
/// status reports, with room to spare.
const AGENT_CONNECTIONS: usize = 64;

/// Every listener choird serves. Agent sockets come and go with the config
/// (SIGHUP).
struct Listeners {
    admin: Option<Server>,
    agents: BTreeMap<AgentId, Server>,
    tcp: Option<Server>,
    metrics: Option<Server>,
    router: Arc<Router>,
}

impl Listeners {
    /// Binds an agent's socket (see [`crate::sockets::bind_agent`]) and serves it.
    fn add_agent(&mut self, home: &Home, id: &AgentId) -> anyhow::Result<()> {
        let owner = rustix::process::geteuid().is_root().then(crate::runtime::docker::agent_ids);
        let (listener, path) = crate::sockets::bind_agent(&home.socks().join("agents"), id.as_str(), owner)?;
        let limits = Limits { max_connections: AGENT_CONNECTIONS, ..Limits::default() };
        let server = Server::start(
            Socket::Unix(listener, path),
            ListenerKind::Agent(id.clone()),
            self.router.clone(),
            limits,
            &format!("rpc-{id}"),
        )?;
        self.agents.insert(id.clone(), server);
        Ok(())
    }

    fn stop_all(mut self) {
        if let Some(a) = self.admin.take() {
            a.stop();
        }
        for (_, s) in std::mem::take(&mut self.agents) {
            s.stop();
        }
        if let Some(t) = self.tcp.take() {
            t.stop();
        }
    }
}

/// Runs choird until SIGTERM or SIGINT.
pub fn run(opts: Options) -> anyhow::Result<()> {
    // Handlers first: a SIGHUP or SIGTERM during start-up must not kill choird
    // by its default action; it is acted on once the signal loop runs.
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    let home = Home::new(opts.home.clone());
    let first_start = home.ensure_layout()?;
    let _lock = home.lock()?;
    home.check_secrets_mode()?;
    let secrets = Secrets::load(&home.secrets())?;
    let config = Config::load(&home.config())?;
    crate::logs::global(&home.logs()).set_limits(config.logs.limits());
    if first_start {
        log::info!(
            "first start: made {} with a starter config.json (an OpenAI endpoint, the docker runtime, no agents) and \
             an empty secrets.json; next: `choirctl secrets set openai_api_key`, add an agent under \"agents\" in \
             config.json, `systemctl reload choird` (or SIGHUP), then `choirctl agent start ID`",
            home.root().display()
        );
    }
    for warning in config.missing_secrets(&secrets) {
        log::warn!("{warning}");
    }
    let agent_binary = config.agent_binary.clone().unwrap_or(opts.default_agent_binary.clone());
    // The TCP listeners are bound before the database work (initdb and the
    // migrations take seconds): a port in use is said at once, naming the
    // field, and leaves nothing behind.
    let admin_gid =
        match &config.admin_group {
            Some(g) => Some(crate::sockets::group_id(g).ok_or_else(|| {
                anyhow::anyhow!("config.json admin_group: no group {g:?} on this host (see /etc/group)")
            })?),
            None => None,
        };
    let tcp = Tcp {
        http: bind_tcp("http_listen", config.http_listen.as_deref())?,
        metrics: bind_tcp("metrics_listen", config.metrics_listen.as_deref())?,
        console: bind_tcp("console_listen", config.console_listen.as_deref())?,
    };

    let (cluster, url, database) = match &config.database_url {
        Some(url) => (None, url.clone(), "external".to_owned()),
        None => {
            let bin = ManagedCluster::find_bin_dir(config.postgres_bin_dir.as_deref())?;
            let lock = home.pg_keeper_lock();
            match keeping::claim(&lock).map_err(|e| anyhow::anyhow!("{}: {e}", lock.display()))? {
                Some(keeping) => {
                    let cluster = Arc::new(ManagedCluster::start(&home.pg(), &bin)?);
                    let url = cluster.url();
                    (Some((cluster, keeping)), url, format!("managed ({})", home.pg().display()))
                }
                None => {
                    let by = crate::home::lock_holder(&lock).map(|p| format!(" (pid {p})")).unwrap_or_default();
                    log::info!(
                        "the managed PostgreSQL is kept by `choird cluster`{by}: adopting it; a restart of choird leaves it running"
                    );
                    let cluster = ManagedCluster::adopt(&home.pg(), &bin, KEPT_CLUSTER_PATIENCE)?;
                    let url = cluster.url();
                    (None, url, format!("managed ({}), kept by `choird cluster`{by}", home.pg().display()))
                }
            }
        }
    };
    let (cluster, _keeping) = cluster.unzip();
    let clock: Arc<dyn crate::schedule::clock::Clock> = match opts.clock_file {
        Some(path) => {
            log::warn!("the scheduler reads its time from {} (a test clock), not the system clock", path.display());
            Arc::new(crate::schedule::clock::FileClock::new(path))
        }
        None => Arc::new(crate::schedule::clock::SystemClock),
    };
    let result = serve(
        home,
        config,
        secrets,
        &url,
        database,
        Runs {
            agent_binary,
            clock,
            cluster: cluster.clone(),
            tcp,
            notify: crate::notify::Notifier::new(opts.notify_socket),
            admin_gid,
        },
        signals,
    );
    if let Some(cluster) = cluster {
        log::info!("stopping the managed PostgreSQL");
        if let Err(e) = cluster.stop() {
            log::error!("stopping the managed PostgreSQL: {e}");
        }
    }
    result
}

/// How long choird waits for a cluster `choird cluster` keeps to accept
/// connections (it may be running initdb, or recovery after a crash).
const KEPT_CLUSTER_PATIENCE: Duration = Duration::from_secs(120);

/// What choird runs with besides its files: the agent binary and the
/// scheduler's clock.
struct Runs {
    agent_binary: PathBuf,
    clock: Arc<dyn crate::schedule::clock::Clock>,
    /// The managed cluster, which `pg-keeper` keeps running.
    cluster: Option<Arc<ManagedCluster>>,
    /// The TCP listeners, bound first.
    tcp: Tcp,
    /// systemd, told when choird is ready and when it stops.
    notify: crate::notify::Notifier,
    /// The admin group's id (config `admin_group`).
    admin_gid: Option<u32>,
}

/// The TCP sockets config asks for, bound before anything else starts.
struct Tcp {
    http: Option<(std::net::TcpListener, String)>,
    metrics: Option<(std::net::TcpListener, String)>,
    console: Option<(std::net::TcpListener, String)>,
}

/// Binds `addr` for the config field `field`; an error names both.
fn bind_tcp(field: &str, addr: Option<&str>) -> anyhow::Result<Option<(std::net::TcpListener, String)>> {
    let Some(addr) = addr else { return Ok(None) };
    let l = std::net::TcpListener::bind(addr)
        .with_context(|| format!("config.json {field}: cannot listen on {addr} (free the port or change the field)"))?;
    Ok(Some((l, addr.to_owned())))
}

fn serve(
    home: Home,
    config: Config,
    secrets: Secrets,
    url: &str,
    database: String,
    runs: Runs,
    signals: signal_hook::iterator::Signals,
) -> anyhow::Result<()> {
    let Runs { agent_binary, clock, cluster, tcp, notify, admin_gid } = runs;
    let db = Db::connect(url)?;
    for name in db.migrate()? {
        log::info!("applied migration {name}");
    }
    let store = Store::new(db);
    let kill_switch = store.policy("kill_switch")?.and_then(|v| v.as_bool()).unwrap_or(false);
    if kill_switch {
        log::warn!("the kill switch is ON: agents will run no tools until `choirctl policy kill-switch off`");
    }
    // The pieces, bottom up: the shared services, the host tools (memory is
    // one registrant), the control plane, and the gateway's handle on it.
    let (events, events_rx) = crate::events::channel();
    let shared = Arc::new(Shared::new(home.clone(), config.clone(), secrets, store, events));
    let memory = crate::host_tools::memory::Memory::start(&shared)?;
    let mut host_tools = crate::host_tools::Registry::new(shared.clone());
    let mcp = crate::host_tools::mcp::McpHttp::new(shared.clone());
    host_tools.set_per_agent(Box::new(crate::host_tools::mcp::Served(mcp)));
    if let Some(m) = &memory {
        crate::host_tools::memory::register(m, &mut host_tools)?;
    }
    crate::host_tools::web::register(&shared, &mut host_tools)?;
    host_tools.register(Arc::new(crate::host_tools::speech::tts::Speak::new(shared.clone())))?;
    host_tools.register(Arc::new(crate::host_tools::notion::Notion::new(shared.clone())))?;
    crate::host_tools::mail::register(&shared, &mut host_tools)?;
    #[cfg(feature = "test-tools")]
    host_tools.register(Arc::new(crate::host_tools::test_echo::EchoOnce { shared: shared.clone() }))?;
    let db_health: Option<Arc<crate::db::keeper::Health>> = cluster.as_ref().map(|_| Arc::default());
    let daemon = Arc::new(Daemon::new(Parts {
        shared: shared.clone(),
        host_tools,
        memory,
        delivery: Arc::new(crate::telegram::TelegramDelivery),
        database,
        db_health: db_health.clone(),
        agent_binary,
        kill_switch,
        clock,
    }));
    let tg = crate::telegram::Handle {
        shared: shared.clone(),
        control: Arc::new(DaemonControl(daemon.clone())),
        link: Arc::default(),
    };
    // Dropped to stop `tg-events`, which sleeps until an event or this.
    let (events_stop, stop) = crossbeam_channel::bounded::<()>(0);
    let events_thread = {
        let tg = tg.clone();
        std::thread::Builder::new()
            .name("tg-events".into())
            .spawn(move || crate::telegram::run_events(&tg, &events_rx, &stop))?
    };
    // The managed cluster is kept running like an agent; its admins hear
    // of an outage through the Bot API itself (the outbox is in the database).
    let (keeper_stop, stop) = crossbeam_channel::bounded::<()>(1);
    let keeper = match (&cluster, &db_health) {
        (Some(cluster), Some(health)) => {
            let (cluster, health, tg) = (cluster.clone(), health.clone(), tg.clone());
            Some(std::thread::Builder::new().name("pg-keeper".into()).spawn(move || {
                crate::db::keeper::run(cluster.as_ref(), &health, &stop, &|text| {
                    crate::telegram::alert_admins_directly(&tg, text)
                })
            })?)
        }
        _ => None,
    };
    daemon.reload_policies("choird");
    daemon.warn_unmatched_tool_policies();
    if let Ok(why) = std::fs::read_to_string(home.restore_hold()) {
        log::warn!("{}", why.trim());
        daemon.hold(why);
    }
    daemon.adopt_containers()?;
    let console = Arc::new(crate::console::Console::default());
    let router = Arc::new(Router { daemon: daemon.clone(), tg: tg.clone(), console: console.clone() });
    let nofile = crate::http::server::raise_nofile_limit();
    log::debug!("open-file limit {nofile}");

    let mut listeners =
        Listeners { admin: None, agents: BTreeMap::new(), tcp: None, metrics: None, router: router.clone() };
    let (admin, admin_path) = crate::sockets::bind_admin(&home.socks(), admin_gid)?;
    listeners.admin = Some(Server::start(
        Socket::Unix(admin, admin_path),
        ListenerKind::Admin,
        router.clone(),
        Limits::default(),
        "admin",
    )?);
    for id in config.agents.keys() {
        listeners.add_agent(&home, id)?;
    }
    if let Some((tcp, _)) = tcp.http {
        let limits = Limits { max_connections: 128, ..Limits::default() };
        listeners.tcp = Some(Server::start(Socket::Tcp(tcp), ListenerKind::Tcp, router.clone(), limits, "rpc-tcp")?);
    }
    if let Some((listener, addr)) = tcp.console {
        console.listen_on(&daemon, listener)?;
        log::info!("console on http://{addr}/ (log in with choirctl console)");
    }
    if let Some((metrics, addr)) = tcp.metrics {
        let limits = Limits { max_connections: 8, ..Limits::default() };
        listeners.metrics =
            Some(Server::start(Socket::Tcp(metrics), ListenerKind::Metrics, router.clone(), limits, "metrics")?);
        log::info!("metrics on http://{addr}/metrics");
    }
    log::info!(
        "choird {} serving {} (admin socket {})",
        env!("CARGO_PKG_VERSION"),
        home.root().display(),
        home.admin_socket().display()
    );
    notify.send("READY=1\nSTATUS=serving");

    daemon.resume_agents();
    for (id, agent) in &config.agents {
        if agent.autostart {
            if let Err(e) = daemon.start_agent(id.as_str(), "choird") {
                log::error!("autostart of {id} failed: {e}");
            }
        }
    }

    // Start-up is done: the code only it ran need not stay resident.
    choir_common::code_pages::give_back_logged();
    let scheduler = {
        let d = daemon.clone();
        std::thread::Builder::new().name("scheduler".into()).spawn(move || d.run_scheduler())?
    };
    let mut gateway = match daemon.held() {
        Some(_) => None,
        None => crate::telegram::Gateway::start(&tg)?,
    };
    let outcome = signal_loop(&daemon, &tg, signals, &mut gateway, &mut listeners);
    notify.send("STOPPING=1\nSTATUS=stopping agents");

    log::info!("shutting down");
    // No new user messages while the agents stop; queued answers stay queued.
    if let Some(g) = gateway.take() {
        g.stop(&tg);
    }
    daemon.shutting_down.store(true, Ordering::SeqCst);
    // No new firings while the agents stop; claimed ones stay claimed.
    daemon.schedule.stop();
    let _ = scheduler.join();
    daemon.stop_all();
    daemon.wake_all();
    daemon.join_supervisors();
    daemon.host_tools.stop_all();
    if let Some(m) = &daemon.memory {
        m.stop();
    }
    listeners.stop_all();
    console.stop();
    drop(events_stop);
    let _ = events_thread.join();
    // Agents, connections and host tools are stopped: the model calls'
    // ledger rows still waiting, while the database still runs.
    daemon.store.flush_ledger_for_read();
    drop(keeper_stop);
    if let Some(k) = keeper {
        let _ = k.join();
    }
    let left = shared.tasks.join_all(Duration::from_secs(30));
    if !left.is_empty() {
        log::warn!("threads still running at exit (left to end with choird): {}", left.join(", "));
    }
    outcome
}

/// How often the signal loop does its duties of the clock: ends agents a
/// signal froze or that stopped answering, reaps lapsed leases, closes
/// unused database connections.
const ROUND: Duration = Duration::from_secs(1);

/// Waits for signals, reloads and resumes, and acts on each at once; does
/// its duties of the clock every [`ROUND`]. It sleeps until one of them
/// wakes it (a thread forwards the signals; a reload or resume asked
/// through the admin API pokes [`Daemon::wake_main`]): once a second at
/// rest, not five times.
fn signal_loop(
    daemon: &Arc<Daemon>,
    tg: &crate::telegram::Handle,
    mut signals: signal_hook::iterator::Signals,
    gateway: &mut Option<crate::telegram::Gateway>,
    listeners: &mut Listeners,
) -> anyhow::Result<()> {
    let (forward, received) = crossbeam_channel::bounded::<i32>(8);
    let closer = signals.handle();
    let forwarder = std::thread::Builder::new().name("signals".into()).spawn(move || {
        for sig in signals.forever() {
            if forward.send(sig).is_err() {
                break;
            }
        }
    })?;
    let outcome = serve_rounds(daemon, tg, &received, gateway, listeners);
    // The forwarder ends with the loop, whichever way it returned (its
    // channel gone, so no send of its can block).
    drop(received);
    closer.close();
    let _ = forwarder.join();
    outcome
}

/// The signal loop's body (see [`signal_loop`]), until SIGTERM or SIGINT.
fn serve_rounds(
    daemon: &Arc<Daemon>,
    tg: &crate::telegram::Handle,
    received: &crossbeam_channel::Receiver<i32>,
    gateway: &mut Option<crate::telegram::Gateway>,
    listeners: &mut Listeners,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let ledger_writing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut next_round = Instant::now() + ROUND;
    loop {
        let mut got = Vec::new();
        crossbeam_channel::select! {
            recv(received) -> sig => match sig {
                Ok(sig) => got.push(sig),
                Err(_) => bail!("the thread forwarding signals ended"),
            },
            recv(daemon.woken()) -> _ => {}
            recv(crossbeam_channel::at(next_round)) -> _ => {}
        }
        got.extend(received.try_iter());
        let mut reloads: Vec<Option<crossbeam_channel::Sender<ReloadReport>>> = Vec::new();
        for sig in got {
            match sig {
                SIGHUP => reloads.push(None),
                SIGTERM | SIGINT => return Ok(()),
                other => bail!("unexpected signal {other}"),
            }
        }
        while let Some(asked) = daemon.reload_asked() {
            reloads.push(Some(asked));
        }
        let resumed = daemon.resumed.swap(false, Ordering::SeqCst);
        if !reloads.is_empty() || resumed {
            // One reload answers every request that came in meanwhile.
            let report = if reloads.is_empty() { ReloadReport::default() } else { reload(daemon) };
            if report.refused.is_none() {
                apply_agent_set(daemon, listeners);
                // Bots, users and tokens may have changed: the gateway starts
                // afresh (not while held after a restore).
                if let Some(g) = gateway.take() {
                    g.stop(tg);
                }
                if daemon.held().is_none() {
                    match crate::telegram::Gateway::start(tg) {
                        Ok(g) => *gateway = g,
                        Err(e) => log::error!("telegram gateway not restarted: {e}"),
                    }
                }
            }
            for reply in reloads.into_iter().flatten() {
                let _ = reply.send(report.clone());
            }
            choir_common::code_pages::give_back_logged();
        }
        if Instant::now() < next_round {
            continue;
        }
        next_round = Instant::now() + ROUND;
        // A frozen process-runtime agent is ended within a second, an agent
        // that stopped answering within SILENT_AFTER and a second.
        daemon.end_frozen_agents();
        daemon.end_silent_agents();
        // A quiet choird holds no database connection (`db::Db`).
        daemon.store.db.close_unused();
        // Ledger rows no answer carried, written within a second, off this
        // thread (a database that does not answer must not hold signals up).
        if daemon.store.ledger.waiting() > 0 && !ledger_writing.swap(true, Ordering::SeqCst) {
            let (d, writing) = (daemon.clone(), Writing(ledger_writing.clone()));
            let spawned = daemon.tasks.spawn("ledger".into(), move || {
                let _writing = writing; // cleared when done, even by a panic
                if let Err(e) = d.store.flush_ledger() {
                    log::error!("the cost ledger's waiting rows were not written: {e}");
                }
            });
            if spawned.is_err() {
                ledger_writing.store(false, Ordering::SeqCst);
            }
        }
        for (id, session) in daemon.stale_sessions() {
            log::warn!(
                "agent {id}: no HEARTBEAT for {:?}; the lease of session {session} lapsed, stopping it",
                crate::daemon::LEASE_TTL
            );
            let d = daemon.clone();
            let _ = daemon.tasks.spawn(format!("reap-{id}"), move || {
                let _ = d.stop_agent(id.as_str(), "choird");
            });
        }
    }
}

/// Clears its flag when dropped: the ledger's writer is done.
struct Writing(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// After a reload: agents removed from config are stopped (their lease
/// revoked) and their sockets closed; agents added get their socket.
fn apply_agent_set(daemon: &Arc<Daemon>, listeners: &mut Listeners) {
    let config = daemon.config();
    let gone: Vec<AgentId> = listeners.agents.keys().filter(|id| !config.agents.contains_key(*id)).cloned().collect();
    for id in gone {
        log::warn!(
            "agent {id} was removed from config.json: stopping it and closing its socket; its workspace, repository \
             clone, schedules and images stay (`choirctl prune` removes the images and lists the rest)"
        );
        daemon.revoke_agent(&id, "choird (removed from config.json)");
        if let Some(s) = listeners.agents.remove(&id) {
            s.stop();
        }
    }
    let added: Vec<AgentId> = config.agents.keys().filter(|id| !listeners.agents.contains_key(*id)).cloned().collect();
    for id in added {
        match listeners.add_agent(&daemon.home, &id) {
            Ok(()) => log::info!("agent {id} was added to config.json: its socket is open"),
            Err(e) => log::error!("agent {id} was added to config.json, but its socket could not be opened: {e:#}"),
        }
    }
}

/// Reloads config.json and secrets.json (SIGHUP, `choirctl reload`); the
/// report says what changed and when each change takes effect, or why the
/// reload was refused (the running configuration stays).
fn reload(daemon: &Daemon) -> ReloadReport {
    let home = &daemon.home;
    let loaded = home
        .check_secrets_mode()
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(Secrets::load(&home.secrets())?))
        .and_then(|s| Ok((Config::load(&home.config())?, s)));
    match loaded {
        Ok((config, secrets)) => {
            let runtime = config.runtime.as_str();
            let mut report = crate::config::diff::changes(&daemon.config(), &config);
            report.secrets_changed = secrets != *daemon.secrets();
            daemon.reload(config, secrets);
            log::info!(
                "reloaded config.json and secrets.json: applied {:?}; after choird's restart {:?}; after each agent's \
                 restart {:?}{}",
                report.applied,
                report.after_choird_restart,
                report.after_agent_restart,
                if report.secrets_changed { "; secrets changed" } else { "" }
            );
            let keep: Vec<String> = daemon
                .sessions
                .summaries(runtime, |_| false)
                .into_iter()
                .filter(|a| a.configured_runtime.is_some())
                .map(|a| format!("{} ({})", a.id, a.runtime))
                .collect();
            if !keep.is_empty() {
                log::warn!(
                    "runtime is now {runtime}; these agents keep the runtime they run in until restarted (`choirctl \
                     agent restart ID`): {}",
                    keep.join(", ")
                );
            }
            report
        }
        Err(e) => {
            log::error!("reload refused, keeping the running config: {e}");
            ReloadReport { refused: Some(format!("{e}")), ..ReloadReport::default() }
        }
    }
}
