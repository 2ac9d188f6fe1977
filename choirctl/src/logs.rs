//! `choirctl logs [AGENT] [--follow] [--since T] [--level L] [--grep S]`:
//! choird's log, or an agent's output and what choird said about it,
//! archives included (R-CTL-3).

use choir_common::admin::{LogPage, LogRecord};

use crate::ctx::{print_json, Ctx};

/// What the operator asked for.
pub struct Args<'a> {
    pub agent: Option<&'a str>,
    pub since: Option<&'a str>,
    pub level: Option<&'a str>,
    pub grep: Option<&'a str>,
    pub limit: Option<u64>,
    pub follow: bool,
}

/// `--since`: a time (RFC 3339, or a date `2026-11-23` meaning its start in
/// UTC) or an age (`30s`, `10m`, `2h`, `1h30m`, `3d`), as RFC 3339.
pub fn since(text: &str) -> anyhow::Result<String> {
    if let Ok(ts) = text.parse::<jiff::Timestamp>() {
        return Ok(ts.to_string());
    }
    if let Ok(date) = text.parse::<jiff::civil::Date>() {
        return Ok(date.to_zoned(jiff::tz::TimeZone::UTC)?.timestamp().to_string());
    }
    let age = match text.strip_suffix('d').and_then(|d| d.parse::<i64>().ok()) {
        Some(days) => jiff::SignedDuration::from_hours(days.saturating_mul(24)),
        None => text.parse::<jiff::SignedDuration>().map_err(|_| {
            anyhow::anyhow!(
                "--since {text:?}: give a time (2026-11-23T08:00:00Z, 2026-11-23) or an age (30s, 10m, 2h, 1h30m, 3d)"
            )
        })?,
    };
    Ok(jiff::Timestamp::now().checked_sub(age.abs())?.to_string())
}

fn print(ctx: &Ctx, r: &LogRecord) -> anyhow::Result<()> {
    if ctx.json {
        crate::ctx::print_json_line(r)?;
    } else {
        say!("{}", crate::term::one_line(&r.human()));
    }
    Ok(())
}

/// Prints the newest matching records, then (`--follow`) new ones as they
/// are written, until interrupted.
pub fn run(ctx: &Ctx, a: &Args<'_>) -> anyhow::Result<()> {
    let mut query = Vec::new();
    if let Some(agent) = a.agent {
        choir_common::ids::AgentId::parse(agent)?;
        query.push(format!("agent={}", choir_common::unix_http::query_value(agent)));
    }
    if let Some(s) = a.since {
        query.push(format!("since={}", choir_common::unix_http::query_value(&since(s)?)));
    }
    if let Some(l) = a.level {
        query.push(format!("level={}", choir_common::unix_http::query_value(l)));
    }
    if let Some(g) = a.grep {
        query.push(format!("grep={}", choir_common::unix_http::query_value(g)));
    }
    let limit = a.limit.unwrap_or(if a.since.is_some() {
        100_000
    } else if a.follow {
        20
    } else {
        200
    });
    query.push(format!("limit={limit}"));
    if !a.follow {
        let page: LogPage = match ctx.client.get(&format!("logs?{}", query.join("&"))) {
            Err(e) if e.downcast_ref::<crate::client::NotListening>().is_some() => {
                say_err!("({e:#}; read from the files)");
                offline(ctx, a, limit)?
            }
            other => other?,
        };
        if ctx.json {
            return print_json(&page);
        }
        if page.truncated && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            say_err!("(older records left out; use --limit N or --since T)");
        }
        for r in &page.records {
            print(ctx, r)?;
        }
        return Ok(());
    }
    query.push("follow=1".into());
    if let Err(e) = ctx.client.get::<serde_json::Value>("status") {
        if e.downcast_ref::<crate::client::NotListening>().is_some() {
            anyhow::bail!("{e:#}; nothing writes the log to follow: drop --follow to read it from the files");
        }
    }
    ctx.client.get_lines(&format!("logs?{}", query.join("&")), |line| {
        if line.is_empty() {
            return Ok(()); // keep-alive
        }
        match serde_json::from_str::<LogRecord>(line) {
            Ok(r) => print(ctx, &r),
            Err(_) => {
                let v: serde_json::Value = serde_json::from_str(line)?;
                anyhow::bail!("{}", v["error"].as_str().unwrap_or(line))
            }
        }
    })
}

/// The page read from the files by `choird logs`, for when choird is down
/// (the moment an operator most needs the log: why did it not start?).
fn offline(ctx: &Ctx, a: &Args<'_>, limit: u64) -> anyhow::Result<LogPage> {
    let since = a.since.map(since).transpose()?;
    let limit = limit.to_string();
    let mut words = vec!["logs"];
    words.extend(a.agent);
    for (flag, value) in [("--since", since.as_deref()), ("--level", a.level), ("--grep", a.grep)] {
        if let Some(v) = value {
            words.extend([flag, v]);
        }
    }
    words.extend(["--limit", &limit]);
    let mut page = None;
    crate::offline::run_lines(&words, ctx.client.home(), None, &mut |v| page = Some(v))?;
    Ok(serde_json::from_value(page.ok_or_else(|| anyhow::anyhow!("choird logs printed nothing"))?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_times_dates_and_ages() {
        assert_eq!(since("2026-11-23T09:00:00+01:00").unwrap_or_default(), "2026-11-23T08:00:00Z");
        assert_eq!(since("2026-11-23").unwrap_or_default(), "2026-11-23T00:00:00Z");
        for age in ["30s", "10m", "2h", "1h30m", "3d"] {
            let t: jiff::Timestamp = since(age).unwrap_or_default().parse().unwrap_or_default();
            assert!(t < jiff::Timestamp::now(), "{age}");
        }
        let err = since("yesterday-ish").map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("30s, 10m"), "{err}");
    }
}
