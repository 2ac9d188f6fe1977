//! An agent's admin routes that answer over time: building or updating its
//! image (progress lines), a chat turn (JSON lines of partial text, then the
//! reply) and its stored commit log, checked against its hash chain.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use choir_common::admin::{ChatRequest, EventsResponse};
use choir_common::commit::{verify_extension, ChainHead};
use choir_common::ids::AgentId;

use super::request::ImageAction;
use super::stream::stream;
use crate::daemon::{ChatUpdate, Daemon};
use crate::error::Error;
use crate::http::{Request, Response};

/// `POST agents/<id>/build|update`: progress lines, then `OK <tag>` or
/// `ERROR <why>`. Bad inputs are refused with a status before anything streams.
pub(super) fn image(d: &Arc<Daemon>, id: &str, action: ImageAction) -> Result<Response, Error> {
    d.validate_image_inputs(id)?;
    let (daemon, id) = (d.clone(), id.to_owned());
    let name = match action {
        ImageAction::Build => format!("build-{id}"),
        ImageAction::Update => format!("update-{id}"),
    };
    stream(d, name, "text/plain; charset=utf-8", move |writer| {
        let mut say = |line: &str| {
            let _ = writeln!(writer, "{line}");
        };
        let outcome = match action {
            ImageAction::Build => daemon.build_image(&id, &mut say).map(|tag| format!("OK {tag}")),
            ImageAction::Update => {
                daemon.update_agent(&id, &mut say).map(|s| format!("OK {}", s.image.unwrap_or_default()))
            }
        };
        match outcome {
            Ok(line) => say(&line),
            Err(e) => say(&format!("ERROR {e}")),
        }
    })
}

/// `POST agents/<id>/chat`: one message in; the reply as one JSON body, or
/// streamed as JSON lines when the request asks for it.
pub(super) fn chat(d: &Arc<Daemon>, id: &str, req: &Request) -> Result<Response, Error> {
    let chat: ChatRequest = req.json()?;
    let conversation = chat.conversation.unwrap_or_else(|| "cli".to_owned());
    let timeout = Duration::from_secs(chat.timeout_s.unwrap_or(300).clamp(1, 3600));
    if !chat.stream {
        return Ok(Response::ok(&d.chat(id, &chat.text, &conversation, "choirctl", timeout)?));
    }
    let (message_id, updates) = d.chat_send(id, &chat.text, &conversation, "choirctl")?;
    let (daemon, id) = (d.clone(), id.to_owned());
    stream(d, format!("chat-{id}"), "application/x-ndjson", move |writer| {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let line = match daemon.chat_next(&id, message_id, &updates, deadline) {
                Ok(ChatUpdate::Partial(text)) => serde_json::json!({"partial": text}),
                Ok(ChatUpdate::Done(Ok(reply))) => serde_json::json!({"message_id": message_id, "reply": reply}),
                Ok(ChatUpdate::Done(Err(e))) => serde_json::json!({"error": e}),
                Err(e) => serde_json::json!({"error": e.to_string()}),
            };
            let last = line.get("partial").is_none();
            if writeln!(writer, "{line}").is_err() || last {
                return;
            }
        }
    })
}

/// `GET agents/<id>/events`: a page of the stored commit log and whether it
/// links to its stored predecessor's hash.
pub(super) fn events(d: &Daemon, agent: &AgentId, after: u64, limit: i64) -> Result<Response, Error> {
    let events = d.store.events(agent, after, limit)?;
    let start = match events.first() {
        Some(first) => ChainHead { seq: first.seq - 1, hash: first.prev_hash.clone() },
        None => ChainHead::genesis(),
    };
    let chain_ok = events.first().is_none_or(|f| after == 0 && f.seq == 1 || after > 0)
        && verify_extension(&start, &events).is_ok();
    Ok(Response::ok(&EventsResponse { events, chain_ok }))
}
