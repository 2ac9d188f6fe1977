//! No process a tool starts outlives its call.
//!
//! At start the agent makes itself a *child subreaper*
//! (`PR_SET_CHILD_SUBREAPER`): a process whose parent exits — a command run
//! in the background with `setsid`, a double fork, a daemon — is reparented
//! to the agent instead of to init. Every child the agent starts itself is
//! registered here ([`spawn`]); any other child of the agent is a *stray*:
//! something a tool left behind. Strays (and everything below them) are
//! stopped and killed when a call's child is reaped ([`sweep`], called by
//! `spawn::wait_until` before the call's result is committed and its locks
//! released), and by a background sweep otherwise: every [`SWEEP_EVERY`]
//! while tools start processes, the pause doubling up to [`SWEEP_IDLE`]
//! while sweeps find nothing and no tool starts one (an idle agent wakes
//! for it twice a minute instead of four times a second: what a call left
//! behind is found by the call's own sweep and the fast ones after it, and
//! only a tool starts processes); starting a process brings the pace back
//! at once.
//!
//! **Invariant:** when a tool call's result is committed, no process it
//! started is alive: its own process group was killed, and whatever left the
//! group was reparented to the agent and swept.
//! **Invariant:** a registered child is never killed by a sweep: it is
//! registered under the same lock the sweep holds, before the sweep can see
//! it.

use std::collections::BTreeSet;
use std::process::Child;
use std::time::Duration;

use parking_lot::Mutex;

/// How often strays are looked for between calls while tools run.
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// The longest pause between background sweeps, reached while idle.
pub const SWEEP_IDLE: Duration = Duration::from_secs(32);

/// Tells the background sweep a process was started (its pace goes back
/// to [`SWEEP_EVERY`]).
static STARTED: std::sync::OnceLock<crossbeam_channel::Sender<()>> = std::sync::OnceLock::new();

/// Children the agent started and has not reaped yet.
static KNOWN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());
/// Set by [`init`]: only a subreaper sweeps (a test process sharing this
/// code never kills children it did not register).
static ACTIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Becomes the subreaper of everything below this process and starts the
/// background sweep (once). Outside the agent binary (unit tests) only the
/// registry is used.
pub fn init() -> std::io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(std::io::Error::from)?;
    ACTIVE.store(true, std::sync::atomic::Ordering::SeqCst);
    let (tx, started) = crossbeam_channel::bounded(1);
    let _ = STARTED.set(tx);
    std::thread::Builder::new().name("reaper".into()).spawn(move || {
        let mut pause = SWEEP_EVERY;
        loop {
            let poked = started.recv_timeout(pause).is_ok();
            pause = next_pause(pause, poked || sweep() > 0);
        }
    })?;
    Ok(())
}

/// The pause before the next background sweep: [`SWEEP_EVERY`] after
/// activity (a process started, a stray killed), else twice the last, at
/// most [`SWEEP_IDLE`].
fn next_pause(last: Duration, active: bool) -> Duration {
    if active {
        SWEEP_EVERY
    } else {
        (last * 2).min(SWEEP_IDLE)
    }
}

/// Starts a child through `start` and registers it atomically with respect
/// to [`sweep`].
pub fn spawn(start: impl FnOnce() -> std::io::Result<Child>) -> std::io::Result<Child> {
    let mut known = KNOWN.lock();
    let child = start()?;
    known.insert(child.id() as i32);
    if let Some(tx) = STARTED.get() {
        let _ = tx.try_send(()); // a poke already waiting is enough
    }
    Ok(child)
}

/// Forgets a child that has been reaped (its pid may be reused from now on).
pub fn forget(child: &Child) {
    KNOWN.lock().remove(&(child.id() as i32));
}

/// Kills every stray child of the agent and everything below it, and reaps
/// them. Returns how many were killed.
pub fn sweep() -> usize {
    if !ACTIVE.load(std::sync::atomic::Ordering::SeqCst) {
        return 0;
    }
    let me = std::process::id() as i32;
    let mut killed = 0;
    // Killing a stray may reparent its children to us: look again until none.
    for _ in 0..64 {
        let known = KNOWN.lock();
        let strays: Vec<i32> =
            choir_common::proc_tree::children_of(me).into_iter().filter(|p| !known.contains(p)).collect();
        if strays.is_empty() {
            break;
        }
        killed += choir_common::proc_tree::kill_trees(&strays);
        drop(known);
        for p in strays {
            if let Some(pid) = rustix::process::Pid::from_raw(p) {
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            }
        }
    }
    if killed > 0 {
        log::warn!("killed {killed} process(es) a tool call left behind (no process outlives its call)");
    }
    killed
}

/// At exit: kills every child, registered or not, and reaps them.
pub fn kill_all() {
    if !ACTIVE.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let me = std::process::id() as i32;
    let children = choir_common::proc_tree::children_of(me);
    if children.is_empty() {
        return;
    }
    choir_common::proc_tree::kill_trees(&children);
    for p in children {
        if let Some(pid) = rustix::process::Pid::from_raw(p) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
        }
    }
    KNOWN.lock().clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_sweep_slows_while_idle_and_speeds_up_on_activity() {
        let mut pause = SWEEP_EVERY;
        let mut seen = Vec::new();
        for _ in 0..8 {
            pause = next_pause(pause, false);
            seen.push(pause.as_millis());
        }
        assert_eq!(seen, [500, 1000, 2000, 4000, 8000, 16000, 32000, 32000], "doubling to SWEEP_IDLE, no further");
        assert_eq!(next_pause(SWEEP_IDLE, true), SWEEP_EVERY, "a process started or a stray killed: fast again");
    }
}
