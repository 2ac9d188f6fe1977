//! choird's HTTP/1.1 server: one accept thread per listener, one thread per
//! connection up to a cap, requests parsed with `httparse`.
//!
//! Everything a client controls is bounded (see [`Limits`]): the size of the
//! request head and its number of header lines, the time to send a head, a
//! body and to take a reply, the time an idle keep-alive connection is kept,
//! and the number of connections open at once. The head is judged before any
//! body byte is read ([`Handler::admit`]: authentication and the body cap of
//! the route), so an unauthenticated client can make choird read at most one
//! head.
//!
//! **Invariant:** the accept loop ends only when the listener is stopped: an
//! error (EMFILE, ENFILE, ENOMEM, a thread that cannot be spawned) is logged
//! (rate-limited), the connection at hand dropped, and accepting resumes after
//! a short backoff.
//! **Invariant:** at most `max_connections` connections of a listener are
//! served at once; a connection over the cap is answered `503` without
//! blocking (best effort) and closed at once by the accept thread.
//! **Invariant:** a panicking handler is answered with 500 and the connection
//! thread ends; choird never dies because of one request.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::api::{Handler, Head, ListenerKind, Request, Response};
use crate::error::Error;

/// What a client may cost a listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Bytes of a request head (request line and header lines).
    pub max_head_bytes: usize,
    /// Header lines of a request.
    pub max_headers: usize,
    /// Time from a request's first byte to the end of its head; also the time
    /// a new connection has to start its first request.
    pub head_timeout: Duration,
    /// Time an idle keep-alive connection is kept open for its next request.
    pub idle_timeout: Duration,
    /// Time to receive a whole body.
    pub body_timeout: Duration,
    /// Time the client has to take each write of a reply.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            max_head_bytes: 16 * 1024,
            max_headers: 48,
            head_timeout: Duration::from_secs(10),
            // Longer than the clients' pool age (ureq keeps idle connections
            // 15 s), so a client never reuses one choird is closing.
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// A bound socket to serve.
pub enum Socket {
    /// A Unix socket (its path, removed when the server stops).
    Unix(UnixListener, PathBuf),
    /// A TCP socket.
    Tcp(TcpListener),
}

/// One accepted connection.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(d),
            Stream::Tcp(s) => s.set_read_timeout(d),
        }
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(d),
            Stream::Tcp(s) => s.set_write_timeout(d),
        }
    }
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// Open connections of a listener, so stopping can cut them.
#[derive(Default)]
struct Open {
    next: usize,
    conns: Vec<(usize, Stream)>,
}

/// A listener being served; [`Server::stop`] ends it.
pub struct Server {
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    open: Arc<Mutex<Open>>,
    active: Arc<AtomicUsize>,
    wake: Wake,
    name: String,
}

enum Wake {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

impl Server {
    /// Serves `socket` on its own accept thread (named `name`).
    pub fn start<H: Handler>(
        socket: Socket,
        kind: ListenerKind,
        handler: Arc<H>,
        limits: Limits,
        name: &str,
    ) -> io::Result<Server> {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Open::default()));
        let active = Arc::new(AtomicUsize::new(0));
        let wake = match &socket {
            Socket::Unix(_, path) => Wake::Unix(path.clone()),
            Socket::Tcp(l) => Wake::Tcp(l.local_addr()?),
        };
        let ctx = Arc::new(Ctx { kind, handler, limits, name: name.to_owned() });
        let accept = {
            let (stop, open, active) = (stop.clone(), open.clone(), active.clone());
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || accept_loop(socket, ctx, stop, open, active))?
        };
        Ok(Server { stop, accept: Some(accept), open, active, wake, name: name.to_owned() })
    }

    /// Connections being served right now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Stops accepting, cuts open connections and waits (up to 5 s) for
    /// their threads to end.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept thread out of accept().
        let _ = match &self.wake {
            Wake::Unix(p) => UnixStream::connect(p).map(drop),
            Wake::Tcp(a) => TcpStream::connect_timeout(a, Duration::from_secs(1)).map(drop),
        };
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (_, s) in self.open.lock().conns.drain(..) {
            s.shutdown();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Wake::Unix(p) = &self.wake {
            let _ = std::fs::remove_file(p);
        }
        log::debug!("listener {} stopped", self.name);
    }
}

struct Ctx<H> {
    kind: ListenerKind,
    handler: Arc<H>,
    limits: Limits,
    name: String,
}

/// Logs at most one line per `every` for a recurring condition.
struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    fn log(&mut self, every: Duration, msg: impl FnOnce(u64) -> String) {
        if self.last.is_none_or(|t| t.elapsed() >= every) {
            log::warn!("{}", msg(self.suppressed));
            self.last = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
    }
}

fn accept_loop<H: Handler>(
    socket: Socket,
    ctx: Arc<Ctx<H>>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Open>>,
    active: Arc<AtomicUsize>,
) {
    let mut errors = Throttled { last: None, suppressed: 0 };
    let mut refused = Throttled { last: None, suppressed: 0 };
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = match &socket {
            Socket::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Socket::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok(s) => {
                backoff = Duration::from_millis(5);
                s
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM …: wait for resources to come back.
                errors.log(Duration::from_secs(10), |n| {
                    format!("listener {}: accept failed: {e} ({n} more since the last report); retrying", ctx.name)
                });
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        if active.load(Ordering::SeqCst) >= ctx.limits.max_connections {
            refused.log(Duration::from_secs(10), |n| {
                format!(
                    "listener {}: {} connections open, the cap; refusing new ones ({n} more refused since the last report)",
                    ctx.name, ctx.limits.max_connections
                )
            });
            busy(stream);
            continue;
        }
        let id = {
            let mut o = open.lock();
            o.next += 1;
            let id = o.next;
            if let Ok(clone) = stream.try_clone() {
                o.conns.push((id, clone));
            }
            id
        };
        active.fetch_add(1, Ordering::SeqCst);
        let spawned = {
            let (ctx, open, active) = (ctx.clone(), open.clone(), active.clone());
            std::thread::Builder::new().name(format!("{}-c", ctx.name)).spawn(move || {
                serve_connection(stream, &ctx);
                open.lock().conns.retain(|(i, _)| *i != id);
                active.fetch_sub(1, Ordering::SeqCst);
            })
        };
        if let Err(e) = spawned {
            // The stream moved into the closure that was dropped: it is closed.
            open.lock().conns.retain(|(i, _)| *i != id);
            active.fetch_sub(1, Ordering::SeqCst);
            errors.log(Duration::from_secs(10), |n| {
                format!("listener {}: cannot start a connection thread: {e} ({n} more)", ctx.name)
            });
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// Tells a connection over the cap to come back later, without blocking.
fn busy(mut stream: Stream) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
}

/// Why a connection ends without (another) request.
enum HeadError {
    /// The client closed cleanly between requests.
    Closed,
    /// Timed out or failed; nothing worth answering.
    Gone,
    /// Answer with this error, then close.
    Answer(Error, u16),
}

/// Bytes read from a connection and not consumed yet.
struct Buffered {
    buf: Vec<u8>,
}

fn serve_connection<H: Handler>(mut stream: Stream, ctx: &Ctx<H>) {
    let limits = &ctx.limits;
    let _ = stream.set_write_timeout(Some(limits.write_timeout));
    let mut pending = Buffered { buf: Vec::new() };
    let mut first = true;
    loop {
        let wait = if first { limits.head_timeout } else { limits.idle_timeout };
        first = false;
        let head = match read_head(&mut stream, &mut pending, limits, wait) {
            Ok(h) => h,
            Err(HeadError::Closed | HeadError::Gone) => return,
            Err(HeadError::Answer(e, status)) => {
                let mut r = Response::from(e);
                r.status = status;
                let _ = write_response(&mut stream, r, false);
                return;
            }
        };
        let ParsedHead { head, keep_alive, expect_continue } = head;
        let admitted = match ctx.handler.admit(&ctx.kind, &head) {
            Ok(a) => a,
            Err(e) => {
                // The body is never read into anything: answer, then close.
                let _ = write_response(&mut stream, Response::from(e), false);
                linger(&mut stream, &mut pending, head.content_length);
                return;
            }
        };
        if head.content_length > admitted.max_body {
            let e = Error::TooLarge(format!(
                "request body of {} bytes is over this endpoint's {} bytes",
                head.content_length, admitted.max_body
            ));
            let _ = write_response(&mut stream, Response::from(e), false);
            linger(&mut stream, &mut pending, head.content_length);
            return;
        }
        if expect_continue && head.content_length > 0 && stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err() {
            return;
        }
        let body = match read_body(&mut stream, &mut pending, head.content_length, limits.body_timeout) {
            Ok(b) => b,
            Err(_) => return,
        };
        let path = head.path.clone();
        let peer = match &stream {
            Stream::Unix(s) => s.try_clone().ok().map(crate::http::api::Peer::Unix),
            Stream::Tcp(s) => s.try_clone().ok().map(crate::http::api::Peer::Tcp),
        };
        let req = Request { method: head.method, path: head.path, query: head.query, bearer: head.bearer, body, peer };
        let route = admitted.route;
        let response = match catch_unwind(AssertUnwindSafe(|| ctx.handler.handle(&ctx.kind, route, req))) {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                log::error!(
                    "handler for {} panicked: {}",
                    crate::http::printable(&path),
                    crate::http::printable(&what)
                );
                let r = Response::from(Error::Internal("internal error (a bug in choird; see choird.log)".into()));
                let _ = write_response(&mut stream, r, false);
                return;
            }
        };
        if let Some(tunnel) = response.tunnel {
            // The head alone, then the connection is the tunnel's.
            if stream.write_all(b"HTTP/1.1 200 Tunnel open\r\nConnection: close\r\n\r\n").is_err() {
                return;
            }
            let _ = stream.set_write_timeout(None);
            let early = std::mem::take(&mut pending.buf);
            let duplex: Box<dyn choir_common::splice::Duplex> = match stream {
                Stream::Unix(s) => Box::new(s),
                Stream::Tcp(s) => Box::new(s),
            };
            tunnel(duplex, early);
            return;
        }
        match write_response(&mut stream, response, keep_alive) {
            Ok(Delivered::Whole) if keep_alive => continue,
            Ok(_) => return,
            Err(e) => {
                log::debug!("client went away before the reply to {}: {e}", crate::http::printable(&path));
                return;
            }
        }
    }
}

/// Bytes of a refused request's body discarded before its connection is
/// closed, and for how long at most.
const LINGER_BYTES: usize = 64 * 1024;
const LINGER_FOR: Duration = Duration::from_secs(1);

/// After answering a request refused from its head: stops writing, and
/// discards (never keeps, never parses) what is left of a small body, so a
/// client still sending it reads the answer instead of a broken pipe. At most
/// [`LINGER_BYTES`] and [`LINGER_FOR`]: a refused client costs no more.
fn linger(stream: &mut Stream, pending: &mut Buffered, declared: usize) {
    let left = declared.saturating_sub(pending.buf.len());
    pending.buf.clear();
    if left == 0 || left > LINGER_BYTES {
        return;
    }
    let _ = match stream {
        Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
    };
    let deadline = Instant::now() + LINGER_FOR;
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < left {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() || stream.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

struct ParsedHead {
    head: Head,
    keep_alive: bool,
    expect_continue: bool,
}

/// Reads until the end of a request head (`\r\n\r\n`), within the limits:
/// the first byte within `wait`, the rest of the head within `head_timeout`.
fn read_head(
    stream: &mut Stream,
    pending: &mut Buffered,
    limits: &Limits,
    wait: Duration,
) -> Result<ParsedHead, HeadError> {
    let mut deadline = Instant::now() + wait;
    let mut started = !pending.buf.is_empty();
    if started {
        deadline = Instant::now() + limits.head_timeout;
    }
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find_head_end(&pending.buf) {
            let parsed = parse_head(&pending.buf[..end], limits);
            pending.buf.drain(..end);
            return parsed;
        }
        if pending.buf.len() > limits.max_head_bytes {
            return Err(HeadError::Answer(
                Error::Malformed(format!("request head over {} bytes", limits.max_head_bytes)),
                431,
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(if started {
                HeadError::Answer(Error::Timeout("request head not received in time".into()), 408)
            } else {
                HeadError::Gone
            });
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Gone);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(if pending.buf.is_empty() { HeadError::Closed } else { HeadError::Gone }),
            Ok(n) => {
                if !started {
                    started = true;
                    deadline = Instant::now() + limits.head_timeout;
                }
                // Never keep more than the cap plus one read.
                pending.buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(if started {
                    HeadError::Answer(Error::Timeout("request head not received in time".into()), 408)
                } else {
                    HeadError::Gone
                });
            }
            Err(_) => return Err(HeadError::Gone),
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn parse_head(bytes: &[u8], limits: &Limits) -> Result<ParsedHead, HeadError> {
    let bad = |m: String| HeadError::Answer(Error::Malformed(m), 400);
    let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("incomplete request head".into())),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::Answer(
                Error::Malformed(format!("more than {} header lines", limits.max_headers)),
                431,
            ))
        }
        Err(e) => return Err(bad(format!("malformed request head: {e}"))),
    }
    let method = req.method.unwrap_or_default().to_owned();
    let target = req.path.unwrap_or_default();
    let http11 = req.version == Some(1);
    let mut content_length: Option<usize> = None;
    let mut bearer = None;
    let mut keep_alive = http11;
    let mut expect_continue = false;
    let mut browser = super::api::BrowserHeaders::default();
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| bad(format!("header {} is not UTF-8", h.name)))?;
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.trim().parse().map_err(|_| bad("invalid Content-Length".into()))?;
            if content_length.is_some_and(|m| m != n) {
                return Err(bad("conflicting Content-Length headers".into()));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HeadError::Answer(
                Error::Malformed("chunked request bodies are not accepted; send Content-Length".into()),
                411,
            ));
        } else if name.eq_ignore_ascii_case("authorization") {
            bearer = value.strip_prefix("Bearer ").map(|t| t.trim().to_owned());
        } else if name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                keep_alive = false;
            } else if v.contains("keep-alive") {
                keep_alive = true;
            }
        } else if name.eq_ignore_ascii_case("expect") && value.eq_ignore_ascii_case("100-continue") {
            expect_continue = true;
        } else if name.eq_ignore_ascii_case("host") {
            browser.host = Some(value.trim().to_owned());
        } else if name.eq_ignore_ascii_case("origin") {
            browser.origin = Some(value.trim().to_owned());
        } else if name.eq_ignore_ascii_case("sec-fetch-site") {
            browser.fetch_site = Some(value.trim().to_owned());
        } else if name.eq_ignore_ascii_case("cookie") {
            // Several Cookie lines are one list.
            let c = browser.cookie.get_or_insert_with(String::new);
            if !c.is_empty() {
                c.push_str("; ");
            }
            c.push_str(value.trim());
        }
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), super::api::parse_query(q)),
        None => (target.to_owned(), Vec::new()),
    };
    Ok(ParsedHead {
        head: Head { method, path, query, bearer, content_length: content_length.unwrap_or(0), browser },
        keep_alive,
        expect_continue,
    })
}

fn read_body(stream: &mut Stream, pending: &mut Buffered, len: usize, timeout: Duration) -> io::Result<Vec<u8>> {
    let mut body = Vec::with_capacity(len.min(1 << 20));
    let take = pending.buf.len().min(len);
    body.extend(pending.buf.drain(..take));
    let deadline = Instant::now() + timeout;
    let mut chunk = vec![0u8; 64 * 1024];
    while body.len() < len {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "body not received in time"));
        }
        stream.set_read_timeout(Some(left))?;
        let want = (len - body.len()).min(chunk.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "client closed mid-body")),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(body)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// How much of a reply's body reached the client.
#[derive(Debug, PartialEq, Eq)]
enum Delivered {
    /// All of it, with its end marked: the connection may carry another request.
    Whole,
    /// A streamed body whose source failed: its end is left unmarked (no last
    /// chunk), so the client sees a cut body, never a short one that looks
    /// whole, and the connection must close.
    Cut,
}

/// Writes a reply. A streamed body goes out chunked, one flushed chunk per
/// read of its source; the connection stays open after it only when the
/// source ended cleanly (its last chunk went out) and the client keeps alive.
/// The source is dropped after the last chunk is written, so whatever its
/// drop does (a relayed model call's ledger row) never delays the client.
fn write_response(stream: &mut Stream, response: Response, keep_alive: bool) -> io::Result<Delivered> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\n",
        response.status,
        reason(response.status),
        response.content_type
    );
    for (k, v) in &response.headers {
        // Header values come from choird, but never let one end the head early.
        if k.bytes().chain(v.bytes()).any(|b| b == b'\r' || b == b'\n') {
            continue;
        }
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    match response.stream {
        Some(mut reader) => {
            head.push_str(&format!(
                "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\nConnection: {connection}\r\n\r\n"
            ));
            stream.write_all(head.as_bytes())?;
            stream.flush()?;
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::debug!("stream source failed: {e}");
                        return Ok(Delivered::Cut);
                    }
                };
                let mut piece = format!("{n:x}\r\n").into_bytes();
                piece.extend_from_slice(&buf[..n]);
                piece.extend_from_slice(b"\r\n");
                stream.write_all(&piece)?;
                stream.flush()?;
            }
            stream.write_all(b"0\r\n\r\n")?;
            stream.flush()?;
            drop(reader);
            Ok(Delivered::Whole)
        }
        None => {
            head.push_str(&format!("Content-Length: {}\r\nConnection: {connection}\r\n\r\n", response.body.len()));
            let mut out = head.into_bytes();
            out.extend_from_slice(&response.body);
            stream.write_all(&out)?;
            stream.flush()?;
            Ok(Delivered::Whole)
        }
    }
}

/// Raises this process's open-file limit to its hard limit, so a flood of
/// connections meets the connection caps long before EMFILE. Returns the new
/// soft limit.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let current = getrlimit(Resource::Nofile);
    let Some(max) = current.maximum else {
        return current.current.unwrap_or(0);
    };
    if current.current.is_some_and(|c| c >= max) {
        return max;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: Some(max), maximum: Some(max) }) {
        Ok(()) => max,
        Err(e) => {
            log::warn!("cannot raise the open-file limit to {max}: {e}");
            current.current.unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Admitted;

    struct Echo;

    impl Handler for Echo {
        type Route = ();
        fn admit(&self, _kind: &ListenerKind, head: &Head) -> Result<Admitted<()>, Error> {
            if head.path == "/secret" && head.bearer.as_deref() != Some("t") {
                return Err(Error::Unauthorized("no".into()));
            }
            Ok(Admitted { max_body: 1024, route: () })
        }
        fn handle(&self, _kind: &ListenerKind, (): (), req: Request) -> Response {
            if req.path == "/panic" {
                panic!("boom");
            }
            if req.path == "/stream" {
                return Response::streaming(io::Cursor::new(b"abc".to_vec()));
            }
            if req.path == "/broken" {
                // Three bytes, then the source fails.
                return Response::streaming(io::Cursor::new(b"abc".to_vec()).chain(Failing));
            }
            Response {
                status: 200,
                body: req.body,
                content_type: "text/plain",
                headers: Vec::new(),
                stream: None,
                tunnel: None,
            }
        }
    }

    struct Failing;

    impl Read for Failing {
        fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("the upstream went away"))
        }
    }

    fn server(limits: Limits) -> (tempfile::TempDir, PathBuf, Server) {
        serve(Arc::new(Echo), limits)
    }

    fn serve<H: Handler>(handler: Arc<H>, limits: Limits) -> (tempfile::TempDir, PathBuf, Server) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let l = UnixListener::bind(&path).unwrap();
        let s = Server::start(Socket::Unix(l, path.clone()), ListenerKind::Tcp, handler, limits, "t").unwrap();
        (dir, path, s)
    }

    fn exchange(path: &PathBuf, raw: &[u8]) -> String {
        let mut c = UnixStream::connect(path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(raw).unwrap();
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    #[test]
    fn requests_are_answered_and_kept_alive() {
        let (_d, path, s) = server(Limits::default());
        let out = exchange(
            &path,
            b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiPOST /b HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nyou",
        );
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert!(out.contains("\r\n\r\nhi") && out.ends_with("you"), "{out}");
        s.stop();
    }

    #[test]
    fn oversized_heads_and_header_floods_are_refused() {
        let (_d, path, s) = server(Limits::default());
        let mut flood = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..100 {
            flood.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        flood.extend_from_slice(b"\r\n");
        assert!(exchange(&path, &flood).starts_with("HTTP/1.1 431"));
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', 40_000));
        assert!(exchange(&path, &long).starts_with("HTTP/1.1 431"));
        s.stop();
    }

    #[test]
    fn the_body_is_never_read_before_admission() {
        let (_d, path, s) = server(Limits::default());
        // Unauthenticated: refused from the head, the connection closed.
        let out = exchange(&path, b"POST /secret HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 401"), "{out}");
        let out = exchange(&path, b"POST /a HTTP/1.1\r\nContent-Length: 999999\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        let out = exchange(&path, b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 411"), "{out}");
        s.stop();
    }

    #[test]
    fn slow_clients_time_out_and_the_cap_holds() {
        let limits = Limits { max_connections: 4, head_timeout: Duration::from_millis(300), ..Limits::default() };
        let (_d, path, s) = server(limits);
        let idle: Vec<UnixStream> = (0..10).map(|_| UnixStream::connect(&path).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        assert!(s.active() <= 4, "{} connections served", s.active());
        // The head deadline frees the slots.
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(s.active(), 0);
        drop(idle);
        assert!(exchange(&path, b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 200"));
        // A body that trickles in past the head is cut at the body deadline.
        s.stop();
    }

    #[test]
    fn a_panicking_handler_is_answered_500() {
        let (_d, path, s) = server(Limits::default());
        assert!(exchange(&path, b"GET /panic HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 500"));
        assert!(exchange(&path, b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 200"));
        s.stop();
    }

    #[test]
    fn a_stream_that_ended_cleanly_leaves_the_connection_open_for_the_next_request() {
        let (_d, path, s) = server(Limits::default());
        let out = exchange(&path, b"GET /stream HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert!(out.contains("Connection: keep-alive\r\n\r\n3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200"), "{out}");
        // A client that asked to close gets its stream, marked, and the close.
        let out = exchange(&path, b"GET /stream HTTP/1.1\r\nConnection: close\r\n\r\nGET /a HTTP/1.1\r\n\r\n");
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 1, "{out}");
        assert!(out.contains("Connection: close\r\n") && out.ends_with("3\r\nabc\r\n0\r\n\r\n"), "{out}");
        s.stop();
    }

    #[test]
    fn a_stream_whose_source_fails_is_cut_unmarked_and_its_connection_closed() {
        let (_d, path, s) = server(Limits::default());
        let out = exchange(&path, b"GET /broken HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\n\r\n");
        // What came before the failure went out; the last chunk did not, so
        // the client cannot take the cut body for a whole one; the request
        // after it is never read.
        assert!(out.ends_with("\r\n\r\n3\r\nabc\r\n"), "{out}");
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 1, "{out}");
        s.stop();
    }

    /// A stream source whose drop waits until the client says it has the
    /// stream's end (or 5 s), and notes which came first.
    struct Gated {
        inner: io::Cursor<Vec<u8>>,
        release: crossbeam_channel::Receiver<()>,
        released_first: Arc<AtomicBool>,
    }

    impl Read for Gated {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.inner.read(buf)
        }
    }

    impl Drop for Gated {
        fn drop(&mut self) {
            let first = self.release.recv_timeout(Duration::from_secs(5)).is_ok();
            self.released_first.store(first, Ordering::SeqCst);
        }
    }

    struct GatedStream(crossbeam_channel::Receiver<()>, Arc<AtomicBool>);

    impl Handler for GatedStream {
        type Route = ();
        fn admit(&self, _kind: &ListenerKind, _head: &Head) -> Result<Admitted<()>, Error> {
            Ok(Admitted { max_body: 0, route: () })
        }
        fn handle(&self, _kind: &ListenerKind, (): (), _req: Request) -> Response {
            Response::streaming(Gated {
                inner: io::Cursor::new(b"abc".to_vec()),
                release: self.0.clone(),
                released_first: self.1.clone(),
            })
        }
    }

    #[test]
    fn a_streams_source_is_dropped_only_after_the_client_has_its_end() {
        // The relay records a model call when its stream's source is dropped:
        // that write must never stand between the agent and the answer's end.
        let (release, gate) = crossbeam_channel::bounded(1);
        let released_first = Arc::new(AtomicBool::new(false));
        let (_d, path, s) = serve(Arc::new(GatedStream(gate, released_first.clone())), Limits::default());
        let mut c = UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"0\r\n\r\n") {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "closed before the stream's end: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        release.send(()).unwrap();
        drop(c);
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.active() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(released_first.load(Ordering::SeqCst), "the source was dropped before the stream's end went out");
        s.stop();
    }
}
