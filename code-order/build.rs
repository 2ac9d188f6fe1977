//! Build script of `choird` and `choir-agent` (both name this file as `build`
//! in their Cargo.toml): a release build on x86-64 Linux links the binary
//! with its functions in the order `code-order/<package>.order` lists them
//! (docs/benchmarks.md).
//!
//! Why: a process's resident memory counts every page of its binary mapped
//! in, and the kernel maps the 64 KiB around each page of code a process
//! runs. The functions steady turns run were spread over the whole text, so
//! nearly all of it stayed resident. Listed first, they sit together: what
//! stays resident is about their size. The list is written by
//! `make code-order` (`scripts/code-order.sh`) from a profiled `bench-soak`.
//!
//! Invariants: the order changes where functions lie, never what the binary
//! does; names the binary no longer has (a changed function, an updated
//! crate or toolchain: symbol hashes follow `-C metadata`) are skipped by
//! the linker without a word, so a stale list costs resident memory, never
//! a build. The option is rustc's bundled `rust-lld`'s, the default linker
//! of `x86_64-unknown-linux-gnu` since Rust 1.90 (the workspace's
//! `rust-version`), given on that target only; `CHOIR_CODE_ORDER=off` leaves
//! it out (a linker configured otherwise).

// A build script's inputs are its environment.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let package = std::env::var("CARGO_PKG_NAME").unwrap_or_default();
    let dir = manifest.join("..").join("code-order");
    let order = dir.join(format!("{package}.order"));
    // The directory, which exists: a missing file watched would rerun this
    // script (and relink) on every build.
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-env-changed=CHOIR_CODE_ORDER");
    let is = |var: &str, value: &str| std::env::var(var).as_deref() == Ok(value);
    let wanted = is("PROFILE", "release")
        && is("CARGO_CFG_TARGET_OS", "linux")
        && is("CARGO_CFG_TARGET_ARCH", "x86_64")
        && is("CARGO_CFG_TARGET_ENV", "gnu")
        && !is("CHOIR_CODE_ORDER", "off");
    if wanted && order.is_file() {
        // `-Xlinker` pairs, not `-Wl,`: a comma in the checkout's path stays
        // part of the path.
        for arg in ["--no-warn-symbol-ordering", "--symbol-ordering-file"] {
            println!("cargo:rustc-link-arg-bins=-Xlinker");
            println!("cargo:rustc-link-arg-bins={arg}");
        }
        println!("cargo:rustc-link-arg-bins=-Xlinker");
        println!("cargo:rustc-link-arg-bins={}", order.display());
    }
}
