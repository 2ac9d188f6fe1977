//! What reaches the operator's terminal. Much of what choirctl prints comes
//! from agents (proposals, their reasons and diffs, events, answers, lane
//! names, errors), and an agent may be hostile: a string of its choosing must
//! not move the cursor, rewrite earlier lines, set the window title, hide text
//! with bidi overrides, or forge a line of choirctl's own output.
//!
//! **Invariant:** everything choirctl writes to a terminal goes through
//! [`clean`] (the `say!` macros do it); fields printed within a line go
//! through [`one_line`] too. Both are `choir_common::text`'s.

pub use choir_common::text::{clean, one_line};

/// `println!` through [`clean`].
#[macro_export]
macro_rules! say {
    () => { println!() };
    ($($arg:tt)*) => { println!("{}", $crate::term::clean(&format!($($arg)*))) };
}

/// `eprintln!` through [`clean`].
#[macro_export]
macro_rules! say_err {
    ($($arg:tt)*) => { eprintln!("{}", $crate::term::clean(&format!($($arg)*))) };
}

/// `print!` through [`clean`].
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => { print!("{}", $crate::term::clean(&format!($($arg)*))) };
}
