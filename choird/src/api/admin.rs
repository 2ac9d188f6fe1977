//! The admin API (R-RPC-4), served only on `socks/choird.sock` (0600): what
//! choirctl talks to. Every state-changing call is audited with actor `admin`.

use std::time::Duration;

use choir_common::admin::{
    AgentList, ApproveRequest, CancelRequest, ChatRequest, EventsResponse, RejectRequest, StatusResponse,
};
use choir_common::commit::{verify_extension, ChainHead};
use choir_common::ids::AgentId;

use crate::daemon::{ChatUpdate, Daemon};
use crate::http::{ApiError, Request, Response};

/// Answers `/admin/v1/...`.
pub fn handle(d: &std::sync::Arc<Daemon>, tg: &crate::telegram::Handle, req: &Request) -> Result<Response, ApiError> {
    let rest = req.path.strip_prefix("/admin/v1/").unwrap_or("");
    let parts: Vec<&str> = rest.split('/').collect();
    match (req.method.as_str(), parts.as_slice()) {
        ("GET", ["status"]) => Ok(Response::ok(&StatusResponse {
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
                .filter_map(|id| d.disk_refusal(id).map(|why| format!("{id}: {why}")))
                .collect(),
            agents: d.summaries(),
            usage: d.usage(),
        })),
        ("POST", ["policy", "kill-switch"]) => {
            let body: serde_json::Value = req.json()?;
            let on = body
                .get("on")
                .and_then(serde_json::Value::as_bool)
                .ok_or_else(|| ApiError::BadRequest("send {\"on\": true|false}".into()))?;
            d.set_kill_switch(on, "admin")?;
            Ok(Response::ok(&serde_json::json!({"kill_switch": on})))
        }
        ("POST", ["backup"]) => {
            let body: serde_json::Value = req.json()?;
            let workspaces = body.get("workspaces").and_then(serde_json::Value::as_bool).unwrap_or(false);
            let (file, summary) = d.backup(workspaces)?;
            let mut response = Response::streaming(file);
            response.content_type = "application/gzip";
            let summary = serde_json::to_string(&summary).map_err(|e| ApiError::Internal(e.to_string()))?;
            response.headers.push(("X-Choir-Backup".to_owned(), summary));
            Ok(response)
        }
        ("GET", ["agents"]) => Ok(Response::ok(&AgentList { agents: d.summaries() })),
        ("GET", ["agents", id]) => Ok(Response::ok(&d.summary(id)?)),
        ("POST", ["agents", id, "start"]) => Ok(Response::ok(&d.start_agent(id, "admin")?)),
        ("POST", ["agents", id, "stop"]) => Ok(Response::ok(&d.stop_agent(id, "admin")?)),
        ("POST", ["agents", id, action @ ("build" | "update")]) => {
            // Bad inputs are refused with a status before anything streams.
            d.validate_image_inputs(id)?;
            let (reader, mut writer) = std::io::pipe().map_err(|e| ApiError::Internal(e.to_string()))?;
            let (daemon, id, action) = (d.clone(), id.to_string(), action.to_string());
            let name = format!("{action}-{id}");
            d.tasks
                .spawn(name, move || {
                    use std::io::Write;
                    let mut say = |line: &str| {
                        let _ = writeln!(writer, "{line}");
                    };
                    let outcome = if action == "build" {
                        daemon.build_image(&id, &mut say).map(|tag| format!("OK {tag}"))
                    } else {
                        daemon.update_agent(&id, &mut say).map(|s| format!("OK {}", s.image.unwrap_or_default()))
                    };
                    match outcome {
                        Ok(line) => say(&line),
                        Err(e) => say(&format!("ERROR {e}")),
                    }
                })
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            Ok(Response::streaming(reader))
        }
        ("POST", ["agents", id, "chat"]) => {
            let chat: ChatRequest = req.json()?;
            let conversation = chat.conversation.unwrap_or_else(|| "cli".to_owned());
            let timeout = Duration::from_secs(chat.timeout_s.unwrap_or(300).clamp(1, 3600));
            if !chat.stream {
                return Ok(Response::ok(&d.chat(id, &chat.text, &conversation, "choirctl", timeout)?));
            }
            let (message_id, updates) = d.chat_send(id, &chat.text, &conversation, "choirctl")?;
            let (reader, mut writer) = std::io::pipe().map_err(|e| ApiError::Internal(e.to_string()))?;
            let (daemon, id) = (d.clone(), id.to_string());
            let name = format!("chat-{id}");
            d.tasks
                .spawn(name, move || {
                    use std::io::Write;
                    let deadline = std::time::Instant::now() + timeout;
                    loop {
                        let line = match daemon.chat_next(&id, message_id, &updates, deadline) {
                            Ok(ChatUpdate::Partial(text)) => serde_json::json!({"partial": text}),
                            Ok(ChatUpdate::Done(Ok(reply))) => {
                                serde_json::json!({"message_id": message_id, "reply": reply})
                            }
                            Ok(ChatUpdate::Done(Err(e))) => serde_json::json!({"error": e}),
                            Err(e) => serde_json::json!({"error": e.to_string()}),
                        };
                        let last = line.get("partial").is_none();
                        if writeln!(writer, "{line}").is_err() || last {
                            return;
                        }
                    }
                })
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            let mut resp = Response::streaming(reader);
            resp.content_type = "application/x-ndjson";
            Ok(resp)
        }
        ("GET", ["agents", id, "events"]) => {
            let id = AgentId::parse(id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let after: u64 = parse_num(req.query("after"), 0)?;
            let limit: i64 = parse_num(req.query("limit"), 1000)?;
            let events = d.store.events(&id, after, limit.clamp(1, 10_000))?;
            // The first event links to its stored predecessor's hash.
            let start = match events.first() {
                Some(first) => ChainHead { seq: first.seq - 1, hash: first.prev_hash.clone() },
                None => ChainHead::genesis(),
            };
            let chain_ok = events.first().is_none_or(|f| after == 0 && f.seq == 1 || after > 0)
                && verify_extension(&start, &events).is_ok();
            Ok(Response::ok(&EventsResponse { events, chain_ok }))
        }
        ("POST", ["agents", id, "cancel"]) => {
            let r: CancelRequest = req.json()?;
            d.cancel_lane(id, &r.lane, "admin")?;
            Ok(Response::ok(&serde_json::json!({"cancel": r.lane})))
        }
        ("GET", ["agents", id, "tools"]) => {
            let agent = AgentId::parse(id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            Ok(Response::ok(&crate::tool_list::list(d.shared(), &d.host_tools, &agent)?))
        }
        ("GET", ["agents", id, "skills"]) => {
            let agent = AgentId::parse(id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            Ok(Response::ok(&crate::skill_list::of_agent(d.shared(), &d.host_tools, &agent)?.1))
        }
        ("POST", ["agents", id, "repos"]) => {
            let r: choir_common::admin::AddRequest = req.json()?;
            Ok(Response::ok(&d.add_reviewed(id, &r)?))
        }
        ("POST", ["agents", id, "tools", tool, "check"]) => {
            let agent = AgentId::parse(id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let said = d.host_tools.check(&agent, tool)?;
            Ok(Response::ok(&serde_json::json!({"tool": tool, "ok": true, "said": said})))
        }
        ("GET", ["sessions"]) => {
            let agent =
                req.query("agent").map(AgentId::parse).transpose().map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let limit: i64 = parse_num(req.query("limit"), 50)?;
            let sessions = d.store.sessions(agent.as_ref(), limit.clamp(1, 10_000))?;
            Ok(Response::ok(&choir_common::admin::SessionList { sessions }))
        }
        ("GET", ["logs"]) => {
            let q = d.log_query(
                req.query("agent"),
                req.query("since"),
                req.query("level"),
                req.query("grep"),
                req.query("limit"),
            )?;
            if req.query("follow").is_none_or(|f| f == "0") {
                return Ok(Response::ok(&d.log_page(&q)));
            }
            let (reader, mut writer) = std::io::pipe().map_err(|e| ApiError::Internal(e.to_string()))?;
            let daemon = d.clone();
            d.tasks
                .spawn("logs-follow".into(), move || {
                    if let Err(e) = daemon.follow_logs(&q, &mut writer) {
                        use std::io::Write;
                        let _ = writeln!(writer, "{}", serde_json::json!({"error": e.to_string()}));
                    }
                })
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            Ok(Response::streaming(reader))
        }
        ("GET", ["usage"]) => {
            let agent = match req.query("agent") {
                Some(a) => Some(d.known_agent(a)?.as_str().to_owned()),
                None => None,
            };
            let since =
                req.query("since").map(crate::logs::query::parse_since).transpose().map_err(ApiError::BadRequest)?;
            let by = req.query("by").unwrap_or("day");
            let by = crate::store::usage::UsageBy::parse(by).ok_or_else(|| {
                ApiError::BadRequest(format!("cannot group usage by {by:?}; use day, model, lane, agent or job"))
            })?;
            Ok(Response::ok(&d.store.usage(agent.as_deref(), since.as_deref(), by)?))
        }
        ("GET", ["secrets"]) => Ok(Response::ok(&d.secret_list()?)),
        ("PUT", ["secrets", name]) => {
            let r: choir_common::admin::SetSecret = req.json()?;
            Ok(Response::ok(&d.set_secret(name, &r.value)?))
        }
        ("DELETE", ["secrets", name]) => Ok(Response::ok(&d.remove_secret(name)?)),
        ("POST", ["policy", "reload"]) => {
            let results = d.reload_policies("admin");
            let mut report = crate::arg_policies::report(&results);
            report["config_version"] = serde_json::json!(d.config_version());
            Ok(Response::ok(&report))
        }
        ("GET", ["agents", id, "policy", "tools"]) => {
            let agent = d.known_agent(id)?;
            Ok(Response::ok(&d.config().agents.get(&agent).map(|a| a.tools.clone()).unwrap_or_default()))
        }
        ("PUT", ["agents", id, "policy", "tools"]) => {
            let policy: choir_common::tool_policy::ToolPolicy = req.json()?;
            Ok(Response::ok(&d.set_tool_policy(id, &policy)?))
        }
        ("GET", ["agents", id, "policy"]) => {
            let agent = d.known_agent(id)?;
            Ok(Response::ok(&*d.argument_policy(&agent)))
        }
        ("POST", ["agents", id, "policy", "test"]) => {
            let agent = d.known_agent(id)?;
            let t: choir_common::admin::PolicyTest = req.json()?;
            Ok(Response::ok(&crate::arg_policies::test(&d.argument_policy(&agent), &t)?))
        }
        ("GET", ["approvals"]) => Ok(Response::ok(&d.approvals(req.query("status"), req.query("agent"))?)),
        ("GET", ["approvals", id]) => Ok(Response::ok(&d.approval(parse_id(id)?)?)),
        ("POST", ["approvals", id, "approve"]) => {
            let r: ApproveRequest = req.json()?;
            Ok(Response::ok(&d.approve(parse_id(id)?, &r)?))
        }
        ("POST", ["approvals", id, "reject"]) => {
            let r: RejectRequest = req.json()?;
            Ok(Response::ok(&d.reject(parse_id(id)?, &r.reason, r.by.as_deref())?))
        }
        ("GET", ["agents", id, "memory", what]) => {
            let agent = d.known_agent(id)?;
            let memory = d
                .memory
                .as_ref()
                .ok_or_else(|| ApiError::NotFound("memory is not configured (add \"memory\" to config.json)".into()))?;
            match *what {
                "stats" => Ok(Response::ok(&memory.stats(&agent)?)),
                "search" => {
                    let q =
                        req.query("q").ok_or_else(|| ApiError::BadRequest("give the text to search: ?q=".into()))?;
                    Ok(Response::ok(&memory.search(&agent, q, parse_num(req.query("k"), 5)?)?))
                }
                "export" => {
                    // JSON lines, streamed page by page: the whole memory never sits in RAM.
                    let (reader, mut writer) = std::io::pipe().map_err(|e| ApiError::Internal(e.to_string()))?;
                    let first = memory.export(&agent, 0, 500)?;
                    let memory = memory.clone();
                    d.tasks
                        .spawn(format!("export-{agent}"), move || {
                            use std::io::Write;
                            let mut page = first;
                            while !page.is_empty() {
                                let last = page.last().and_then(|v| v["id"].as_i64()).unwrap_or(i64::MAX);
                                for v in &page {
                                    if writeln!(writer, "{v}").is_err() {
                                        return;
                                    }
                                }
                                page = match memory.export(&agent, last, 500) {
                                    Ok(p) => p,
                                    Err(e) => {
                                        let _ = writeln!(writer, "{}", serde_json::json!({"error": e.to_string()}));
                                        return;
                                    }
                                };
                            }
                        })
                        .map_err(|e| ApiError::Internal(e.to_string()))?;
                    let mut resp = Response::streaming(reader);
                    resp.content_type = "application/x-ndjson";
                    Ok(resp)
                }
                other => Err(ApiError::NotFound(format!("no memory endpoint {other:?}; use stats, search or export"))),
            }
        }
        ("GET", ["telegram"]) => Ok(Response::ok(&crate::telegram::status(tg)?)),
        ("GET", ["telegram", "pairings"]) => {
            Ok(Response::ok(&crate::telegram::pairing::list(tg, req.query("all").is_some_and(|v| v == "1"))?))
        }
        ("POST", ["telegram", "pairings", bot, user]) => {
            let r: choir_common::admin::PairDecision = req.json()?;
            let user: i64 =
                user.parse().map_err(|_| ApiError::BadRequest(format!("{user:?} is not a Telegram user id")))?;
            let done = crate::telegram::pairing::decide(tg, bot, user, r.approve, "admin")?;
            Ok(Response::ok(&serde_json::json!({"done": done})))
        }
        ("GET", ["schedule"]) => Ok(Response::ok(&d.schedule_list(req.query("agent"))?)),
        ("POST", ["agents", id, "schedule"]) => {
            let spec: choir_common::schedule::JobSpec = req.json()?;
            Ok(Response::ok(&d.schedule_add(id, &spec, "admin")?))
        }
        ("GET", ["agents", id, "schedule", name]) => Ok(Response::ok(&d.schedule_show(id, name)?)),
        ("DELETE", ["agents", id, "schedule", name]) => {
            d.schedule_remove(id, name)?;
            Ok(Response::ok(&serde_json::json!({"removed": name})))
        }
        ("POST", ["agents", id, "schedule", name, verb @ ("pause" | "resume")]) => {
            Ok(Response::ok(&d.schedule_pause(id, name, *verb == "pause")?))
        }
        ("POST", ["agents", id, "schedule", name, "run-now"]) => {
            d.schedule_run_now(id, name)?;
            Ok(Response::ok(&serde_json::json!({"due": name})))
        }
        ("GET", ["audit"]) => {
            let agent =
                req.query("agent").map(AgentId::parse).transpose().map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let limit: i64 = parse_num(req.query("limit"), 100)?;
            Ok(Response::ok(
                &serde_json::json!({"records": d.store.audit_rows(agent.as_ref(), limit.clamp(1, 10_000))?}),
            ))
        }
        _ => Err(ApiError::NotFound(format!("no admin endpoint {} {}", req.method, req.path))),
    }
}

fn parse_id(s: &str) -> Result<i64, ApiError> {
    s.parse().map_err(|_| ApiError::BadRequest(format!("{s:?} is not a proposal id (a number)")))
}

fn parse_num<T: std::str::FromStr>(v: Option<&str>, default: T) -> Result<T, ApiError> {
    match v {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| ApiError::BadRequest(format!("{s:?} is not a number"))),
    }
}
