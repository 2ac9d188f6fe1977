//! `choird`: the Choir control-plane daemon. Parses the command line, sets up
//! logging, and hands over to [`choird::run`]. Errors are printed once, here.

use std::path::PathBuf;

const USAGE: &str = "\
usage: choird [--home DIR]

Runs the Choir control plane. The state directory is DIR, else $CHOIR_HOME,
else ~/.choir.d. Logs go to stderr and DIR/logs/choird.log (level: RUST_LOG,
default info).";

fn main() {
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    choir_common::malloc::limit_arenas(std::env::var_os("MALLOC_ARENA_MAX").is_some());
    // Faults map about the code that runs (each its 64 KiB neighbourhood),
    // not whatever else of the binary is cached (code_pages::drop_unmapped_cache).
    choir_common::code_pages::drop_unmapped_cache();
    if let Err(e) = real_main() {
        eprintln!("choird: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    use lexopt::prelude::*;
    let mut home: Option<PathBuf> = None;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("home") => home = Some(parser.value()?.into()),
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
    init_logging(&home);
    let default_agent_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("choir-agent")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("choir-agent"));
    // Tests move the scheduler's clock through this file (never set in production).
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let clock_file = std::env::var_os("CHOIR_TEST_CLOCK_FILE").map(PathBuf::from);
    choird::run(choird::Options { home, default_agent_binary, clock_file })
}

/// Logs to stderr (human) and to `logs/choird.log` (JSON, rotated and
/// archived by the log manager); level from `RUST_LOG`, default info.
fn init_logging(home: &std::path::Path) {
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let filters = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
    let manager = choird::logs::global(&home.join("logs"));
    if let Err(e) = choird::logs::facade::Facade::install(manager, &filters) {
        eprintln!("choird: cannot set up logging: {e}");
    }
}
