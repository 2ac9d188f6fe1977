//! The egress proxy of one agent's browser context: an HTTP proxy on
//! loopback that Chromium sends every request of that context through
//! (`Target.createBrowserContext { proxyServer }`, loopback not bypassed).
//! It applies the agent's egress policy to each connection — the page, each
//! redirect, each sub-resource — at the address it actually connects to:
//! it resolves the name itself, checks the address and connects to exactly
//! that address (a rebinding DNS answer cannot move it).
//!
//! HTTPS goes through `CONNECT` tunnels (TLS stays end to end between the
//! browser and the site); plain HTTP requests are forwarded one per
//! connection (`Connection: close`, so a kept-alive connection can never
//! carry a second request to another host past the check).
//!
//! **Invariants:** connections at once are bounded ([`MAX_CONNECTIONS`]);
//! a request head is read only up to [`MAX_HEAD`] bytes; a connection
//! receives at most the page cap from the site, then is cut; every refusal
//! and cut is recorded (bounded) for the tool to report.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::egress::Policy;

/// Connections served at once; beyond, 503.
pub const MAX_CONNECTIONS: usize = 64;
/// Largest request head read.
const MAX_HEAD: usize = 32 * 1024;
/// Refusals remembered at most.
const MAX_RECORDS: usize = 64;
/// How long a connection to a site may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle time after which a connection is dropped.
const IDLE: Duration = Duration::from_secs(60);

/// The one spelling of a destination, by which the proxy records a refusal
/// and the tab looks its page up: host lowercased without a trailing dot,
/// an IPv6 literal bracketed in its canonical form (`[::1]:80` however the
/// page wrote it).
pub fn target_key(host: &str, port: u16) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::Ipv6Addr>() {
        Ok(v6) => format!("[{v6}]:{port}"),
        Err(_) => format!("{}:{port}", bare.trim_end_matches('.').to_ascii_lowercase()),
    }
}

/// A request the proxy refused or cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// `host:port` asked for.
    pub target: String,
    /// Why.
    pub reason: String,
    /// Whether it was cut for size (else refused by policy or unreachable).
    pub over_size: bool,
    /// When.
    pub at: Instant,
}

struct State {
    policy: Mutex<Policy>,
    max_bytes: u64,
    blocked: Mutex<Vec<Blocked>>,
    active: AtomicUsize,
    stop: AtomicBool,
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Starts a proxy for `policy` on an ephemeral loopback port; each
    /// connection may receive `max_bytes` from its site.
    pub fn start(policy: Policy, max_bytes: u64) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            policy: Mutex::new(policy),
            max_bytes,
            blocked: Mutex::new(Vec::new()),
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        std::thread::Builder::new().name("browser-proxy".into()).spawn(move || accept_loop(&listener, &st))?;
        Ok(Proxy { addr, state })
    }

    /// `http://127.0.0.1:PORT`, for Chromium.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Applies `policy` from the next connection on (a config reload).
    pub fn set_policy(&self, policy: Policy) {
        *self.state.policy.lock() = policy;
    }

    /// What was refused or cut since `since`.
    pub fn blocked_since(&self, since: Instant) -> Vec<Blocked> {
        self.state.blocked.lock().iter().filter(|b| b.at >= since).cloned().collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

impl State {
    fn record(&self, target: &str, reason: &str, over_size: bool) {
        let mut b = self.blocked.lock();
        if b.len() >= MAX_RECORDS {
            b.remove(0);
        }
        b.push(Blocked { target: target.to_owned(), reason: reason.to_owned(), over_size, at: Instant::now() });
    }
}

/// Decrements the active count when a connection ends.
struct Slot(Arc<State>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>) {
    for conn in listener.incoming() {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        if state.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            state.active.fetch_sub(1, Ordering::SeqCst);
            let _ =
                conn.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            continue;
        }
        let slot = Slot(state.clone());
        let spawned = std::thread::Builder::new().name("browser-proxy-conn".into()).spawn(move || {
            let st = slot.0.clone();
            serve(&st, conn);
            drop(slot);
        });
        if spawned.is_err() {
            // The slot was moved into the closure that never ran and is dropped with it.
            continue;
        }
    }
}

/// Reads a request head (up to the blank line); returns it and whatever
/// followed it in the same reads.
fn read_head(conn: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn reply(conn: &mut TcpStream, status: &str, body: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn serve(state: &State, mut conn: TcpStream) {
    // Bytes are relayed as they come: no Nagle delay on either side.
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(IDLE));
    let _ = conn.set_write_timeout(Some(IDLE));
    let Some((head, rest)) = read_head(&mut conn) else { return };
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(&head), Ok(httparse::Status::Complete(_))) {
        return reply(&mut conn, "400 Bad Request", "malformed request");
    }
    let (Some(method), Some(target)) = (req.method, req.path) else { return };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = match target.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>())) {
            Some((h, Ok(p))) => (h.to_owned(), p),
            _ => return reply(&mut conn, "400 Bad Request", "CONNECT needs host:port"),
        };
        let Some(site) = open(state, &mut conn, &host, port) else { return };
        if conn.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").is_err() {
            return;
        }
        let mut site = site;
        if !rest.is_empty() && site.write_all(&rest).is_err() {
            return;
        }
        return pump(state, conn, site, &target_key(&host, port));
    }
    // Plain HTTP: the target is an absolute URL.
    let Ok(url) = url::Url::parse(target) else {
        return reply(&mut conn, "400 Bad Request", "a proxy request needs an absolute URL");
    };
    if url.scheme() != "http" {
        state.record(target, "only http and https are allowed", false);
        return reply(&mut conn, "403 Forbidden", "refused by Choir's egress policy: only http and https");
    }
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let Some(mut site) = open(state, &mut conn, &host, port) else { return };
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    };
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        out.push_str(h.name);
        out.push_str(": ");
        out.push_str(&String::from_utf8_lossy(h.value));
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    if site.write_all(out.as_bytes()).is_err() || (!rest.is_empty() && site.write_all(&rest).is_err()) {
        return;
    }
    pump(state, conn, site, &target_key(&host, port));
}

/// Checks and connects to `host:port` for the browser; on refusal answers
/// the browser and records why.
fn open(state: &State, conn: &mut TcpStream, host: &str, port: u16) -> Option<TcpStream> {
    let target = target_key(host, port);
    let policy = state.policy.lock().clone();
    let addr = match policy.resolve(host, port) {
        Ok(a) => a,
        Err(e) => {
            state.record(&target, &e.0, false);
            reply(conn, "403 Forbidden", &format!("refused by Choir's egress policy: {}", e.0));
            return None;
        }
    };
    match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(s) => {
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(IDLE));
            let _ = s.set_write_timeout(Some(IDLE));
            Some(s)
        }
        Err(e) => {
            state.record(&target, &format!("{target} could not be reached: {}", e.kind()), false);
            reply(conn, "502 Bad Gateway", "the site could not be reached");
            None
        }
    }
}

/// Copies both ways until either side closes; the site's side at most
/// `max_bytes`.
fn pump(state: &State, client: TcpStream, site: TcpStream, target: &str) {
    let (Ok(mut client_r), Ok(mut site_w)) = (client.try_clone(), site.try_clone()) else { return };
    let upstream = std::thread::Builder::new().name("browser-proxy-up".into()).spawn(move || {
        let _ = std::io::copy(&mut client_r, &mut site_w);
        let _ = site_w.shutdown(Shutdown::Write);
    });
    let (mut site_r, mut client_w) = (site, client);
    let mut total: u64 = 0;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match site_r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        total += n as u64;
        if total > state.max_bytes {
            state.record(target, &format!("more than {} MiB from {target}; cut", state.max_bytes >> 20), true);
            break;
        }
        if client_w.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = client_w.shutdown(Shutdown::Both);
    let _ = site_r.shutdown(Shutdown::Both);
    if let Ok(h) = upstream {
        let _ = h.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentWeb;

    fn proxy(allow_loopback: bool, max: u64) -> Proxy {
        let web = AgentWeb {
            allow_addresses: if allow_loopback { vec!["127.0.0.1/32".into()] } else { vec![] },
            ..AgentWeb::default()
        };
        Proxy::start(Policy::new(&web), max).unwrap()
    }

    /// A site answering every request with `body`.
    fn site(body: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                let _ = read_head(&mut c);
                let _ = write!(c, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                let _ = c.write_all(body);
            }
        });
        addr
    }

    fn get(proxy: &Proxy, url: &str) -> String {
        let mut c = TcpStream::connect(proxy.addr).unwrap();
        write!(c, "GET {url} HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    #[test]
    fn loopback_is_refused_by_default_and_recorded() {
        let addr = site(b"secret");
        let p = proxy(false, 1 << 20);
        let since = Instant::now();
        let answer = get(&p, &format!("http://{addr}/"));
        assert!(answer.starts_with("HTTP/1.1 403") && !answer.contains("secret"), "{answer}");
        let b = p.blocked_since(since);
        assert_eq!(b.len(), 1);
        assert!(b[0].reason.contains("internal"), "{b:?}");
        let mut c = TcpStream::connect(p.addr).unwrap();
        write!(c, "CONNECT 169.254.169.254:443 HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    }

    #[test]
    fn an_allowed_site_is_forwarded_and_a_big_one_is_cut() {
        let addr = site(b"hello");
        let p = proxy(true, 1 << 20);
        let answer = get(&p, &format!("http://{addr}/x?y=1"));
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"), "{answer}");
        static BIG: [u8; 300_000] = [b'a'; 300_000];
        let addr = site(&BIG);
        let p = proxy(true, 100_000);
        let since = Instant::now();
        let answer = get(&p, &format!("http://{addr}/"));
        assert!(answer.len() <= 100_000, "{}", answer.len());
        assert!(p.blocked_since(since).iter().any(|b| b.over_size));
    }

    #[test]
    fn regression_an_ipv6_refusal_was_reported_as_an_opened_page() {
        // The tab looks a page's refusal up by the URL's host; the proxy
        // records it by the host the browser sent. Both spell it one way.
        let p = proxy(false, 1 << 20);
        for (sent, url) in [
            ("[::1]", "http://[::1]:8080/"),
            ("[::ffff:7f00:1]", "http://[::ffff:127.0.0.1]:8080/"),
            ("[0:0:0:0:0:0:0:0]", "http://[::]:8080/"),
        ] {
            let since = Instant::now();
            let answer = get(&p, &format!("http://{sent}:8080/"));
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
            let blocked = p.blocked_since(since);
            let key = crate::host_tools::browser::target_of(url).unwrap();
            assert!(blocked.iter().any(|b| b.target == key), "{key} not among {blocked:?}");
        }
        assert_eq!(target_key("Example.COM.", 443), "example.com:443");
        // Negative control: the old spelling (brackets stripped) matched nothing.
        assert_ne!(target_key("[::1]", 80), "::1:80");
    }
}
