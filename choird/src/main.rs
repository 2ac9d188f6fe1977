//! `choird`: the Choir control-plane daemon. Parses the command line, sets up
//! logging, and hands over to [`choird::run`]. Errors are printed once, here.

use std::path::PathBuf;

const USAGE: &str = "\
usage: choird [--home DIR]
       choird doctor [--home DIR]
       choird restore FILE [--home DIR] [--managed | --database-url-stdin]
       choird workspaces mount|release [--home DIR]
       choird cluster [--home DIR]
       choird logs [AGENT] [--since T] [--level L] [--grep S] [--limit N] [--home DIR]

Runs the Choir control plane. The state directory is DIR, else $CHOIR_HOME,
else ~/.choir.d. Logs go to stderr and DIR/logs/choird.log (level: RUST_LOG,
default info).

`doctor` and `restore` are the offline work `choirctl doctor` and
`choirctl restore` have done here (they need no running choird): each
prints one JSON object a line (a check; a step, then the summary), and
`restore` reads the database's connection string from stdin with
--database-url-stdin (never from the command line: it may hold a password).

`workspaces mount` (as root) mounts every configured agent's workspace
image, making each that is missing, for a choird that runs unprivileged
(the systemd unit runs it before choird starts and on reload);
`workspaces release` unmounts them (after choird stops).

`cluster` keeps the home's managed PostgreSQL running in a process of
its own (the choir-db unit), so a restart of choird leaves the database
up; choird adopts it. It logs to stderr only.

`logs` reads the home's log files (archives included) with no choird
running, as `choirctl logs` does then: one JSON object, the page of
records (T is RFC 3339).";

/// What the command line asks for.
enum Mode {
    /// Run the daemon.
    Serve,
    /// The offline checks, one JSON line each.
    Doctor,
    /// Unpack a backup into an empty home.
    Restore { file: PathBuf, into: Into },
    /// Mount (or release) the agents' workspace images, as root.
    Workspaces { release: bool },
    /// Read the log files offline.
    Logs(LogArgs),
    /// Keep the managed cluster running in a process of its own.
    Cluster,
}

/// `choird logs`' filters, as given.
#[derive(Default)]
struct LogArgs {
    agent: Option<String>,
    since: Option<String>,
    level: Option<String>,
    grep: Option<String>,
    limit: Option<String>,
}

/// Where `restore` puts the database.
#[derive(PartialEq, Eq)]
enum Into {
    AsBackedUp,
    Managed,
    UrlOnStdin,
}

fn main() {
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    choir_common::malloc::limit_arenas(std::env::var_os("MALLOC_ARENA_MAX").is_some());
    if let Err(e) = real_main() {
        eprintln!("choird: {}", choir_common::text::causes_once(e.chain()));
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    use lexopt::prelude::*;
    let mut home: Option<PathBuf> = None;
    let mut mode = Mode::Serve;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("home") => home = Some(parser.value()?.into()),
            Value(word) if matches!(mode, Mode::Serve) && word == "doctor" => mode = Mode::Doctor,
            Value(word) if matches!(mode, Mode::Serve) && word == "workspaces" => {
                let what = parser.value().map_err(|_| anyhow::anyhow!("workspaces needs mount or release\n{USAGE}"))?;
                let release = match what.to_str() {
                    Some("mount") => false,
                    Some("release") => true,
                    _ => anyhow::bail!("workspaces needs mount or release\n{USAGE}"),
                };
                mode = Mode::Workspaces { release };
            }
            Value(word) if matches!(mode, Mode::Serve) && word == "logs" => mode = Mode::Logs(LogArgs::default()),
            Value(word) if matches!(mode, Mode::Serve) && word == "cluster" => mode = Mode::Cluster,
            Value(agent) if matches!(&mode, Mode::Logs(a) if a.agent.is_none()) => {
                if let Mode::Logs(a) = &mut mode {
                    a.agent = Some(agent.string()?);
                }
            }
            Long(name @ ("since" | "level" | "grep" | "limit")) if matches!(mode, Mode::Logs(_)) => {
                let name = name.to_owned();
                let value = parser.value()?.string()?;
                if let Mode::Logs(a) = &mut mode {
                    let slot = match name.as_str() {
                        "since" => &mut a.since,
                        "level" => &mut a.level,
                        "grep" => &mut a.grep,
                        _ => &mut a.limit,
                    };
                    *slot = Some(value);
                }
            }
            Value(word) if matches!(mode, Mode::Serve) && word == "restore" => {
                let file = parser.value().map_err(|_| anyhow::anyhow!("restore needs the backup FILE\n{USAGE}"))?;
                mode = Mode::Restore { file: file.into(), into: Into::AsBackedUp };
            }
            Long(name @ ("managed" | "database-url-stdin")) => match &mut mode {
                Mode::Restore { into, .. } if *into == Into::AsBackedUp => {
                    *into = if name == "managed" { Into::Managed } else { Into::UrlOnStdin };
                }
                _ => anyhow::bail!("--{name} is for `choird restore`, once\n{USAGE}"),
            },
            Long("help") | Short('h') => {
                println!("{USAGE}");
                return Ok(());
            }
            Long("version") | Short('V') => {
                println!("choird {}", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let home = home
        .or_else(|| std::env::var_os("CHOIR_HOME").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".choir.d")))
        .ok_or_else(|| anyhow::anyhow!("no --home given and neither CHOIR_HOME nor HOME is set"))?;
    let home = if home.is_absolute() { home } else { std::env::current_dir()?.join(home) };
    match mode {
        Mode::Serve => {}
        Mode::Doctor => return doctor(&home),
        Mode::Restore { file, into } => return restore(&home, &file, into),
        Mode::Workspaces { release } => return workspaces(&home, release),
        Mode::Logs(args) => return logs(&home, &args),
        Mode::Cluster => return cluster(home),
    }
    init_logging(&home);
    let default_agent_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("choir-agent")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("choir-agent"));
    // Tests move the scheduler's clock through this file (never set in production).
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let clock_file = std::env::var_os("CHOIR_TEST_CLOCK_FILE").map(PathBuf::from);
    // Why choird could not start (or stopped) goes to its log file too,
    // where the operator looks (`choirctl logs` reads it with choird down),
    // not only to stderr.
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let notify_socket = std::env::var_os("NOTIFY_SOCKET");
    if let Err(e) = choird::run(choird::Options { home: home.clone(), default_agent_binary, clock_file, notify_socket })
    {
        log::error!("choird stopped: {}", choir_common::text::causes_once(e.chain()));
        choird::logs::global(&home.join("logs")).flush(std::time::Duration::from_secs(5));
        std::process::exit(1);
    }
    Ok(())
}

/// `choird logs`: the page of records the filters select, as one JSON
/// object, from the files alone.
fn logs(home: &std::path::Path, a: &LogArgs) -> anyhow::Result<()> {
    use choird::logs::query::LogQuery;
    let q = LogQuery::parse(
        a.agent.as_deref(),
        a.since.as_deref(),
        a.level.as_deref(),
        a.grep.as_deref(),
        a.limit.as_deref(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = home.join("logs");
    if !dir.is_dir() {
        anyhow::bail!("{} has no logs (is {} a Choir home?)", dir.display(), home.display());
    }
    let snapshot = choird::logs::snapshot_of_files(&dir);
    let page = choird::logs::query::read(&dir, &snapshot, &q.filter, q.limit);
    println!("{}", serde_json::to_string(&page)?);
    Ok(())
}

/// Logs to stderr (human) and to `logs/choird.log` (JSON, rotated and
/// archived by the log manager); level from `RUST_LOG`, default info.
/// `choird cluster`: the managed cluster kept by a process of its own.
fn cluster(home: PathBuf) -> anyhow::Result<()> {
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let filters = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
    if let Err(e) = choird::logs::facade::Facade::install_stderr_only(&filters) {
        eprintln!("choird: cannot set up logging: {e}");
    }
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let notify_socket = std::env::var_os("NOTIFY_SOCKET");
    choird::cluster_unit::run(home, notify_socket)
}

fn init_logging(home: &std::path::Path) {
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let filters = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
    let manager = choird::logs::global(&home.join("logs"));
    if let Err(e) = choird::logs::facade::Facade::install(manager, &filters) {
        eprintln!("choird: cannot set up logging: {e}");
    }
}

/// `choird doctor`: each offline check as one JSON line, as it is made.
fn doctor(home: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let mut broken: Option<std::io::Error> = None;
    choird::doctor::run(home, &mut |check| {
        if broken.is_none() {
            let line = serde_json::to_string(&check).unwrap_or_default();
            if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                broken = Some(e);
            }
        }
    });
    match broken {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// `choird workspaces mount|release`: one line per agent; fails when any
/// agent's could not be done (the others are done all the same).
fn workspaces(home: &std::path::Path, release: bool) -> anyhow::Result<()> {
    let mut failed = 0;
    for (agent, outcome) in choird::runtime::workspace::for_every_agent(home, release).map_err(anyhow::Error::msg)? {
        match outcome {
            Ok(done) => println!("{agent}: {done}"),
            Err(e) => {
                failed += 1;
                eprintln!("{agent}: {e}");
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} agent(s) failed");
    Ok(())
}

/// `choird restore`: each step as `{"step": …}`, then `{"summary": …}`.
fn restore(home: &std::path::Path, file: &std::path::Path, into: Into) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let into = match into {
        Into::AsBackedUp => choird::backup::RestoreInto::AsBackedUp,
        Into::Managed => choird::backup::RestoreInto::Managed,
        Into::UrlOnStdin => {
            let mut url = String::new();
            std::io::stdin().lock().read_line(&mut url)?;
            choird::backup::RestoreInto::Url(url.trim_end_matches(['\n', '\r']).to_owned())
        }
    };
    let mut out = std::io::stdout().lock();
    let summary = choird::backup::restore(file, home, &into, &mut |step: &str| {
        let _ = writeln!(out, "{}", serde_json::json!({"step": step})).and_then(|()| out.flush());
    })?;
    writeln!(out, "{}", serde_json::json!({"summary": summary}))?;
    Ok(())
}
