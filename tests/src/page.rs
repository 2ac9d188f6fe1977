//! What a test does with a page in a real browser, whichever browser it is
//! (Chromium over CDP, Firefox over WebDriver BiDi): go to an address,
//! evaluate script, take a screenshot — and wait for a page to settle or a
//! condition to hold, built on those three.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long a page may take to settle.
const SETTLE: Duration = Duration::from_secs(20);

/// One tab of a real browser.
pub trait Page {
    /// Goes to `url` and waits until the page settles.
    fn goto(&self, url: &str);

    /// Evaluates `js` in the page (a promise is awaited); its value as JSON,
    /// or null when it threw.
    fn eval(&self, js: &str) -> Value;

    /// The page as a PNG.
    fn screenshot(&self) -> Vec<u8>;

    /// Waits until the document is complete (after a navigation or a form
    /// post). A redirect replaces the document under an evaluation, so the
    /// page counts as settled once it is complete at the same address
    /// twice, 300 ms apart.
    fn settle(&self) {
        let started = Instant::now();
        let mut last = Value::Null;
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.eval("document.readyState === 'complete' ? location.href : null");
            if now.is_string() && now == last {
                return;
            }
            assert!(started.elapsed() < SETTLE, "the page did not finish loading");
            last = now;
        }
    }

    /// Waits until `js` is true in the page.
    fn wait_until(&self, what: &str, js: &str, within: Duration) {
        let started = Instant::now();
        while self.eval(js) != json!(true) {
            assert!(started.elapsed() < within, "{what}: not so after {within:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
