//! `choirctl secrets list|set|rm` (R-CTL-2). A value is read from stdin, or
//! from a prompt that does not echo when stdin is a terminal — never from
//! the command line, where `ps` and shell history would keep it.

use std::io::{IsTerminal, Read, Write};

use anyhow::Context;
use choir_common::admin::{SecretList, SetSecret};
use serde_json::Value;

use crate::ctx::{print_json, Ctx};

/// Longest value read (choird refuses more anyway).
const MAX_VALUE: u64 = 64 * 1024;

/// Every secret: name, set or missing, length, what uses it. Never a value.
pub fn list(ctx: &Ctx) -> anyhow::Result<()> {
    let l: SecretList = ctx.client.get("secrets")?;
    if ctx.json {
        return print_json(&l);
    }
    say!("{:<24} {:<8} {:<7} USED BY", "SECRET", "STATE", "LENGTH");
    for s in &l.secrets {
        let state = if s.set { "set" } else { "MISSING" };
        let len = s.length.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        let first = s.used_by.first().map(String::as_str).unwrap_or("(nothing)");
        say!("{:<24} {:<8} {:<7} {first}", s.name, state, len);
        for more in s.used_by.iter().skip(1) {
            say!("{:<41} {more}", "");
        }
    }
    Ok(())
}

/// Reads a value that must stay out of `ps` and the shell's history (a
/// secret, a connection string with a password): from a prompt without echo
/// on a terminal, naming `what`, else from stdin (at most `MAX_VALUE` bytes).
pub(crate) fn read_hidden(what: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        let fd = rustix::stdio::stdin();
        let saved = rustix::termios::tcgetattr(fd).context("cannot read the terminal's settings")?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(rustix::termios::LocalModes::ECHO);
        rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Now, &quiet)
            .context("cannot turn the terminal's echo off")?;
        eprint!("{what} (not shown): ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        let read = stdin.read_line(&mut line);
        let _ = rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Now, &saved);
        eprintln!();
        read.context("cannot read the value")?;
        return Ok(line.trim_end_matches(['\n', '\r']).to_owned());
    }
    let mut buf = Vec::new();
    stdin.lock().take(MAX_VALUE + 1).read_to_end(&mut buf).context("cannot read the value from stdin")?;
    if buf.len() as u64 > MAX_VALUE {
        anyhow::bail!("the value on stdin is longer than {MAX_VALUE} bytes");
    }
    let text = String::from_utf8(buf).context("the value on stdin is not UTF-8")?;
    // `echo VALUE |` adds one newline; it is not part of the value.
    let text = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    Ok(text.to_owned())
}

/// Refuses a name choird would refuse, before anything is read or sent.
fn check_name(name: &str) -> anyhow::Result<()> {
    if !choir_common::ids::valid_secret_name(name) {
        anyhow::bail!("secret name {name:?} must be 1–64 letters, digits, '_' or '-'");
    }
    Ok(())
}

/// Sets a secret from stdin or a prompt.
pub fn set(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    check_name(name)?;
    let value = read_hidden(&format!("value of secret {name}"))?;
    let r: Value = ctx.client.put(&format!("secrets/{name}"), &SetSecret { value })?;
    if ctx.json {
        return print_json(&r);
    }
    say!("secret {name} set ({} bytes); choird uses it from now on", r["length"]);
    if let Some(agents) = r["agents"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<&str> = agents.iter().filter_map(Value::as_str).collect();
        say!("agents bound to it read it when they start: choirctl agent update {}", names.join(" / "));
    }
    Ok(())
}

/// Removes a secret nothing uses.
pub fn rm(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    check_name(name)?;
    let r: Value = ctx.client.delete(&format!("secrets/{name}"))?;
    if ctx.json {
        return print_json(&r);
    }
    say!("secret {name} removed");
    Ok(())
}
