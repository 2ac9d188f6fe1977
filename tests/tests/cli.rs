//! choirctl as a shell user meets it: what it does when the reader of its
//! output goes away.

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
