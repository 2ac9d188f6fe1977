//! The per-hop breakdown of the turn benchmarks: read the turn marks
//! (`choir_common::hop`) that choird's and the agent's processes logged,
//! cut each turn's window into steps between consecutive marks, and report
//! each step's p50 / p99.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::bench::pct;
use crate::harness::Choird;

/// The marks every turn passes between choird handing a message to the
/// agent and storing its reply (the agent's and the relay's), whichever
/// way the message came in.
pub const TURN: &[&str] = &[
    "poll.handout",
    "agent.message",
    "agent.request",
    "relay.in",
    "relay.upstream",
    "relay.answered",
    "relay.out",
    "agent.answer",
    "agent.reply",
    "agent.push",
    "reply.in",
    "reply.stored",
];

/// A path's marks: `before`, then [`TURN`], then `after`.
pub fn path(before: &[&'static str], after: &[&'static str]) -> Vec<&'static str> {
    before.iter().chain(TURN).chain(after).copied().collect()
}

/// Wall-clock microseconds (the marks' clock).
pub fn wall_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()
}

/// Every mark in choird's log and in the logs of `agents`, by time.
pub fn marks(choird: &Choird, agents: &[&str]) -> Vec<(u128, String)> {
    let mut out = Vec::new();
    let files = std::iter::once("choird.log".to_owned()).chain(agents.iter().map(|a| format!("{a}.log")));
    for file in files {
        let text = std::fs::read_to_string(choird.home.path().join("logs").join(file)).unwrap_or_default();
        out.extend(text.lines().filter_map(choir_common::hop::parse).map(|(n, us)| (us, n.to_owned())));
    }
    out.sort();
    out
}

/// p50 and p99 of each step between consecutive marks of `hops`, from each
/// turn's start to its end (`windows`, wall-clock µs); turns missing a mark
/// are counted and left out.
pub fn breakdown(hops: &[&str], windows: &[(u128, u128)], marks: &[(u128, String)]) {
    let mut steps: BTreeMap<usize, Vec<Duration>> = BTreeMap::new();
    let mut turns: Vec<Vec<Duration>> = Vec::new();
    let mut incomplete = 0;
    for &(start, end) in windows {
        let inside: Vec<&(u128, String)> = marks.iter().filter(|(t, _)| *t >= start && *t <= end).collect();
        let mut at = vec![start];
        for hop in hops {
            let after = *at.last().unwrap_or(&start);
            match inside.iter().find(|(t, n)| n == hop && *t >= after) {
                Some((t, _)) => at.push(*t),
                None => break,
            }
        }
        if at.len() != hops.len() + 1 {
            if incomplete == 0 {
                let seen: Vec<&str> = inside.iter().map(|(_, n)| n.as_str()).collect();
                crate::report!("  (a turn without every mark: it has {seen:?})");
            }
            incomplete += 1;
            continue;
        }
        at.push(end);
        let turn: Vec<Duration> =
            at.windows(2).map(|w| Duration::from_micros(w[1].saturating_sub(w[0]) as u64)).collect();
        for (i, d) in turn.iter().enumerate() {
            steps.entry(i).or_default().push(*d);
        }
        turns.push(turn);
    }
    let names: Vec<&str> = std::iter::once("bench: start").chain(hops.iter().copied()).chain(["bench: end"]).collect();
    crate::report!(
        "per hop over {} turns ({incomplete} without every mark left out): step p50 / p99 (ms)",
        windows.len()
    );
    let mut total = 0.0;
    for (i, mut d) in steps {
        let p50 = pct(&mut d, 0.5).as_secs_f64() * 1e3;
        total += p50;
        let p99 = pct(&mut d, 0.99).as_secs_f64() * 1e3;
        crate::report!("  {:>18} → {:<18} {:>7.3} / {:>7.3}", names[i], names[i + 1], p50, p99);
    }
    crate::report!("  sum of the p50s: {total:.3} ms");
    // Where the slowest turns lose their time: the p99 of a direction is
    // made of these turns, not of each hop's own p99.
    let index_of = |hop: &str| names.iter().position(|n| *n == hop);
    if let (Some(upstream), Some(answered)) = (index_of("relay.upstream"), index_of("relay.answered")) {
        slowest(&turns, &names, "in", 0..upstream);
        slowest(&turns, &names, "out", answered..names.len() - 1);
    }
}

/// The slowest 1 % of `turns` (at least five) by the sum of their steps in
/// `range`, and the mean of each of those steps over them.
fn slowest(turns: &[Vec<Duration>], names: &[&str], direction: &str, range: std::ops::Range<usize>) {
    let mut by_sum: Vec<(Duration, &Vec<Duration>)> =
        turns.iter().map(|t| (t[range.clone()].iter().sum(), t)).collect();
    by_sum.sort_by_key(|(sum, _)| std::cmp::Reverse(*sum));
    let n = (turns.len() / 100).max(5).min(turns.len());
    if n == 0 {
        return;
    }
    let worst = &by_sum[..n];
    let mean = |d: Duration| d.as_secs_f64() * 1e3 / n as f64;
    crate::report!(
        "  the slowest {n} turns {direction} (from {:.3} ms): mean per step (ms)",
        worst[n - 1].0.as_secs_f64() * 1e3
    );
    for i in range {
        let m = mean(worst.iter().map(|(_, t)| t[i]).sum());
        crate::report!("  {:>18} → {:<18} {:>7.3}", names[i], names[i + 1], m);
    }
}
