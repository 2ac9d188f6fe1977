//! Pacing of choird's retry loops (gateway, embedding batcher): how long to
//! back off after repeated failures, and sleeping in a way a stop request
//! cuts short.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Backoff after `n` consecutive failures: 0.5 s doubling to 30 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis((500u64 << n.min(6)).min(30_000))
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
        let stop = AtomicBool::new(true);
        let t = Instant::now();
        nap(Duration::from_secs(10), &stop);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
