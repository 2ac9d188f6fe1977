//! `choird`: the Choir control-plane daemon. Parses the command line, sets up
//! logging, and hands over to [`choird::run`]. Errors are printed once, here.

use std::path::PathBuf;

const USAGE: &str = "\
usage: choird [--home DIR]

Runs the Choir control plane. The state directory is DIR, else $CHOIR_HOME,
else ~/.choir.d. Logs go to stderr and DIR/logs/choird.log (level: RUST_LOG,
default info).";

fn main() {
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
    choird::run(choird::Options { home, default_agent_binary })
}

/// Logs to stderr and, when the log directory is usable, to `logs/choird.log`.
fn init_logging(home: &std::path::Path) {
    use std::io::Write;
    struct Tee(Option<std::fs::File>);
    impl Write for Tee {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(f) = self.0.as_mut() {
                let _ = f.write_all(buf);
            }
            std::io::stderr().write_all(buf)?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            std::io::stderr().flush()
        }
    }
    let logs = home.join("logs");
    let file = std::fs::create_dir_all(&logs)
        .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(logs.join("choird.log")))
        .ok();
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
        .target(env_logger::Target::Pipe(Box::new(Tee(file))))
        .init();
}
