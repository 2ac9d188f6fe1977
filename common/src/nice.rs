//! Background work below the person waiting: core jobs' threads in the agent,
//! and choird's connection threads relaying their model calls, run at a
//! higher nice value than the edge, so when the CPU is short the edge's turn
//! goes first. An unprivileged thread may raise its own nice value but never
//! lower it again: a thread lowered stays lowered until it ends.

use std::cell::Cell;

/// The nice value background threads run at (the edge and link threads keep
/// the process's own).
pub const BACKGROUND_NICE: i32 = 10;

thread_local! {
    static LOWERED: Cell<bool> = const { Cell::new(false) };
}

/// Puts the calling thread (only it, not its process) at
/// [`BACKGROUND_NICE`]; once per thread, later calls do nothing. A failure
/// is logged at debug level and changes nothing (the work runs, unlowered).
pub fn lower_this_thread() {
    if LOWERED.with(|l| l.replace(true)) {
        return;
    }
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), BACKGROUND_NICE) {
        log::debug!("cannot lower this thread's priority ({e})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's nice value.
    fn this_thread() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0)
    }

    #[test]
    fn only_the_calling_thread_is_lowered_and_only_once() {
        let before = this_thread();
        let lowered = std::thread::spawn(|| {
            lower_this_thread();
            lower_this_thread();
            this_thread()
        })
        .join()
        .unwrap();
        // An absolute value: a process already below it stays where it is.
        assert_eq!(lowered, before.max(BACKGROUND_NICE));
        assert_eq!(this_thread(), before, "the caller's neighbours keep their priority");
    }
}
