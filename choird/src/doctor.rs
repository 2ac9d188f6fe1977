//! `choirctl doctor`: the checks a failing deployment trips on, each with what
//! was found and the fix. They run in the operator's process, from the home's
//! own files (`config.json`, `secrets.json`), so they work when choird does
//! not start; what only a running choird can tell (its host tools' logins) is
//! asked over the admin socket by `choirctl`.
//!
//! **Invariants:** a check never changes anything (the model probe asks for
//! one token; the embeddings probe embeds one word); every network probe has
//! a timeout of at most [`PROBE_TIMEOUT`]; no check's text carries a secret
//! or a database URL (tokens are masked, URLs are named by their config key).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::{Config, Lane, RuntimeKind};
use crate::home::Home;
use crate::secrets::Secrets;

/// The longest any one network probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// Below this much free space in the home, the check fails.
pub const DISK_FAIL_BYTES: u64 = 512 * 1024 * 1024;
/// Below this much free space in the home, the check warns.
pub const DISK_WARN_BYTES: u64 = 2 * 1024 * 1024 * 1024;

pub use choir_common::admin::{Check, CheckOutcome as Outcome};

/// Runs every offline check for the home at `root`, in the order an operator
/// fixes things (files, disk, engine, database, endpoints, bots), handing
/// each to `report` as it is done (some wait on the network).
pub fn run(root: &Path, report: &mut dyn FnMut(Check)) {
    let home = Home::new(root.to_owned());
    let config = match Config::load(&home.config()) {
        Ok(c) => {
            report(Check::ok(
                "config",
                format!("{}: {} agent(s), {} bot(s)", home.config().display(), c.agents.len(), c.telegram.bots.len()),
            ));
            Some(c)
        }
        Err(e) => {
            report(Check::fail("config", e.to_string(), "correct config.json (the field is named above)"));
            None
        }
    };
    let (secrets, check) = secrets(&home, config.as_ref());
    report(check);
    report(disk(&home));
    report(sockets(&home));
    let Some(config) = config else {
        report(Check::skip("the rest", "nothing else can be checked without a valid config.json"));
        return;
    };
    let secrets = secrets.unwrap_or_default();
    report(workspaces(&home, &config));
    report(workspace_access(&home, &config));
    if config.runtime == RuntimeKind::Docker {
        docker(&config).into_iter().for_each(&mut *report);
    }
    report(postgres(&home, &config));
    for lane in [Lane::Edge, Lane::Core] {
        let first = config.endpoint(lane);
        report(model(first, &format!("llm.{}", lane.as_str()), &secrets, lane));
        for (i, fallback) in first.fallbacks.iter().enumerate() {
            report(model(fallback, &format!("llm.{}.fallbacks[{i}]", lane.as_str()), &secrets, lane));
        }
    }
    report(embeddings(&config, &secrets));
    for agent in config.agents.keys() {
        mcp(&home, &config, &secrets, agent).into_iter().for_each(&mut *report);
    }
    for (name, bot) in &config.telegram.bots {
        report(bot_token(&config.telegram.api_base, name, &bot.token_secret, &secrets));
    }
}

/// [`run`], collected.
pub fn run_all(root: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    run(root, &mut |c| out.push(c));
    out
}

/// Whether any check failed.
pub fn failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.outcome == Outcome::Fail)
}

fn secrets(home: &Home, config: Option<&Config>) -> (Option<Secrets>, Check) {
    let path = home.secrets();
    let secrets = match Secrets::load(&path) {
        Ok(s) => s,
        Err(e) => {
            let fix = "run doctor as the user choird runs as, or create secrets.json (mode 0600) with `choirctl secrets set NAME`";
            return (None, Check::fail("secrets", e.to_string(), fix));
        }
    };
    if let Err(e) = home.check_secrets_mode() {
        return (Some(secrets), Check::fail("secrets", e.to_string(), format!("chmod 600 {}", path.display())));
    }
    let missing = config.map(|c| c.missing_secrets(&secrets)).unwrap_or_default();
    let check = if missing.is_empty() {
        Check::ok("secrets", format!("{}: mode 0600, every secret config names is set", path.display()))
    } else {
        Check::fail(
            "secrets",
            missing.join("; "),
            "set each with `choirctl secrets set NAME` (the value is read from stdin)",
        )
    };
    (Some(secrets), check)
}

fn disk(home: &Home) -> Check {
    let space = match crate::disk::Space::of(home.root()) {
        Ok(s) => s,
        Err(e) => {
            return Check::fail("disk", format!("{}: {e}", home.root().display()), "create the home, or fix its path")
        }
    };
    let (free, total) = (space.free, space.total.max(1));
    let detail = format!(
        "{} free of {} on the home's file system ({:.0} %)",
        choir_common::text::human_bytes(free),
        choir_common::text::human_bytes(total),
        free as f64 * 100.0 / total as f64
    );
    let fix = "free space there (docker image prune, old logs/archive), or lower logs.max_total_mb";
    if free < DISK_FAIL_BYTES {
        Check::fail("disk", detail, fix)
    } else if free < DISK_WARN_BYTES {
        Check::warn("disk", detail, fix)
    } else {
        Check::ok("disk", detail)
    }
}

/// Every agent's workspace has its quota: off is a warning (an agent can
/// then fill choird's disk); on, choird must be able to mount the image
/// itself (root) or find it mounted (`choird workspaces mount`).
fn workspaces(home: &Home, config: &Config) -> Check {
    let name = "workspaces";
    let root = rustix::process::geteuid().is_root();
    let off: Vec<&str> =
        config.agents.iter().filter(|(_, a)| a.quotas.workspace_mb == 0).map(|(id, _)| id.as_str()).collect();
    let unmounted: Vec<&str> = config
        .agents
        .iter()
        .filter(|(_, a)| a.quotas.workspace_mb > 0 && !root)
        .filter(|(id, _)| {
            !crate::runtime::workspace::is_mounted(&home.workspace_image(id), &config.workspace(home, id))
        })
        .map(|(id, _)| id.as_str())
        .collect();
    if !unmounted.is_empty() {
        return Check::fail(
            name,
            format!("not mounted, and choird (not root) cannot mount them: {}", unmounted.join(", ")),
            "run `choird workspaces mount` as root (the systemd unit does before start and on reload)",
        );
    }
    if !off.is_empty() {
        return Check::warn(
            name,
            format!("no quota (quotas.workspace_mb is 0), so each can fill choird's disk: {}", off.join(", ")),
            "set agents.<id>.quotas.workspace_mb",
        );
    }
    Check::ok(name, format!("{} agent workspace(s), each a sized file system of its own", config.agents.len()))
}

/// Every existing workspace is private (0700) and owned, with its `.choir`
/// state, by the user its agent runs as under the configured runtime (a
/// workspace left by the other runtime would meet `Permission denied`). A
/// shallow look: the directory, `.choir` and what `.choir` holds.
fn workspace_access(home: &Home, config: &Config) -> Check {
    use std::os::unix::fs::MetadataExt;
    let name = "workspace access";
    let (uid, gid) = match config.runtime {
        crate::config::RuntimeKind::Docker => crate::runtime::docker::agent_ids(),
        crate::config::RuntimeKind::Process => {
            (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw())
        }
    };
    let mut open = Vec::new();
    let mut foreign = Vec::new();
    for id in config.agents.keys() {
        let ws = config.workspace(home, id);
        let Ok(top) = std::fs::symlink_metadata(&ws) else { continue };
        if top.mode() & 0o077 != 0 {
            open.push(format!("{} ({:03o})", ws.display(), top.mode() & 0o777));
        }
        let state = ws.join(".choir");
        let entries = std::fs::read_dir(&state).into_iter().flatten().flatten().map(|e| e.path()).take(64);
        let wrong = std::iter::once(ws.clone())
            .chain(std::iter::once(state.clone()))
            .chain(entries)
            .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.uid() != uid));
        if let Some(p) = wrong {
            foreign.push((id.as_str(), ws.clone(), p));
        }
    }
    if let Some((id, ws, p)) = foreign.first() {
        return Check::fail(
            name,
            format!(
                "{} is not owned by uid {uid}, the user agent {id} runs as under the {} runtime ({} agent(s) so)",
                p.display(),
                config.runtime.as_str(),
                foreign.len()
            ),
            format!(
                "`choirctl agent start {id}` from a choird running as root hands it over; otherwise, as root: chown -R \
                 --no-dereference {uid}:{gid} {}",
                ws.display()
            ),
        );
    }
    if !open.is_empty() {
        return Check::warn(
            name,
            format!("readable by other users: {}", open.join(", ")),
            "choird makes a workspace 0700 at its agent's next start; or chmod 700 it now",
        );
    }
    Check::ok(name, format!("every workspace is 0700 and owned by uid {uid}"))
}

/// The admin socket and the socket directories must be choird's alone.
fn sockets(home: &Home) -> Check {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let name = "sockets";
    let socks = home.socks();
    let Ok(dir) = std::fs::symlink_metadata(&socks) else {
        return Check::skip(name, format!("{} does not exist yet (choird creates it)", socks.display()));
    };
    if !dir.is_dir() {
        return Check::fail(name, format!("{} is not a directory", socks.display()), "remove it; choird recreates it");
    }
    let mode = dir.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Check::fail(
            name,
            format!("{} has mode {mode:03o}: others may replace choird's sockets", socks.display()),
            format!("chmod 700 {}", socks.display()),
        );
    }
    let admin = home.admin_socket();
    match std::fs::symlink_metadata(&admin) {
        Ok(m) => {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Check::fail(
                    name,
                    format!("{} has mode {mode:03o}: other users may administer choird", admin.display()),
                    format!("chmod 600 {} (choird sets it on start)", admin.display()),
                );
            }
            let me = rustix::process::geteuid().as_raw();
            if m.uid() != me && me != 0 {
                return Check::warn(
                    name,
                    format!("{} belongs to uid {}, not to you (uid {me})", admin.display(), m.uid()),
                    "run choirctl as the user choird runs as (or root)",
                );
            }
            Check::ok(name, format!("{} mode {mode:03o} in a {:03o} directory", admin.display(), dir.mode() & 0o777))
        }
        Err(_) => Check::skip(name, format!("no {} (choird is not running)", admin.display())),
    }
}

fn docker(config: &Config) -> Vec<Check> {
    use crate::docker::client::{Engine, EngineError, API_VERSION};
    let engine = Engine::new(&config.docker.socket);
    let socket = config.docker.socket.display().to_string();
    let version = match engine.version() {
        Ok(v) => v,
        Err(e) => {
            let fix = match &e {
                EngineError::NoSocket(_) => {
                    format!("start the engine (systemctl start docker), or set docker.socket (now {socket})")
                }
                EngineError::Permission(_) => {
                    "add choird's user to the docker group (usermod -aG docker USER), then log in again".to_owned()
                }
                _ => format!("the engine must speak API {API_VERSION} or newer: upgrade docker.io"),
            };
            return vec![
                Check::fail("docker", e.to_string(), fix),
                Check::skip("base image", "the Docker engine cannot be reached"),
            ];
        }
    };
    let api = version["ApiVersion"].as_str().unwrap_or("?");
    let server = version["Version"].as_str().unwrap_or("?");
    let mut out = vec![Check::ok(
        "docker",
        format!("engine {server} at {socket}, API {api} (choird speaks {})", API_VERSION.trim_start_matches('v')),
    )];
    let base = &config.docker.base_image;
    out.push(match engine.image(base) {
        Ok(Some(image)) => {
            let size = image["Size"].as_u64().unwrap_or(0);
            Check::ok("base image", format!("{base} ({})", choir_common::text::human_bytes(size)))
        }
        Ok(None) => Check::fail(
            "base image",
            format!("{base} is not in the engine (agent images are built FROM it)"),
            "make base-image (scripts/build-base-image.sh builds it from Debian packages)",
        ),
        Err(e) => Check::fail("base image", e.to_string(), "see the docker check"),
    });
    out
}

fn postgres(home: &Home, config: &Config) -> Check {
    use crate::db::cluster::ManagedCluster;
    let name = "postgres";
    let (url, which) = match &config.database_url {
        Some(url) => (url.clone(), "database_url".to_owned()),
        None => {
            let (url, up) = ManagedCluster::probe(&home.pg());
            if !up {
                return managed_offline(config);
            }
            (url, format!("the managed cluster in {}", home.pg().display()))
        }
    };
    let fix_connect = if config.database_url.is_some() {
        "start the PostgreSQL server database_url names (systemctl start postgresql), or correct database_url"
    } else {
        "restart choird (it starts its managed cluster); see pg/postgres.log in the home"
    };
    let db = match crate::db::Db::connect(&url) {
        Ok(db) => db,
        Err(e) => return Check::fail(name, format!("cannot connect to {which}: {}", db_reason(&e)), fix_connect),
    };
    let row = db.with(|c| {
        let v: String = c.query_one("SHOW server_version", &[])?.get(0);
        let ext = c.query_opt(
            "SELECT default_version, installed_version FROM pg_available_extensions WHERE name = 'vector'",
            &[],
        )?;
        Ok((v, ext.map(|r| (r.get::<_, String>(0), r.get::<_, Option<String>>(1)))))
    });
    match row {
        Err(e) => Check::fail(name, format!("{which}: {}", db_reason(&e)), fix_connect),
        Ok((v, None)) => Check::fail(
            name,
            format!("PostgreSQL {v} at {which} has no pgvector extension"),
            "install pgvector for this server (Debian: postgresql-NN-pgvector; `make build-deps` builds it)",
        ),
        Ok((v, Some((default, installed)))) => Check::ok(
            name,
            format!(
                "PostgreSQL {v} at {which}; pgvector {} ({})",
                installed.as_deref().unwrap_or(&default),
                if installed.is_some() { "installed" } else { "available" }
            ),
        ),
    }
}

/// A database error with its causes, without the connection string.
fn db_reason(e: &crate::db::DbError) -> String {
    use std::error::Error;
    let mut cause: Option<&dyn Error> = match e {
        crate::db::DbError::Connect { source, .. } => Some(source),
        other => Some(other),
    };
    let mut parts = Vec::new();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// The managed cluster runs only while choird does: check what starting it needs.
fn managed_offline(config: &Config) -> Check {
    use crate::db::cluster::ManagedCluster;
    let name = "postgres";
    let bin = match ManagedCluster::find_bin_dir(config.postgres_bin_dir.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            return Check::fail(
                name,
                e.to_string(),
                "sudo make runtime-deps (installs PostgreSQL's server), or set database_url",
            )
        }
    };
    // Debian: /usr/lib/postgresql/<major>/bin → /usr/share/postgresql/<major>/extension.
    let major = bin.parent().and_then(|p| p.file_name()).map(|m| m.to_string_lossy().into_owned());
    let control = major.map(|m| Path::new("/usr/share/postgresql").join(m).join("extension").join("vector.control"));
    match control {
        Some(c) if !c.exists() => Check::fail(
            name,
            format!("the managed cluster is not running, and {} is missing", c.display()),
            "install pgvector for this PostgreSQL (`make build-deps` builds it)",
        ),
        _ => Check::warn(
            name,
            format!("the managed cluster is not running (choird starts it); server binaries in {}", bin.display()),
            "start choird (systemctl start choird), then run doctor again",
        ),
    }
}

/// A one-token request to `endpoint` (at `at` in config.json), one of
/// `lane`'s.
fn model(endpoint: &crate::config::LlmEndpoint, at: &str, secrets: &Secrets, lane: Lane) -> Check {
    let name = if at.contains("fallbacks") {
        format!("model ({} lane, fallback {})", lane.as_str(), endpoint.model)
    } else {
        format!("model ({} lane)", lane.as_str())
    };
    let mut endpoint = endpoint.clone();
    endpoint.timeout_s = endpoint.timeout_s.min(PROBE_TIMEOUT.as_secs());
    endpoint.answer_timeout_s = Some(endpoint.timeout_s);
    let (model, key) = (endpoint.model.clone(), endpoint.api_key_secret.clone());
    let base_url = endpoint.base_url.clone();
    if let Some(k) = key.as_ref().filter(|k| !secrets.contains(k)) {
        return Check::fail(
            &name,
            format!("{at}.api_key_secret names {k:?}, which is not in secrets.json"),
            format!("choirctl secrets set {k}"),
        );
    }
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Reply with OK."}],
        "max_tokens": 1,
    })
    .to_string();
    let upstream = crate::upstream::Upstream::new();
    let mut resp = match upstream.chat(&endpoint, secrets, lane, body.as_bytes(), false, "doctor") {
        Ok(r) => r,
        Err(e) => {
            // The operator's own check: the address and the OS's reason
            // (the relay's error, made for agents, says neither).
            return Check::fail(
                &name,
                format!("{base_url}: {e}; {}", reach(&base_url)),
                format!("check {at}.base_url and that the server is up"),
            );
        }
    };
    let status = resp.status;
    let text = String::from_utf8_lossy(&resp.read_to_vec(64 * 1024).unwrap_or_default()).into_owned();
    let key_fix = match &key {
        Some(k) => format!("set a valid key: choirctl secrets set {k}"),
        None => format!("the endpoint wants a key: set {at}.api_key_secret and the secret"),
    };
    match status {
        200 => {
            let body = serde_json::from_str::<Value>(&text).unwrap_or(Value::Null);
            let answered = body["model"].as_str().map(str::to_owned).unwrap_or_else(|| model.clone());
            let mut said = format!("{model} answered a 1-token request (served by {answered})");
            if endpoint.protocol == crate::config::Protocol::Openai {
                match (looks_like(&base_url, &body), endpoint.preset) {
                    (Some(seen), Some(set)) if seen != set => {
                        said.push_str(&format!("; it looks like {}, but {at}.preset is {:?}", seen.name(), set.name()))
                    }
                    (Some(seen), None) => {
                        said.push_str(&format!("; it looks like {0} (set {at}.preset to \"{0}\")", seen.name()))
                    }
                    _ => {}
                }
            }
            Check::ok(&name, said)
        }
        401 | 403 => Check::fail(&name, format!("the endpoint refused the key ({status})"), key_fix),
        404 => Check::fail(
            &name,
            format!("404 for model {model}: {}", choir_common::text::clipped(&text, 200)),
            format!("check {at}.model and base_url (it includes /v1)"),
        ),
        _ => Check::fail(
            &name,
            format!("{status}: {}", choir_common::text::clipped(&text, 200)),
            "see the endpoint's own status page or logs",
        ),
    }
}

/// Which provider an OpenAI-compatible endpoint looks like, from its host
/// and the fields its answer carries (Groq's `x_groq`, Mistral's `prefix`,
/// llama.cpp's `timings`, Ollama's `fp_ollama`, vLLM's `prompt_logprobs`).
fn looks_like(base_url: &str, answer: &Value) -> Option<crate::config::Preset> {
    use crate::config::Preset;
    let host = url::Url::parse(base_url).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
    let by_host = [
        ("api.openai.com", Preset::Openai),
        ("openrouter.ai", Preset::Openrouter),
        ("generativelanguage.googleapis.com", Preset::Gemini),
        ("api.mistral.ai", Preset::Mistral),
        ("api.groq.com", Preset::Groq),
        ("api.deepseek.com", Preset::Deepseek),
    ];
    if let Some((_, p)) = by_host.iter().find(|(h, _)| host == *h || host.ends_with(&format!(".{h}"))) {
        return Some(*p);
    }
    let message = &answer["choices"][0]["message"];
    if answer.get("x_groq").is_some() {
        Some(Preset::Groq)
    } else if answer.get("timings").is_some() {
        Some(Preset::Llamacpp)
    } else if answer["system_fingerprint"] == "fp_ollama" {
        Some(Preset::Ollama)
    } else if answer.get("prompt_logprobs").is_some() || answer.get("kv_transfer_params").is_some() {
        Some(Preset::Vllm)
    } else if message.get("prefix").is_some() {
        Some(Preset::Mistral)
    } else if message.get("reasoning_content").is_some() {
        Some(Preset::Deepseek)
    } else {
        None
    }
}

/// What a plain TCP connection to `base_url`'s host and port says: the
/// address it resolved to and the OS's answer.
fn reach(base_url: &str) -> String {
    use std::net::ToSocketAddrs;
    let Ok(url) = url::Url::parse(base_url) else { return "the URL does not parse".into() };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return "the URL names no host".into();
    };
    let addrs: Vec<std::net::SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return format!("{host} does not resolve: {e}"),
    };
    let Some(addr) = addrs.first() else { return format!("{host} resolves to no address") };
    match std::net::TcpStream::connect_timeout(addr, std::time::Duration::from_secs(3)) {
        Ok(_) => format!("{addr} accepts connections, so the HTTP exchange failed (TLS, a proxy, the path?)"),
        Err(e) => format!("connecting to {addr}: {e}"),
    }
}

fn embeddings(config: &Config, secrets: &Secrets) -> Check {
    use crate::host_tools::memory::embeddings::{EmbedError, Embedder};
    let name = "embeddings";
    let Some(memory) = &config.memory else {
        return Check::skip(name, "no memory section: the memory tools are off");
    };
    let mut memory = memory.clone();
    memory.embeddings.timeout_s = memory.embeddings.timeout_s.min(PROBE_TIMEOUT.as_secs());
    let want = memory.embeddings.dimensions;
    match Embedder::new(&memory, secrets).embed(&["choir doctor".to_owned()]) {
        Ok(_) => Check::ok(name, format!("{} gives vectors of {want} dimensions, as configured", memory.embeddings.model)),
        Err(EmbedError::Dimensions { got, .. }) => Check::fail(
            name,
            format!("{} gives {got} dimensions; memory.embeddings.dimensions says {want}", memory.embeddings.model),
            format!("set memory.embeddings.dimensions to {got} (agents' existing memory then needs re-embedding), or configure the model it was made with"),
        ),
        Err(e) => Check::fail(
            name,
            e.to_string(),
            "check memory.embeddings.base_url, model and api_key_secret, and that the server is up",
        ),
    }
}

/// Each MCP server of `agent`: its file loads; an HTTP one answers and
/// lists its tools as pinned; a stdio one's program exists (process
/// runtime; in a container the agent checks it at start).
fn mcp(home: &Home, config: &Config, secrets: &Secrets, agent: &choir_common::ids::AgentId) -> Vec<Check> {
    let mut out = Vec::new();
    for (scope, file) in crate::mcp_pins::servers(home, agent) {
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                let fix = "correct or remove the file (choirctl mcp rm); the agent would refuse to start";
                out.push(Check::fail(&format!("mcp {agent} ({})", scope.as_str()), e, fix));
                continue;
            }
        };
        let name = format!("mcp {agent}.{}", file.server.name);
        if file.server.is_http() {
            out.push(match crate::host_tools::mcp::probe(config, secrets, agent, &file) {
                Ok(found) if !found.contains(';') => Check::ok(&name, found),
                // Drift: the changed tools are off until approved, nothing else is wrong.
                Ok(found) => {
                    Check::warn(&name, found, format!("review its catalog: choirctl approvals list --agent {agent}"))
                }
                Err(e) => {
                    Check::fail(&name, e, "check the server's url, its credential and agents.<id>.web.allow_addresses")
                }
            });
        } else if config.runtime == RuntimeKind::Process && !Path::new(&file.server.command).is_file() {
            out.push(Check::fail(
                &name,
                format!("{} does not exist", file.server.command),
                "install the server, or correct its command (choirctl mcp rm, then mcp add)",
            ));
        } else {
            out.push(Check::ok(
                &name,
                format!("{} pinned tool(s); the agent checks the server at start", file.tools.len()),
            ));
        }
    }
    out
}

fn bot_token(api_base: &str, bot: &str, secret: &str, secrets: &Secrets) -> Check {
    use frankenstein::TelegramApi;
    let name = format!("telegram bot {bot}");
    let Some(token) = secrets.get(secret) else {
        return Check::fail(
            &name,
            format!("its token secret {secret:?} is not set"),
            format!("choirctl secrets set {secret} (the token from @BotFather)"),
        );
    };
    let client = crate::telegram::bots::client(api_base, token, PROBE_TIMEOUT);
    match client.get_me() {
        Ok(me) => {
            Check::ok(&name, format!("getMe: @{} (id {})", me.result.username.as_deref().unwrap_or("?"), me.result.id))
        }
        Err(frankenstein::Error::Api(r)) if matches!(r.error_code, 401 | 404) => Check::fail(
            &name,
            format!(
                "Telegram refused the token in secret {secret:?}: {}",
                crate::telegram::text::mask(&r.description, token)
            ),
            format!("put the bot's current token (from @BotFather) in it: choirctl secrets set {secret}"),
        ),
        Err(e) => match crate::telegram::bots::classify(&e, token) {
            crate::telegram::bots::Failure::Permanent(why) | crate::telegram::bots::Failure::Transient(why) => {
                Check::fail(&name, format!("getMe failed: {why}"), "check telegram.api_base and the network")
            }
            crate::telegram::bots::Failure::RetryAfter(d) => {
                Check::warn(&name, format!("rate limited for {} s", d.as_secs()), "run doctor again later")
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_told_by_its_host_or_the_fields_of_its_answer() {
        use crate::config::Preset;
        let none = serde_json::json!({"choices": [{"message": {"content": "OK"}}]});
        assert_eq!(looks_like("https://openrouter.ai/api/v1", &none), Some(Preset::Openrouter));
        assert_eq!(looks_like("https://generativelanguage.googleapis.com/v1beta/openai", &none), Some(Preset::Gemini));
        assert_eq!(looks_like("https://evil-api.openai.com.example/v1", &none), None, "a host that only ends alike");
        let local = "http://127.0.0.1:8080/v1";
        assert_eq!(looks_like(local, &none), None);
        assert_eq!(looks_like(local, &serde_json::json!({"timings": {"predicted_n": 1}})), Some(Preset::Llamacpp));
        assert_eq!(looks_like(local, &serde_json::json!({"system_fingerprint": "fp_ollama"})), Some(Preset::Ollama));
        assert_eq!(looks_like(local, &serde_json::json!({"x_groq": {"id": "r"}})), Some(Preset::Groq));
        assert_eq!(looks_like(local, &serde_json::json!({"prompt_logprobs": null})), Some(Preset::Vllm));
        let mistral =
            serde_json::json!({"choices": [{"message": {"content": "OK", "tool_calls": null, "prefix": false}}]});
        assert_eq!(looks_like(local, &mistral), Some(Preset::Mistral));
    }

    #[test]
    fn a_home_without_config_fails_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let checks = run_all(dir.path());
        assert!(failed(&checks));
        assert_eq!(checks[0].name, "config");
        assert_eq!(checks[0].outcome, Outcome::Fail);
        assert!(checks[0].detail.contains("config.json"), "{checks:?}");
        assert_eq!(checks.last().unwrap().outcome, Outcome::Skip);
    }

    /// A workspace another runtime left: doctor names the file owned by the
    /// wrong user and the exact command; an open mode is a warning; a
    /// private, owned workspace is ok.
    #[test]
    fn doctor_names_a_workspace_the_agent_cannot_use_and_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_owned());
        home.ensure_layout().unwrap();
        let mut config = Config::parse(crate::home::STARTER_CONFIG).unwrap();
        config.runtime = crate::config::RuntimeKind::Process;
        config.agents.insert(choir_common::ids::AgentId::parse("ops").unwrap(), Default::default());
        let ws = config.workspace(&home, &choir_common::ids::AgentId::parse("ops").unwrap());
        std::fs::create_dir_all(ws.join(".choir")).unwrap();
        std::fs::write(ws.join(".choir/agent.lock"), "").unwrap();
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = workspace_access(&home, &config);
        assert_eq!(c.outcome, Outcome::Warn, "{c:?}");
        assert!(c.detail.contains("755") && c.fix.as_deref().unwrap_or_default().contains("chmod 700"), "{c:?}");
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(workspace_access(&home, &config).outcome, Outcome::Ok);
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(ws.join(".choir/agent.lock"), Some(10001), Some(10001)).unwrap();
            let c = workspace_access(&home, &config);
            assert_eq!(c.outcome, Outcome::Fail, "{c:?}");
            assert!(
                c.detail.contains("agent.lock")
                    && c.fix.as_deref().unwrap_or_default().contains("chown -R --no-dereference 0:0"),
                "{c:?}"
            );
        }
    }

    /// A missing key named the base URL as the fix; an unreachable endpoint
    /// gave neither its address nor the OS's reason.
    #[test]
    fn regression_doctor_gave_the_wrong_fix_for_a_missing_key_and_no_address_for_a_dead_endpoint() {
        let mut config = Config::parse(crate::home::STARTER_CONFIG).unwrap();
        config.llm.edge.base_url = "http://127.0.0.1:1/v1".into();
        let c = model(config.endpoint(Lane::Edge), "llm.edge", &Secrets::default(), Lane::Edge);
        assert_eq!(c.outcome, Outcome::Fail);
        assert_eq!(c.fix.as_deref(), Some("choirctl secrets set openai_api_key"), "{c:?}");
        let c = model(
            config.endpoint(Lane::Edge),
            "llm.edge",
            &Secrets::from_pairs(&[("openai_api_key", "k")]),
            Lane::Edge,
        );
        assert_eq!(c.outcome, Outcome::Fail);
        assert!(c.detail.contains("http://127.0.0.1:1/v1") && c.detail.to_lowercase().contains("refused"), "{c:?}");
        assert!(!c.detail.contains("openai_api_key") && !c.detail.contains(": k"), "no secret in it: {c:?}");
    }
}
