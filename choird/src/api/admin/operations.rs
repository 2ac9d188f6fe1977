//! The daemon's own state as the operator reads and changes it: status, the
//! kill switch, argument-policy reloads, backups and the logs.

use std::io::Write;
use std::sync::Arc;

use choir_common::admin::StatusResponse;

use super::stream::stream;
use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::{Request, Response};
use crate::logs::query::LogQuery;

/// `GET status`.
pub(super) fn status(d: &Daemon) -> StatusResponse {
    StatusResponse {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        uptime_s: d.uptime_s(),
        home: d.home.root().display().to_string(),
        database: d.database_status(),
        kill_switch: d.kill_switch(),
        disk: d
            .config()
            .agents
            .keys()
            .filter_map(|id| d.disk_refusal(id, crate::disk::Look::Now).map(|why| format!("{id}: {why}")))
            .collect(),
        agents: d.summaries_now(),
        usage: d.usage(),
        config_on_disk: d.config_on_disk(),
        held: d.held().map(|h| h.trim().to_owned()),
    }
}

/// `POST policy/kill-switch`, body `{"on": bool}`.
pub(super) fn kill_switch(d: &Daemon, req: &Request) -> Result<Response, Error> {
    let body: serde_json::Value = req.json()?;
    let on = body
        .get("on")
        .and_then(serde_json::Value::as_bool)
        .ok_or_else(|| Error::Malformed("send {\"on\": true|false}".into()))?;
    d.set_kill_switch(on, "admin")?;
    Ok(Response::ok(&serde_json::json!({"kill_switch": on})))
}

/// `POST policy/reload`: what each agent's argument policy reloaded to.
pub(super) fn reload_policies(d: &Daemon) -> serde_json::Value {
    let results = d.reload_policies("admin");
    let mut report = crate::arg_policies::report(&results);
    report["config_version"] = serde_json::json!(d.config_version());
    report
}

/// `POST backup`: the archive streamed, its summary in `X-Choir-Backup`.
pub(super) fn backup(d: &Daemon, req: &Request) -> Result<Response, Error> {
    let body: serde_json::Value = req.json()?;
    let workspaces = body.get("workspaces").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let abandoned = || req.peer.as_ref().is_some_and(crate::http::Peer::gone);
    let (file, summary) = d.backup(workspaces, &abandoned)?;
    let mut response = Response::streaming(file);
    response.content_type = "application/gzip";
    let summary = serde_json::to_string(&summary).map_err(|e| Error::Internal(e.to_string()))?;
    response.headers.push(("X-Choir-Backup".to_owned(), summary));
    Ok(response)
}

/// `GET logs`: one page, or followed live as JSON lines.
pub(super) fn logs(d: &Arc<Daemon>, query: LogQuery, follow: bool) -> Result<Response, Error> {
    if !follow {
        return Ok(Response::ok(&d.log_page(&query)));
    }
    let daemon = d.clone();
    stream(d, "logs-follow".into(), "text/plain; charset=utf-8", move |writer| {
        if let Err(e) = daemon.follow_logs(&query, writer) {
            let _ = writeln!(writer, "{}", serde_json::json!({"error": e.to_string()}));
        }
    })
}
