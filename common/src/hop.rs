//! Turn tracing for the per-hop breakdown of `bench-turns`: each
//! process marks where a turn passes (`admin.chat`, `relay.in`, …) as one
//! `log` record at trace level under the target `choir::hop`, holding the
//! wall-clock time in microseconds (one clock for choird and its agents on
//! one host, so marks of both compare).
//!
//! **Invariant:** off unless `RUST_LOG` enables `choir::hop=trace`; then a
//! mark costs one relaxed atomic load and a comparison (the `log` crate's
//! level check) and nothing else. A mark carries only its fixed name — no
//! message text, no id a client chose.

use std::time::{SystemTime, UNIX_EPOCH};

/// The target the marks are logged under.
pub const TARGET: &str = "choir::hop";

/// Marks that a turn passed the point `name` (a fixed, dotted name).
pub fn mark(name: &'static str) {
    if log::log_enabled!(target: TARGET, log::Level::Trace) {
        let us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
        log::trace!(target: TARGET, "hop {name} {us}");
    }
}

/// Parses a mark out of a log line (whatever the logger put around it):
/// the name and the time in microseconds since the epoch.
pub fn parse(line: &str) -> Option<(&str, u128)> {
    let rest = &line[line.find("hop ")? + 4..];
    let mut words = rest.split_whitespace();
    let name = words.next()?;
    let us = words.next()?.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok()?;
    Some((name, us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_parse_out_of_either_processes_log_lines() {
        assert_eq!(
            parse("[1700000000000 TRACE choir::hop] hop agent.request 1700000000000123"),
            Some(("agent.request", 1_700_000_000_000_123))
        );
        assert_eq!(
            parse(r#"{"ts":"x","level":"TRACE","component":"choir::hop","msg":"hop relay.in 42"}"#),
            Some(("relay.in", 42))
        );
        assert_eq!(parse("no mark here"), None);
        assert_eq!(parse("hop relay.in soon"), None);
    }
}
