//! Pacing of choird's retry loops (gateway, embedding batcher, agent
//! restarts): how long to back off after repeated failures, and sleeping in a
//! way a stop request cuts short.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Backoff after `n` consecutive failures: 0.5 s doubling to 30 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis((500u64 << n.min(6)).min(30_000))
}

/// How long to wait before restarting an agent after its `crashes`-th crash
/// in a row (counted from 1): the first restart is immediate — one crash is
/// not a loop, and a user waits meanwhile — then 1 s doubling to `max`.
pub fn restart_delay(crashes: u32, max: Duration) -> Duration {
    match crashes {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(6)).min(max),
    }
}

/// Sleeps `d` in short slices, returning early once `stop` is set.
pub fn nap(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50).min(until.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(40), Duration::from_secs(30));
        let max = Duration::from_secs(60);
        let delays: Vec<u64> = (1..=9).map(|n| restart_delay(n, max).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 32, 60, 60]);
        let stop = AtomicBool::new(true);
        let t = Instant::now();
        nap(Duration::from_secs(10), &stop);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
