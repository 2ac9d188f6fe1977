//! A job's spec checked, and its times: when it fires next and which
//! firings fell between two looks. The checks here need nothing but the
//! spec; those against the agent (its users, tools and skills) are the
//! daemon's (`daemon/schedule.rs`).

use std::time::Duration;

use choir_common::rpc::CoreBudget;
use choir_common::schedule::{JobBudget, JobSpec, Precondition};
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

/// Shortest interval.
pub const MIN_EVERY_S: u64 = 60;
/// Longest interval (a year).
pub const MAX_EVERY_S: u64 = 366 * 24 * 3600;
/// Longest prompt, in characters.
pub const MAX_PROMPT: usize = 8000;
/// Longest cron expression, in bytes.
pub const MAX_CRON: usize = 200;
/// Most tools a job's allowlist may name.
pub const MAX_TOOLS: usize = 64;
/// Missed firings of a cron job counted one by one after a long outage
/// (the count is "at least" beyond it).
pub const MAX_COUNTED: u64 = 10_000;
/// Highest breaker threshold.
pub const MAX_BREAKER: u32 = 100;
/// Budget ceilings a job may ask for.
pub const MAX_STEPS: u64 = 1000;
/// See [`MAX_STEPS`].
pub const MAX_TOKENS: u64 = 10_000_000;
/// See [`MAX_STEPS`].
pub const MAX_WALL_S: u64 = 24 * 3600;

/// When a job fires.
#[derive(Debug, Clone)]
pub enum When {
    /// A cron expression read in a time zone.
    Cron(Box<Cron>, TimeZone),
    /// Every so many seconds from the job's first due time.
    Every(u64),
}

/// A job name: `[A-Za-z0-9_.-]{1,64}` (it names a core job and a ledger row).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "job name {:?} is not allowed: use 1 to 64 of A-Z a-z 0-9 _ . -",
            choir_common::text::clipped(name, 80)
        ))
    }
}

/// Parses a cron expression of 5 fields (minute hour day month weekday) or
/// 6 (seconds first) in time zone `tz` (IANA name), and refuses one that
/// never fires or fires more often than once a minute.
pub fn parse_cron(expr: &str, tz: &str) -> Result<When, String> {
    let when = read_cron(expr, tz)?;
    let shown = choir_common::text::clipped(expr, 120);
    // An expression that never matches (31 February) is refused now, not at its first look.
    let Some(first) = when.next_after(Timestamp::UNIX_EPOCH, None) else {
        return Err(format!("cron expression {shown:?} never fires"));
    };
    // Nor more often than once a minute (a per-second job is a loop, not a schedule).
    let mut t = first;
    for _ in 0..120 {
        let Some(next) = when.next_after(t, None) else { break };
        if next.as_second() - t.as_second() < MIN_EVERY_S as i64 {
            return Err(format!("cron expression {shown:?} fires more often than once a minute"));
        }
        t = next;
    }
    Ok(when)
}

/// Reads a cron expression and its zone, without the checks of
/// [`parse_cron`] (for specs already checked when stored).
fn read_cron(expr: &str, tz: &str) -> Result<When, String> {
    let shown = choir_common::text::clipped(expr, 120);
    let fields = expr.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "cron expression {shown:?} has {fields} fields; use 5 (minute hour day-of-month month day-of-week) or 6 \
             (seconds first)"
        ));
    }
    out_of_range(expr).map_or(Ok(()), Err)?;
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| format!("cron expression {shown:?} is not valid: {e}"))?;
    let zone = TimeZone::get(tz).map_err(|_| {
        format!(
            "unknown time zone {:?}: use an IANA name such as UTC or Europe/Berlin",
            choir_common::text::clipped(tz, 80)
        )
    })?;
    Ok(When::Cron(Box::new(cron), zone))
}

/// The first number of a cron expression outside its field's range, named
/// with the field (`hour 25 is out of range (0-23)`); none when every number
/// fits (names, `*`, `?`, `L` and the like are left to the parser).
fn out_of_range(expr: &str) -> Option<String> {
    let shown = choir_common::text::clipped(expr, 120);
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let names: &[(&str, u32, u32)] =
        &[("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7)];
    let with_seconds: Vec<(&str, u32, u32)> = if fields.len() == 6 {
        std::iter::once(("second", 0, 59)).chain(names.iter().copied()).collect()
    } else {
        names.to_vec()
    };
    for (field, (name, lo, hi)) in fields.iter().zip(with_seconds) {
        for part in field.split(',') {
            let (range, step) = part.split_once('/').unwrap_or((part, ""));
            for n in range.split('-').filter_map(|x| x.parse::<u32>().ok()) {
                if n < lo || n > hi {
                    return Some(format!("cron expression {shown:?}: {name} {n} is out of range ({lo}-{hi})"));
                }
            }
            if step == "0" {
                return Some(format!("cron expression {shown:?}: a {name} step of 0 never moves"));
            }
        }
    }
    None
}

/// Checks everything in `spec` that needs no knowledge of the agent;
/// returns when it fires.
pub fn check(spec: &JobSpec) -> Result<When, String> {
    check_name(&spec.name)?;
    if spec.cron.as_ref().is_some_and(|c| c.len() > MAX_CRON) || spec.tz.as_ref().is_some_and(|t| t.len() > 64) {
        return Err(format!("a cron expression is at most {MAX_CRON} bytes and a time zone name at most 64"));
    }
    let when = match (&spec.cron, spec.every_s) {
        (Some(expr), None) => parse_cron(expr, spec.tz.as_deref().unwrap_or("UTC"))?,
        (None, Some(s)) => {
            if spec.tz.is_some() {
                return Err("tz applies to a cron expression, not to every_s".into());
            }
            if !(MIN_EVERY_S..=MAX_EVERY_S).contains(&s) {
                return Err(format!("every_s must be between {MIN_EVERY_S} and {MAX_EVERY_S} seconds, not {s}"));
            }
            When::Every(s)
        }
        (Some(_), Some(_)) => return Err("give either cron or every_s, not both".into()),
        (None, None) => return Err("a job needs cron (with tz) or every_s".into()),
    };
    let prompt = spec.prompt.trim();
    if prompt.is_empty() {
        return Err("a job needs a prompt (what it is to do)".into());
    }
    if spec.prompt.chars().count() > MAX_PROMPT || spec.prompt.contains('\0') {
        return Err(format!("the prompt must be at most {MAX_PROMPT} characters of text"));
    }
    if spec.skill.is_none() && !spec.input.is_null() {
        return Err("input is the input of a skill; name the skill".into());
    }
    if let Some(tools) = &spec.allowed_tools {
        if tools.len() > MAX_TOOLS {
            return Err(format!("allowed_tools names {} tools; at most {MAX_TOOLS}", tools.len()));
        }
        for t in tools {
            choir_common::ids::validate_tool_name(t).map_err(|e| format!("allowed_tools: {e}"))?;
            if choir_common::tool_names::EDGE_ONLY_TOOLS.contains(&t.as_str()) {
                return Err(format!("allowed_tools: {t} is for the edge lane only; a scheduled job cannot use it"));
            }
        }
    }
    let b = &spec.budget;
    for (what, v, max) in
        [("steps", b.steps, MAX_STEPS), ("tokens", b.tokens, MAX_TOKENS), ("wall_s", b.wall_s, MAX_WALL_S)]
    {
        if let Some(v) = v {
            if v == 0 || v > max {
                return Err(format!("budget.{what} must be between 1 and {max}, not {v}"));
            }
        }
    }
    if !(1..=MAX_BREAKER).contains(&spec.breaker) {
        return Err(format!("breaker must be between 1 and {MAX_BREAKER} failures in a row, not {}", spec.breaker));
    }
    if let Some(to) = &spec.deliver_to {
        if crate::conversations::telegram_chat(to).is_none() {
            return Err(format!(
                "deliver_to {:?} is not a Telegram conversation (tg:<bot>:<user>); leave it out to keep results in the log",
                choir_common::text::clipped(to, 80)
            ));
        }
    }
    match &spec.precondition {
        Some(Precondition::FileChanged { path }) => {
            let p = std::path::Path::new(path);
            let bad = path.is_empty()
                || path.len() > 1024
                || p.is_absolute()
                || p.components().any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
            if bad {
                return Err(format!(
                    "precondition path {:?} must be relative to the workspace, without ..",
                    choir_common::text::clipped(path, 80)
                ));
            }
        }
        Some(Precondition::UrlChanged { url }) => {
            crate::egress::parse_web_url(url).map_err(|e| format!("precondition url: {}", e.0))?;
        }
        Some(Precondition::NewMail | Precondition::MemoryDue) | None => {}
    }
    Ok(when)
}

/// The budget a stored job's firing runs with: each of its own limits when
/// it is within what [`check`] allows, the agent's core budget otherwise.
/// A spec edited in the database past the bounds gets the core budget —
/// the same rule the scheduler's overrun sweep applies to `wall_s`
/// (`store::schedule`), so the agent and choird agree on the wall time.
pub fn firing_budget(b: &JobBudget, core: &CoreBudget) -> CoreBudget {
    let within = |v: Option<u64>, max: u64| v.filter(|v| (1..=max).contains(v));
    CoreBudget {
        steps: within(b.steps, MAX_STEPS).unwrap_or(core.steps),
        tokens: within(b.tokens, MAX_TOKENS).unwrap_or(core.tokens),
        wall_s: within(b.wall_s, MAX_WALL_S).unwrap_or(core.wall_s),
    }
}

impl When {
    /// When a stored (already checked) spec fires: parsed only, so the
    /// scheduler's claim does not repeat the checks of [`check`].
    pub fn of(spec: &JobSpec) -> Result<When, String> {
        match (&spec.cron, spec.every_s) {
            (Some(expr), _) => read_cron(expr, spec.tz.as_deref().unwrap_or("UTC")),
            (None, Some(s)) if s > 0 => Ok(When::Every(s)),
            _ => Err("the job has neither cron nor every_s".into()),
        }
    }

    /// The first firing strictly after `t`; `anchor` is an interval job's
    /// current due time (its firings are `anchor + k × interval`). `None`
    /// when a cron expression has no later match.
    pub fn next_after(&self, t: Timestamp, anchor: Option<Timestamp>) -> Option<Timestamp> {
        match self {
            When::Cron(cron, tz) => {
                let z = t.to_zoned(tz.clone());
                cron.find_next_occurrence(&z, false).ok().map(|n: Zoned| n.timestamp())
            }
            When::Every(s) => {
                let step = *s as i64;
                let Some(a) = anchor else {
                    return t.checked_add(jiff::SignedDuration::from_secs(step)).ok();
                };
                let gap = t.as_second() - a.as_second();
                let k = if gap < 0 { 0 } else { gap / step + 1 };
                a.checked_add(jiff::SignedDuration::from_secs(k * step)).ok()
            }
        }
    }

    /// The last firing at or before `now` (`anchor`: an interval job's due
    /// time at or before `now`).
    pub fn latest(&self, now: Timestamp, anchor: Timestamp) -> Option<Timestamp> {
        match self {
            When::Cron(cron, tz) => {
                let z = now.to_zoned(tz.clone());
                cron.find_previous_occurrence(&z, true).ok().map(|p: Zoned| p.timestamp())
            }
            When::Every(s) => {
                let step = *s as i64;
                let gap = now.as_second() - anchor.as_second();
                if gap < 0 {
                    return None;
                }
                anchor.checked_add(jiff::SignedDuration::from_secs(gap / step * step)).ok()
            }
        }
    }

    /// The firings from `first` (a due time) up to and including `now`, at
    /// most `cap` of them, and how many more there were.
    pub fn due(&self, first: Timestamp, now: Timestamp, cap: usize) -> (Vec<Timestamp>, u64) {
        let mut out = Vec::new();
        let mut more = 0u64;
        let mut t = first;
        while t <= now {
            if out.len() < cap {
                out.push(t);
            } else if let When::Every(s) = self {
                // The rest counted, not walked.
                more = ((now.as_second() - t.as_second()) / *s as i64 + 1) as u64;
                break;
            } else {
                more += 1;
                // Counted, not walked, past this: "at least" is enough.
                if more >= MAX_COUNTED {
                    break;
                }
            }
            match self.next_after(t, Some(t)) {
                Some(n) => t = n,
                None => break,
            }
        }
        (out, more)
    }

    /// How long until `t` from `now` (zero if past).
    pub fn until(now: Timestamp, t: Timestamp) -> Duration {
        let ms = t.as_millisecond() - now.as_millisecond();
        Duration::from_millis(ms.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_number_out_of_its_fields_range_is_named_with_the_field() {
        let e = parse_cron("0 25 * * *", "UTC").map(|_| ()).unwrap_err();
        assert!(e.contains("hour 25 is out of range (0-23)"), "{e}");
        let e = parse_cron("0 0 8 * 1-9", "UTC").map(|_| ()).unwrap_err();
        assert!(e.contains("day of week 9 is out of range"), "{e}");
        let e = parse_cron("61 0 8 * * *", "UTC").map(|_| ()).unwrap_err();
        assert!(e.contains("second 61"), "{e}");
        assert!(parse_cron("*/15 8-17 * * mon-fri", "UTC").is_ok());
        // A hostile expression is quoted cut short, control characters escaped.
        let long = format!("0 25 * * 1{}\u{1b}[2J", ",1".repeat(5000));
        let e = parse_cron(&long, "UTC").map(|_| ()).unwrap_err();
        assert!(e.contains("hour 25") && e.len() < 400 && !e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn a_stored_budget_past_the_bounds_runs_on_the_core_budget() {
        let core = CoreBudget { steps: 50, tokens: 100_000, wall_s: 600 };
        let own = JobBudget { steps: Some(10), tokens: Some(2_000), wall_s: Some(60) };
        let b = firing_budget(&own, &core);
        assert_eq!((b.steps, b.tokens, b.wall_s), (10, 2_000, 60));
        // Edited in the database: zero, or past what `check` allows.
        let edited = JobBudget { steps: Some(0), tokens: Some(u64::MAX), wall_s: Some(2_000_000_000) };
        let b = firing_budget(&edited, &core);
        assert_eq!((b.steps, b.tokens, b.wall_s), (50, 100_000, 600));
        let b = firing_budget(&JobBudget::default(), &core);
        assert_eq!((b.steps, b.tokens, b.wall_s), (50, 100_000, 600));
    }

    fn spec(v: serde_json::Value) -> Result<JobSpec, serde_json::Error> {
        serde_json::from_value(v)
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn bad_cron_expressions_and_zones_are_clear_errors() {
        let e = check(&spec(json!({"name": "a", "cron": "61 * * * *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("cron expression \"61 * * * *\": minute 61 is out of range (0-59)"), "{e}");
        let e = check(&spec(json!({"name": "a", "cron": "* * * foo *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("is not valid"), "what the range check leaves, the parser refuses: {e}");
        let e = check(&spec(json!({"name": "a", "cron": "* * *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("has 3 fields"), "{e}");
        let e = check(&spec(json!({"name": "a", "cron": "0 8 * * 1-5", "tz": "Mars/Olympus", "prompt": "p"})).unwrap())
            .unwrap_err();
        assert!(e.contains("unknown time zone \"Mars/Olympus\""), "{e}");
        let e = check(&spec(json!({"name": "a", "cron": "0 0 31 2 *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("never fires"), "{e}");
        let e = check(&spec(json!({"name": "a", "cron": "*/10 * * * * *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("more often than once a minute"), "{e}");
        let e = check(&spec(json!({"name": "a", "cron": "0,1 * * * * *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("more often than once a minute"), "{e}");
        let e = check(&spec(json!({"name": "a", "every_s": 5, "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("every_s must be between 60"), "{e}");
        let e = check(&spec(json!({"name": "a b", "every_s": 60, "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("job name"), "{e}");
        let e =
            check(&spec(json!({"name": "a", "every_s": 60, "cron": "* * * * *", "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = check(
            &spec(json!({"name": "a", "every_s": 60, "prompt": "p", "precondition": {"kind": "file_changed", "path": "../x"}}))
                .unwrap(),
        )
        .unwrap_err();
        assert!(e.contains("without .."), "{e}");
        let e = check(
            &spec(json!({"name": "a", "every_s": 60, "prompt": "p", "allowed_tools": ["choir.core.start"]})).unwrap(),
        )
        .unwrap_err();
        assert!(e.contains("edge lane only"), "{e}");
        assert!(spec(json!({"name": "a", "every_s": 60, "prompt": "p", "colour": "red"})).is_err());
    }

    #[test]
    fn hostile_specs_are_refused_saying_why() {
        let every = |extra: serde_json::Value| {
            let mut v = json!({"name": "a", "every_s": 60, "prompt": "p"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            check(&spec(v).unwrap()).unwrap_err()
        };
        assert!(every(json!({"prompt": "x".repeat(MAX_PROMPT + 1)})).contains("at most 8000 characters"));
        assert!(every(json!({"prompt": "a\u{0}b"})).contains("at most 8000 characters of text"));
        assert!(every(json!({"prompt": "   "})).contains("needs a prompt"));
        let tools: Vec<String> = (0..=MAX_TOOLS).map(|i| format!("t.x{i}")).collect();
        assert!(every(json!({"allowed_tools": tools})).contains("at most 64"));
        assert!(every(json!({"allowed_tools": ["bad name\n"]})).contains("allowed_tools"));
        assert!(every(json!({"budget": {"steps": 0}})).contains("budget.steps must be between 1"));
        assert!(every(json!({"budget": {"tokens": 10_000_001u64}})).contains("budget.tokens"));
        assert!(every(json!({"breaker": 0})).contains("breaker must be between 1"));
        assert!(every(json!({"input": {"x": 1}})).contains("name the skill"));
        assert!(every(json!({"precondition": {"kind": "url_changed", "url": "file:///etc/passwd"}}))
            .contains("precondition url"));
        assert!(every(json!({"precondition": {"kind": "file_changed", "path": "/etc"}}))
            .contains("relative to the workspace"));
        assert!(every(json!({"deliver_to": "tg:a:\u{1b}[2J"})).contains("not a Telegram conversation"));
        let e = check(&spec(json!({"name": "a\u{1b}[31m\n", "every_s": 60, "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("job name") && !e.contains('\u{1b}'), "{e}");
        let long = format!("{} * * * *", "1,".repeat(200));
        let e = check(&spec(json!({"name": "a", "cron": long, "prompt": "p"})).unwrap()).unwrap_err();
        assert!(e.contains("at most 200 bytes"), "{e}");
        let e = check(
            &spec(json!({"name": "a", "cron": "0 8 * * *", "tz": "../../etc/localtime", "prompt": "p"})).unwrap(),
        )
        .unwrap_err();
        assert!(e.contains("unknown time zone"), "{e}");
    }

    #[test]
    fn cron_fires_in_its_time_zone() {
        let w =
            check(&spec(json!({"name": "a", "cron": "0 8 * * 1-5", "tz": "Europe/Berlin", "prompt": "p"})).unwrap())
                .unwrap();
        // Friday 2026-01-02 10:00 UTC → Monday 2026-01-05 08:00 Berlin = 07:00 UTC.
        assert_eq!(w.next_after(ts("2026-01-02T10:00:00Z"), None), Some(ts("2026-01-05T07:00:00Z")));
        let six = parse_cron("30 * * * * *", "UTC").unwrap();
        assert!(parse_cron("0 */15 9-17 * * 1-5", "UTC").is_ok());
        assert_eq!(six.next_after(ts("2026-01-02T10:00:00Z"), None), Some(ts("2026-01-02T10:00:30Z")));
    }

    #[test]
    fn firings_between_two_looks_are_listed_once_and_capped() {
        let w = parse_cron("* * * * *", "UTC").unwrap();
        let (due, more) = w.due(ts("2026-01-01T00:01:00Z"), ts("2026-01-01T00:03:30Z"), 10);
        assert_eq!(due, [ts("2026-01-01T00:01:00Z"), ts("2026-01-01T00:02:00Z"), ts("2026-01-01T00:03:00Z")]);
        assert_eq!(more, 0);
        let (due, more) = w.due(ts("2026-01-01T00:00:00Z"), ts("2026-01-01T10:00:00Z"), 5);
        assert_eq!((due.len(), more), (5, 601 - 5));
        let every = When::Every(60);
        let (due, more) = every.due(ts("2026-01-01T00:00:00Z"), ts("2026-01-08T00:00:00Z"), 100);
        assert_eq!((due.len() as u64 + more), 7 * 24 * 60 + 1);
        assert_eq!(
            every.next_after(ts("2026-01-01T00:02:30Z"), Some(ts("2026-01-01T00:00:00Z"))),
            Some(ts("2026-01-01T00:03:00Z"))
        );
        assert_eq!(
            every.latest(ts("2026-01-01T00:02:30Z"), ts("2026-01-01T00:00:00Z")),
            Some(ts("2026-01-01T00:02:00Z"))
        );
        assert_eq!(w.latest(ts("2026-01-01T00:02:30Z"), ts("2026-01-01T00:00:00Z")), Some(ts("2026-01-01T00:02:00Z")));
        assert_eq!(w.latest(ts("2026-01-01T00:02:00Z"), ts("2026-01-01T00:00:00Z")), Some(ts("2026-01-01T00:02:00Z")));
    }
}
