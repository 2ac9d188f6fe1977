//! The console's live feed (`GET /events`, server-sent events): the agents'
//! states and lanes when they change, and each commit event as it
//! replicates. The page never polls; choird looks at its own in-memory
//! state twice a second and reads the database only when an agent's
//! replicated sequence moved.
//!
//! **Invariants:** at most [`MAX_STREAMS`] feeds at once; a feed ends after
//! [`MAX_LIFE`] (the browser reconnects) or as soon as its page is gone (a
//! write to it fails); it sends only new events, at most [`BATCH`] per
//! agent per look.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::Response;

/// Feeds open at once.
pub const MAX_STREAMS: usize = 4;
/// How long one feed lasts.
const MAX_LIFE: Duration = Duration::from_secs(3600);
/// Events sent per agent per look.
const BATCH: i64 = 50;
/// How often choird looks.
const TICK: Duration = Duration::from_millis(500);
/// A comment line this often keeps proxies and the browser from closing it.
const KEEPALIVE: Duration = Duration::from_secs(15);

static OPEN: AtomicUsize = AtomicUsize::new(0);

/// One feed's place among [`MAX_STREAMS`].
struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starts a feed.
pub fn stream(d: &Arc<Daemon>) -> Result<Response, Error> {
    if OPEN.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
        OPEN.fetch_sub(1, Ordering::SeqCst);
        return Err(Error::Conflict(format!("at most {MAX_STREAMS} live feeds at once; close a console tab")));
    }
    let slot = Slot;
    let (reader, mut writer) = std::io::pipe().map_err(|e| Error::Internal(e.to_string()))?;
    let d2 = d.clone();
    d.tasks
        .spawn("console-live".into(), move || {
            let _slot = slot;
            feed(&d2, &mut writer);
        })
        .map_err(|e| Error::Internal(e.to_string()))?;
    let mut r = Response::streaming(reader);
    r.content_type = "text/event-stream";
    Ok(r)
}

fn feed(d: &Daemon, out: &mut impl Write) {
    let started = Instant::now();
    let mut cursors: HashMap<String, u64> = d.summaries().into_iter().map(|a| (a.id, a.replicated_seq)).collect();
    let mut last_agents = String::new();
    let mut last_write = Instant::now();
    if out.write_all(b"retry: 2000\n\n").is_err() {
        return;
    }
    while started.elapsed() < MAX_LIFE {
        // Lanes asked at most once a second, however many feeds are open.
        d.refresh_status(None, Duration::from_secs(1));
        let agents = d.summaries();
        let view: Vec<_> = agents
            .iter()
            .map(|a| {
                let lanes: Vec<_> = a
                    .lanes
                    .iter()
                    .map(|l| json!({"lane": l.lane, "state": l.state, "steps": l.steps, "tokens": l.tokens, "detail": l.detail}))
                    .collect();
                json!({"id": a.id, "state": a.state, "lanes": lanes})
            })
            .collect();
        let now = serde_json::to_string(&view).unwrap_or_default();
        if now != last_agents {
            if send(out, "agents", &now).is_err() {
                return;
            }
            last_agents = now;
            last_write = Instant::now();
        }
        for a in &agents {
            let cursor = cursors.entry(a.id.clone()).or_insert(0);
            if a.replicated_seq <= *cursor {
                continue;
            }
            let Ok(agent) = d.known_agent(&a.id) else { continue };
            let Ok(events) = d.store.events(&agent, *cursor, BATCH) else { continue };
            for e in events {
                *cursor = e.seq;
                let data = json!({
                    "agent": a.id, "seq": e.seq, "lane": e.lane, "kind": format!("{:?}", e.kind),
                    "tool": e.tool, "outcome": choir_common::text::clipped(&format!("{:?}", e.outcome), 120),
                });
                if send(out, "commit", &data.to_string()).is_err() {
                    return;
                }
                last_write = Instant::now();
            }
        }
        if last_write.elapsed() >= KEEPALIVE {
            if out.write_all(b": keepalive\n\n").and_then(|()| out.flush()).is_err() {
                return;
            }
            last_write = Instant::now();
        }
        std::thread::sleep(TICK);
    }
}

/// One event; `data` is one line of JSON (serde never writes a raw newline).
fn send(out: &mut impl Write, event: &str, data: &str) -> std::io::Result<()> {
    out.write_all(format!("event: {event}\ndata: {data}\n\n").as_bytes())?;
    out.flush()
}
