//! choirctl as a shell user meets it: usage errors exit 2 with the command's
//! own usage, work that fails exits 1, every command has its help, flags a
//! command does not take are refused, and a reader of its output that goes
//! away ends it quietly.

use std::process::{Command, Stdio};

use choir_tests::harness::bin;

/// Runs choirctl with `args` and its standard output a pipe whose reader
/// is already closed (`choirctl … | head -0`); returns its status and
/// standard error.
#[allow(clippy::disallowed_methods)]
fn with_reader_gone(args: &[&str]) -> (Option<i32>, String) {
    let (read, write) = rustix::pipe::pipe().unwrap();
    drop(read);
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(bin("choirctl"))
        .arg("--home")
        .arg(home.path())
        .args(args)
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
#[allow(clippy::disallowed_methods)]
fn regression_choirctl_panicked_when_the_reader_of_its_output_went_away() {
    // The manual is long enough to be written in more than one piece.
    let home = tempfile::tempdir().unwrap();
    let full = Command::new(bin("choirctl")).arg("--home").arg(home.path()).arg("--help").output().unwrap();
    assert!(full.stdout.len() > 1000, "the manual is printed: {} bytes", full.stdout.len());
    // Its reader gone, choirctl ends quietly, as `ls | head` does.
    let (status, stderr) = with_reader_gone(&["--help"]);
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(stderr, "", "nothing said, no panic");
    // So does a command that prints JSON.
    let (status, stderr) = with_reader_gone(&["--json", "policy", "show", "demo"]);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{status:?} {stderr}");
}

#[allow(clippy::disallowed_methods)]
fn ctl(args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    Command::new(bin("choirctl")).arg("--home").arg(home.path()).args(args).output().unwrap()
}

/// A missing argument printed "unknown command" and the whole manual, exit
/// 1; `help` was an unknown command; a flag meaning nothing for a command
/// was ignored.
#[test]
fn regression_a_usage_error_printed_the_whole_manual_and_exited_1() {
    let out = ctl(&["approvals", "show"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("Usage: choirctl approvals show <ID>") && err.lines().count() < 10, "{err}");
    // A flag the command does not take is refused, not ignored.
    let out = ctl(&["status", "--deny", "choir.exec"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--deny'"));
    // An unknown command is named, with a suggestion.
    let out = ctl(&["agnet", "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent"), "{out:?}");
    // Help: per command, and `help` itself; both exit 0 on stdout.
    for args in [&["help", "agent"][..], &["agent", "--help"], &["logs", "-h"]] {
        let out = ctl(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Usage: choirctl"), "{args:?}: {help}");
    }
    assert!(String::from_utf8_lossy(&ctl(&["logs", "--help"]).stdout).contains("-n, --limit <N>"), "logs -n / --tail");
    // Work that fails (no choird here) is 1, not 2: a script tells them apart.
    let out = ctl(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("choird is not running"));
}

/// The completions and the man page are made from the same definitions as
/// the parser: every command is in each.
#[test]
fn completions_and_the_man_page_name_every_command() {
    let man = String::from_utf8_lossy(&ctl(&["man"]).stdout).into_owned();
    assert!(man.starts_with(".ie") || man.contains(".TH choirctl"), "{man}");
    for shell in ["bash", "zsh", "fish"] {
        let out = ctl(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout).into_owned();
        for command in ["status", "reload", "agent", "restart", "approvals", "policy", "kill-switch", "logs"] {
            assert!(script.contains(command), "{shell} completion lacks {command}");
            assert!(man.contains(command) || command == "restart" || command == "kill-switch", "man lacks {command}");
        }
    }
    assert_eq!(ctl(&["completions", "tcsh"]).status.code(), Some(2), "an unknown shell is a usage error");
}
