//! Tidy checks over the source tree: every Rust file says what it is in its
//! first line, and no test is switched off.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && name != "target" && !name.starts_with('.') {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_a_doc_line_and_nothing_is_ignored() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for dir in ["common", "choird", "choir-agent", "choirctl", "tests"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let (ignore, should_panic) = (["#[", "ignore]"].concat(), ["#[", "should_panic"].concat());
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.starts_with("//!"), "{} must start with a //! line saying what it is", f.display());
        assert!(!text.contains(&ignore), "{} switches a test off", f.display());
        assert!(!text.contains(&should_panic), "{} uses should_panic; assert on the error instead", f.display());
    }
}

#[test]
fn the_systemd_unit_bounds_choird() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let unit = std::fs::read_to_string(root.join("packaging/choird.service")).unwrap();
    // KillMode=mixed: choird alone gets SIGTERM and stops what it started in
    // order (the harness stops it the same way); without it, its database
    // died under its last audit records.
    // Type=notify: started means answering. UMask: what choird makes is
    // private. The docker group for the unit's choird alone.
    for key in [
        "LimitNOFILE=",
        "TasksMax=",
        "MemoryMax=",
        "NoNewPrivileges=yes",
        "KillMode=mixed",
        "ProtectKernelModules=yes",
        "Type=notify",
        "UMask=0077",
        "SupplementaryGroups=docker",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(key)), "packaging/choird.service has no {key}");
    }
    // The database's own unit: choird waits for it, it runs as choird's
    // user on choird's home, and SIGTERM reaches `choird cluster` alone, so
    // PostgreSQL stops in order.
    assert!(
        unit.lines().any(|l| l.starts_with("After=") && l.contains("choir-db.service")),
        "choird starts after choir-db"
    );
    let db = std::fs::read_to_string(root.join("packaging/choir-db.service")).unwrap();
    for key in [
        "Type=notify",
        "KillMode=mixed",
        "User=choir",
        "Environment=CHOIR_HOME=/var/lib/choir",
        "UMask=0077",
        "NoNewPrivileges=yes",
    ] {
        assert!(db.lines().any(|l| l.starts_with(key)), "packaging/choir-db.service has no {key}");
    }
}

/// choirctl is a client: it links none of the daemon (its offline work is
/// `choird doctor|restore`, run as a process), so building it builds none
/// of choird's dependencies. `cargo tree -p choirctl -e normal` shows the
/// same; this reads the manifest, which is where a dependency would come
/// back.
#[test]
fn choirctl_depends_on_no_daemon_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("choirctl/Cargo.toml")).unwrap();
    let deps: Vec<&str> = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]") || section.starts_with("build-dependencies]"))
        .flat_map(|section| section.lines().skip(1))
        .filter_map(|l| l.split(['=', '.']).next().map(str::trim))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(!deps.is_empty(), "no dependencies read from choirctl/Cargo.toml: the check would pass blindly");
    for daemon in ["choird", "choir-agent", "postgres", "lettre", "imap", "frankenstein"] {
        assert!(!deps.contains(&daemon), "choirctl depends on {daemon}: {deps:?}");
    }
}
