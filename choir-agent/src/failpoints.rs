//! Crash injection for the durability tests. Built only with the `failpoints`
//! feature (the test build enables it); otherwise [`hit`] compiles to nothing.
//!
//! The agent reads the name of one failpoint from `<state dir>/failpoint` at
//! start and deletes the file, so the restarted agent runs normally. When
//! execution reaches a [`hit`] point the process kills itself with SIGKILL —
//! no destructors, no flushing — like `kill -9` at that exact instant; at a
//! [`hang`] point the thread blocks for good, like a deadlock.

#[cfg(feature = "failpoints")]
static ACTIVE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Arms the failpoint named in `dir/failpoint`, if any (and removes the file).
#[cfg(feature = "failpoints")]
pub fn arm_from(dir: &std::path::Path) {
    let path = dir.join("failpoint");
    let name = std::fs::read_to_string(&path).ok().map(|s| s.trim().to_owned());
    if name.is_some() {
        let _ = std::fs::remove_file(&path);
        log::warn!("failpoint armed: {name:?}");
    }
    let _ = ACTIVE.set(name);
}

/// Without the feature there is nothing to arm.
#[cfg(not(feature = "failpoints"))]
pub fn arm_from(_dir: &std::path::Path) {}

/// Kills the process here if this failpoint is armed.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    if ACTIVE.get().and_then(|a| a.as_deref()) == Some(name) {
        log::warn!("failpoint {name}: SIGKILL");
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}

/// Without the feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Blocks the calling thread for good here if this failpoint is armed: a
/// hung agent, as a deadlock would leave it (the liveness tests).
#[cfg(feature = "failpoints")]
pub fn hang(name: &str) {
    if ACTIVE.get().and_then(|a| a.as_deref()) == Some(name) {
        log::warn!("failpoint {name}: this thread hangs");
        loop {
            std::thread::park();
        }
    }
}

/// Without the feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hang(_name: &str) {}
