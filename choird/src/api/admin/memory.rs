//! `GET agents/<id>/memory/stats|search|export`: an agent's long-term memory
//! as the operator reads it. The export streams page by page, so a whole
//! memory never sits in choird's RAM.

use std::io::Write;

use super::request::MemoryRead;
use super::stream::stream;
use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::Response;

/// Rows per page of an export.
const EXPORT_PAGE: i64 = 500;

/// Answers one memory read of agent `id`.
pub(super) fn read(d: &Daemon, id: &str, read: MemoryRead) -> Result<Response, Error> {
    let agent = d.known_agent(id)?;
    let memory = d
        .memory
        .as_ref()
        .ok_or_else(|| Error::NotFound("memory is not configured (add \"memory\" to config.json)".into()))?;
    match read {
        MemoryRead::Stats => Ok(Response::ok(&memory.stats(&agent)?)),
        MemoryRead::Search { q, k } => Ok(Response::ok(&memory.search(&agent, &q, k)?)),
        MemoryRead::Export => {
            let first = memory.export(&agent, 0, EXPORT_PAGE)?;
            let memory = memory.clone();
            stream(d, format!("export-{agent}"), "application/x-ndjson", move |writer| {
                let mut page = first;
                while !page.is_empty() {
                    let last = page.last().and_then(|v| v["id"].as_i64()).unwrap_or(i64::MAX);
                    for v in &page {
                        if writeln!(writer, "{v}").is_err() {
                            return;
                        }
                    }
                    page = match memory.export(&agent, last, EXPORT_PAGE) {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = writeln!(writer, "{}", serde_json::json!({"error": e.to_string()}));
                            return;
                        }
                    };
                }
            })
        }
    }
}
