//! The Chrome DevTools Protocol over `--remote-debugging-pipe`: JSON
//! messages separated by NUL bytes on two pipes (choird writes the
//! browser's fd 3, reads its fd 4). No listening socket exists, so no other
//! process on the host can attach to the browser.
//!
//! One reader thread routes answers to their callers by id, and events to
//! the channel of the session they belong to. When the browser's end closes
//! (it exited or was killed), every waiting call fails at once and the
//! connection stays dead; the owner starts a new browser.
//!
//! **Invariant:** every call has a deadline; a message from the browser is
//! read only up to [`MAX_MESSAGE`] bytes (a bigger one kills the connection:
//! a page cannot make choird buffer without bound).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;
use serde_json::{json, Value};

/// Largest message read from the browser (screenshots are the big ones).
pub const MAX_MESSAGE: u64 = 64 * 1024 * 1024;
/// Events queued for one session at most; beyond, the oldest are lost
/// (their waiters time out rather than choird growing without bound).
const EVENT_QUEUE: usize = 4096;

/// What went wrong with a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdpError {
    /// The browser is gone (exited, killed, or its pipe broke).
    #[error("the browser exited")]
    Closed,
    /// No answer in time.
    #[error("the browser did not answer {0} in time")]
    Timeout(String),
    /// The browser answered with an error.
    #[error("{0}")]
    Protocol(String),
}

/// An event: its method and parameters.
#[derive(Debug, Clone)]
pub struct Event {
    /// e.g. `Page.loadEventFired`.
    pub method: String,
    /// Its parameters.
    pub params: Value,
}

type Pending = HashMap<u64, Sender<Result<Value, CdpError>>>;

struct Inner {
    writer: Mutex<Box<dyn Write + Send>>,
    pending: Mutex<Pending>,
    sessions: Mutex<HashMap<String, Sender<Event>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

/// A connection to one browser.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl Connection {
    /// Speaks CDP over `to_browser` / `from_browser`; starts the reader thread.
    pub fn new(to_browser: impl Write + Send + 'static, from_browser: impl Read + Send + 'static) -> Connection {
        let inner = Arc::new(Inner {
            writer: Mutex::new(Box::new(to_browser)),
            pending: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        });
        let reader = inner.clone();
        let spawned = std::thread::Builder::new().name("cdp-reader".into()).spawn(move || {
            read_loop(&reader, BufReader::new(from_browser));
            reader.close();
        });
        if spawned.is_err() {
            inner.close();
        }
        Connection { inner }
    }

    /// Whether the browser is gone.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Calls `method` (in `session`, if any) and waits for its answer until `timeout`.
    pub fn call(
        &self,
        method: &str,
        params: Value,
        session: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, CdpError> {
        if self.is_closed() {
            return Err(CdpError::Closed);
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = bounded(1);
        self.inner.pending.lock().insert(id, tx);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        let written = {
            let mut w = self.inner.writer.lock();
            w.write_all(&bytes).and_then(|()| w.flush())
        };
        if written.is_err() {
            self.inner.pending.lock().remove(&id);
            self.inner.close();
            return Err(CdpError::Closed);
        }
        let answer = rx.recv_timeout(timeout);
        self.inner.pending.lock().remove(&id);
        match answer {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(CdpError::Timeout(method.to_owned())),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(CdpError::Closed),
        }
    }

    /// The events of `session` from now on (one subscriber per session).
    pub fn subscribe(&self, session: &str) -> Receiver<Event> {
        let (tx, rx) = bounded(EVENT_QUEUE);
        self.inner.sessions.lock().insert(session.to_owned(), tx);
        rx
    }

    /// Stops routing `session`'s events.
    pub fn unsubscribe(&self, session: &str) {
        self.inner.sessions.lock().remove(session);
    }

    /// Closes choird's end (the browser exits when its pipe closes).
    pub fn close(&self) {
        self.inner.close();
    }
}

impl Inner {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Dropping the senders wakes every waiter with `Closed`.
        self.pending.lock().clear();
        self.sessions.lock().clear();
        // Replacing the writer closes the pipe to the browser.
        *self.writer.lock() = Box::new(std::io::sink());
    }
}

fn read_loop(inner: &Inner, mut from: BufReader<impl Read>) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut from).take(MAX_MESSAGE + 1).read_until(0, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if buf.last() != Some(&0) {
            // EOF inside a message, or a message over the cap.
            if n as u64 > MAX_MESSAGE {
                log::warn!("browser: a message over {MAX_MESSAGE} bytes; closing the connection");
            }
            return;
        }
        buf.pop();
        let Ok(msg) = serde_json::from_slice::<Value>(&buf) else { continue };
        if let Some(id) = msg["id"].as_u64() {
            let result = match msg.get("error") {
                Some(e) => Err(CdpError::Protocol(e["message"].as_str().unwrap_or("error").to_owned())),
                None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
            };
            if let Some(tx) = inner.pending.lock().remove(&id) {
                let _ = tx.try_send(result);
            }
        } else if let (Some(method), Some(session)) = (msg["method"].as_str(), msg["sessionId"].as_str()) {
            let tx = inner.sessions.lock().get(session).cloned();
            if let Some(tx) = tx {
                let _ = tx.try_send(Event { method: method.to_owned(), params: msg["params"].clone() });
            }
        }
    }
}

/// Waits on `events` until `done` says so, or `deadline`; returns whether
/// `done` was met. Every event is also offered to `seen` first.
pub fn wait_events(
    events: &Receiver<Event>,
    deadline: Instant,
    mut done: impl FnMut(&Event) -> bool,
) -> Result<bool, CdpError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        match events.recv_timeout(left) {
            Ok(ev) => {
                if done(&ev) {
                    return Ok(true);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => return Ok(false),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(CdpError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A fake browser on the other end of a socket pair: answers each call
    /// with its params, emits one event per call.
    fn fake() -> (Connection, std::thread::JoinHandle<()>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let reader = theirs.try_clone().unwrap();
        let h = std::thread::spawn(move || {
            let mut w = theirs;
            for msg in BufReader::new(reader).split(0) {
                let Ok(msg) = msg else { return };
                let m: Value = serde_json::from_slice(&msg).unwrap();
                if m["method"] == "Die" {
                    return;
                }
                if m["method"] == "Silent" {
                    continue;
                }
                let ev = json!({"method": "Ev.x", "sessionId": "s1", "params": {"n": m["id"]}});
                let ans = json!({"id": m["id"], "result": m["params"]});
                for v in [ev, ans] {
                    let mut b = v.to_string().into_bytes();
                    b.push(0);
                    w.write_all(&b).unwrap();
                }
            }
        });
        (Connection::new(ours.try_clone().unwrap(), ours), h)
    }

    #[test]
    fn answers_reach_their_callers_and_events_their_session() {
        let (c, _h) = fake();
        let events = c.subscribe("s1");
        let t = Duration::from_secs(5);
        assert_eq!(c.call("A", json!({"a": 1}), None, t).unwrap(), json!({"a": 1}));
        assert_eq!(c.call("B", json!({"b": 2}), Some("s1"), t).unwrap(), json!({"b": 2}));
        assert_eq!(events.recv_timeout(t).unwrap().method, "Ev.x");
        assert!(matches!(c.call("Silent", json!({}), None, Duration::from_millis(100)), Err(CdpError::Timeout(_))));
    }

    #[test]
    fn a_browser_that_dies_fails_every_waiting_call_at_once() {
        let (c, h) = fake();
        let c2 = c.clone();
        let waiting = std::thread::spawn(move || c2.call("Silent", json!({}), None, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let _ = c.call("Die", json!({}), None, Duration::from_millis(50));
        h.join().unwrap();
        // The fake's end is closed: the reader sees EOF.
        assert_eq!(waiting.join().unwrap(), Err(CdpError::Closed));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(c.is_closed());
        assert_eq!(c.call("A", json!({}), None, Duration::from_secs(1)), Err(CdpError::Closed));
    }
}
