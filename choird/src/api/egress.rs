//! The network of an agent's stdio MCP servers (`POST /egress/v1?server=S&
//! host=H&port=P`): a server granted hosts reaches them through this tunnel
//! — the agent's loopback proxy opens one per `CONNECT` and choird decides.
//!
//! **Invariants:**
//! - choird decides from its own copy of the server file (the approved one
//!   under `repos/`), never from what the agent says was granted: the host
//!   must be in that server's `network` grant *and* pass the agent's egress
//!   policy at the address actually connected to (private ranges refused
//!   unless allowed, the name resolved once — see [`crate::egress`]).
//! - A tunnel carries bytes only (TLS stays end to end between the server
//!   and the site); it is bounded in bytes each way and idle time, and an
//!   agent holds at most [`MAX_TUNNELS`] at once.
//! - Every tunnel opened or refused is audited with the server, host, port
//!   and address (never the bytes).
//! - The grant is the agent's, not one process's: anything in the agent's
//!   container that can reach its socket can claim any of its servers'
//!   grants. The union of an agent's grants is what its container can reach.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use choir_common::ids::AgentId;
use choir_common::splice::{splice, Limits};
use parking_lot::Mutex;
use serde_json::json;

use crate::error::Error;
use crate::http::{Caller, Head, Response};
use crate::shared::Shared;

/// Tunnels an agent holds open at once.
pub const MAX_TUNNELS: usize = 8;
/// Bytes a tunnel carries each way.
pub const MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Silence after which a tunnel is closed.
pub const IDLE: Duration = Duration::from_secs(60);
/// How long connecting to the site may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A tunnel asked for, read from the request's head.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The server whose grant is claimed.
    pub server: String,
    /// The host to reach.
    pub host: String,
    /// Its port.
    pub port: u16,
}

impl Ask {
    /// Reads `server`, `host` and `port` from the head's query.
    pub fn parse(head: &Head) -> Result<Ask, Error> {
        let get = |k: &str| head.query.iter().find(|(q, _)| q == k).map(|(_, v)| v.clone());
        let (Some(server), Some(host), Some(port)) = (get("server"), get("host"), get("port")) else {
            return Err(Error::Malformed("a tunnel names server, host and port".into()));
        };
        let port = port.parse::<u16>().map_err(|_| Error::Malformed("port: 1 to 65535".into()))?;
        if host.is_empty() || host.len() > 253 || server.len() > 64 {
            return Err(Error::Malformed("host or server name too long".into()));
        }
        Ok(Ask { server, host, port })
    }
}

/// Tunnels open, per agent.
static OPEN: Mutex<Option<HashMap<AgentId, usize>>> = Mutex::new(None);

/// One tunnel's place among its agent's [`MAX_TUNNELS`]; freed on drop.
struct Slot(AgentId);

impl Slot {
    fn take(agent: &AgentId) -> Option<Slot> {
        let mut open = OPEN.lock();
        let n = open.get_or_insert_with(HashMap::new).entry(agent.clone()).or_default();
        (*n < MAX_TUNNELS).then(|| {
            *n += 1;
            Slot(agent.clone())
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(open) = OPEN.lock().as_mut() {
            if let Some(n) = open.get_mut(&self.0) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&self.0);
                }
            }
        }
    }
}

/// Opens the tunnel `ask` for `who`, or refuses it saying why (403).
pub fn handle(shared: &Arc<Shared>, who: &Caller, ask: &Ask) -> Result<Response, Error> {
    let agent = &who.agent;
    let detail = json!({"server": ask.server, "host": ask.host, "port": ask.port});
    let refuse = |why: String| {
        let mut d = detail.clone();
        d["reason"] = json!(why);
        shared.audit_always(Some(agent), "mcp.egress", "refused", d);
        Error::Forbidden(why)
    };
    let granted = crate::mcp_pins::servers(&shared.home, agent)
        .into_iter()
        .filter_map(|(_, f)| f.ok())
        .find(|f| f.server.name == ask.server && !f.server.is_http())
        .map(|f| f.server.network)
        .ok_or_else(|| refuse(format!("the agent has no stdio MCP server {:?}", ask.server)))?;
    if !choir_common::mcp::network_allows(&granted, &ask.host, ask.port) {
        return Err(refuse(format!(
            "MCP server {} is not granted {}:{} (its network grant: {})",
            ask.server,
            ask.host,
            ask.port,
            if granted.is_empty() { "none".to_owned() } else { granted.join(", ") }
        )));
    }
    let slot = Slot::take(agent)
        .ok_or_else(|| refuse(format!("the agent already holds {MAX_TUNNELS} tunnels; one must close first")))?;
    let web = shared.config().agents.get(agent).and_then(|a| a.web.clone()).unwrap_or_default();
    let addr = crate::egress::Policy::new(&web)
        .resolve(&ask.host, ask.port)
        .map_err(|e| refuse(format!("the agent's egress policy refuses it: {}", e.0)))?;
    let site = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| refuse(format!("{}:{} did not answer: {e}", ask.host, ask.port)))?;
    let mut opened = detail.clone();
    opened["address"] = json!(addr.to_string());
    shared.audit_always(Some(agent), "mcp.egress", "opened", opened.clone());
    let (shared, agent) = (shared.clone(), agent.clone());
    let mut resp = Response::json(200, &serde_json::Value::Null);
    resp.tunnel = Some(Box::new(move |client, early| {
        let _slot = slot;
        let mut site = site;
        if !early.is_empty() && std::io::Write::write_all(&mut site, &early).is_err() {
            return;
        }
        let limits = Limits { idle: IDLE, max_bytes: MAX_BYTES };
        if let Ok(c) = splice(client, Box::new(site), limits) {
            opened["sent"] = json!(c.a_to_b + early.len() as u64);
            opened["received"] = json!(c.b_to_a);
            opened["cut"] = json!(c.cut);
            shared.audit_always(Some(&agent), "mcp.egress", "closed", opened);
        }
    }));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(query: &[(&str, &str)]) -> Head {
        Head {
            method: "POST".into(),
            path: "/egress/v1".into(),
            query: query.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            bearer: None,
            content_length: 0,
            browser: Default::default(),
        }
    }

    #[test]
    fn a_tunnel_request_missing_a_field_or_out_of_bounds_is_refused_saying_why() {
        let ok = Ask::parse(&head(&[("server", "net"), ("host", "api.example.com"), ("port", "443")])).unwrap();
        assert_eq!((ok.server.as_str(), ok.host.as_str(), ok.port), ("net", "api.example.com", 443));
        let long = "a".repeat(254);
        for (q, why) in [
            (vec![("server", "net"), ("host", "x.example")], "server, host and port"),
            (vec![("server", "net"), ("host", "x.example"), ("port", "70000")], "port"),
            (vec![("server", "net"), ("host", "x.example"), ("port", "-1")], "port"),
            (vec![("server", "net"), ("host", long.as_str()), ("port", "443")], "too long"),
            (vec![("server", "net"), ("host", ""), ("port", "443")], "too long"),
        ] {
            let e = Ask::parse(&head(&q)).unwrap_err().to_string();
            assert!(e.contains(why), "{q:?}: {e}");
        }
    }

    #[test]
    fn an_agent_holds_at_most_its_tunnels_and_a_closed_one_frees_its_place() {
        let agent = AgentId::parse("tunnels_test").unwrap();
        let held: Vec<Slot> = (0..MAX_TUNNELS).map(|_| Slot::take(&agent).expect("a place")).collect();
        assert!(Slot::take(&agent).is_none(), "one past the cap is refused");
        drop(held);
        assert!(Slot::take(&agent).is_some(), "places come back when tunnels close");
    }
}
