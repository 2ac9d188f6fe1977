//! Reading logs back: archives (compressed or not) and live files up to a
//! [`Snapshot`](super::Snapshot), filtered, newest `limit` kept.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use choir_common::admin::{LogPage, LogRecord};

use choir_common::ids::AgentId;

use super::files::archive_name;
use super::{Snapshot, CHOIRD};
use crate::error::Error;

/// Which records a reader wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// An agent's output and what choird logged about it; none: choird's own
    /// log.
    pub agent: Option<String>,
    /// Records at or after this time (the records' own format).
    pub since: Option<String>,
    /// The least severe level shown (1 = ERROR … 5 = TRACE).
    pub max_rank: u8,
    /// Records whose message or component contains this.
    pub grep: Option<String>,
}

/// A level's rank (1 = ERROR … 5 = TRACE; unknown: INFO).
pub fn rank(level: &str) -> u8 {
    match level.to_ascii_uppercase().as_str() {
        "ERROR" => 1,
        "WARN" | "WARNING" => 2,
        "DEBUG" => 4,
        "TRACE" => 5,
        _ => 3,
    }
}

/// A level name a reader gave, as a rank; an error naming the choices.
pub fn parse_level(level: &str) -> Result<u8, String> {
    match level.to_ascii_uppercase().as_str() {
        "ERROR" => Ok(1),
        "WARN" | "WARNING" => Ok(2),
        "INFO" => Ok(3),
        "DEBUG" => Ok(4),
        "TRACE" => Ok(5),
        _ => Err(format!("unknown level {level:?}; use error, warn, info, debug or trace")),
    }
}

/// A time a reader gave (RFC 3339 with any offset) in the records' format.
pub fn parse_since(since: &str) -> Result<String, String> {
    let ts: jiff::Timestamp =
        since.parse().map_err(|e| format!("{since:?} is not a time (RFC 3339, e.g. 2026-11-23T08:00:00Z): {e}"))?;
    Ok(ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
}

impl Filter {
    /// The streams (files) this filter reads.
    pub fn streams(&self) -> Vec<String> {
        match &self.agent {
            Some(a) => vec![a.clone(), CHOIRD.to_owned()],
            None => vec![CHOIRD.to_owned()],
        }
    }

    /// Whether a record of `stream` is wanted.
    pub fn matches(&self, stream: &str, r: &LogRecord) -> bool {
        let about = match &self.agent {
            Some(a) => stream == a || (stream == CHOIRD && r.agent.as_deref() == Some(a)),
            None => stream == CHOIRD,
        };
        about
            && self.since.as_ref().is_none_or(|s| r.ts.as_str() >= s.as_str())
            && rank(&r.level) <= self.max_rank
            && self.grep.as_ref().is_none_or(|g| r.msg.contains(g.as_str()) || r.component.contains(g.as_str()))
    }
}

/// A line of a log file as a record (a line from before structured logs is
/// kept whole as its message).
pub fn parse_line(line: &str) -> LogRecord {
    serde_json::from_str(line).unwrap_or_else(|_| LogRecord {
        ts: String::new(),
        level: "INFO".into(),
        component: "-".into(),
        agent: None,
        msg: choir_common::text::one_line(line),
    })
}

/// The newest `limit` records matching `filter`, oldest first, from the
/// archives and the live files as far as `snapshot` saw them.
pub fn read(dir: &Path, snapshot: &Snapshot, filter: &Filter, limit: usize) -> LogPage {
    let since_compact: Option<String> = filter.since.as_ref().map(|s| s.replace(['-', ':', '.'], ""));
    let mut all: Vec<LogRecord> = Vec::new();
    let mut truncated = false;
    for stream in filter.streams() {
        let mut kept: VecDeque<LogRecord> = VecDeque::new();
        let mut keep = |r: LogRecord| {
            if filter.matches(&stream, &r) {
                if kept.len() == limit {
                    kept.pop_front();
                    truncated = true;
                }
                kept.push_back(r);
            }
        };
        let mut archived: Vec<&str> = Vec::new();
        for name in &snapshot.archives {
            if let Some((s, time)) = archive_name(name) {
                // An archive's time is when it was closed: after its last record.
                let recent = since_compact.as_ref().is_none_or(|since| time >= since.as_str());
                if s == stream && recent {
                    archived.push(time);
                }
            }
        }
        archived.sort_unstable();
        archived.dedup(); // x.log and x.log.gz listed during compression
        for time in archived {
            // Compression replaces x.log by x.log.gz with one of them always
            // there; one missing both was deleted by retention since.
            let base = dir.join("archive").join(format!("{stream}.{time}.log"));
            if let Ok(f) = std::fs::File::open(&base) {
                for_each_line(f, &mut keep);
            } else if let Ok(f) = std::fs::File::open(base.with_extension("log.gz")) {
                for_each_line(flate2::read::MultiGzDecoder::new(f), &mut keep);
            }
        }
        if let Some((f, size)) = snapshot.live.get(&stream) {
            for_each_line(f.take(*size), &mut keep);
        }
        all.extend(kept);
    }
    all.sort_by(|a, b| a.ts.cmp(&b.ts));
    if all.len() > limit {
        all.drain(..all.len() - limit);
        truncated = true;
    }
    LogPage { records: all, truncated }
}

fn for_each_line(r: impl Read, keep: &mut impl FnMut(LogRecord)) {
    let mut reader = BufReader::new(r);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = line.trim_end_matches('\n');
                if !text.is_empty() {
                    keep(parse_line(text));
                }
            }
        }
    }
}

/// Most records one page returns.
pub const MAX_LIMIT: usize = 100_000;

/// A reader's query, checked.
#[derive(Debug)]
pub struct LogQuery {
    /// What to read.
    pub filter: Filter,
    /// The newest this many.
    pub limit: usize,
}

impl LogQuery {
    /// Checks a query's parameters (each error names the fix).
    pub fn parse(
        agent: Option<&str>,
        since: Option<&str>,
        level: Option<&str>,
        grep: Option<&str>,
        limit: Option<&str>,
    ) -> Result<LogQuery, Error> {
        let agent = match agent {
            Some(a) => Some(AgentId::parse(a).map_err(|e| Error::Malformed(e.to_string()))?.as_str().to_owned()),
            None => None,
        };
        let since = since.map(parse_since).transpose().map_err(Error::Malformed)?;
        let max_rank = level.map_or(Ok(5), parse_level).map_err(Error::Malformed)?;
        let limit = match limit {
            None => 1000,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| Error::Malformed(format!("limit {l:?} must be a number from 1 to {MAX_LIMIT}")))?,
        };
        let grep = grep.filter(|g| !g.is_empty()).map(str::to_owned);
        Ok(LogQuery { filter: Filter { agent, since, max_rank, grep }, limit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(level: &str, agent: Option<&str>, msg: &str) -> LogRecord {
        LogRecord {
            ts: "2026-11-23T10:00:00.000000Z".into(),
            level: level.into(),
            component: "choird::x".into(),
            agent: agent.map(str::to_owned),
            msg: msg.into(),
        }
    }

    #[test]
    fn an_agent_filter_takes_its_stream_and_choirds_lines_about_it() {
        let f = Filter { agent: Some("a1".into()), max_rank: 3, ..Filter::default() };
        assert!(f.matches("a1", &rec("INFO", Some("a1"), "hi")));
        assert!(f.matches("choird", &rec("WARN", Some("a1"), "restarting")));
        assert!(!f.matches("choird", &rec("WARN", Some("a2"), "restarting")));
        assert!(!f.matches("choird", &rec("WARN", None, "x")));
        assert!(!f.matches("a1", &rec("DEBUG", Some("a1"), "noise")));
    }

    #[test]
    fn since_level_and_grep_filter() {
        let f = Filter {
            since: Some(parse_since("2026-11-23T11:00:00+01:00").unwrap_or_default()),
            max_rank: parse_level("warn").unwrap_or(0),
            grep: Some("disk".into()),
            ..Filter::default()
        };
        assert!(f.matches("choird", &rec("ERROR", None, "disk full")));
        assert!(!f.matches("choird", &rec("INFO", None, "disk full")));
        assert!(!f.matches("choird", &rec("WARN", None, "other")));
        let old = LogRecord { ts: "2026-11-23T09:59:59.999999Z".into(), ..rec("ERROR", None, "disk") };
        assert!(!f.matches("choird", &old));
        assert!(parse_level("loud").is_err());
        assert!(parse_since("yesterday").is_err());
    }
}
