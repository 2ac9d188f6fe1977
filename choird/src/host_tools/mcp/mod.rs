//! MCP servers reached over Streamable HTTP: a host-tool family choird
//! runs for each agent whose repository pins such a server
//! (`mcp/<server>.json` with a `url`; [docs/mcp.md](../../../../docs/mcp.md)).
//! The agent is told of the pinned tools in INIT_HELLO like any host tool
//! and never connects to the server; choird does, through the agent's
//! egress policy, adding the server's credential (a choird secret) itself.
//!
//! choird decides for itself, as for a stdio server in the agent: it
//! compares the live catalog with the pins when a session opens and around
//! every call (a `tools/list` before and after it: a server's own
//! `list_changed` may travel on a stream choird does not hold open); a tool whose
//! entry no longer hashes to its pin is refused and taken out of the
//! agent's model requests by the relay (`Shared::mcp_disabled`), and the catalog is
//! filed for the operator's approval once per content. The result's text
//! has the credential masked.
//!
//! **Invariant:** a call reaches the server only for a tool whose live
//! entry matched its pin in this session, after the last `list_changed`.

pub mod http;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::commit::canonical_json;
use choir_common::ids::{wire_tool_name, AgentId};
use choir_common::manifest::ToolManifest;
use choir_common::mcp::{catalog_content, content_sha256, Entry, ServerFile};
use choir_common::rpc::{ApprovalRequest, ProposalKind, ProposalScope};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::error::Error;
use crate::host_tools::{HostCall, HostTool, PerAgentTools, ToolStatus};
use crate::shared::Shared;

/// The longest a call may take when its pin names no timeout.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Slot {
    session: Option<http::Session>,
    /// The sha256 of the server file the catalog was last compared with.
    checked_against: Option<String>,
    disabled: BTreeMap<String, String>,
    retry_at: Option<Instant>,
    failures: u32,
    last_error: Option<String>,
    filed: Option<String>,
}

/// An agent's server, by (agent, server name).
type SlotKey = (AgentId, String);

/// The HTTP servers of every agent, one session each.
pub struct McpHttp {
    shared: Arc<Shared>,
    slots: Mutex<HashMap<SlotKey, Arc<Mutex<Slot>>>>,
}

/// One pinned tool of one agent's HTTP server, as the registry runs it.
pub struct McpHttpTool {
    service: Arc<McpHttp>,
    agent: AgentId,
    file: ServerFile,
    tool: String,
    manifest: ToolManifest,
}

impl McpHttp {
    /// The service over `shared`.
    pub fn new(shared: Arc<Shared>) -> Arc<McpHttp> {
        Arc::new(McpHttp { shared, slots: Mutex::default() })
    }

    /// `agent`'s HTTP servers, as pinned now.
    fn servers(&self, agent: &AgentId) -> Vec<ServerFile> {
        crate::mcp_pins::servers(&self.shared.home, agent)
            .into_iter()
            .filter_map(|(_, f)| f.ok())
            .filter(|f| f.server.is_http())
            .collect()
    }

    /// Every pinned tool of `agent`'s HTTP servers, with its manifest.
    pub fn served(&self, agent: &AgentId) -> Vec<(String, Option<ToolManifest>)> {
        self.servers(agent).iter().flat_map(|f| f.manifests()).map(|(_, m)| (m.llm.name.clone(), Some(m))).collect()
    }

    /// The tool `name` of `agent`, if one of its HTTP servers pins it.
    pub fn tool(self: &Arc<Self>, agent: &AgentId, name: &str) -> Option<McpHttpTool> {
        self.servers(agent).into_iter().find_map(|file| {
            let (tool, manifest) = file.manifests().into_iter().find(|(_, m)| m.llm.name == name)?;
            Some(McpHttpTool { service: self.clone(), agent: agent.clone(), file, tool, manifest })
        })
    }

    /// Checks each of `agent`'s HTTP servers now, each on a thread of its
    /// own (INIT_HELLO): drift is found and new tools filed before a call.
    pub fn prepare(self: &Arc<Self>, agent: &AgentId) {
        for file in self.servers(agent) {
            let (service, id) = (self.clone(), agent.clone());
            let name = format!("mcp-check-{}", file.server.name);
            // A task thread: joined at shutdown, bounded by its deadline.
            let spawned = self.shared.tasks.spawn(name, move || {
                if let Err(e) = service.checked(&id, &file, Instant::now() + DEFAULT_DEADLINE) {
                    log::warn!("agent {id}: MCP server {}: {e}", file.server.name);
                }
            });
            if let Err(e) = spawned {
                log::warn!("agent {agent}: no thread to check an MCP server: {e}");
            }
        }
    }

    fn slot(&self, agent: &AgentId, server: &str) -> Arc<Mutex<Slot>> {
        self.slots.lock().entry((agent.clone(), server.to_owned())).or_default().clone()
    }

    /// Runs `checked` under the server's slot, then a call.
    fn call(
        &self,
        agent: &AgentId,
        file: &ServerFile,
        tool: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<Value, Error> {
        let server = &file.server.name;
        let slot = self.slot(agent, server);
        let mut st = slot
            .try_lock_until(deadline)
            .ok_or_else(|| Error::Timeout(format!("MCP server {server} is busy for another call")))?;
        self.check_locked(agent, file, &mut st, deadline, true)?;
        if let Some(why) = st.disabled.get(tool) {
            return Err(Error::Forbidden(why.clone()));
        }
        let params = json!({"name": tool, "arguments": input});
        let Some(session) = st.session.as_mut() else {
            return Err(Error::Unavailable(format!("MCP server {server} has no session")));
        };
        let answer = session.request("tools/call", params.clone(), deadline);
        let answer = match answer {
            // An expired session never ran the call: open a new one, once.
            Err(e) if e.contains("session expired") => {
                st.session = None;
                self.check_locked(agent, file, &mut st, deadline, true)?;
                match st.session.as_mut() {
                    Some(s) => s.request("tools/call", params, deadline),
                    None => Err(e),
                }
            }
            other => other,
        };
        let info = st.session.as_ref().map(|s| s.info.clone()).unwrap_or(Value::Null);
        let pin = file.tools.get(tool).map_or("", |p| p.sha256.as_str());
        match answer {
            Ok(result) => {
                let shaped = choir_common::mcp_result::shape(server, tool, &info, pin, result);
                // A list changed meanwhile is found now, before the agent's
                // next model request (a server's own notification may come
                // on a stream choird does not hold open).
                if let Err(e) = self.check_locked(agent, file, &mut st, Instant::now() + DEFAULT_DEADLINE, true) {
                    log::warn!("agent {agent}: MCP server {server}: {e}");
                }
                Ok(self.masked(file, shaped))
            }
            Err(e) => {
                if e.contains("in time") || e.contains("could not be reached") || e.contains("broke off") {
                    st.session = None;
                }
                let message = format!("MCP server {server}: {tool}: {e}");
                Err(if e.contains("in time") { Error::Timeout(message) } else { Error::Upstream(message) })
            }
        }
    }

    /// The credential is never in what goes back.
    fn masked(&self, file: &ServerFile, mut v: Value) -> Value {
        let Some(secret) =
            file.server.auth_secret.as_deref().and_then(|n| self.shared.secrets().get(n).map(str::to_owned))
        else {
            return v;
        };
        fn walk(v: &mut Value, secret: &str) {
            match v {
                Value::String(s) if secret.len() >= 4 && s.contains(secret) => *s = s.replace(secret, "[REDACTED]"),
                Value::Array(a) => a.iter_mut().for_each(|x| walk(x, secret)),
                Value::Object(o) => o.values_mut().for_each(|x| walk(x, secret)),
                _ => {}
            }
        }
        walk(&mut v, &secret);
        v
    }

    /// Opens, lists and compares, under the slot's lock of its own.
    fn checked(&self, agent: &AgentId, file: &ServerFile, deadline: Instant) -> Result<(), Error> {
        let slot = self.slot(agent, &file.server.name);
        let mut st = slot.try_lock_until(deadline).ok_or_else(|| Error::Timeout("busy".into()))?;
        self.check_locked(agent, file, &mut st, deadline, false)
    }

    /// Makes sure the session is open and its catalog compared with the pins
    /// as they are now; `always`: compared again even if nothing says it
    /// changed (around every call: one `tools/list` before, one after).
    fn check_locked(
        &self,
        agent: &AgentId,
        file: &ServerFile,
        st: &mut Slot,
        deadline: Instant,
        always: bool,
    ) -> Result<(), Error> {
        let server = &file.server.name;
        let pins = content_sha256(&canonical_json(&serde_json::to_value(file).unwrap_or_default()));
        let stale = always || st.session.as_ref().is_none_or(|s| s.stale);
        if !stale && st.checked_against.as_deref() == Some(pins.as_str()) {
            return Ok(());
        }
        if st.session.is_none() {
            if let Some(at) = st.retry_at.filter(|at| *at > Instant::now()) {
                return Err(Error::Unavailable(format!(
                    "MCP server {server} failed ({}); it is tried again in {} s",
                    st.last_error.clone().unwrap_or_default(),
                    at.saturating_duration_since(Instant::now()).as_secs().max(1)
                )));
            }
            match self.open(agent, file, deadline) {
                Ok(s) => {
                    st.session = Some(s);
                    st.failures = 0;
                    st.retry_at = None;
                }
                Err(e) => {
                    st.failures = st.failures.saturating_add(1);
                    let backoff =
                        Duration::from_secs(1 << st.failures.saturating_sub(1).min(6)).min(Duration::from_secs(60));
                    st.retry_at = Some(Instant::now() + backoff);
                    st.last_error = Some(e.clone());
                    return Err(Error::Upstream(format!("MCP server {server}: {e}")));
                }
            }
        }
        let Some(session) = st.session.as_mut() else { return Ok(()) };
        session.stale = false;
        let listed = list(session, deadline);
        let entries = match listed {
            Ok(e) => e,
            Err(e) => {
                st.session = None;
                return Err(Error::Upstream(format!("MCP server {server}: listing its tools: {e}")));
            }
        };
        self.verify(agent, file, st, &entries);
        st.checked_against = Some(pins);
        Ok(())
    }

    fn open(&self, agent: &AgentId, file: &ServerFile, deadline: Instant) -> Result<http::Session, String> {
        open_session(&self.shared.config(), &self.shared.secrets(), agent, file, deadline)
    }

    /// Compares the live catalog with the pins; files what differs.
    fn verify(&self, agent: &AgentId, file: &ServerFile, st: &mut Slot, live: &[Entry]) {
        let server = &file.server.name;
        let c = choir_common::mcp::compare(file, live);
        // The relay leaves switched-off tools out of the agent's model requests.
        {
            let mut off = self.shared.mcp_disabled.write();
            let set = off.entry(agent.clone()).or_default();
            for (tool, m) in file.manifests() {
                let wire = wire_tool_name(&m.llm.name);
                if c.off.contains_key(&tool) {
                    set.insert(wire);
                } else {
                    set.remove(&wire);
                }
            }
        }
        st.disabled = c.off.clone();
        if !c.differs() {
            return;
        }
        let content = catalog_content(server, live);
        let sha = content_sha256(&canonical_json(&content));
        if st.filed.as_deref() == Some(sha.as_str()) {
            return;
        }
        match self.file_catalog(agent, content) {
            Ok(id) => {
                log::info!("agent {agent}: MCP server {server}'s catalog waits for approval as proposal {id}");
                st.filed = Some(sha);
            }
            Err(e) => log::warn!("agent {agent}: MCP server {server}: its catalog could not be filed: {e}"),
        }
    }

    /// Files a catalog as choird's own proposal for the agent.
    fn file_catalog(&self, agent: &AgentId, content: Value) -> Result<i64, Error> {
        let req = ApprovalRequest {
            kind: ProposalKind::Mcp,
            scope: ProposalScope::Agent,
            content,
            reason: "choird found tools of this server that are not approved as they are".into(),
            lane: "choird".into(),
            skill: None,
            state: None,
            conversation: None,
        };
        let settings = self
            .shared
            .config()
            .agents
            .get(agent)
            .and_then(|a| serde_json::to_value(a).ok())
            .unwrap_or_else(|| json!({}));
        let proposal =
            crate::proposals::validate(&self.shared.home, agent, &settings, &req).map_err(|e| Error::Invalid(e.0))?;
        let (id, status) = self.shared.store.insert_approval(agent, &proposal, &req)?;
        self.shared.audit(
            "choird",
            Some(agent),
            "mcp.catalog",
            "pending",
            json!({"approval": id, "subject": proposal.subject, "sha256": proposal.sha256}),
        );
        if status == "pending" {
            self.shared.events.send(crate::events::Event::ProposalPending { id });
        }
        Ok(id)
    }
}

/// The registry's view: `Arc<McpHttp>` serves each agent its pinned tools.
pub struct Served(pub Arc<McpHttp>);

impl PerAgentTools for Served {
    fn served(&self, agent: &AgentId) -> Vec<(String, Option<ToolManifest>)> {
        self.0.served(agent)
    }

    fn tool(&self, agent: &AgentId, name: &str) -> Option<Arc<dyn HostTool>> {
        self.0.tool(agent, name).map(|t| Arc::new(t) as Arc<dyn HostTool>)
    }

    fn prepare(&self, agent: &AgentId) {
        self.0.prepare(agent);
    }

    fn refresh(&self, agent: &AgentId, server: &str) -> Result<String, Error> {
        let file = self.0.servers(agent).into_iter().find(|f| f.server.name == server).ok_or_else(|| {
            Error::NotFound(format!(
                "agent {agent} has no MCP server {} reached over HTTP (a stdio server is read again at the agent's \
                 every start: choirctl agent restart {agent})",
                crate::http::printable(server)
            ))
        })?;
        let deadline = Instant::now() + DEFAULT_DEADLINE;
        let slot = self.0.slot(agent, server);
        let mut st = slot.try_lock_until(deadline).ok_or_else(|| Error::Timeout("the server is busy".into()))?;
        self.0.check_locked(agent, &file, &mut st, deadline, true)?;
        Ok(if st.disabled.is_empty() {
            format!("{} pinned tool(s) as approved", file.tools.len())
        } else {
            let off: Vec<&str> = st.disabled.keys().map(String::as_str).collect();
            format!("off until approved: {} (the change is filed: choirctl approvals list)", off.join(", "))
        })
    }
}

/// Opens a session of its own with `agent`'s HTTP server `file`, lists its
/// tools and compares them with the pins, filing nothing: for `choirctl
/// mcp check` and `choirctl doctor`. What it found, or why it could not.
pub fn probe(
    config: &crate::config::Config,
    secrets: &crate::secrets::Secrets,
    agent: &AgentId,
    file: &ServerFile,
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut session = open_session(config, secrets, agent, file, deadline)?;
    let live = list(&mut session, deadline)?;
    Ok(choir_common::mcp::compare(file, &live).summary())
}

/// A session with `agent`'s HTTP server `file`: its url checked, its host
/// resolved and checked by the agent's egress policy, its credential from
/// choird's secrets.
fn open_session(
    config: &crate::config::Config,
    secrets: &crate::secrets::Secrets,
    agent: &AgentId,
    file: &ServerFile,
    deadline: Instant,
) -> Result<http::Session, String> {
    let url = choir_common::mcp::check_url(file.server.url.as_deref().unwrap_or_default())?;
    let web = config.agents.get(agent).and_then(|a| a.web.clone()).unwrap_or_default();
    let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
    let addr = crate::egress::Policy::new(&web)
        .resolve(&host, url.port_or_known_default().unwrap_or(443))
        .map_err(|e| format!("the agent's egress policy refuses it: {}", e.0))?;
    let auth = match &file.server.auth_secret {
        Some(name) => Some(
            secrets
                .get(name)
                .map(str::to_owned)
                .ok_or_else(|| format!("its credential {name} is not in secrets.json"))?,
        ),
        None => None,
    };
    http::Session::open(url, addr, auth, deadline)
}

/// Every tool the session's server lists (paginated, bounded).
fn list(session: &mut http::Session, deadline: Instant) -> Result<Vec<Entry>, String> {
    choir_common::mcp::list_all(|params| session.request("tools/list", params, deadline))
}

impl HostTool for McpHttpTool {
    fn name(&self) -> &str {
        &self.manifest.llm.name
    }

    fn manifest(&self) -> Option<ToolManifest> {
        Some(self.manifest.clone())
    }

    fn status(&self, _: &crate::config::Config, secrets: &crate::secrets::Secrets, _: &AgentId) -> ToolStatus {
        match &self.file.server.auth_secret {
            Some(name) if secrets.get(name).is_none() => {
                ToolStatus::Available(format!("its credential {name} is not set in secrets.json"))
            }
            _ => ToolStatus::Connected,
        }
    }

    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        let deadline = Instant::now() + Duration::from_millis(self.manifest.runtime.timeout_ms);
        self.service.call(&self.agent, &self.file, &self.tool, call.input, deadline)
    }
}
