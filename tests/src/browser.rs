//! A real Chromium for tests that look at a page as a person would:
//! Debian's Chromium, started the way choird starts it (its own launcher
//! and CDP client over a pipe), one tab in a context of its own that
//! connects directly (loopback included). What a test does in it is
//! [`Page`].

use std::time::Duration;

use choird::config::BrowserConfig;
use choird::host_tools::browser::launch::{chromium_binary, Process};
use serde_json::{json, Value};

use crate::page::Page;

const T: Duration = Duration::from_secs(20);

/// Chromium and one browser context of its own (tabs in it share cookies).
pub struct Browser {
    process: Process,
    context: Value,
}

/// One tab of a [`Browser`].
pub struct Tab<'a> {
    browser: &'a Browser,
    session: String,
}

impl Browser {
    /// Chromium with an empty context; `None` (the test skips) when
    /// Chromium is not installed and services are not required.
    pub fn open() -> Option<Browser> {
        let config = BrowserConfig::default();
        if chromium_binary(&config).is_none() {
            assert!(!crate::services_required(), "Chromium is required for this test (make deps installs it)");
            eprintln!("SKIPPED: no Chromium here");
            return None;
        }
        let process = Process::start(&config).expect("Chromium starts");
        // No proxy for this context: the console is on loopback.
        let context = process
            .conn
            .call("Target.createBrowserContext", json!({"proxyServer": "direct://", "disposeOnDetach": true}), None, T)
            .expect("a browser context")["browserContextId"]
            .clone();
        Some(Browser { process, context })
    }

    /// A new tab on `about:blank`.
    pub fn tab(&self) -> Tab<'_> {
        let conn = &self.process.conn;
        let target = conn
            .call("Target.createTarget", json!({"url": "about:blank", "browserContextId": self.context}), None, T)
            .expect("a tab");
        let session = conn
            .call("Target.attachToTarget", json!({"targetId": target["targetId"], "flatten": true}), None, T)
            .expect("attached")["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        let tab = Tab { browser: self, session };
        tab.call("Page.enable", json!({}));
        tab.call("Runtime.enable", json!({}));
        tab
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.process.stop();
    }
}

impl Tab<'_> {
    /// A CDP call in the tab's session.
    pub fn call(&self, method: &str, params: Value) -> Value {
        self.browser
            .process
            .conn
            .call(method, params, Some(&self.session), T)
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }
}

impl Page for Tab<'_> {
    fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
        self.settle();
    }

    fn eval(&self, js: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": js, "returnByValue": true, "awaitPromise": true}));
        r["result"]["value"].clone()
    }

    fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        // A tab behind another is not painted: this one comes to the front.
        self.call("Page.bringToFront", json!({}));
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().unwrap()).unwrap()
    }
}
