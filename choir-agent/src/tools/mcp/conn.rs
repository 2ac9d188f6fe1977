//! One running MCP server over stdio: newline-delimited JSON-RPC 2.0 on its
//! stdin and stdout, its stderr drained to the agent's log.
//!
//! Three threads per server, each bounded: a writer (so a server that stops
//! reading can never block a lane: the lane waits on its answer's channel
//! with its deadline, never on a pipe), a reader, and a stderr drain.
//!
//! **Invariants.**
//! - Nothing the server sends is trusted: a line longer than [`MAX_LINE`],
//!   or more than [`MAX_GARBAGE`] lines that are not JSON-RPC, end the
//!   connection (the server is killed); its requests (elicitation, roots,
//!   anything) are refused with `-32601` — Choir declares no client
//!   capability — except `ping`, and `sampling/createMessage` when the
//!   operator granted the server sampling ([`Sampler`]): then one at a time,
//!   on a thread of its own, so the reader never waits for a model.
//! - A connection that ended ([`Conn::ended`]) is never used again; every
//!   call waiting on it gets the reason at once.
//! - The server runs in its own process group, registered with the reaper;
//!   dropping the connection kills the whole group.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{bounded, unbounded, Sender};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::process::spawn::{kill_group, Cmd};

/// The longest message a server may send (a bigger result is refused and
/// the server restarted).
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// Lines that are not JSON-RPC tolerated before the server is dropped.
pub const MAX_GARBAGE: usize = 16;

/// Most stderr lines logged per connection (the rest are read and counted).
const MAX_LOGGED: usize = 200;

/// The protocol versions Choir speaks, newest first.
pub const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No answer by the deadline (the connection is then dropped).
    Timeout,
    /// The connection ended: why.
    Ended(String),
    /// The server answered with a JSON-RPC error.
    Error {
        /// Its code.
        code: i64,
        /// Its message (the server's words: untrusted).
        message: String,
    },
}

type Waiters = Arc<Mutex<HashMap<u64, Sender<Result<Value, Failure>>>>>;

/// Answers a server's `sampling/createMessage` params (the result, or why not).
pub type Sampler = Arc<dyn Fn(&Value) -> Result<Value, String> + Send + Sync>;

/// A running server.
pub struct Conn {
    child: Mutex<Child>,
    to_server: Sender<Vec<u8>>,
    waiters: Waiters,
    next_id: AtomicU64,
    ended: Arc<Mutex<Option<String>>>,
    /// Set when the server said its tool list changed.
    pub stale: Arc<AtomicBool>,
    /// `serverInfo` from its handshake.
    pub info: Value,
}

impl Conn {
    /// Starts `cmd` and shakes hands by `deadline`. `changed` hears of every
    /// `notifications/tools/list_changed` (after [`Conn::stale`] is set).
    /// With `sampler`, the server may ask for samples (the capability is declared).
    pub fn start(
        cmd: &mut Cmd,
        label: &str,
        changed: Sender<()>,
        sampler: Option<Sampler>,
        deadline: Instant,
    ) -> Result<Conn, String> {
        let capabilities = if sampler.is_some() { json!({"sampling": {}}) } else { json!({}) };
        let mut child =
            cmd.spawn(Stdio::piped(), Stdio::piped(), Stdio::piped()).map_err(|e| format!("cannot start it: {e}"))?;
        let (stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => return Err("its pipes could not be opened".into()),
        };
        let waiters: Waiters = Arc::default();
        let ended: Arc<Mutex<Option<String>>> = Arc::default();
        let stale = Arc::new(AtomicBool::new(false));
        let (to_server, outbox) = unbounded::<Vec<u8>>();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map(|_| ()).map_err(|e| e.to_string())
        };
        spawn(
            "mcp-write",
            Box::new(move || {
                let mut stdin = stdin;
                for line in outbox {
                    if stdin.write_all(&line).and_then(|()| stdin.flush()).is_err() {
                        break;
                    }
                }
            }),
        )?;
        {
            let (waiters, ended, stale, replies, label) =
                (waiters.clone(), ended.clone(), stale.clone(), to_server.clone(), label.to_owned());
            spawn(
                "mcp-read",
                Box::new(move || {
                    read_loop(stdout, &waiters, &ended, (&stale, &changed), (&replies, sampler.as_ref()), &label)
                }),
            )?;
        }
        let label_err = label.to_owned();
        spawn("mcp-stderr", Box::new(move || drain_stderr(stderr, &label_err)))?;
        let mut conn = Conn {
            child: Mutex::new(child),
            to_server,
            waiters,
            next_id: AtomicU64::new(1),
            ended,
            stale,
            info: Value::Null,
        };
        let init = conn.request(
            "initialize",
            json!({
                "protocolVersion": VERSIONS[0],
                // No elicitation or roots; sampling only when granted.
                "capabilities": capabilities,
                "clientInfo": {"name": "choir", "version": env!("CARGO_PKG_VERSION")},
            }),
            deadline,
        );
        let init = init.map_err(|f| describe(&f, "the handshake"))?;
        let version = init["protocolVersion"].as_str().unwrap_or_default();
        if !VERSIONS.contains(&version) {
            return Err(format!(
                "it speaks MCP {:?}; Choir speaks {}",
                choir_common::text::clipped(version, 40),
                VERSIONS.join(", ")
            ));
        }
        conn.info = init["serverInfo"].clone();
        conn.notify("notifications/initialized", json!({}));
        Ok(conn)
    }

    /// Why the connection ended, if it did.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().clone()
    }

    /// Sends a notification.
    pub fn notify(&self, method: &str, params: Value) {
        let _ = self.to_server.send(line(&json!({"jsonrpc": "2.0", "method": method, "params": params})));
    }

    /// Sends a request and waits for its answer until `deadline`.
    pub fn request(&self, method: &str, params: Value, deadline: Instant) -> Result<Value, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        {
            // Registered under the lock the reader takes to end the
            // connection, so no waiter is missed by it.
            let mut waiters = self.waiters.lock();
            if let Some(why) = self.ended() {
                return Err(Failure::Ended(why));
            }
            waiters.insert(id, tx);
        }
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self.to_server.send(line(&msg)).is_err() {
            self.waiters.lock().remove(&id);
            return Err(Failure::Ended("its input is closed".into()));
        }
        let got = rx.recv_deadline(deadline);
        self.waiters.lock().remove(&id);
        match got {
            Ok(answer) => answer,
            Err(_) => {
                if let Some(why) = self.ended() {
                    return Err(Failure::Ended(why));
                }
                // Tell the server, for politeness; the caller drops it anyway.
                self.notify("notifications/cancelled", json!({"requestId": id, "reason": "timeout"}));
                Err(Failure::Timeout)
            }
        }
    }

    /// Ends the connection: the server's whole process group is killed.
    pub fn stop(&self, why: &str) {
        end(&self.ended, &self.waiters, why);
        let mut child = self.child.lock();
        kill_group(&child);
        let _ = child.kill();
        let _ = child.wait();
        crate::process::reaper::forget(&child);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.stop("the connection was closed");
    }
}

/// What a failed request means, for the model and the log.
pub fn describe(f: &Failure, what: &str) -> String {
    match f {
        Failure::Timeout => format!("{what} got no answer in time"),
        Failure::Ended(why) => format!("{what} failed: {why}"),
        Failure::Error { code, message } => {
            format!("{what} was refused by the server ({code}: {})", choir_common::text::clipped(message, 300))
        }
    }
}

fn line(v: &Value) -> Vec<u8> {
    // serde_json never writes a raw newline inside a value.
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

/// Marks the connection ended (once) and fails every waiter with why.
fn end(ended: &Mutex<Option<String>>, waiters: &Waiters, why: &str) {
    let mut w = waiters.lock();
    let mut e = ended.lock();
    if e.is_none() {
        *e = Some(why.to_owned());
    }
    let why = e.clone().unwrap_or_default();
    drop(e);
    for (_, tx) in w.drain() {
        let _ = tx.send(Err(Failure::Ended(why.clone())));
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes; `Ok(None)` at the end.
fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> Result<Option<()>, String> {
    buf.clear();
    loop {
        let chunk = r.fill_buf().map_err(|e| format!("its output could not be read: {e}"))?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() { None } else { Some(()) });
        }
        let (take, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if buf.len() + take > MAX_LINE + 1 {
            return Err(format!("it sent a message larger than {} MiB", MAX_LINE / (1024 * 1024)));
        }
        buf.extend_from_slice(&chunk[..take]);
        r.consume(take);
        if done {
            return Ok(Some(()));
        }
    }
}

fn read_loop(
    stdout: impl Read,
    waiters: &Waiters,
    ended: &Mutex<Option<String>>,
    (stale, changed): (&AtomicBool, &Sender<()>),
    (replies, sampler): (&Sender<Vec<u8>>, Option<&Sampler>),
    label: &str,
) {
    let sampling = Arc::new(AtomicBool::new(false));
    let mut r = BufReader::with_capacity(64 * 1024, stdout);
    let mut buf = Vec::new();
    let mut garbage = 0usize;
    let why = loop {
        match read_line(&mut r, &mut buf) {
            Ok(None) => break "it exited".to_owned(),
            Err(why) => break why,
            Ok(Some(())) => {}
        }
        let text = buf.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_slice(text) {
            Ok(v @ Value::Object(_)) if v["jsonrpc"] == "2.0" => v,
            _ => {
                garbage += 1;
                if garbage > MAX_GARBAGE {
                    break format!("it sent {garbage} lines that are not JSON-RPC 2.0");
                }
                continue;
            }
        };
        let id = msg.get("id").filter(|i| !i.is_null());
        match (msg.get("method").and_then(Value::as_str), id) {
            // A request to Choir: ping is answered, sampling when granted; nothing else.
            (Some("sampling/createMessage"), Some(id)) if sampler.is_some() => {
                let id = id.clone();
                if sampling.swap(true, Ordering::SeqCst) {
                    let busy = json!({"jsonrpc": "2.0", "id": id,
                                      "error": {"code": -1, "message": "one sampling request at a time"}});
                    let _ = replies.send(line(&busy));
                    continue;
                }
                let (sampler, replies, busy) = (sampler.cloned(), replies.clone(), sampling.clone());
                let params = msg.get("params").cloned().unwrap_or(Value::Null);
                let spawned = std::thread::Builder::new().name("mcp-sample".into()).spawn(move || {
                    let answer = sampler.map_or_else(|| Err("no sampler".to_owned()), |s| s(&params));
                    let reply = match answer {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err(why) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -1, "message": why}}),
                    };
                    busy.store(false, Ordering::SeqCst);
                    let _ = replies.send(line(&reply));
                });
                if spawned.is_err() {
                    sampling.store(false, Ordering::SeqCst);
                }
            }
            (Some(method), Some(id)) => {
                let reply = if method == "ping" {
                    json!({"jsonrpc": "2.0", "id": id, "result": {}})
                } else {
                    log::warn!("MCP server {label} asked for {:?}: refused", choir_common::text::clipped(method, 60));
                    json!({"jsonrpc": "2.0", "id": id,
                           "error": {"code": -32601, "message": "Choir grants this server no such capability"}})
                };
                let _ = replies.send(line(&reply));
            }
            (Some(method), None) => {
                if method == "notifications/tools/list_changed" {
                    stale.store(true, Ordering::SeqCst);
                    let _ = changed.try_send(());
                }
            }
            (None, Some(id)) => {
                let Some(tx) = id.as_u64().and_then(|id| waiters.lock().remove(&id)) else {
                    continue; // An answer nobody waits for (any more).
                };
                let answer = match (msg.get("result"), msg.get("error")) {
                    (Some(r), None) => Ok(r.clone()),
                    (_, Some(e)) => Err(Failure::Error {
                        code: e["code"].as_i64().unwrap_or(0),
                        message: e["message"].as_str().unwrap_or_default().to_owned(),
                    }),
                    _ => {
                        Err(Failure::Error { code: -32603, message: "an answer with neither result nor error".into() })
                    }
                };
                let _ = tx.send(answer);
            }
            (None, None) => {
                garbage += 1;
                if garbage > MAX_GARBAGE {
                    break format!("it sent {garbage} lines that are not JSON-RPC 2.0");
                }
            }
        }
    };
    log::warn!("MCP server {label}: {why}");
    end(ended, waiters, &why);
}

fn drain_stderr(stderr: impl Read, label: &str) {
    let mut r = BufReader::new(stderr);
    let mut buf = Vec::new();
    let mut lines = 0usize;
    loop {
        match read_line(&mut r, &mut buf) {
            Ok(None) => break,
            Err(_) if buf.is_empty() => break,
            // A line too long to log whole: its first part is logged, the rest read on.
            Ok(Some(())) | Err(_) => {}
        }
        lines += 1;
        if lines <= MAX_LOGGED {
            let text = String::from_utf8_lossy(&buf);
            log::debug!("MCP server {label} says: {}", choir_common::text::clipped(text.trim_end(), 300));
        }
    }
    if lines > MAX_LOGGED {
        log::debug!("MCP server {label} wrote {lines} lines on stderr ({MAX_LOGGED} logged)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A server in a few lines of Python: answers `initialize`, then does
    /// `then` for the first request after it.
    fn server(then: &str) -> Option<Cmd> {
        let python = std::path::Path::new("/usr/bin/python3");
        if !python.exists() {
            eprintln!("skipping: no /usr/bin/python3");
            return None;
        }
        let script = format!(
            r#"
import json, sys, time, os
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
init = json.loads(sys.stdin.readline())
send({{"jsonrpc": "2.0", "id": init["id"], "result": {{"protocolVersion": "2025-11-25", "capabilities": {{}}, "serverInfo": {{"name": "t", "version": "1"}}}}}})
sys.stdin.readline()  # initialized
req = json.loads(sys.stdin.readline())
{then}
"#
        );
        let mut cmd = Cmd::new(python);
        cmd.args(["-c", script.as_str()]);
        Some(cmd)
    }

    fn start(then: &str) -> Option<Conn> {
        let (tx, _rx) = bounded(1);
        Some(Conn::start(&mut server(then)?, "test", tx, None, Instant::now() + Duration::from_secs(10)).unwrap())
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn an_answer_is_matched_to_its_request() {
        let Some(c) = start(r#"send({"jsonrpc": "2.0", "id": req["id"], "result": {"echo": req["method"]}})"#) else {
            return;
        };
        assert_eq!(c.request("tools/list", json!({}), soon()).unwrap()["echo"], "tools/list");
    }

    #[test]
    fn a_message_past_the_bound_ends_the_connection_with_a_reason() {
        let Some(c) =
            start(r#"sys.stdout.write("{" + "x" * (5 * 1024 * 1024) + "\n"); sys.stdout.flush(); time.sleep(30)"#)
        else {
            return;
        };
        match c.request("tools/call", json!({}), soon()) {
            Err(Failure::Ended(why)) => assert!(why.contains("larger than 4 MiB"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(c.ended().is_some(), "never used again");
    }

    #[test]
    fn lines_that_are_not_json_rpc_are_tolerated_up_to_a_bound() {
        let few = r#"
for _ in range(3): sys.stdout.write("noise\n")
send({"jsonrpc": "2.0", "id": req["id"], "result": {"ok": True}})"#;
        if let Some(c) = start(few) {
            assert_eq!(c.request("x", json!({}), soon()).unwrap()["ok"], true);
        }
        let many = r#"
for _ in range(100): sys.stdout.write("noise\n")
sys.stdout.flush(); time.sleep(30)"#;
        if let Some(c) = start(many) {
            match c.request("x", json!({}), soon()) {
                Err(Failure::Ended(why)) => assert!(why.contains("not JSON-RPC"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_servers_request_is_refused_and_its_answer_still_arrives() {
        let asks = r#"
send({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {}})
reply = json.loads(sys.stdin.readline())
send({"jsonrpc": "2.0", "id": req["id"], "result": {"reply": reply}})"#;
        let Some(c) = start(asks) else { return };
        let got = c.request("tools/call", json!({}), soon()).unwrap();
        assert_eq!(got["reply"]["error"]["code"], -32601, "{got}");
        assert_eq!(got["reply"]["id"], "s1");
    }

    #[test]
    fn granted_sampling_is_declared_answered_one_at_a_time_and_other_requests_still_refused() {
        // The server reports the capabilities it was offered, asks twice at
        // once (the second must be refused as busy), then asks for roots.
        let asks = r#"
send({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {"n": 1}})
send({"jsonrpc": "2.0", "id": "s2", "method": "sampling/createMessage", "params": {"n": 2}})
replies = {}
for _ in range(2):
    r = json.loads(sys.stdin.readline()); replies[r["id"]] = r
send({"jsonrpc": "2.0", "id": "r1", "method": "roots/list", "params": {}})
replies["r1"] = json.loads(sys.stdin.readline())
send({"jsonrpc": "2.0", "id": req["id"], "result": {"init": init["params"]["capabilities"], "replies": replies}})"#;
        let Some(mut cmd) = server(asks) else { return };
        let sampler: Sampler = Arc::new(|p: &Value| {
            std::thread::sleep(Duration::from_millis(200));
            Ok(json!({"answered": p["n"]}))
        });
        let (tx, _rx) = bounded(1);
        let c = Conn::start(&mut cmd, "test", tx, Some(sampler), soon()).unwrap();
        let got = c.request("tools/call", json!({}), soon()).unwrap();
        assert_eq!(got["init"], json!({"sampling": {}}), "{got}");
        assert_eq!(got["replies"]["s1"]["result"]["answered"], 1, "{got}");
        assert!(got["replies"]["s2"]["error"]["message"].as_str().unwrap().contains("one sampling request"), "{got}");
        assert_eq!(got["replies"]["r1"]["error"]["code"], -32601, "{got}");
    }

    #[test]
    fn a_silent_server_costs_the_caller_its_deadline_and_no_more() {
        let Some(c) = start("time.sleep(30)") else { return };
        let t = Instant::now();
        assert_eq!(
            c.request("tools/call", json!({}), Instant::now() + Duration::from_millis(300)),
            Err(Failure::Timeout)
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        c.stop("test over");
    }
}
