//! The offline work choirctl does with no choird running (`doctor`'s
//! checks from the home's files, `restore` of a backup) is done by the
//! `choird` binary's own subcommands, so choirctl links none of the
//! daemon: it starts `choird doctor|restore --home DIR` and reads one JSON
//! object a line from it.
//!
//! The binary is the `choird` beside choirctl's own executable (where
//! `make install` puts both), else the one on `PATH`. A secret the
//! subcommand needs (a database URL with its password) goes on its stdin,
//! never on its command line, where any local user could read it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The `choird` binary to run.
pub(crate) fn choird_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("choird")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("choird"))
}

/// Runs `choird WORDS --home HOME`, handing each line it prints (parsed as
/// JSON) to `each` as it comes; `stdin` is written to its standard input.
/// An exit that is not a success is an error carrying what it said on
/// stderr.
pub(crate) fn run_lines(
    words: &[&str],
    home: &Path,
    stdin: Option<&str>,
    each: &mut dyn FnMut(Value),
) -> anyhow::Result<()> {
    let binary = choird_binary();
    // The one process choirctl starts (clippy's rule is for the daemon and
    // the agent, whose spawns go through their `spawn` modules).
    #[allow(clippy::disallowed_methods)]
    let mut child = Command::new(&binary)
        .args(words)
        .arg("--home")
        .arg(home)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run {} ({e}): choirctl does this offline work with the choird binary; install it beside \
                 choirctl (make install)",
                binary.display()
            )
        })?;
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        writeln!(input, "{text}")?;
    }
    let mut said = String::new();
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut text);
        }
        text
    });
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            match serde_json::from_str::<Value>(&line) {
                Ok(v) => each(v),
                Err(_) => said.push_str(&format!("{line}\n")),
            }
        }
    }
    let status = child.wait()?;
    said.push_str(&reader.join().unwrap_or_default());
    if !status.success() {
        let why = said.trim().trim_start_matches("choird: ");
        anyhow::bail!(
            "{}",
            if why.is_empty() { format!("choird {} failed ({status})", words[0]) } else { why.to_owned() }
        );
    }
    Ok(())
}
