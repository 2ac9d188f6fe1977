//! The admin API (R-RPC-4), served only on `socks/choird.sock` (0600): what
//! choirctl talks to. Every state-changing call is audited with actor `admin`.
//!
//! A request's route is decided once, at admission, from its head
//! ([`request::AdminRequest::parse`]); [`handle`] only dispatches it to the
//! resource's handler: agents' lifecycle and conversation ([`agents`]), their
//! memory ([`memory`]), and the daemon's own state ([`operations`]). The
//! short ones are answered inline here.

mod agents;
mod memory;
mod operations;
pub mod request;
mod stream;

use choir_common::admin::{ApproveRequest, CancelRequest, RejectRequest};

use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::{Request, Response};
pub use request::AdminRequest;

/// Answers one admitted `/admin/v1/...` request.
pub fn handle(
    d: &std::sync::Arc<Daemon>,
    tg: &crate::telegram::Handle,
    console: &std::sync::Arc<crate::console::Console>,
    route: AdminRequest,
    req: &Request,
) -> Result<Response, Error> {
    use AdminRequest as R;
    match route {
        R::ConsoleOpen => {
            let body: serde_json::Value = req.json()?;
            let port = body["port"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| Error::Malformed("send {\"port\": N}, the loopback port you forward".into()))?;
            Ok(Response::ok(&console.open(d, port)?))
        }
        R::ConsoleRevoke => Ok(Response::ok(&serde_json::json!({"ended": console.revoke(d)}))),
        R::Console => {
            let (listening, sessions) = console.state();
            Ok(Response::ok(&serde_json::json!({"listening": listening, "sessions": sessions})))
        }
        R::Status => Ok(Response::ok(&operations::status(d))),
        R::Prune => Ok(Response::ok(&d.prune()?)),
        R::Resume => Ok(Response::ok(&serde_json::json!({"done": d.resume("admin")?}))),
        R::Reload => {
            let report = d.request_reload()?;
            d.audit(
                "admin",
                None,
                "config.reload",
                if report.refused.is_some() { "refused" } else { "ok" },
                serde_json::json!(report),
            );
            Ok(Response::ok(&report))
        }
        R::KillSwitch => operations::kill_switch(d, req),
        R::ReloadPolicies => Ok(Response::ok(&operations::reload_policies(d))),
        R::Backup => operations::backup(d, req),
        R::Agents => Ok(Response::ok(&choir_common::admin::AgentList { agents: d.summaries_now() })),
        R::Agent { id } => Ok(Response::ok(&d.summary_now(&id)?)),
        R::Start { id } => Ok(Response::ok(&d.start_agent(&id, "admin")?)),
        R::Stop { id } => Ok(Response::ok(&d.stop_agent(&id, "admin")?)),
        R::Image { id, action } => agents::image(d, &id, action),
        R::Chat { id } => agents::chat(d, &id, req),
        R::Events { agent, after, limit } => agents::events(d, &agent, after, limit),
        R::Cancel { id } => {
            let r: CancelRequest = req.json()?;
            d.cancel_lane(&id, &r.lane, "admin")?;
            Ok(Response::ok(&serde_json::json!({"cancel": r.lane})))
        }
        R::Tools { agent } => Ok(Response::ok(&crate::tool_list::list(d.shared(), &d.host_tools, &agent)?)),
        R::Mcp { agent } => Ok(Response::ok(&crate::tool_list::mcp(d.shared(), &agent)?)),
        R::McpCheck { agent, server } => Ok(Response::ok(&crate::tool_list::mcp_check(d.shared(), &agent, &server)?)),
        R::McpRefresh { agent, server } => {
            let found = d.host_tools.refresh_own(&agent, &server)?;
            Ok(Response::ok(&serde_json::json!({"server": server, "found": found})))
        }
        R::Skills { agent } => Ok(Response::ok(&crate::skill_list::of_agent(d.shared(), &d.host_tools, &agent)?.1)),
        R::AddReviewed { id } => {
            let r: choir_common::admin::AddRequest = req.json()?;
            Ok(Response::ok(&d.add_reviewed(&id, &r)?))
        }
        R::CheckTool { agent, tool } => {
            let said = d.host_tools.check(&agent, &tool)?;
            Ok(Response::ok(&serde_json::json!({"tool": tool, "ok": true, "said": said})))
        }
        R::ToolPolicy { id } => {
            let agent = d.known_agent(&id)?;
            Ok(Response::ok(&d.config().agents.get(&agent).map(|a| a.tools.clone()).unwrap_or_default()))
        }
        R::SetToolPolicy { id } => {
            let policy: choir_common::tool_policy::ToolPolicy = req.json()?;
            let force = matches!(req.query("force"), Some("1" | "true"));
            Ok(Response::ok(&d.set_tool_policy(&id, &policy, force)?))
        }
        R::ArgumentPolicy { id } => Ok(Response::ok(&*d.argument_policy(&d.known_agent(&id)?))),
        R::TestPolicy { id } => {
            let agent = d.known_agent(&id)?;
            let t: choir_common::admin::PolicyTest = req.json()?;
            let runtime = crate::arg_policies::runtime_of(&d.home, &d.host_tools, &agent, &t.tool);
            Ok(Response::ok(&crate::arg_policies::test(&d.argument_policy(&agent), runtime.as_ref(), &t)?))
        }
        R::Memory { id, read } => memory::read(d, &id, read),
        R::ScheduleAdd { id } => {
            let spec: choir_common::schedule::JobSpec = req.json()?;
            Ok(Response::ok(&d.schedule_add(&id, &spec, "admin")?))
        }
        R::ScheduleShow { id, name } => Ok(Response::ok(&d.schedule_show(&id, &name)?)),
        R::ScheduleRemove { id, name } => {
            d.schedule_remove(&id, &name)?;
            Ok(Response::ok(&serde_json::json!({"removed": name})))
        }
        R::SchedulePause { id, name, pause } => Ok(Response::ok(&d.schedule_pause(&id, &name, pause)?)),
        R::ScheduleRunNow { id, name } => {
            d.schedule_run_now(&id, &name)?;
            Ok(Response::ok(&serde_json::json!({"due": name})))
        }
        R::Schedule { agent } => Ok(Response::ok(&d.schedule_list(agent.as_deref())?)),
        R::Sessions { agent, limit } => {
            let sessions = d.store.sessions(agent.as_ref(), limit)?;
            Ok(Response::ok(&choir_common::admin::SessionList { sessions }))
        }
        R::Logs { query, follow } => operations::logs(d, query, follow),
        R::Usage { agent, since, by } => {
            let agent = agent.map(|a| d.known_agent(&a)).transpose()?;
            Ok(Response::ok(&d.store.usage(agent.as_ref().map(|a| a.as_str()), since.as_deref(), by)?))
        }
        R::Audit { agent, limit } => {
            Ok(Response::ok(&serde_json::json!({"records": d.store.audit_rows(agent.as_ref(), limit)?})))
        }
        R::Secrets => Ok(Response::ok(&d.secret_list()?)),
        R::SetSecret { name } => {
            let r: choir_common::admin::SetSecret = req.json()?;
            Ok(Response::ok(&d.set_secret(&name, &r.value)?))
        }
        R::RemoveSecret { name } => Ok(Response::ok(&d.remove_secret(&name)?)),
        R::Approvals { status, agent } => Ok(Response::ok(&d.approvals(status.as_deref(), agent.as_deref())?)),
        R::Approval { id } => Ok(Response::ok(&d.approval(id)?)),
        R::Approve { id } => {
            let r: ApproveRequest = req.json()?;
            Ok(Response::ok(&d.approve(id, &r)?))
        }
        R::Reject { id } => {
            let r: RejectRequest = req.json()?;
            Ok(Response::ok(&d.reject(id, &r.reason, r.by.as_deref())?))
        }
        R::Telegram => Ok(Response::ok(&crate::telegram::status(tg)?)),
        R::Pairings { all } => Ok(Response::ok(&crate::telegram::pairing::list(tg, all)?)),
        R::Pair { bot, user } => {
            let r: choir_common::admin::PairDecision = req.json()?;
            let done = crate::telegram::pairing::decide(tg, &bot, user, r.approve, "admin")?;
            Ok(Response::ok(&serde_json::json!({"done": done})))
        }
    }
}
