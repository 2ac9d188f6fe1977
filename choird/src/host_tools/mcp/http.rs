//! One Streamable-HTTP MCP session, as choird keeps it for one agent's
//! server: JSON-RPC over POST (`Accept: application/json,
//! text/event-stream`), a JSON answer or an SSE stream that carries it,
//! `Mcp-Session-Id` and `MCP-Protocol-Version` kept, an expired session
//! (404) opened again once.
//!
//! **Invariants.** Every request goes to the address the agent's egress
//! policy checked, with no redirect followed; every answer is read only up
//! to [`MAX_BODY`]; the server's requests (sampling, elicitation, roots, …)
//! are answered `-32601`; a `notifications/tools/list_changed` in any
//! stream marks the session stale. The credential header is built here from
//! choird's secret and goes to this server's address only.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The most bytes of one answer read.
pub const MAX_BODY: u64 = 4 * 1024 * 1024;

/// The protocol versions choird speaks, newest first.
const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// An open session.
pub struct Session {
    url: url::Url,
    /// Connects only to the checked address; its connections are kept
    /// between requests.
    agent: ureq::Agent,
    auth: Option<String>,
    id: Option<String>,
    version: String,
    next: u64,
    /// `serverInfo` from its handshake.
    pub info: Value,
    /// Whether the server said its tool list changed since it was read.
    pub stale: bool,
}

/// Why a request failed (words for the operator and the model; never the
/// credential, never the answer's body beyond a clipped line).
pub type Failure = String;

impl Session {
    /// Opens a session with the server at `url` (connecting to `addr`),
    /// `auth` its bearer token.
    pub fn open(url: url::Url, addr: SocketAddr, auth: Option<String>, deadline: Instant) -> Result<Session, Failure> {
        let mut s = Session {
            url,
            agent: crate::host_tools::web::common::pinned_agent(addr, Duration::from_secs(600)),
            auth,
            id: None,
            version: VERSIONS[0].to_owned(),
            next: 0,
            info: Value::Null,
            stale: false,
        };
        let init = s.request(
            "initialize",
            json!({"protocolVersion": VERSIONS[0], "capabilities": {},
                   "clientInfo": {"name": "choird", "version": env!("CARGO_PKG_VERSION")}}),
            deadline,
        )?;
        let version = init["protocolVersion"].as_str().unwrap_or_default();
        if !VERSIONS.contains(&version) {
            return Err(format!("it speaks MCP {:?}", choir_common::text::clipped(version, 40)));
        }
        s.version = version.to_owned();
        s.info = init["serverInfo"].clone();
        s.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), None, deadline)?;
        Ok(s)
    }

    /// Sends a request and returns its result by `deadline`.
    pub fn request(&mut self, method: &str, params: Value, deadline: Instant) -> Result<Value, Failure> {
        self.next += 1;
        let id = self.next;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let answer = self.post(&msg, Some(id), deadline)?.ok_or("the server sent no answer")?;
        match (answer.get("result"), answer.get("error")) {
            (Some(r), None) => Ok(r.clone()),
            (_, Some(e)) => Err(format!(
                "the server refused it ({}: {})",
                e["code"].as_i64().unwrap_or(0),
                choir_common::text::clipped(e["message"].as_str().unwrap_or_default(), 300)
            )),
            _ => Err("an answer with neither result nor error".into()),
        }
    }

    /// POSTs one message; for a request, reads its answer.
    fn post(&mut self, msg: &Value, id: Option<u64>, deadline: Instant) -> Result<Option<Value>, Failure> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no answer in time".into());
        }
        let mut req = self
            .agent
            .post(self.url.as_str())
            .config()
            .timeout_global(Some(left.max(Duration::from_millis(50))))
            .build()
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", self.version.as_str());
        if let Some(sid) = &self.id {
            req = req.header("Mcp-Session-Id", sid.as_str());
        }
        if let Some(token) = &self.auth {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let mut resp = req.send(msg.to_string().as_bytes()).map_err(|e| match e {
            ureq::Error::Timeout(_) => "no answer in time".to_owned(),
            _ => "it could not be reached".to_owned(),
        })?;
        let status = resp.status().as_u16();
        if let Some(sid) = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            if self.id.is_none() && sid.len() <= 256 && sid.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                self.id = Some(sid.to_owned());
            }
        }
        let kind = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        match status {
            202 if id.is_none() => return Ok(None),
            200 => {}
            404 if self.id.is_some() => return Err("its session expired".into()),
            401 | 403 => return Err(format!("it refused choird's credentials ({status})")),
            _ => return Err(format!("it answered HTTP {status}")),
        }
        let body = resp.body_mut().as_reader().take(MAX_BODY + 1);
        let Some(id) = id else { return Ok(None) };
        if kind.starts_with("text/event-stream") {
            self.read_stream(body, id, deadline).map(Some)
        } else {
            let mut raw = Vec::new();
            BufReader::new(body).read_to_end(&mut raw).map_err(|_| "its answer broke off".to_owned())?;
            if raw.len() as u64 > MAX_BODY {
                return Err(format!("it sent an answer larger than {} MiB", MAX_BODY / (1024 * 1024)));
            }
            let v: Value = serde_json::from_slice(&raw).map_err(|_| "its answer is not JSON-RPC".to_owned())?;
            self.note(&v);
            Ok(Some(v))
        }
    }

    /// Reads SSE events until the answer to `id`; notifications and the
    /// server's requests on the way are handled.
    fn read_stream(&mut self, body: impl Read, id: u64, deadline: Instant) -> Result<Value, Failure> {
        let mut r = BufReader::new(body);
        let mut data = String::new();
        let mut line = String::new();
        let mut total = 0u64;
        loop {
            line.clear();
            let n = r.read_line(&mut line).map_err(|_| "its stream broke off".to_owned())?;
            total += n as u64;
            if total > MAX_BODY {
                return Err(format!("it sent an answer larger than {} MiB", MAX_BODY / (1024 * 1024)));
            }
            if n == 0 {
                return Err("its stream ended without the answer".into());
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if let Some(d) = l.strip_prefix("data:") {
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
                data.push('\n');
                continue;
            }
            if !l.is_empty() || data.is_empty() {
                continue;
            }
            let event = std::mem::take(&mut data);
            let Ok(v) = serde_json::from_str::<Value>(&event) else { continue };
            if v["id"] == id && v.get("method").is_none() {
                return Ok(v);
            }
            self.note(&v);
            if v.get("method").is_some() && v.get("id").is_some_and(|i| !i.is_null()) {
                // A request to choird: refused (only ping is answered).
                let reply = if v["method"] == "ping" {
                    json!({"jsonrpc": "2.0", "id": v["id"], "result": {}})
                } else {
                    json!({"jsonrpc": "2.0", "id": v["id"],
                           "error": {"code": -32601, "message": "Choir grants this server no such capability"}})
                };
                let _ = self.post(&reply, None, deadline);
            }
        }
    }

    /// A notification that matters: the tool list changed.
    fn note(&mut self, v: &Value) {
        if v["method"] == "notifications/tools/list_changed" {
            self.stale = true;
        }
    }
}
