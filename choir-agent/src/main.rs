//! `choir-agent`: the agent runtime binary. Parses arguments, reads the lease
//! token from stdin, and runs [`choir_agent::run::run`]. Started by choird's
//! runtime, not by hand.

use std::io::BufRead;
use std::path::PathBuf;

use choir_agent::rpc::Endpoint;

const USAGE: &str = "\
usage: choir-agent --agent ID --connect (unix:PATH | http://HOST:PORT) --workspace DIR
                   --token-stdin [--state-dir DIR] [--choir-dir DIR]

Started by choird. The lease token is read from the first line of stdin.";

fn main() {
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    choir_common::malloc::limit_arenas(std::env::var_os("MALLOC_ARENA_MAX").is_some());
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        // One record, one line: whatever a client or a model put in a
        // message (newlines, escape sequences) is escaped, never a new line.
        .format(|buf, record| {
            use std::io::Write;
            let ts = buf.timestamp_millis();
            writeln!(
                buf,
                "[{ts} {:<5} {}] {}",
                record.level(),
                record.target(),
                choir_common::text::one_line(&record.args().to_string())
            )
        })
        .init();
    if let Err(e) = real_main() {
        eprintln!("choir-agent: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    use lexopt::prelude::*;
    let (mut agent, mut connect, mut workspace, mut state_dir, mut token_stdin) = (None, None, None, None, false);
    let mut choir_dir = PathBuf::from("/choir");
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("agent") => agent = Some(parser.value()?.string()?),
            Long("connect") => connect = Some(parser.value()?.string()?),
            Long("workspace") => workspace = Some(PathBuf::from(parser.value()?)),
            Long("state-dir") => state_dir = Some(PathBuf::from(parser.value()?)),
            Long("choir-dir") => choir_dir = PathBuf::from(parser.value()?),
            Long("token-stdin") => token_stdin = true,
            Long("help") | Short('h') => {
                println!("{USAGE}");
                return Ok(());
            }
            Long("version") | Short('V') => {
                let extra = if cfg!(feature = "failpoints") { " (test build: failpoints)" } else { "" };
                println!("choir-agent {}{extra}", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let missing = |what: &str| anyhow::anyhow!("{what} is required\n{USAGE}");
    let agent = agent.ok_or_else(|| missing("--agent"))?;
    let connect = connect.ok_or_else(|| missing("--connect"))?;
    let endpoint =
        Endpoint::parse(&connect).ok_or_else(|| anyhow::anyhow!("--connect must be unix:PATH or http://HOST:PORT"))?;
    let workspace = workspace.ok_or_else(|| missing("--workspace"))?;
    if !token_stdin {
        anyhow::bail!("--token-stdin is required: the lease token is never taken from the command line");
    }
    // Before the token (and later the secrets) is in memory: no process of
    // the same user — a shell a tool started — may read this process's
    // memory, environment or descriptors (/proc/<pid>/mem, ptrace, core dumps).
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| anyhow::anyhow!("cannot make the agent non-dumpable: {e}"))?;
    // No process below this one may trace or read another (the container's
    // PID 1, a tool holding a secret): a seccomp filter every child inherits.
    choir_agent::process::confine::install().map_err(|e| anyhow::anyhow!("{e}"))?;
    // A session of its own: every tool stays in it (tools get a process
    // group of their own, not a session), so a supervisor that outlives this
    // process can end what it started if it dies without cleaning up
    // (SIGKILL, OOM): choird's process runtime kills the session's members
    // when it reaps the agent. Already a session or group leader (started so
    // by hand): nothing to do.
    if let Err(e) = rustix::process::setsid() {
        log::debug!("no session of its own ({e}): already a group leader");
    }
    // Whatever a tool starts and leaves behind is reparented to us and killed.
    choir_agent::process::reaper::init()
        .map_err(|e| anyhow::anyhow!("cannot become the subreaper of tool processes: {e}"))?;
    let mut token = String::new();
    std::io::stdin().lock().read_line(&mut token)?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        anyhow::bail!("no lease token on stdin");
    }
    choir_agent::run::run(choir_agent::run::Args { agent, endpoint, token, workspace, state_dir, choir_dir })
}
