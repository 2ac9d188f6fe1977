//! Who may use the console, decided for every request before anything else:
//! the `Host` and `Origin` it names, the session its cookie carries, and for
//! a state change the session's CSRF token.
//!
//! **Invariants:**
//! - A one-time code works once, within [`CODE_TTL`]; it is exchanged for a
//!   session and forgotten. Codes and sessions are random 256-bit values,
//!   compared in constant time, never logged.
//! - A session ends after [`IDLE`] without a request, after [`LIFETIME`]
//!   whatever happens, or when revoked; at most [`MAX_SESSIONS`] live at
//!   once (the oldest goes).
//! - `Host` must be one of the console's own addresses (DNS rebinding: a
//!   page on `evil.example` resolved to 127.0.0.1 still sends its own name);
//!   an `Origin`, when sent, must be the console's own; a request that
//!   changes anything must carry an `Origin` or `Sec-Fetch-Site:
//!   same-origin`, and the session's CSRF token.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::daemon::random_token;

/// How long a one-time code may wait to be used.
pub const CODE_TTL: Duration = Duration::from_secs(120);
/// A session's idle limit.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session's whole life.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions at once.
pub const MAX_SESSIONS: usize = 16;
/// Codes waiting at once.
const MAX_CODES: usize = 8;
/// The session cookie's name.
pub const COOKIE: &str = "choir_console";

/// The short name of a session in the audit (the first 8 hex digits of
/// its id's sha256): never the id itself.
pub fn label_of(id: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(id.as_bytes()))[..8].to_owned()
}

/// Equality that takes the same time wherever the first difference is.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One operator's session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Its short name in the audit (the first 8 hex digits of its id's
    /// sha256: the id itself is never written anywhere).
    pub label: String,
    /// The token each state change must carry.
    pub csrf: String,
    created: Instant,
    seen: Instant,
}

/// Codes, sessions and the console's own addresses.
#[derive(Default)]
pub struct Guard {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    codes: Vec<(String, Instant)>,
    sessions: HashMap<String, Session>,
    /// `host:port` spellings the console answers to.
    hosts: Vec<String>,
}

/// Why a request is refused (said in the answer; never names a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` is not the console's (403).
    Host,
    /// The `Origin` is not the console's, or a state change has none (403).
    Origin,
    /// No valid session (401: log in again with `choirctl console`).
    Session,
    /// The CSRF token is missing or wrong (403).
    Csrf,
}

impl Refusal {
    /// The answer's status and text.
    pub fn answer(&self) -> (u16, &'static str) {
        match self {
            Refusal::Host => (403, "this console answers only to its own address (Host refused)"),
            Refusal::Origin => (403, "a request from another origin is refused"),
            Refusal::Session => (401, "no session: open the console again with choirctl console"),
            Refusal::Csrf => (403, "the form's token is missing or stale: reload the page"),
        }
    }
}

/// The browser headers a request brought.
#[derive(Debug, Clone, Default)]
pub struct Seen<'a> {
    /// `Host`.
    pub host: Option<&'a str>,
    /// `Origin`.
    pub origin: Option<&'a str>,
    /// `Sec-Fetch-Site`.
    pub fetch_site: Option<&'a str>,
    /// `Cookie`.
    pub cookie: Option<&'a str>,
}

impl Guard {
    /// Answers to `port` on loopback (its spellings `127.0.0.1`, `localhost`,
    /// `[::1]`), besides any port allowed before.
    pub fn allow_port(&self, port: u16) {
        let mut inner = self.inner.lock();
        for h in ["127.0.0.1", "localhost", "[::1]"] {
            let hp = format!("{h}:{port}");
            if !inner.hosts.contains(&hp) {
                inner.hosts.push(hp);
            }
        }
        // A forwarder per `choirctl console`: keep the last few only.
        let excess = inner.hosts.len().saturating_sub(3 * 8);
        inner.hosts.drain(..excess);
    }

    /// A new one-time code.
    pub fn code(&self) -> Result<String, crate::error::Error> {
        let mut inner = self.inner.lock();
        inner.codes.retain(|(_, at)| at.elapsed() < CODE_TTL);
        let excess = (inner.codes.len() + 1).saturating_sub(MAX_CODES);
        inner.codes.drain(..excess);
        let code = random_token()?;
        inner.codes.push((code.clone(), Instant::now()));
        Ok(code)
    }

    /// Exchanges `code` for a new session: its id (the cookie's value), or
    /// `None` when the code is unknown, used or expired.
    pub fn redeem(&self, code: &str) -> Option<(String, Session)> {
        let mut inner = self.inner.lock();
        inner.codes.retain(|(_, at)| at.elapsed() < CODE_TTL);
        let i = inner.codes.iter().position(|(c, _)| same(c, code))?;
        inner.codes.remove(i);
        let id = random_token().ok()?;
        let now = Instant::now();
        let label = label_of(&id);
        let session = Session { label, csrf: random_token().ok()?, created: now, seen: now };
        if inner.sessions.len() >= MAX_SESSIONS {
            if let Some(oldest) = inner.sessions.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| k.clone()) {
                inner.sessions.remove(&oldest);
            }
        }
        inner.sessions.insert(id.clone(), session.clone());
        Some((id, session))
    }

    /// Ends every session (`choirctl console --revoke`), returning how many.
    pub fn revoke_all(&self) -> usize {
        let mut inner = self.inner.lock();
        let n = inner.sessions.len();
        inner.sessions.clear();
        inner.codes.clear();
        n
    }

    /// Ends the session `id`.
    pub fn end(&self, id: &str) {
        self.inner.lock().sessions.retain(|k, _| !same(k, id));
    }

    /// Sessions alive now.
    pub fn sessions(&self) -> usize {
        let mut inner = self.inner.lock();
        inner.sessions.retain(|_, s| alive(s));
        inner.sessions.len()
    }

    /// Checks `Host` and `Origin`: for every request, logged in or not.
    pub fn check_site(&self, seen: &Seen<'_>, changes: bool) -> Result<(), Refusal> {
        let inner = self.inner.lock();
        let host = seen.host.ok_or(Refusal::Host)?;
        if !inner.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return Err(Refusal::Host);
        }
        match seen.origin {
            Some(o) => {
                let own = o
                    .strip_prefix("http://")
                    .is_some_and(|rest| inner.hosts.iter().any(|h| h.eq_ignore_ascii_case(rest)));
                if !own {
                    return Err(Refusal::Origin);
                }
            }
            None if changes && seen.fetch_site != Some("same-origin") => return Err(Refusal::Origin),
            None => {}
        }
        if seen.fetch_site.is_some_and(|s| s == "cross-site" || s == "same-site") {
            return Err(Refusal::Origin);
        }
        Ok(())
    }

    /// The session the cookie names, touched; `None` when there is none or
    /// it expired (then it is forgotten).
    pub fn session(&self, seen: &Seen<'_>) -> Option<(String, Session)> {
        let id = cookie_value(seen.cookie?, COOKIE)?;
        let mut inner = self.inner.lock();
        let key = inner.sessions.keys().find(|k| same(k, id)).cloned()?;
        let s = inner.sessions.get_mut(&key)?;
        if !alive(s) {
            inner.sessions.remove(&key);
            return None;
        }
        s.seen = Instant::now();
        Some((key, s.clone()))
    }

    /// Ages every session by `by` (tests of expiry).
    #[cfg(test)]
    pub fn age(&self, by: Duration) {
        for s in self.inner.lock().sessions.values_mut() {
            s.seen = s.seen.checked_sub(by).unwrap_or(s.seen);
            s.created = s.created.checked_sub(by).unwrap_or(s.created);
        }
    }
}

fn alive(s: &Session) -> bool {
    s.seen.elapsed() < IDLE && s.created.elapsed() < LIFETIME
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').map(str::trim).find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        let g = Guard::default();
        g.allow_port(4711);
        g
    }

    fn seen<'a>(host: &'a str, origin: Option<&'a str>, cookie: Option<&'a str>) -> Seen<'a> {
        Seen { host: Some(host), origin, fetch_site: None, cookie }
    }

    #[test]
    fn a_code_works_once_and_its_session_is_found_by_its_cookie() {
        let g = guard();
        let code = g.code().unwrap();
        let (id, s) = g.redeem(&code).expect("a fresh code");
        assert!(g.redeem(&code).is_none(), "a replayed code is refused");
        let cookie = format!("other=1; {COOKIE}={id}");
        let (_, found) = g.session(&seen("127.0.0.1:4711", None, Some(&cookie))).unwrap();
        assert_eq!(found.csrf, s.csrf);
        assert!(g.session(&seen("127.0.0.1:4711", None, Some(&format!("{COOKIE}=nope")))).is_none());
        assert!(g.redeem("0000").is_none());
    }

    #[test]
    fn an_idle_or_revoked_session_is_gone() {
        let g = guard();
        let (id, _) = g.redeem(&g.code().unwrap()).unwrap();
        let cookie = format!("{COOKIE}={id}");
        g.age(IDLE + Duration::from_secs(1));
        assert!(g.session(&seen("127.0.0.1:4711", None, Some(&cookie))).is_none(), "idle too long");
        let (id, _) = g.redeem(&g.code().unwrap()).unwrap();
        let cookie = format!("{COOKIE}={id}");
        assert!(g.session(&seen("127.0.0.1:4711", None, Some(&cookie))).is_some(), "negative control");
        assert_eq!(g.revoke_all(), 1);
        assert!(g.session(&seen("127.0.0.1:4711", None, Some(&cookie))).is_none());
    }

    #[test]
    fn foreign_hosts_and_origins_are_refused_and_a_change_needs_an_origin() {
        let g = guard();
        assert_eq!(g.check_site(&seen("127.0.0.1:4711", None, None), false), Ok(()));
        assert_eq!(g.check_site(&seen("localhost:4711", Some("http://localhost:4711"), None), true), Ok(()));
        assert_eq!(g.check_site(&seen("evil.example:4711", None, None), false), Err(Refusal::Host), "rebinding");
        assert_eq!(g.check_site(&seen("127.0.0.1:4712", None, None), false), Err(Refusal::Host));
        let foreign = seen("127.0.0.1:4711", Some("http://evil.example"), None);
        assert_eq!(g.check_site(&foreign, false), Err(Refusal::Origin));
        assert_eq!(g.check_site(&seen("127.0.0.1:4711", Some("null"), None), true), Err(Refusal::Origin));
        assert_eq!(g.check_site(&seen("127.0.0.1:4711", None, None), true), Err(Refusal::Origin), "no origin");
        let cross = Seen { fetch_site: Some("cross-site"), ..seen("127.0.0.1:4711", None, None) };
        assert_eq!(g.check_site(&cross, false), Err(Refusal::Origin));
    }
}
