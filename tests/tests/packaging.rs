//! What `make install` does on an operator's host: it copies what `make
//! release` built, and nothing else — no apt, no compiling (as root, in the
//! checkout), no test servers; staged into `DESTDIR` it needs no root.

use std::path::Path;
use std::process::Command;

fn checkout() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn make(args: &[&str]) -> Command {
    let mut c = Command::new("make");
    c.arg("--no-print-directory").arg("-C").arg(checkout()).args(args);
    c
}

#[test]
fn make_install_runs_no_apt_and_builds_nothing() {
    let out = make(&["-n", "install"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("install -m 0755"), "the plan copies the binaries: {plan}");
    // What it runs (the closing hint it prints is no command).
    let plan: String = plan.lines().filter(|l| !l.trim_start().starts_with("echo ")).collect::<Vec<_>>().join("\n");
    for never in ["apt-get", "install-deps", "cargo", "dpkg", "systemctl"] {
        assert!(!plan.contains(never), "`make -n install` would run {never}:\n{plan}");
    }
    // Negative control: the target the test set needs does run apt's script.
    let deps = make(&["-n", "deps"]).output().unwrap();
    assert!(String::from_utf8_lossy(&deps.stdout).contains("install-deps.sh test"));
}

/// Staged as an unprivileged user: the binaries, the docs and the unit land
/// under DESTDIR with PREFIX in the unit; `make uninstall` removes them.
/// Without built binaries it refuses, saying what to run, and copies nothing.
#[test]
fn make_install_into_destdir_works_without_root_and_uninstall_removes_it() {
    let built = checkout().join("target/debug");
    if !["choird", "choir-agent", "choirctl"].iter().all(|b| built.join(b).exists()) {
        assert!(!choir_tests::services_required(), "the debug binaries are built by make test");
        eprintln!("SKIPPED: no debug binaries in target/debug (run cargo build --workspace)");
        return;
    }
    let stage = tempfile::tempdir().unwrap();
    std::fs::set_permissions(stage.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "make", "--no-print-directory", "-C"])
            .arg(checkout())
            .args(args);
        c.output().unwrap()
    };
    let destdir = format!("DESTDIR={}", stage.path().display());
    let built_arg = format!("BUILT={}", built.display());

    let missing = as_nobody(&["install", &destdir, "PREFIX=/usr", "BUILT=/nonexistent"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("run `make release`"), "{missing:?}");
    assert_eq!(std::fs::read_dir(stage.path()).unwrap().count(), 0, "a refused install copies nothing");

    let out = as_nobody(&["install", &destdir, "PREFIX=/usr", &built_arg]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for bin in ["choird", "choir-agent", "choirctl"] {
        assert!(stage.path().join("usr/bin").join(bin).is_file(), "{bin}");
    }
    assert!(stage.path().join("usr/share/doc/choir/README.md").is_file());
    let unit = std::fs::read_to_string(stage.path().join("etc/systemd/system/choird.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/choird") && !unit.contains("@PREFIX@"), "{unit}");
    let db_unit = std::fs::read_to_string(stage.path().join("etc/systemd/system/choir-db.service")).unwrap();
    assert!(db_unit.contains("ExecStart=/usr/bin/choird cluster") && !db_unit.contains("@PREFIX@"), "{db_unit}");
    let man = std::fs::read_to_string(stage.path().join("usr/share/man/man1/choirctl.1")).unwrap();
    assert!(man.contains(".TH choirctl") && man.contains("reload"), "the man page from the command definitions");
    for (file, says) in [
        ("usr/share/bash-completion/completions/choirctl", "complete -F"),
        ("usr/share/zsh/vendor-completions/_choirctl", "#compdef choirctl"),
        ("usr/share/fish/vendor_completions.d/choirctl.fish", "complete -c choirctl"),
    ] {
        let text = std::fs::read_to_string(stage.path().join(file)).unwrap();
        assert!(text.contains(says) && text.contains("restart"), "{file}");
    }

    let out = as_nobody(&["uninstall", &destdir, "PREFIX=/usr"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stage.path().join("usr/bin/choird").exists());
    assert!(!stage.path().join("etc/systemd/system/choird.service").exists());
    assert!(!stage.path().join("etc/systemd/system/choir-db.service").exists());
    assert!(!stage.path().join("usr/share/doc/choir").exists());
    assert!(!stage.path().join("usr/share/man/man1/choirctl.1").exists());
    assert!(!stage.path().join("usr/share/zsh/vendor-completions/_choirctl").exists());
}
