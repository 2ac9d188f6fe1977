//! The console's pages, each drawn by choird from the same daemon calls
//! the admin API answers with (one definition of what an agent, an approval
//! or a usage row is), and its three writes.
//!
//! **Invariant:** a write is served only for a live session whose CSRF
//! token the form carries; an approval is decided only when the sha256 the
//! form carries is the one the page showed, which choird checks against
//! the proposal's content as it does for `choirctl`.

use std::sync::Arc;

use choir_common::admin::ApproveRequest;
use serde_json::json;

use super::guard::{self, Guard, Session};
use super::html::{esc, page, table};
use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::{status_of, Request, Response};

/// The script and style, embedded in the binary.
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// A plain-text answer.
pub fn plain(status: u16, text: &str) -> Response {
    let mut r = Response::json(status, &());
    r.body = format!("{text}\n").into_bytes();
    r.content_type = "text/plain; charset=utf-8";
    r
}

fn html(status: u16, body: String) -> Response {
    let mut r = Response::json(status, &());
    r.body = body.into_bytes();
    r.content_type = "text/html; charset=utf-8";
    r
}

fn redirect(to: &str) -> Response {
    let mut r = plain(303, "see other");
    r.headers.push(("Location".into(), to.to_owned()));
    r
}

/// Serves one admitted request.
pub fn route(d: &Arc<Daemon>, guard: &Guard, session: Option<(String, Session)>, req: &Request) -> Response {
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    match (req.method.as_str(), segs.as_slice()) {
        ("GET", ["static", "app.js"]) => asset(APP_JS, "text/javascript; charset=utf-8"),
        ("GET", ["static", "style.css"]) => asset(STYLE_CSS, "text/css; charset=utf-8"),
        ("GET", ["login"]) => login(d, guard, req),
        _ => {
            let Some((id, s)) = session else {
                return html(401, page_without_session());
            };
            let answer =
                if req.method == "GET" { read(d, &s, &segs, req) } else { write(d, guard, &id, &s, &segs, req) };
            answer.unwrap_or_else(|e| {
                let status = status_of(&e);
                html(
                    status,
                    page(
                        "Refused",
                        &s.csrf,
                        d.kill_switch(),
                        &format!("<p class=\"error\">{}</p>", esc(&e.to_string())),
                    ),
                )
            })
        }
    }
}

fn asset(body: &str, kind: &'static str) -> Response {
    let mut r = plain(200, "");
    r.body = body.as_bytes().to_vec();
    r.content_type = kind;
    r
}

fn page_without_session() -> String {
    "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Choir console</title>\
     <link rel=\"stylesheet\" href=\"/static/style.css\"></head><body><main><h1>Not logged in</h1>\
     <p>Open the console with <code>choirctl console</code>: it prints an address that logs you in once.</p>\
     </main></body></html>"
        .into()
}

/// `GET /login?code=…`: the code for a session cookie, then away from the
/// address that carried it.
fn login(d: &Daemon, guard: &Guard, req: &Request) -> Response {
    let Some((id, s)) = req.query("code").and_then(|c| guard.redeem(c)) else {
        d.audit("console", None, "console.login", "refused", json!({"reason": "unknown, used or expired code"}));
        return html(401, page_without_session().replace("Not logged in", "This login address was used or expired"));
    };
    d.audit("console", None, "console.login", "ok", json!({"session": s.label}));
    let mut r = redirect("/");
    r.headers.push((
        "Set-Cookie".into(),
        format!("{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}", guard::COOKIE, guard::LIFETIME.as_secs()),
    ));
    r
}

/// The pages.
fn read(d: &Arc<Daemon>, s: &Session, segs: &[&str], req: &Request) -> Result<Response, Error> {
    let body = match segs {
        [] => agents(d),
        ["agents", id] => agent(d, id)?,
        ["approvals"] => approvals(d, req.query("status"))?,
        ["approvals", id] => approval(d, s, id)?,
        ["usage"] => usage(d, req.query("by"))?,
        ["schedule"] => schedule(d)?,
        ["sessions"] => sessions(d)?,
        ["logs"] => logs(d, req)?,
        ["agents", id, "tools"] => tools(d, id)?,
        ["agents", id, "skills"] => skills(d, id)?,
        ["audit"] => audit(d)?,
        ["kill-switch"] => kill_switch_page(d, s),
        ["events"] => return super::live::stream(d),
        _ => return Err(Error::NotFound(format!("no page {}", crate::http::printable(&req.path)))),
    };
    let title = match segs.first() {
        None => "Agents".to_owned(),
        Some(first) => {
            let mut t = first.replace('-', " ");
            t[..1].make_ascii_uppercase();
            t
        }
    };
    Ok(html(200, page(&title, &s.csrf, d.kill_switch(), &body)))
}

/// The writes: each checks the form's CSRF token first.
fn write(
    d: &Arc<Daemon>,
    guard: &Guard,
    id: &str,
    s: &Session,
    segs: &[&str],
    req: &Request,
) -> Result<Response, Error> {
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&req.body).into_owned().collect();
    let field = |k: &str| form.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
    if !field("csrf").is_some_and(|t| guard::same(t, &s.csrf)) {
        d.audit("console", None, "console.write", "refused", json!({"session": s.label, "reason": "csrf"}));
        return Err(Error::Forbidden(guard::Refusal::Csrf.answer().1.into()));
    }
    let by = format!("console:{}", s.label);
    match segs {
        ["approvals", pid, verb @ ("approve" | "reject")] => {
            let pid: i64 = pid.parse().map_err(|_| Error::NotFound("no such approval".into()))?;
            let sha = field("sha256").unwrap_or_default();
            if *verb == "approve" {
                d.approve(pid, &ApproveRequest { sha256: Some(sha.to_owned()), by: Some(by), ..Default::default() })?;
            } else {
                // A rejection is bound to what was shown too.
                let shown = d.approval(pid)?;
                if !guard::same(&shown.info.sha256, sha) {
                    return Err(Error::Conflict(format!(
                        "approval {pid} is not what the page showed (sha256 differs): reload it"
                    )));
                }
                let reason = field("reason").filter(|r| !r.trim().is_empty()).unwrap_or("rejected in the console");
                d.reject(pid, reason, Some(by.as_str()))?;
            }
            Ok(redirect(&format!("/approvals/{pid}")))
        }
        ["kill-switch"] => {
            if field("confirm") != Some("yes") {
                return Err(Error::Malformed("tick the confirmation to switch it".into()));
            }
            let on = field("on") == Some("1");
            d.set_kill_switch(on, &by)?;
            Ok(redirect("/"))
        }
        ["logout"] => {
            guard.end(id);
            d.audit("console", None, "console.logout", "ok", json!({"session": s.label}));
            let mut r = redirect("/login");
            r.headers.push((
                "Set-Cookie".into(),
                format!("{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0", guard::COOKIE),
            ));
            Ok(r)
        }
        _ => Err(Error::NotFound("nothing to do there".into())),
    }
}

fn agents(d: &Daemon) -> String {
    let rows: Vec<Vec<String>> = d
        .summaries_now()
        .iter()
        .map(|a| {
            let lanes: Vec<String> = a
                .lanes
                .iter()
                .map(|l| {
                    let detail = l.detail.as_deref().map(|x| format!(" — {}", esc(x))).unwrap_or_default();
                    format!("{} {} · {} steps · {} tokens{detail}", esc(&l.lane), esc(&l.state), l.steps, l.tokens)
                })
                .collect();
            vec![
                format!("<a href=\"/agents/{0}\">{0}</a>", esc(&a.id)),
                format!("<span data-agent-state=\"{}\">{}</span>", esc(&a.id), esc(&a.state)),
                esc(&a.runtime),
                format!("<span data-agent-lanes=\"{}\">{}</span>", esc(&a.id), lanes.join("<br>")),
                a.replicated_seq.to_string(),
            ]
        })
        .collect();
    format!(
        "{}<h2>Live</h2><ol id=\"live\" class=\"live\"></ol>",
        table(&["agent", "state", "runtime", "lanes", "events"], &rows)
    )
}

fn agent(d: &Daemon, id: &str) -> Result<String, Error> {
    let a = d.summary_now(id)?;
    let agent = d.known_agent(id)?;
    let head = a.replicated_seq.saturating_sub(50);
    let events = d.store.events(&agent, head, 50)?;
    let rows: Vec<Vec<String>> = events
        .iter()
        .rev()
        .map(|e| {
            vec![
                e.seq.to_string(),
                esc(&e.lane),
                esc(&format!("{:?}", e.kind)),
                esc(&e.tool),
                esc(&choir_common::text::clipped(&e.input.to_string(), 200)),
                esc(&format!("{:?}", e.outcome).chars().take(200).collect::<String>()),
            ]
        })
        .collect();
    Ok(format!(
        "<p>{} · {} · session {} · <a href=\"/agents/{id}/tools\">tools</a> · <a href=\"/agents/{id}/skills\">skills</a></p>\
         <h2>Commit log (last 50)</h2>{}",
        esc(&a.state),
        esc(&a.runtime),
        a.session_id.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
        table(&["seq", "lane", "kind", "tool", "input", "outcome"], &rows),
        id = esc(&a.id),
    ))
}

fn approvals(d: &Daemon, status: Option<&str>) -> Result<String, Error> {
    let status = status.unwrap_or("pending");
    let list = d.approvals(Some(status), None)?;
    let rows: Vec<Vec<String>> = list
        .approvals
        .iter()
        .map(|a| {
            vec![
                format!("<a href=\"/approvals/{0}\">{0}</a>", a.id),
                esc(&a.agent),
                esc(&a.kind),
                esc(&a.subject),
                esc(&a.status),
                esc(&a.created_at),
            ]
        })
        .collect();
    Ok(format!(
        "<p><a href=\"/approvals?status=pending\">pending</a> · <a href=\"/approvals?status=approved\">approved</a> · \
         <a href=\"/approvals?status=rejected\">rejected</a></p>{}",
        table(&["id", "agent", "kind", "subject", "status", "filed"], &rows)
    ))
}

fn approval(d: &Daemon, s: &Session, id: &str) -> Result<String, Error> {
    let id: i64 = id.parse().map_err(|_| Error::NotFound("no such approval".into()))?;
    let a = d.approval(id)?;
    let i = &a.info;
    let mut out = format!(
        "<dl><dt>agent</dt><dd>{}</dd><dt>kind</dt><dd>{}</dd><dt>subject</dt><dd>{}</dd>\
         <dt>reason given</dt><dd>{}</dd><dt>status</dt><dd id=\"status\">{}</dd><dt>sha256</dt><dd><code>{}</code></dd></dl>\
         <h2>Exactly what would change</h2><pre class=\"diff\">{}</pre>\
         <details><summary>The proposal as filed</summary><pre>{}</pre></details>",
        esc(&i.agent),
        esc(&i.kind),
        esc(&i.subject),
        esc(&i.reason),
        esc(&i.status),
        esc(&i.sha256),
        esc(&a.diff),
        esc(&serde_json::to_string_pretty(&a.content).unwrap_or_default()),
    );
    if let Some(r) = &i.rollout {
        let lines: Vec<String> = r.lines.iter().map(|l| esc(l)).collect();
        out.push_str(&format!(
            "<h2>Rollout: <span id=\"rollout\">{}</span></h2><pre class=\"rollout\">{}</pre>{}",
            esc(&r.state),
            lines.join("\n"),
            r.outcome.as_deref().map(|o| format!("<p>{}</p>", esc(o))).unwrap_or_default()
        ));
    }
    if !i.intact {
        out.push_str("<p class=\"error\">Its content no longer matches its sha256: it cannot be approved.</p>");
    }
    if i.status == "pending" {
        let hidden = format!(
            "<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"sha256\" value=\"{}\">",
            esc(&s.csrf),
            esc(&i.sha256)
        );
        out.push_str(&format!(
            "<div class=\"decide\"><form method=\"post\" action=\"/approvals/{id}/approve\">{hidden}\
             <button id=\"approve\" class=\"go\">Approve</button></form>\
             <form method=\"post\" action=\"/approvals/{id}/reject\">{hidden}\
             <input name=\"reason\" placeholder=\"why (optional)\" maxlength=\"500\">\
             <button id=\"reject\" class=\"danger\">Reject</button></form></div>"
        ));
    } else {
        out.push_str(&format!(
            "<p>Decided {} by {}.</p>",
            esc(i.decided_at.as_deref().unwrap_or("-")),
            esc(i.decided_by.as_deref().unwrap_or("-"))
        ));
    }
    Ok(out)
}

fn usage(d: &Daemon, by: Option<&str>) -> Result<String, Error> {
    use crate::store::usage::UsageBy;
    let mut out = String::from(
        "<p>By <a href=\"/usage?by=day\">day</a> · <a href=\"/usage?by=agent\">agent</a> · \
         <a href=\"/usage?by=model\">model</a> · <a href=\"/usage?by=job\">job</a></p>",
    );
    let by_name = by.unwrap_or("day");
    let by = UsageBy::parse(by_name).ok_or_else(|| Error::Malformed("by: day, agent, model or job".into()))?;
    let report = d.store.usage(None, None, by)?;
    let tokens: Vec<(String, f64)> =
        report.rows.iter().map(|r| (r.key.clone(), (r.prompt_tokens + r.completion_tokens) as f64)).collect();
    let cost: Vec<(String, f64)> = report.rows.iter().map(|r| (r.key.clone(), r.cost_usd.unwrap_or(0.0))).collect();
    out.push_str(&super::plot::bars(&format!("tokens per {by_name}"), &tokens, |v| format!("{v:.0}")));
    out.push_str(&super::plot::bars(&format!("cost (USD) per {by_name}"), &cost, |v| format!("{v:.4}")));
    Ok(out)
}

/// Each job with its next firing and its last one (state and when).
fn schedule(d: &Daemon) -> Result<String, Error> {
    let jobs = d.schedule_list(None)?.jobs;
    let lasts = d.store.last_firings(&jobs.iter().map(|j| j.id).collect::<Vec<_>>())?;
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let when = match (&j.spec.cron, j.spec.every_s) {
                (Some(cron), _) => format!("{cron} ({})", j.spec.tz.as_deref().unwrap_or("UTC")),
                (None, Some(s)) => format!("every {s} s"),
                (None, None) => "-".into(),
            };
            let last =
                lasts.get(&j.id).map_or_else(|| "never".into(), |f| format!("{} · {}", f.scheduled_for, f.state));
            let paused = if j.paused {
                format!("paused: {}", esc(j.paused_reason.as_deref().unwrap_or("")))
            } else {
                "no".into()
            };
            vec![
                esc(&j.agent),
                esc(&j.spec.name),
                esc(&when),
                esc(j.next_due.as_deref().unwrap_or("-")),
                esc(&last),
                paused,
                j.failures.to_string(),
            ]
        })
        .collect();
    Ok(table(&["agent", "job", "when", "next", "last", "paused", "failures in a row"], &rows))
}

fn sessions(d: &Daemon) -> Result<String, Error> {
    let rows: Vec<Vec<String>> = d
        .store
        .sessions(None, 100)?
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                esc(&r.agent),
                esc(&r.runtime),
                esc(&r.started_at),
                esc(r.ended_at.as_deref().unwrap_or("running")),
                esc(r.end_reason.as_deref().unwrap_or("")),
                r.commits.to_string(),
                r.tokens.to_string(),
            ]
        })
        .collect();
    Ok(table(&["session", "agent", "runtime", "started", "ended", "why", "commits", "tokens"], &rows))
}

/// The log, newest last, filtered as the form asks (a GET form: nothing changes).
fn logs(d: &Daemon, req: &Request) -> Result<String, Error> {
    let q = |k: &str| req.query(k).filter(|v| !v.is_empty());
    let query = crate::logs::query::LogQuery::parse(q("agent"), q("since"), q("level"), q("grep"), Some("200"))?;
    let page = d.log_page(&query);
    let value = |k: &str| esc(q(k).unwrap_or(""));
    let mut out = format!(
        "<form method=\"get\" action=\"/logs\" class=\"filters\">\
         <input name=\"agent\" placeholder=\"agent\" value=\"{}\" maxlength=\"64\">\
         <input name=\"level\" placeholder=\"level (warn, info…)\" value=\"{}\" maxlength=\"8\">\
         <input name=\"since\" placeholder=\"since (1h, 2026-11-28…)\" value=\"{}\" maxlength=\"40\">\
         <input name=\"grep\" placeholder=\"text\" value=\"{}\" maxlength=\"200\"> <button>Filter</button></form>",
        value("agent"),
        value("level"),
        value("since"),
        value("grep")
    );
    let rows: Vec<Vec<String>> = page
        .records
        .iter()
        .map(|r| vec![esc(&r.ts), esc(&r.level), esc(&r.component), esc(r.agent.as_deref().unwrap_or("")), esc(&r.msg)])
        .collect();
    out.push_str(&table(&["at", "level", "from", "agent", "message"], &rows));
    if page.truncated {
        out.push_str("<p>The newest 200 shown; narrow the filter for older ones.</p>");
    }
    Ok(out)
}

fn tools(d: &Daemon, id: &str) -> Result<String, Error> {
    let agent = d.known_agent(id)?;
    let list = crate::tool_list::list(d.shared(), &d.host_tools, &agent)?;
    let rows: Vec<Vec<String>> = list
        .tools
        .iter()
        .map(|t| {
            vec![
                esc(&t.name),
                esc(&t.kind),
                esc(&t.status),
                esc(t.why.as_deref().unwrap_or("")),
                esc(&t.runs),
                esc(&t.source),
            ]
        })
        .collect();
    Ok(table(&["tool", "kind", "status", "why", "runs", "from"], &rows))
}

/// The agent's skills with their status, as `choirctl skills list` shows them.
fn skills(d: &Daemon, id: &str) -> Result<String, Error> {
    let agent = d.known_agent(id)?;
    let (_, list) = crate::skill_list::of_agent(d.shared(), &d.host_tools, &agent)?;
    let rows: Vec<Vec<String>> = list
        .skills
        .iter()
        .map(|s| {
            vec![
                esc(&s.name),
                esc(&s.status),
                esc(s.why.as_deref().unwrap_or("")),
                esc(&s.source),
                s.states.to_string(),
                esc(&s.description),
                esc(&s.file),
            ]
        })
        .collect();
    Ok(table(&["skill", "status", "why", "from", "states", "what for", "file"], &rows))
}

fn audit(d: &Daemon) -> Result<String, Error> {
    let rows: Vec<Vec<String>> = d
        .store
        .audit_rows(None, 100)?
        .iter()
        .map(|r| {
            let f = |k: &str| esc(&r[k].as_str().map(str::to_owned).unwrap_or_else(|| r[k].to_string()));
            vec![
                f("at"),
                f("actor"),
                f("agent_id"),
                f("action"),
                f("outcome"),
                esc(&choir_common::text::clipped(&r["detail"].to_string(), 200)),
            ]
        })
        .collect();
    Ok(table(&["at", "actor", "agent", "action", "outcome", "detail"], &rows))
}

fn kill_switch_page(d: &Daemon, s: &Session) -> String {
    let on = d.kill_switch();
    let (next, label) = if on { ("0", "Switch it OFF") } else { ("1", "Switch it ON") };
    format!(
        "<p>The kill switch is <strong>{}</strong>. When on, agents run no tool that acts on the outside world.</p>\
         <form method=\"post\" action=\"/kill-switch\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"on\" value=\"{next}\"><label><input type=\"checkbox\" name=\"confirm\" value=\"yes\"> \
         I mean it</label> <button class=\"danger\" id=\"kill\">{label}</button></form>",
        if on { "ON" } else { "off" },
        esc(&s.csrf)
    )
}
