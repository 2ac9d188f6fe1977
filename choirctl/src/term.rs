//! What reaches the operator's terminal. Much of what choirctl prints comes
//! from agents (proposals, their reasons and diffs, events, answers, lane
//! names, errors), and an agent may be hostile: a string of its choosing must
//! not move the cursor, rewrite earlier lines, set the window title, hide text
//! with bidi overrides, or forge a line of choirctl's own output.
//!
//! **Invariant:** everything choirctl writes to a terminal goes through
//! [`clean`] (the `say!` macros do it); fields printed within a line go
//! through [`one_line`] too. Both are `choir_common::text`'s.
//! **Invariant:** standard output is written only through [`out`]: a reader
//! that went away (`choirctl status | head -3`) ends choirctl quietly with
//! status 0, as `ls | head` does from the shell's view, never a panic.

use std::io::Write;

pub use choir_common::text::{clean, one_line};

/// Writes `text` to standard output. A closed pipe ends the program at
/// once, quietly, with status 0 (what was wanted was read); another error
/// is said once on standard error, status 1.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("choirctl: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`clean`] and [`out`].
#[macro_export]
macro_rules! say {
    () => { $crate::term::out("\n") };
    ($($arg:tt)*) => { $crate::term::out(&format!("{}\n", $crate::term::clean(&format!($($arg)*)))) };
}

/// `eprintln!` through [`clean`].
#[macro_export]
macro_rules! say_err {
    ($($arg:tt)*) => { eprintln!("{}", $crate::term::clean(&format!($($arg)*))) };
}

/// `print!` through [`clean`] and [`out`].
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => { $crate::term::out(&$crate::term::clean(&format!($($arg)*))) };
}

/// The one way choirctl writes a moment: UTC, marked, to the second.
fn utc(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A moment as choirctl shows it everywhere: UTC, marked, to the second,
/// with its age (`2026-11-28 14:02:11 UTC, 8s ago`).
pub fn when(ts: jiff::Timestamp) -> String {
    let age = jiff::Timestamp::now().duration_since(ts).as_secs().max(0).unsigned_abs();
    format!("{}, {} ago", utc(ts), choir_common::text::human_duration(std::time::Duration::from_secs(age)))
}

/// A moment choird sent (RFC 3339, or PostgreSQL's `2026-11-28 15:01:53.2+00`)
/// as choirctl shows moments in tables: UTC, marked, to the second. Text that
/// is no moment is shown as it came (on one line).
pub fn moment(text: &str) -> String {
    let t = text.trim().replacen(' ', "T", 1);
    // PostgreSQL writes a whole-hour offset as `+00`; RFC 3339 wants `+00:00`.
    let t = match t.rfind(['+', '-']) {
        Some(i) if i > 10 && t.len() - i == 3 => format!("{t}:00"),
        _ => t,
    };
    match t.parse::<jiff::Timestamp>() {
        Ok(ts) => utc(ts),
        Err(_) => one_line(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_from_choird_read_one_way() {
        for given in [
            "2026-11-28T15:01:53.288+00",
            "2026-11-28 15:01:53+00",
            "2026-11-28T16:01:53.288+01:00",
            "2026-11-28T15:01:53Z",
        ] {
            assert_eq!(moment(given), "2026-11-28 15:01:53 UTC", "{given}");
        }
        assert_eq!(moment("soon"), "soon");
    }
}
