//! The browser behind `choir.web.browse`: one headless Chromium per choird,
//! started on first use and started again if it died, driven over the
//! DevTools protocol ([`cdp`]); **one isolated browser context per agent**
//! (its own cookies, storage and cache, never shared), each with its own
//! egress proxy ([`proxy`]) that applies the agent's policy to every
//! request the context makes.
//!
//! **Invariants:**
//! - An agent's actions run one at a time (its tab's mutex); agents run in
//!   parallel.
//! - Downloads are denied, file choosers intercepted (never answered),
//!   JavaScript dialogs dismissed; the page only ever shows `http`/`https`
//!   (anything else is left for `about:blank` and refused).
//! - Every action has a deadline (`web.browser.load_timeout_ms` for page
//!   loads, `action_timeout_ms` for the rest); the text returned is capped.
//! - A browser that dies fails the calls in flight with a clear error; the
//!   next call starts a new browser (and new, empty contexts).
//! - A tab whose call timed out (a page that spins, hangs its renderer or
//!   never loads) or that opened more than [`MAX_DIALOGS`] dialogs in one
//!   call is discarded when the call returns: its renderer is crashed (on
//!   the renderer's IO thread, which a spinning script does not block), its
//!   target closed and its context disposed; the agent's next call gets a
//!   fresh tab. So no page burns CPU after its call, and none ends an
//!   agent's browsing.

pub mod cdp;
pub mod launch;
pub mod proxy;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use choir_common::ids::AgentId;
use crossbeam_channel::Receiver;
use parking_lot::Mutex;
use serde_json::{json, Value};

use self::cdp::{CdpError, Connection, Event};
use self::proxy::{Blocked, Proxy};
use crate::config::{AgentWeb, BrowserConfig};
use crate::egress::Policy;

/// The readable-text extractor, run in an isolated world.
const READABLE_JS: &str = include_str!("readable.js");
/// Largest screenshot kept.
pub const MAX_SCREENSHOT: usize = 20 * 1024 * 1024;
/// How long a click or a typed submit is watched for a navigation it starts.
const NAV_GRACE: Duration = Duration::from_millis(400);
/// Network quiet that counts as "rendered" after a load.
const QUIET: Duration = Duration::from_millis(60);
/// Longest wait for that quiet after the load.
const QUIET_MAX: Duration = Duration::from_secs(2);

/// Dialogs (`alert`, `confirm`, `prompt`, `beforeunload`) one call
/// dismisses before it gives up on the page.
pub const MAX_DIALOGS: u32 = 20;

/// Why an action failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrowseError {
    /// Refused by policy or by the tool's rules (nothing was loaded).
    #[error("{0}")]
    Refused(String),
    /// Bad input (an unknown link number, a selector that matches nothing).
    #[error("{0}")]
    Invalid(String),
    /// The page or action failed.
    #[error("{0}")]
    Failed(String),
    /// Out of time.
    #[error("{0}")]
    Timeout(String),
    /// Chromium is not installed or would not start.
    #[error("{0}")]
    Unavailable(String),
}

/// A page as the model gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Its title.
    pub title: String,
    /// Its final URL (after redirects).
    pub url: String,
    /// Its readable text, links numbered `[n]`.
    pub text: String,
    /// How many links it numbered.
    pub links: usize,
    /// Whether the text was cut.
    pub truncated: bool,
    /// Requests of the page refused or cut by the egress proxy meanwhile.
    pub blocked: Vec<Blocked>,
}

/// One agent's context and its one tab.
struct Tab {
    generation: u64,
    conn: Connection,
    context: String,
    target: String,
    session: String,
    events: Receiver<Event>,
    proxy: Proxy,
    policy_of: AgentWeb,
    links: Vec<String>,
    /// Dialogs dismissed during the current call.
    dialogs: std::cell::Cell<u32>,
}

struct Running {
    process: launch::Process,
    generation: u64,
}

/// The browser of a choird.
#[derive(Default)]
pub struct Browser {
    running: Mutex<Option<Running>>,
    tabs: Mutex<HashMap<AgentId, Arc<Mutex<Option<Tab>>>>>,
    generations: AtomicU64,
}

fn cdp_err(e: CdpError, what: &str) -> BrowseError {
    match e {
        CdpError::Closed => BrowseError::Failed(format!(
            "the browser exited during {what}; the next call starts a new one (this agent's cookies are gone)"
        )),
        CdpError::Timeout(_) => BrowseError::Timeout(format!("{what} took too long")),
        CdpError::Protocol(m) => BrowseError::Failed(format!("{what} failed: {m}")),
    }
}

/// Whether the page may be shown: `http`, `https`, or the blank page.
fn showable(url: &str) -> bool {
    url == "about:blank" || url.starts_with("http://") || url.starts_with("https://")
}

/// `host:port` of a URL, as the proxy records its targets.
fn target_of(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    Some(proxy::target_key(u.host_str()?, u.port_or_known_default()?))
}

impl Browser {
    /// A browser, not started yet.
    pub fn new() -> Browser {
        Browser::default()
    }

    /// The pid of the running browser, if any.
    pub fn pid(&self) -> Option<u32> {
        self.running.lock().as_ref().map(|r| r.process.pid())
    }

    /// Stops the browser and forgets every context.
    pub fn stop(&self) {
        self.tabs.lock().clear();
        if let Some(mut r) = self.running.lock().take() {
            r.process.stop();
            log::info!("browser: stopped");
        }
    }

    /// The running browser's connection, starting one if none runs or it died.
    fn connection(&self, config: &BrowserConfig) -> Result<(Connection, u64), BrowseError> {
        let mut running = self.running.lock();
        if let Some(r) = running.as_ref() {
            if r.process.alive() {
                return Ok((r.process.conn.clone(), r.generation));
            }
            log::warn!("browser: the browser (pid {}) is gone; starting a new one", r.process.pid());
        }
        if let Some(mut old) = running.take() {
            old.process.stop();
        }
        let process = launch::Process::start(config).map_err(BrowseError::Unavailable)?;
        let generation = self.generations.fetch_add(1, Ordering::SeqCst) + 1;
        let conn = process.conn.clone();
        *running = Some(Running { process, generation });
        Ok((conn, generation))
    }

    /// Runs `f` on `agent`'s tab (made when missing or from a dead browser).
    fn with_tab<T>(
        &self,
        agent: &AgentId,
        web: &AgentWeb,
        config: &BrowserConfig,
        f: impl FnOnce(&mut Tab) -> Result<T, BrowseError>,
    ) -> Result<T, BrowseError> {
        let slot = self.tabs.lock().entry(agent.clone()).or_default().clone();
        let mut guard = slot.lock();
        let (conn, generation) = self.connection(config)?;
        let stale = guard.as_ref().is_none_or(|t| t.generation != generation || t.conn.is_closed());
        if stale {
            *guard = None;
            *guard = Some(Tab::open(conn, generation, web, config)?);
        }
        let Some(tab) = guard.as_mut() else { return Err(BrowseError::Failed("no tab".into())) };
        if tab.policy_of != *web {
            tab.proxy.set_policy(Policy::new(web));
            tab.policy_of = web.clone();
        }
        tab.dialogs.set(0);
        let result = f(tab);
        if matches!(&result, Err(BrowseError::Failed(_))) && tab.conn.is_closed() {
            *guard = None;
        } else if matches!(&result, Err(BrowseError::Timeout(_))) || tab.dialogs.get() > MAX_DIALOGS {
            log::warn!("agent {agent}: its browser tab is discarded after a hung or hostile page; the next call gets a new one");
            tab.crash();
            *guard = None;
        }
        result
    }

    /// Opens `url` in `agent`'s tab.
    pub fn open(
        &self,
        agent: &AgentId,
        web: &AgentWeb,
        config: &BrowserConfig,
        url: &str,
    ) -> Result<Page, BrowseError> {
        let url = Policy::new(web).check_url(url).map_err(|e| BrowseError::Refused(e.0))?;
        self.with_tab(agent, web, config, |tab| tab.navigate(url.as_str(), config))
    }

    /// Follows link `n` of the last page read, or clicks the element `selector`.
    pub fn click(
        &self,
        agent: &AgentId,
        web: &AgentWeb,
        config: &BrowserConfig,
        link: Option<u64>,
        selector: Option<&str>,
    ) -> Result<Page, BrowseError> {
        self.with_tab(agent, web, config, |tab| match (link, selector) {
            (Some(n), None) => {
                let href = usize::try_from(n)
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| tab.links.get(i))
                    .cloned()
                    .ok_or_else(|| {
                        BrowseError::Invalid(format!("there is no link [{n}] on the page (it has {})", tab.links.len()))
                    })?;
                let url = Policy::new(web).check_url(&href).map_err(|e| BrowseError::Refused(format!("link [{n}]: {}", e.0)))?;
                tab.navigate(url.as_str(), config)
            }
            (None, Some(sel)) => {
                let started = Instant::now();
                let done = tab.in_page(&format!(
                    "((s) => {{ const el = document.querySelector(s); if (!el) return 'missing'; el.scrollIntoView(); el.click(); return 'ok'; }})({})",
                    json!(sel)
                ), config)?;
                if done != json!("ok") {
                    return Err(BrowseError::Invalid(format!("nothing on the page matches the selector {sel:?}")));
                }
                tab.settle(false, started, config)?;
                tab.read(started, config)
            }
            _ => Err(BrowseError::Invalid("give exactly one of link and selector".into())),
        })
    }

    /// Types `text` into the field `selector`; with `submit`, submits its form.
    pub fn type_text(
        &self,
        agent: &AgentId,
        web: &AgentWeb,
        config: &BrowserConfig,
        selector: &str,
        text: &str,
        submit: bool,
    ) -> Result<Page, BrowseError> {
        self.with_tab(agent, web, config, |tab| {
            let started = Instant::now();
            let found = tab.in_page(&format!(
                "((s) => {{ const el = document.querySelector(s); if (!el) return 'missing'; el.focus(); \
                 if (typeof el.select === 'function') {{ try {{ el.select(); }} catch (e) {{}} }} \
                 return document.activeElement === el ? 'ok' : 'unfocusable'; }})({})",
                json!(selector)
            ), config)?;
            match found.as_str() {
                Some("ok") => {}
                Some("unfocusable") => {
                    return Err(BrowseError::Invalid(format!("the element {selector:?} cannot take text")))
                }
                _ => return Err(BrowseError::Invalid(format!("nothing on the page matches the selector {selector:?}"))),
            }
            let t = Duration::from_millis(config.action_timeout_ms);
            tab.call("Input.insertText", json!({"text": text}), t, "typing")?;
            if submit {
                let how = tab.in_page(&format!(
                    "((s) => {{ const el = document.querySelector(s); if (el && el.form) {{ \
                     if (el.form.requestSubmit) el.form.requestSubmit(); else el.form.submit(); return 'form'; }} \
                     return 'none'; }})({})",
                    json!(selector)
                ), config)?;
                if how != json!("form") {
                    for kind in ["keyDown", "keyUp"] {
                        tab.call(
                            "Input.dispatchKeyEvent",
                            json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}),
                            t,
                            "pressing Enter",
                        )?;
                    }
                }
            }
            tab.settle(false, started, config)?;
            tab.read(started, config)
        })
    }

    /// Goes back one page.
    pub fn back(&self, agent: &AgentId, web: &AgentWeb, config: &BrowserConfig) -> Result<Page, BrowseError> {
        self.with_tab(agent, web, config, |tab| {
            let started = Instant::now();
            let t = Duration::from_millis(config.action_timeout_ms);
            let h = tab.call("Page.getNavigationHistory", json!({}), t, "reading the history")?;
            let current = h["currentIndex"].as_u64().unwrap_or(0) as usize;
            let entries = h["entries"].as_array().cloned().unwrap_or_default();
            // Never back to the blank page the tab started on.
            let Some(entry) = current.checked_sub(1).and_then(|i| entries.get(i)).filter(|e| e["url"] != "about:blank")
            else {
                return Err(BrowseError::Invalid("there is no page to go back to".into()));
            };
            tab.call("Page.navigateToHistoryEntry", json!({"entryId": entry["id"]}), t, "going back")?;
            tab.settle(true, started, config)?;
            tab.read(started, config)
        })
    }

    /// A PNG of what the tab shows.
    pub fn screenshot(
        &self,
        agent: &AgentId,
        web: &AgentWeb,
        config: &BrowserConfig,
    ) -> Result<(Vec<u8>, String), BrowseError> {
        self.with_tab(agent, web, config, |tab| {
            let t = Duration::from_millis(config.action_timeout_ms);
            let shot = tab.call("Page.captureScreenshot", json!({"format": "png"}), t, "the screenshot")?;
            let data = shot["data"].as_str().unwrap_or_default();
            if data.len() > MAX_SCREENSHOT * 4 / 3 + 4 {
                return Err(BrowseError::Failed("the screenshot is too large".into()));
            }
            let png = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|_| BrowseError::Failed("the browser sent a screenshot that is not base64".into()))?;
            let url = tab.current_url(config).unwrap_or_default();
            Ok((png, url))
        })
    }
}

impl Tab {
    /// A new context (its own proxy, downloads denied) with one tab.
    fn open(conn: Connection, generation: u64, web: &AgentWeb, config: &BrowserConfig) -> Result<Tab, BrowseError> {
        let t = Duration::from_millis(config.action_timeout_ms);
        let c = |e| cdp_err(e, "opening the agent's browser context");
        let proxy = Proxy::start(Policy::new(web), config.max_page_mb << 20)
            .map_err(|e| BrowseError::Failed(format!("cannot start the egress proxy: {e}")))?;
        let ctx = conn
            .call(
                "Target.createBrowserContext",
                json!({"disposeOnDetach": true, "proxyServer": proxy.url(), "proxyBypassList": "<-loopback>"}),
                None,
                t,
            )
            .map_err(c)?;
        let context = ctx["browserContextId"].as_str().unwrap_or_default().to_owned();
        conn.call("Browser.setDownloadBehavior", json!({"behavior": "deny", "browserContextId": context}), None, t)
            .map_err(c)?;
        let target = conn
            .call("Target.createTarget", json!({"url": "about:blank", "browserContextId": context}), None, t)
            .map_err(c)?["targetId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let session = conn
            .call("Target.attachToTarget", json!({"targetId": target, "flatten": true}), None, t)
            .map_err(c)?["sessionId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let events = conn.subscribe(&session);
        for (method, params) in [
            ("Page.enable", json!({})),
            ("Network.enable", json!({"maxTotalBufferSize": 0, "maxResourceBufferSize": 0})),
            ("Page.setInterceptFileChooserDialog", json!({"enabled": true})),
        ] {
            conn.call(method, params, Some(&session), t).map_err(c)?;
        }
        Ok(Tab {
            generation,
            conn,
            context,
            target,
            session,
            events,
            proxy,
            policy_of: web.clone(),
            links: Vec::new(),
            dialogs: std::cell::Cell::new(0),
        })
    }

    fn call(&self, method: &str, params: Value, timeout: Duration, what: &str) -> Result<Value, BrowseError> {
        self.conn.call(method, params, Some(&self.session), timeout).map_err(|e| cdp_err(e, what))
    }

    /// Handles what the page asked for while nobody watched (dialogs).
    fn drain(&self) -> Result<(), BrowseError> {
        while let Ok(ev) = self.events.try_recv() {
            self.react(&ev)?;
        }
        Ok(())
    }

    /// Dismisses a dialog the page opened; past [`MAX_DIALOGS`] in one call
    /// the page is given up on (and the tab discarded after the call).
    fn react(&self, ev: &Event) -> Result<(), BrowseError> {
        if ev.method == "Page.javascriptDialogOpening" {
            let n = self.dialogs.get() + 1;
            self.dialogs.set(n);
            if n > MAX_DIALOGS {
                return Err(BrowseError::Failed(format!(
                    "the page opened more than {MAX_DIALOGS} dialogs; it was closed"
                )));
            }
            // A dialog that is gone already (the page closed it, or the
            // renderer moved on) is not the call's failure.
            if let Err(e) =
                self.call("Page.handleJavaScriptDialog", json!({"accept": false}), Duration::from_secs(5), "a dialog")
            {
                log::debug!("browser: dismissing a dialog: {e}");
            }
        }
        Ok(())
    }

    /// Ends the tab's page at once: crashes its renderer (handled on the
    /// renderer's IO thread, so a script spinning on its main thread does not
    /// delay it) and closes its target. The context goes with the tab.
    fn crash(&self) {
        let t = Duration::from_secs(2);
        let _ = self.conn.call("Page.crash", json!({}), Some(&self.session), t);
        let _ = self.conn.call("Target.closeTarget", json!({"targetId": self.target}), None, t);
    }

    /// Navigates to `url` (already checked) and reads the page.
    fn navigate(&mut self, url: &str, config: &BrowserConfig) -> Result<Page, BrowseError> {
        self.drain()?;
        let started = Instant::now();
        let t = Duration::from_millis(config.load_timeout_ms);
        let nav = self.call("Page.navigate", json!({"url": url}), t, "loading the page")?;
        if let Some(err) = nav["errorText"].as_str() {
            return Err(self.failure(started, url, err));
        }
        self.settle(true, started, config)?;
        self.read(started, config)
    }

    /// What to say about a navigation that failed with `err`.
    fn failure(&self, since: Instant, url: &str, err: &str) -> BrowseError {
        let blocked = self.proxy.blocked_since(since);
        if let Some(b) = blocked.iter().find(|b| !b.over_size) {
            return BrowseError::Refused(format!("{url} was not loaded: {}", b.reason));
        }
        if let Some(b) = blocked.first() {
            return BrowseError::Failed(format!("{url} was not loaded: {}", b.reason));
        }
        if err.contains("ERR_BLOCKED") {
            return BrowseError::Refused(format!("{url} was not loaded: the browser refused it ({err})"));
        }
        BrowseError::Failed(format!("{url} could not be loaded ({err})"))
    }

    /// Waits for the page to load and its network to go quiet. With
    /// `expect_nav`, a load is awaited; otherwise one is awaited only if the
    /// action started one within [`NAV_GRACE`].
    fn settle(&self, expect_nav: bool, started: Instant, config: &BrowserConfig) -> Result<(), BrowseError> {
        let load_deadline = started + Duration::from_millis(config.load_timeout_ms);
        let mut inflight: HashSet<String> = HashSet::new();
        let main = self.target.clone();
        let mut navigating = expect_nav;
        let handle = |ev: &Event, inflight: &mut HashSet<String>| -> Result<(), BrowseError> {
            let id = ev.params["requestId"].as_str().unwrap_or_default().to_owned();
            match ev.method.as_str() {
                "Network.requestWillBeSent" => {
                    inflight.insert(id);
                }
                "Network.loadingFinished" | "Network.loadingFailed" => {
                    inflight.remove(&id);
                }
                _ => self.react(ev)?,
            }
            Ok(())
        };
        if !expect_nav {
            let grace = Instant::now() + NAV_GRACE;
            let mut err = None;
            let started_nav = cdp::wait_events(&self.events, grace, |ev| {
                if let Err(e) = handle(ev, &mut inflight) {
                    err = Some(e);
                    return true;
                }
                let frame = ev.params["frameId"].as_str() == Some(&main);
                frame
                    && matches!(
                        ev.method.as_str(),
                        "Page.frameStartedLoading" | "Page.frameRequestedNavigation" | "Page.frameStartedNavigating"
                    )
            })
            .map_err(|e| cdp_err(e, "the action"))?;
            if let Some(e) = err {
                return Err(e);
            }
            navigating = started_nav;
        }
        if navigating {
            let mut err = None;
            let loaded = cdp::wait_events(&self.events, load_deadline, |ev| {
                if let Err(e) = handle(ev, &mut inflight) {
                    err = Some(e);
                    return true;
                }
                ev.method == "Page.loadEventFired"
                    || (ev.method == "Page.frameStoppedLoading" && ev.params["frameId"].as_str() == Some(&main))
            })
            .map_err(|e| cdp_err(e, "loading the page"))?;
            if let Some(e) = err {
                return Err(e);
            }
            if !loaded {
                return Err(BrowseError::Timeout(format!(
                    "the page did not finish loading within {} ms",
                    config.load_timeout_ms
                )));
            }
        }
        // Rendered: no request in flight for QUIET (at most QUIET_MAX).
        let quiet_deadline = (Instant::now() + QUIET_MAX).min(load_deadline.max(Instant::now()));
        loop {
            let window = (Instant::now() + QUIET).min(quiet_deadline);
            let mut err = None;
            let mut changed = false;
            let _ = cdp::wait_events(&self.events, window, |ev| {
                if let Err(e) = handle(ev, &mut inflight) {
                    err = Some(e);
                    return true;
                }
                changed = ev.method.starts_with("Network.");
                changed
            })
            .map_err(|e| cdp_err(e, "loading the page"))?;
            if let Some(e) = err {
                return Err(e);
            }
            if (!changed && inflight.is_empty()) || Instant::now() >= quiet_deadline {
                return Ok(());
            }
        }
    }

    /// Evaluates `expression` in a fresh isolated world of the main frame.
    fn in_page(&self, expression: &str, config: &BrowserConfig) -> Result<Value, BrowseError> {
        let t = Duration::from_millis(config.action_timeout_ms);
        let world = self.call(
            "Page.createIsolatedWorld",
            json!({"frameId": self.target, "worldName": "choir", "grantUniveralAccess": false}),
            t,
            "reading the page",
        )?;
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "contextId": world["executionContextId"], "returnByValue": true,
                   "timeout": config.action_timeout_ms}),
            t + Duration::from_secs(1),
            "reading the page",
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            let text = ex["exception"]["description"].as_str().or(ex["text"].as_str()).unwrap_or("an exception");
            let first = text.lines().next().unwrap_or_default().chars().take(200).collect::<String>();
            return Err(BrowseError::Invalid(format!("the page refused the action: {first}")));
        }
        Ok(r["result"]["value"].clone())
    }

    fn current_url(&self, config: &BrowserConfig) -> Option<String> {
        self.in_page("location.href", config).ok()?.as_str().map(str::to_owned)
    }

    /// Reads the page after an action that began at `started`.
    fn read(&mut self, started: Instant, config: &BrowserConfig) -> Result<Page, BrowseError> {
        let raw = match self.in_page(&READABLE_JS.replace("__MAX__", &(config.max_text_chars + 1).to_string()), config)
        {
            Ok(raw) => raw,
            // A page the proxy cut for its size may have no body for the
            // reader to walk: the cut, not the reader's stumble, is the answer.
            Err(e) => {
                if self.proxy.blocked_since(started).iter().any(|b| b.over_size) {
                    let _ = self.call(
                        "Page.navigate",
                        json!({"url": "about:blank"}),
                        Duration::from_secs(5),
                        "leaving the page",
                    );
                    self.links.clear();
                    return Err(BrowseError::Failed(format!(
                        "the page is larger than the {} MiB cap",
                        config.max_page_mb
                    )));
                }
                return Err(e);
            }
        };
        let v: Value = serde_json::from_str(raw.as_str().unwrap_or("{}")).unwrap_or(Value::Null);
        let url = v["url"].as_str().unwrap_or_default().to_owned();
        let blocked = self.proxy.blocked_since(started);
        if !showable(&url) {
            let _ =
                self.call("Page.navigate", json!({"url": "about:blank"}), Duration::from_secs(5), "leaving the page");
            self.links.clear();
            if url.starts_with("chrome-error:") {
                let err = blocked.first().map_or("the page could not be loaded".to_owned(), |b| b.reason.clone());
                return Err(if blocked.iter().any(|b| !b.over_size) {
                    BrowseError::Refused(err)
                } else {
                    BrowseError::Failed(err)
                });
            }
            let scheme = url.split(':').next().unwrap_or_default();
            return Err(BrowseError::Refused(format!("{scheme}: pages are refused; only http and https are shown")));
        }
        // The page itself refused or cut by the proxy (a plain-HTTP refusal
        // shows the proxy's own answer as the page).
        let here = target_of(&url);
        if let Some(b) = blocked.iter().find(|b| Some(&b.target) == here.as_ref()) {
            let _ =
                self.call("Page.navigate", json!({"url": "about:blank"}), Duration::from_secs(5), "leaving the page");
            self.links.clear();
            return Err(if b.over_size {
                BrowseError::Failed(format!("the page is larger than the {} MiB cap", config.max_page_mb))
            } else {
                BrowseError::Refused(format!("{url} was not loaded: {}", b.reason))
            });
        }
        let links: Vec<String> = v["links"]
            .as_array()
            .map(|l| l.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let text = v["text"].as_str().unwrap_or_default();
        let (text, cut) = choir_common::text::cap_with_note(text, config.max_text_chars);
        self.links = links;
        Ok(Page {
            title: v["title"].as_str().unwrap_or_default().chars().take(300).collect(),
            url,
            text,
            links: self.links.len(),
            truncated: cut || v["truncated"].as_bool().unwrap_or(false),
            blocked,
        })
    }
}

impl Drop for Tab {
    fn drop(&mut self) {
        self.conn.unsubscribe(&self.session);
        if !self.conn.is_closed() {
            let _ = self.conn.call(
                "Target.disposeBrowserContext",
                json!({"browserContextId": self.context}),
                None,
                Duration::from_secs(2),
            );
        }
    }
}
