//! Start-up, the listeners, the signal loop and shutdown: the order in which
//! choird brings its pieces up and takes them down.
//!
//! Start: layout → instance lock → secrets (mode check) → config → database
//! (managed cluster or URL) → migrations → listeners → autostart agents.
//! Shutdown (SIGTERM/SIGINT): stop agents → stop listeners → stop the managed
//! cluster → remove sockets. SIGHUP reloads config.json and secrets.json.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context};
use choir_common::rpc::Verb;

use crate::config::Config;
use crate::daemon::Daemon;
use crate::db::cluster::ManagedCluster;
use crate::db::Db;
use crate::home::Home;
use crate::http::{ApiError, Handler, ListenerKind, Request, Response};
use crate::secrets::Secrets;
use crate::store::Store;

/// What `choird` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The state directory.
    pub home: PathBuf,
    /// The `choir-agent` binary to use when config does not name one.
    pub default_agent_binary: PathBuf,
}

/// Routes a request to the admin API, the agent RPC or the LLM relay,
/// according to what the listener exposes.
struct Router {
    daemon: Arc<Daemon>,
}

impl Handler for Router {
    fn handle(&self, kind: &ListenerKind, req: Request) -> Response {
        let d = &self.daemon;
        let result = if let Some(verb) = Verb::from_path(&req.path) {
            crate::rpc_api::handle(d, kind, verb, &req)
        } else if let Some(rest) = req.path.strip_prefix("/llm/") {
            match rest.split_once('/') {
                Some((lane, "v1/chat/completions")) if req.method == "POST" => {
                    crate::relay::handle(d, kind, lane, &req)
                }
                _ => Err(ApiError::NotFound(format!("no LLM endpoint {}", req.path))),
            }
        } else if req.path.starts_with("/admin/") {
            if *kind == ListenerKind::Admin {
                crate::admin_api::handle(d, &req)
            } else {
                // The admin API exists only on choird.sock; agents cannot reach it.
                Err(ApiError::NotFound(format!("no endpoint {}", req.path)))
            }
        } else {
            Err(ApiError::NotFound(format!("no endpoint {} {}", req.method, req.path)))
        };
        result.unwrap_or_else(ApiError::into_response)
    }
}

struct Listener {
    server: Arc<tiny_http::Server>,
    threads: Vec<JoinHandle<()>>,
    socket: Option<PathBuf>,
}

fn bind_unix(path: &Path) -> anyhow::Result<tiny_http::Server> {
    // We hold the instance lock, so a socket file left here is stale.
    if path.exists() {
        std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let server =
        tiny_http::Server::http_unix(path).map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))?;
    Ok(server)
}

/// Runs choird until SIGTERM or SIGINT.
pub fn run(opts: Options) -> anyhow::Result<()> {
    // Handlers first: a SIGHUP or SIGTERM during start-up must not kill choird
    // by its default action; it is acted on once the signal loop runs.
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    let home = Home::new(opts.home.clone());
    home.ensure_layout()?;
    let _lock = home.lock()?;
    home.check_secrets_mode()?;
    let secrets = Secrets::load(&home.secrets())?;
    let config = Config::load(&home.config())?;
    for warning in config.missing_secrets(&secrets) {
        log::warn!("{warning}");
    }
    let agent_binary = config.agent_binary.clone().unwrap_or(opts.default_agent_binary.clone());

    let (cluster, url, database) = match &config.database_url {
        Some(url) => (None, url.clone(), "external".to_owned()),
        None => {
            let bin = ManagedCluster::find_bin_dir(config.postgres_bin_dir.as_deref())?;
            let cluster = ManagedCluster::start(&home.pg(), &bin)?;
            let url = cluster.url();
            (Some(cluster), url, format!("managed ({})", home.pg().display()))
        }
    };
    let result = serve(home, config, secrets, &url, database, agent_binary, signals);
    if let Some(cluster) = cluster {
        log::info!("stopping the managed PostgreSQL");
        if let Err(e) = cluster.stop() {
            log::error!("stopping the managed PostgreSQL: {e}");
        }
    }
    result
}

fn serve(
    home: Home,
    config: Config,
    secrets: Secrets,
    url: &str,
    database: String,
    agent_binary: PathBuf,
    signals: signal_hook::iterator::Signals,
) -> anyhow::Result<()> {
    let db = Db::connect(url)?;
    for name in db.migrate()? {
        log::info!("applied migration {name}");
    }
    let store = Store::new(db);
    let kill_switch = store.policy("kill_switch")?.and_then(|v| v.as_bool()).unwrap_or(false);
    if kill_switch {
        log::warn!("the kill switch is ON: agents will run no tools until `choirctl policy kill-switch off`");
    }
    let daemon =
        Arc::new(Daemon::new(home.clone(), config.clone(), secrets, store, database, agent_binary, kill_switch));
    if let Some(memory) = crate::memory::Memory::start(&daemon)? {
        let _ = daemon.memory.set(memory);
    }
    daemon.adopt_containers()?;
    let router: Arc<dyn Handler> = Arc::new(Router { daemon: daemon.clone() });
    let stop = Arc::new(AtomicBool::new(false));

    let mut listeners = Vec::new();
    let admin = Arc::new(bind_unix(&home.admin_socket())?);
    let threads = crate::http::serve(admin.clone(), ListenerKind::Admin, router.clone(), 16, "admin", stop.clone())?;
    listeners.push(Listener { server: admin, threads, socket: Some(home.admin_socket()) });
    for id in config.agents.keys() {
        let dir = home.agent_socket_dir(id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let path = home.agent_socket(id);
        let server = Arc::new(bind_unix(&path)?);
        if rustix::process::geteuid().is_root() {
            // A containerised agent runs as its own non-root user: the socket
            // (and only it) is theirs. Re-done on every start of choird.
            let (uid, gid) = crate::runtime::docker::agent_ids();
            for p in [&dir, &path] {
                rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
                    .with_context(|| format!("chown {}", p.display()))?;
            }
        }
        let threads = crate::http::serve(
            server.clone(),
            ListenerKind::Agent(id.clone()),
            router.clone(),
            // The long-poll, replication, streamed model calls of the edge and
            // of up to a handful of core jobs, and status reports at once.
            16,
            &format!("rpc-{id}"),
            stop.clone(),
        )?;
        listeners.push(Listener { server, threads, socket: Some(path) });
    }
    if let Some(addr) = &config.http_listen {
        let server =
            Arc::new(tiny_http::Server::http(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?);
        let threads =
            crate::http::serve(server.clone(), ListenerKind::Tcp, router.clone(), 8, "rpc-tcp", stop.clone())?;
        listeners.push(Listener { server, threads, socket: None });
    }
    log::info!(
        "choird {} serving {} (admin socket {})",
        env!("CARGO_PKG_VERSION"),
        home.root().display(),
        home.admin_socket().display()
    );

    for (id, agent) in &config.agents {
        if agent.autostart {
            if let Err(e) = daemon.start_agent(id.as_str(), "choird") {
                log::error!("autostart of {id} failed: {e}");
            }
        }
    }

    let mut gateway = crate::telegram::Gateway::start(&daemon)?;
    let outcome = signal_loop(&daemon, signals, &mut gateway);

    log::info!("shutting down");
    // No new user messages while the agents stop; queued answers stay queued.
    if let Some(g) = gateway.take() {
        g.stop(&daemon);
    }
    daemon.shutting_down.store(true, Ordering::SeqCst);
    daemon.stop_all();
    daemon.wake_all();
    daemon.join_supervisors();
    if let Some(m) = daemon.memory.get() {
        m.stop();
    }
    stop.store(true, Ordering::SeqCst);
    for l in &listeners {
        for _ in 0..l.threads.len() {
            l.server.unblock();
        }
    }
    for l in listeners {
        for t in l.threads {
            let _ = t.join();
        }
        if let Some(path) = l.socket {
            let _ = std::fs::remove_file(path);
        }
    }
    outcome
}

/// Waits for signals; also reaps lapsed leases every few seconds.
fn signal_loop(
    daemon: &Arc<Daemon>,
    mut signals: signal_hook::iterator::Signals,
    gateway: &mut Option<crate::telegram::Gateway>,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    loop {
        for sig in signals.pending() {
            match sig {
                SIGHUP => {
                    reload(daemon);
                    // Bots, users and tokens may have changed: the gateway starts afresh.
                    if let Some(g) = gateway.take() {
                        g.stop(daemon);
                    }
                    match crate::telegram::Gateway::start(daemon) {
                        Ok(g) => *gateway = g,
                        Err(e) => log::error!("telegram gateway not restarted: {e}"),
                    }
                }
                SIGTERM | SIGINT => return Ok(()),
                other => bail!("unexpected signal {other}"),
            }
        }
        for (id, session) in daemon.stale_sessions() {
            log::warn!(
                "agent {id}: no HEARTBEAT for {:?}; the lease of session {session} lapsed, stopping it",
                crate::daemon::LEASE_TTL
            );
            let d = daemon.clone();
            let _ = std::thread::Builder::new().name(format!("reap-{id}")).spawn(move || {
                let _ = d.stop_agent(id.as_str(), "choird");
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn reload(daemon: &Daemon) {
    let home = &daemon.home;
    let loaded = home
        .check_secrets_mode()
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(Secrets::load(&home.secrets())?))
        .and_then(|s| Ok((Config::load(&home.config())?, s)));
    match loaded {
        Ok((config, secrets)) => {
            daemon.reload(config, secrets);
            log::info!("reloaded config.json and secrets.json");
        }
        Err(e) => log::error!("reload refused, keeping the running config: {e}"),
    }
}
