//! An admin request, decided once from its head: `(method, path, query)`
//! parsed into one closed [`AdminRequest`] at admission, before any body
//! byte is read. An unknown route, a malformed id or a bad query parameter
//! is refused there with a message naming the fix; a handler only ever sees
//! a request whose route and parameters were already checked. The body type
//! of each route is named in its variant's doc and parsed by its handler.

use choir_common::ids::AgentId;

use crate::error::Error;
use crate::http::Head;
use crate::logs::query::LogQuery;
use crate::store::usage::UsageBy;

/// The image actions of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageAction {
    /// Build the agent's image.
    Build,
    /// Build it and roll the agent onto it.
    Update,
}

/// What `GET /admin/v1/agents/<id>/memory/<what>` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryRead {
    /// Counts and sizes.
    Stats,
    /// The `k` nearest memories to `q`.
    Search { q: String, k: i64 },
    /// Every memory, as JSON lines.
    Export,
}

/// Every admin route. One line of [`AdminRequest::parse`] per variant.
#[derive(Debug)]
pub enum AdminRequest {
    /// `GET status`.
    Status,
    /// `POST reload`: config.json and secrets.json again, as SIGHUP does.
    Reload,
    /// `POST resume`: end the hold after a restore.
    Resume,
    /// `POST prune`: remove the agent images no agent needs.
    Prune,
    /// `POST policy/kill-switch`, body `{"on": bool}`.
    KillSwitch,
    /// `POST policy/reload`.
    ReloadPolicies,
    /// `POST backup`, body `{"workspaces": bool}`.
    Backup,
    /// `GET agents`.
    Agents,
    /// `GET agents/<id>`.
    Agent { id: String },
    /// `POST agents/<id>/start`.
    Start { id: String },
    /// `POST agents/<id>/stop`.
    Stop { id: String },
    /// `POST agents/<id>/build|update`.
    Image { id: String, action: ImageAction },
    /// `POST agents/<id>/chat`, body [`choir_common::admin::ChatRequest`].
    Chat { id: String },
    /// `GET agents/<id>/events?after=&limit=`.
    Events { agent: AgentId, after: u64, limit: i64 },
    /// `POST agents/<id>/cancel`, body [`choir_common::admin::CancelRequest`].
    Cancel { id: String },
    /// `GET agents/<id>/tools`.
    Tools { agent: AgentId },
    /// `GET agents/<id>/skills`.
    Skills { agent: AgentId },
    /// `GET agents/<id>/mcp`.
    Mcp { agent: AgentId },
    /// `POST agents/<id>/mcp/<server>/check`.
    McpCheck { agent: AgentId, server: String },
    /// `POST agents/<id>/mcp/<server>/refresh`.
    McpRefresh { agent: AgentId, server: String },
    /// `POST agents/<id>/repos`, body [`choir_common::admin::AddRequest`].
    AddReviewed { id: String },
    /// `POST agents/<id>/tools/<tool>/check`.
    CheckTool { agent: AgentId, tool: String },
    /// `GET agents/<id>/policy/tools`.
    ToolPolicy { id: String },
    /// `PUT agents/<id>/policy/tools`, body [`choir_common::tool_policy::ToolPolicy`].
    SetToolPolicy { id: String },
    /// `GET agents/<id>/policy`.
    ArgumentPolicy { id: String },
    /// `POST agents/<id>/policy/test`, body [`choir_common::admin::PolicyTest`].
    TestPolicy { id: String },
    /// `GET agents/<id>/memory/stats|search|export`.
    Memory { id: String, read: MemoryRead },
    /// `POST agents/<id>/schedule`, body [`choir_common::schedule::JobSpec`].
    ScheduleAdd { id: String },
    /// `GET agents/<id>/schedule/<name>`.
    ScheduleShow { id: String, name: String },
    /// `DELETE agents/<id>/schedule/<name>`.
    ScheduleRemove { id: String, name: String },
    /// `POST agents/<id>/schedule/<name>/pause|resume`.
    SchedulePause { id: String, name: String, pause: bool },
    /// `POST agents/<id>/schedule/<name>/run-now`.
    ScheduleRunNow { id: String, name: String },
    /// `GET schedule?agent=`.
    Schedule { agent: Option<String> },
    /// `GET sessions?agent=&limit=`.
    Sessions { agent: Option<AgentId>, limit: i64 },
    /// `GET logs?agent=&since=&level=&grep=&limit=&follow=`.
    Logs { query: LogQuery, follow: bool },
    /// `GET usage?agent=&since=&by=`.
    Usage { agent: Option<String>, since: Option<String>, by: UsageBy },
    /// `GET audit?agent=&limit=`.
    Audit { agent: Option<AgentId>, limit: i64 },
    /// `GET secrets`.
    Secrets,
    /// `PUT secrets/<name>`, body [`choir_common::admin::SetSecret`].
    SetSecret { name: String },
    /// `DELETE secrets/<name>`.
    RemoveSecret { name: String },
    /// `GET approvals?status=&agent=`.
    Approvals { status: Option<String>, agent: Option<String> },
    /// `GET approvals/<id>`.
    Approval { id: i64 },
    /// `POST approvals/<id>/approve`, body [`choir_common::admin::ApproveRequest`].
    Approve { id: i64 },
    /// `POST approvals/<id>/reject`, body [`choir_common::admin::RejectRequest`].
    Reject { id: i64 },
    /// `GET telegram`.
    Telegram,
    /// `GET telegram/pairings?all=1`.
    Pairings { all: bool },
    /// `POST telegram/pairings/<bot>/<user>`, body [`choir_common::admin::PairDecision`].
    Pair { bot: String, user: i64 },
    /// `POST console/open`, body `{"port": N}`: the console's listener
    /// started and a one-time login code for a forwarder on loopback `port`.
    ConsoleOpen,
    /// `POST console/revoke`: every console session ended.
    ConsoleRevoke,
    /// `GET console`: whether it listens, and its sessions.
    Console,
}

impl AdminRequest {
    /// The request `head` asks for, or why there is none. `head.path` starts
    /// with `/admin/`.
    pub fn parse(head: &Head) -> Result<AdminRequest, Error> {
        use AdminRequest as R;
        let q = |key: &str| head.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let owned = |key: &str| q(key).map(str::to_owned);
        let rest = head.path.strip_prefix("/admin/v1/").unwrap_or("");
        let parts: Vec<&str> = rest.split('/').collect();
        let s = |v: &str| v.to_owned();
        Ok(match (head.method.as_str(), parts.as_slice()) {
            ("GET", ["status"]) => R::Status,
            ("POST", ["reload"]) => R::Reload,
            ("POST", ["resume"]) => R::Resume,
            ("POST", ["prune"]) => R::Prune,
            ("POST", ["policy", "kill-switch"]) => R::KillSwitch,
            ("POST", ["policy", "reload"]) => R::ReloadPolicies,
            ("POST", ["backup"]) => R::Backup,
            ("GET", ["agents"]) => R::Agents,
            ("GET", ["agents", id]) => R::Agent { id: s(id) },
            ("POST", ["agents", id, "start"]) => R::Start { id: s(id) },
            ("POST", ["agents", id, "stop"]) => R::Stop { id: s(id) },
            ("POST", ["agents", id, "build"]) => R::Image { id: s(id), action: ImageAction::Build },
            ("POST", ["agents", id, "update"]) => R::Image { id: s(id), action: ImageAction::Update },
            ("POST", ["agents", id, "chat"]) => R::Chat { id: s(id) },
            ("GET", ["agents", id, "events"]) => R::Events {
                agent: agent_id(id)?,
                after: number(q("after"), 0)?,
                limit: number::<i64>(q("limit"), 1000)?.clamp(1, 10_000),
            },
            ("POST", ["agents", id, "cancel"]) => R::Cancel { id: s(id) },
            ("GET", ["agents", id, "tools"]) => R::Tools { agent: agent_id(id)? },
            ("GET", ["agents", id, "mcp"]) => R::Mcp { agent: agent_id(id)? },
            ("POST", ["agents", id, "mcp", server, "check"]) => R::McpCheck { agent: agent_id(id)?, server: s(server) },
            ("POST", ["agents", id, "mcp", server, "refresh"]) => {
                R::McpRefresh { agent: agent_id(id)?, server: s(server) }
            }
            ("GET", ["agents", id, "skills"]) => R::Skills { agent: agent_id(id)? },
            ("POST", ["agents", id, "repos"]) => R::AddReviewed { id: s(id) },
            ("POST", ["agents", id, "tools", tool, "check"]) => R::CheckTool { agent: agent_id(id)?, tool: s(tool) },
            ("GET", ["agents", id, "policy", "tools"]) => R::ToolPolicy { id: s(id) },
            ("PUT", ["agents", id, "policy", "tools"]) => R::SetToolPolicy { id: s(id) },
            ("GET", ["agents", id, "policy"]) => R::ArgumentPolicy { id: s(id) },
            ("POST", ["agents", id, "policy", "test"]) => R::TestPolicy { id: s(id) },
            ("GET", ["agents", id, "memory", what]) => R::Memory { id: s(id), read: memory_read(what, &q)? },
            ("POST", ["agents", id, "schedule"]) => R::ScheduleAdd { id: s(id) },
            ("GET", ["agents", id, "schedule", name]) => R::ScheduleShow { id: s(id), name: s(name) },
            ("DELETE", ["agents", id, "schedule", name]) => R::ScheduleRemove { id: s(id), name: s(name) },
            ("POST", ["agents", id, "schedule", name, "pause"]) => {
                R::SchedulePause { id: s(id), name: s(name), pause: true }
            }
            ("POST", ["agents", id, "schedule", name, "resume"]) => {
                R::SchedulePause { id: s(id), name: s(name), pause: false }
            }
            ("POST", ["agents", id, "schedule", name, "run-now"]) => R::ScheduleRunNow { id: s(id), name: s(name) },
            ("GET", ["schedule"]) => R::Schedule { agent: owned("agent") },
            ("GET", ["sessions"]) => R::Sessions {
                agent: q("agent").map(agent_id).transpose()?,
                limit: number::<i64>(q("limit"), 50)?.clamp(1, 10_000),
            },
            ("GET", ["logs"]) => R::Logs {
                query: LogQuery::parse(q("agent"), q("since"), q("level"), q("grep"), q("limit"))?,
                follow: q("follow").is_some_and(|f| f != "0"),
            },
            ("GET", ["usage"]) => R::Usage {
                agent: owned("agent"),
                since: q("since").map(crate::logs::query::parse_since).transpose().map_err(Error::Malformed)?,
                by: usage_by(q("by").unwrap_or("day"))?,
            },
            ("GET", ["audit"]) => R::Audit {
                agent: q("agent").map(agent_id).transpose()?,
                limit: number::<i64>(q("limit"), 100)?.clamp(1, 10_000),
            },
            ("GET", ["secrets"]) => R::Secrets,
            ("PUT", ["secrets", name]) => R::SetSecret { name: s(name) },
            ("DELETE", ["secrets", name]) => R::RemoveSecret { name: s(name) },
            ("GET", ["approvals"]) => R::Approvals { status: owned("status"), agent: owned("agent") },
            ("GET", ["approvals", id]) => R::Approval { id: proposal_id(id)? },
            ("POST", ["approvals", id, "approve"]) => R::Approve { id: proposal_id(id)? },
            ("POST", ["approvals", id, "reject"]) => R::Reject { id: proposal_id(id)? },
            ("POST", ["console", "open"]) => R::ConsoleOpen,
            ("POST", ["console", "revoke"]) => R::ConsoleRevoke,
            ("GET", ["console"]) => R::Console,
            ("GET", ["telegram"]) => R::Telegram,
            ("GET", ["telegram", "pairings"]) => R::Pairings { all: q("all") == Some("1") },
            ("POST", ["telegram", "pairings", bot, user]) => R::Pair {
                bot: s(bot),
                user: user.parse().map_err(|_| Error::Malformed(format!("{user:?} is not a Telegram user id")))?,
            },
            _ => {
                return Err(Error::NotFound(format!(
                    "no admin endpoint {} {}",
                    crate::http::printable(&head.method),
                    crate::http::printable(&head.path)
                )))
            }
        })
    }
}

fn agent_id(s: &str) -> Result<AgentId, Error> {
    AgentId::parse(s).map_err(|e| Error::Malformed(e.to_string()))
}

fn proposal_id(s: &str) -> Result<i64, Error> {
    s.parse().map_err(|_| Error::Malformed(format!("{s:?} is not a proposal id (a number)")))
}

fn number<T: std::str::FromStr>(v: Option<&str>, default: T) -> Result<T, Error> {
    match v {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| Error::Malformed(format!("{s:?} is not a number"))),
    }
}

fn usage_by(by: &str) -> Result<UsageBy, Error> {
    UsageBy::parse(by)
        .ok_or_else(|| Error::Malformed(format!("cannot group usage by {by:?}; use day, model, lane, agent or job")))
}

fn memory_read<'a>(what: &str, q: &impl Fn(&str) -> Option<&'a str>) -> Result<MemoryRead, Error> {
    Ok(match what {
        "stats" => MemoryRead::Stats,
        "search" => MemoryRead::Search {
            q: q("q").ok_or_else(|| Error::Malformed("give the text to search: ?q=".into()))?.to_owned(),
            k: number(q("k"), 5)?,
        },
        "export" => MemoryRead::Export,
        other => return Err(Error::NotFound(format!("no memory endpoint {other:?}; use stats, search or export"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, target: &str) -> Head {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let query = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').map_or((p.to_owned(), String::new()), |(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        Head {
            method: method.into(),
            path: path.into(),
            query,
            bearer: None,
            content_length: 0,
            browser: Default::default(),
        }
    }

    fn refused(method: &str, target: &str) -> (u16, String) {
        match AdminRequest::parse(&head(method, target)) {
            Ok(r) => panic!("{method} {target} was admitted as {r:?}"),
            Err(e) => {
                let r = crate::http::Response::from(e);
                (r.status, String::from_utf8_lossy(&r.body).into_owned())
            }
        }
    }

    #[test]
    fn each_route_is_decided_once_with_its_parameters_parsed() {
        assert!(matches!(AdminRequest::parse(&head("GET", "/admin/v1/status")), Ok(AdminRequest::Status)));
        match AdminRequest::parse(&head("GET", "/admin/v1/agents/demo/events?after=7&limit=99999")).unwrap() {
            AdminRequest::Events { agent, after, limit } => {
                assert_eq!((agent.as_str(), after, limit), ("demo", 7, 10_000), "the limit is clamped");
            }
            other => panic!("{other:?}"),
        }
        match AdminRequest::parse(&head("POST", "/admin/v1/agents/demo/schedule/nightly/resume")).unwrap() {
            AdminRequest::SchedulePause { id, name, pause } => {
                assert_eq!((id.as_str(), name.as_str(), pause), ("demo", "nightly", false))
            }
            other => panic!("{other:?}"),
        }
        match AdminRequest::parse(&head("GET", "/admin/v1/agents/demo/memory/search?q=tea")).unwrap() {
            AdminRequest::Memory { read: MemoryRead::Search { q, k }, .. } => assert_eq!((q.as_str(), k), ("tea", 5)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            AdminRequest::parse(&head("GET", "/admin/v1/logs?follow=1")),
            Ok(AdminRequest::Logs { follow: true, .. })
        ));
        assert!(matches!(
            AdminRequest::parse(&head("GET", "/admin/v1/logs?follow=0")),
            Ok(AdminRequest::Logs { follow: false, .. })
        ));
    }

    #[test]
    fn a_bad_route_or_parameter_is_refused_from_the_head_saying_why() {
        assert_eq!(refused("GET", "/admin/v1/nothing").0, 404);
        assert_eq!(refused("DELETE", "/admin/v1/status").0, 404, "a known path with the wrong method");
        let (status, body) = refused("GET", "/admin/v1/agents/demo/events?after=x");
        assert_eq!(status, 400);
        assert!(body.contains("is not a number"), "{body}");
        let (status, body) = refused("GET", "/admin/v1/agents/Bad%20Id/tools");
        assert_eq!(status, 400, "{body}");
        let (status, body) = refused("POST", "/admin/v1/approvals/seven/approve");
        assert_eq!(status, 400);
        assert!(body.contains("proposal id"), "{body}");
        let (status, body) = refused("GET", "/admin/v1/usage?by=week");
        assert_eq!(status, 400);
        assert!(body.contains("use day, model, lane, agent or job"), "{body}");
        let (status, body) = refused("GET", "/admin/v1/agents/demo/memory/search");
        assert_eq!(status, 400);
        assert!(body.contains("?q="), "{body}");
        let (status, body) = refused("GET", "/admin/v1/agents/demo/memory/dump");
        assert_eq!(status, 404);
        assert!(body.contains("use stats, search or export"), "{body}");
        let (status, body) = refused("POST", "/admin/v1/telegram/pairings/bot/\u{1b}[2J");
        assert_eq!(status, 400);
        assert!(!body.contains('\u{1b}'), "a client's control characters are not echoed: {body}");
    }
}
