//! The operator's console: a local web page to look at agents, approvals,
//! usage and the schedule, and to decide approvals — served by choird on a
//! Unix socket of its own (`socks/console.sock`, mode 0600), opened only
//! when the operator asks (`choirctl console`, which forwards a loopback
//! port to it and prints a one-time login address).
//!
//! **Invariants:**
//! - No listener exists until `POST /admin/v1/console/open` (the admin
//!   socket only) starts it; closed again when choird stops.
//! - Every request passes [`guard::Guard::check_site`] (Host, Origin) before
//!   anything else, and every page but `/login` and `/static/*` needs a live
//!   session; every state change also needs the session's CSRF token. The
//!   one-time code leaves the address bar by a redirect and is never logged.
//! - Every answer carries a CSP without inline script or anything
//!   third-party, `frame-ancestors 'none'`, `Referrer-Policy: same-origin` (a browser then sends its own `Origin` on the console's posts, and nothing beyond the console) and `no-store`.
//! - The only writes are deciding an approval (bound to the sha256 shown,
//!   exactly as `choirctl approvals approve --sha256`), the kill switch
//!   (behind a confirmation page) and logging out. Each is audited with the
//!   session's label. There is no shell, exec, file browser or config editor.

pub mod guard;
pub mod html;
mod live;
mod pages;
pub mod plot;

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::server::{Limits, Server, Socket};
use crate::http::{Admitted, Handler, Head, ListenerKind, Request, Response};
use guard::{Guard, Seen};

/// The console's service: its guard and, once opened, its listener.
pub struct Console {
    guard: Guard,
    server: Mutex<Option<Server>>,
    /// The loopback address of `console_listen`, when configured.
    configured: Mutex<Option<std::net::SocketAddr>>,
    daemon: Mutex<Option<std::sync::Weak<Daemon>>>,
}

/// What `console/open` answers.
#[derive(Debug, serde::Serialize)]
pub struct Opened {
    /// The console's socket, to forward a loopback port to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// The loopback address it listens on itself (`console_listen`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// A one-time login code.
    pub code: String,
}

impl Default for Console {
    fn default() -> Console {
        Console {
            guard: Guard::default(),
            server: Mutex::new(None),
            configured: Mutex::new(None),
            daemon: Mutex::new(None),
        }
    }
}

impl Console {
    /// Listens on `listener` (`console_listen`, loopback) from now on.
    pub fn listen_on(self: &Arc<Self>, d: &Arc<Daemon>, listener: std::net::TcpListener) -> Result<(), Error> {
        let addr = listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?;
        *self.daemon.lock() = Some(Arc::downgrade(d));
        let handler = Arc::new(Pages { console: self.clone() });
        let limits = Limits { max_connections: 32, ..Limits::default() };
        let s = Server::start(Socket::Tcp(listener), ListenerKind::Console, handler, limits, "console")
            .map_err(|e| Error::Internal(format!("console listener: {e}")))?;
        self.guard.allow_port(addr.port());
        *self.configured.lock() = Some(addr);
        *self.server.lock() = Some(s);
        Ok(())
    }

    /// Starts the listener if it is not running, allows `port` (the
    /// operator's forwarder) and mints a one-time code. With
    /// `console_listen` configured, that listener is the console: the code
    /// is for it, and no socket is made.
    pub fn open(self: &Arc<Self>, d: &Arc<Daemon>, port: u16) -> Result<Opened, Error> {
        if let Some(addr) = *self.configured.lock() {
            d.audit("admin", None, "console.open", "ok", serde_json::json!({"listen": addr.to_string()}));
            return Ok(Opened { socket: None, listen: Some(addr.to_string()), code: self.guard.code()? });
        }
        let path = d.home.socks().join("console.sock");
        {
            let mut server = self.server.lock();
            if server.is_none() {
                *self.daemon.lock() = Some(Arc::downgrade(d));
                let group = d.config().admin_group.as_deref().and_then(crate::sockets::group_id);
                let (listener, path) = crate::sockets::bind_console(&d.home.socks(), group)
                    .map_err(|e| Error::Internal(format!("console socket: {e}")))?;
                let limits = Limits { max_connections: 32, ..Limits::default() };
                let handler = Arc::new(Pages { console: self.clone() });
                let s = Server::start(
                    Socket::Unix(listener, path.clone()),
                    ListenerKind::Console,
                    handler,
                    limits,
                    "console",
                )
                .map_err(|e| Error::Internal(format!("console listener: {e}")))?;
                *server = Some(s);
                log::info!("console listening on {}", path.display());
            }
        }
        self.guard.allow_port(port);
        d.audit("admin", None, "console.open", "ok", serde_json::json!({"port": port}));
        Ok(Opened { socket: Some(path), listen: None, code: self.guard.code()? })
    }

    /// Ends every session and code.
    pub fn revoke(&self, d: &Daemon) -> usize {
        let n = self.guard.revoke_all();
        d.audit("admin", None, "console.revoke", "ok", serde_json::json!({"sessions": n}));
        n
    }

    /// Whether its listener runs, and its live sessions.
    pub fn state(&self) -> (bool, usize) {
        (self.server.lock().is_some(), self.guard.sessions())
    }

    /// Stops the listener (choird's shutdown).
    pub fn stop(&self) {
        if let Some(s) = self.server.lock().take() {
            s.stop();
        }
    }

    fn daemon(&self) -> Option<Arc<Daemon>> {
        self.daemon.lock().as_ref().and_then(std::sync::Weak::upgrade)
    }
}

/// The console's HTTP handler.
struct Pages {
    console: Arc<Console>,
}

/// A request as the console admitted it.
#[derive(Debug)]
pub struct Admit {
    /// Refused already (status, why), before any body byte.
    refused: Option<(u16, &'static str)>,
    /// The session id (cookie), when it has one.
    session: Option<(String, guard::Session)>,
}

/// Largest form body.
const MAX_FORM: usize = 16 * 1024;

impl Handler for Pages {
    type Route = Admit;

    fn admit(&self, _: &ListenerKind, head: &Head) -> Result<Admitted<Admit>, Error> {
        let seen = Seen {
            host: head.browser.host.as_deref(),
            origin: head.browser.origin.as_deref(),
            fetch_site: head.browser.fetch_site.as_deref(),
            cookie: head.browser.cookie.as_deref(),
        };
        let changes = head.method != "GET" && head.method != "HEAD";
        let refused = self.console.guard.check_site(&seen, changes).err().map(|r| r.answer());
        let session = if refused.is_none() { self.console.guard.session(&seen) } else { None };
        // A refused request's small body is read and dropped, so the
        // refusal itself is what the client reads.
        Ok(Admitted { max_body: MAX_FORM, route: Admit { refused, session } })
    }

    fn handle(&self, _: &ListenerKind, admit: Admit, req: Request) -> Response {
        let mut response = match (admit.refused, self.console.daemon()) {
            (Some((status, why)), _) => pages::plain(status, why),
            (None, None) => pages::plain(503, "choird is stopping"),
            (None, Some(d)) => pages::route(&d, &self.console.guard, admit.session, &req),
        };
        harden(&mut response);
        response
    }
}

/// The headers every console answer carries.
fn harden(r: &mut Response) {
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
               form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    for (k, v) in [
        ("Content-Security-Policy", csp),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "same-origin"),
        ("X-Content-Type-Options", "nosniff"),
        ("Cross-Origin-Opener-Policy", "same-origin"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
        ("Cache-Control", "no-store"),
    ] {
        r.headers.push((k.to_owned(), v.to_owned()));
    }
}
