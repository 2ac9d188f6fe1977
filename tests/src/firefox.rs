//! A real Firefox for tests that look at a page as a person would:
//! Debian's Firefox ESR, headless, in a profile of its own, driven over
//! WebDriver BiDi (the W3C protocol Firefox speaks on its remote port;
//! it has no CDP since ESR 128). Every tab shares the profile's cookies,
//! as tabs of one person's browser do. The whole process group is killed
//! when the value is dropped, so no content process outlives a test.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

use crate::page::Page;

/// How long one command may take before the test fails.
const T: Duration = Duration::from_secs(30);

/// Where Debian installs it.
const BINARY: &str = "/usr/bin/firefox-esr";

/// Firefox and its BiDi session.
pub struct Firefox {
    child: Child,
    _profile: tempfile::TempDir,
    ws: Mutex<(WebSocket<TcpStream>, u64)>,
}

/// One tab (a top-level browsing context) of a [`Firefox`].
pub struct Tab<'a> {
    firefox: &'a Firefox,
    context: String,
}

impl Firefox {
    /// Firefox with an empty profile; `None` (the test skips) when it is not
    /// installed and services are not required.
    pub fn open() -> Option<Firefox> {
        if !std::path::Path::new(BINARY).exists() {
            assert!(!crate::services_required(), "Firefox is required for this test (make deps installs firefox-esr)");
            eprintln!("SKIPPED: no Firefox here");
            return None;
        }
        let profile = tempfile::tempdir().expect("a profile directory");
        // Nothing that phones home or asks a question; no proxy (the
        // console is on loopback).
        std::fs::write(
            profile.path().join("user.js"),
            "user_pref(\"network.proxy.type\", 0);\n\
             user_pref(\"browser.shell.checkDefaultBrowser\", false);\n\
             user_pref(\"datareporting.policy.dataSubmissionEnabled\", false);\n\
             user_pref(\"app.update.disabledForTesting\", true);\n",
        )
        .expect("user.js");
        let mut child = Command::new(BINARY)
            .args(["--headless", "--no-remote", "--remote-debugging-port", "0", "--profile"])
            .arg(profile.path())
            .env("HOME", profile.path())
            .env("MOZ_CRASHREPORTER_DISABLE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("Firefox starts");
        // It says where it listens on standard error; the rest is drained.
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut address = None;
        let mut said = String::new();
        for _ in 0..200 {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if let Some(at) = line.split("WebDriver BiDi listening on ").nth(1) {
                address = Some(at.trim().to_owned());
                break;
            }
            said.push_str(&line);
        }
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        let address = address.unwrap_or_else(|| panic!("Firefox did not open its remote port: {said}"));
        let host = address.trim_start_matches("ws://").trim_end_matches('/').to_owned();
        let stream = TcpStream::connect(&host).expect("Firefox's remote port");
        stream.set_read_timeout(Some(T)).expect("a read timeout");
        let (ws, _) = tungstenite::client(format!("ws://{host}/session"), stream).expect("a BiDi session socket");
        let firefox = Firefox { child, _profile: profile, ws: Mutex::new((ws, 0)) };
        firefox.call("session.new", json!({"capabilities": {}}));
        Some(firefox)
    }

    /// One BiDi command; its result (a failed command fails the test).
    pub fn call(&self, method: &str, params: Value) -> Value {
        let mut guard = self.ws.lock();
        let (ws, last) = &mut *guard;
        *last += 1;
        let id = *last;
        ws.send(Message::text(json!({"id": id, "method": method, "params": params}).to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        loop {
            let message = ws.read().unwrap_or_else(|e| panic!("{method}: {e}"));
            let Message::Text(text) = message else { continue };
            let v: Value = serde_json::from_str(&text).expect("BiDi sends JSON");
            if v["id"] != json!(id) {
                continue; // an event
            }
            assert_eq!(v["type"], "success", "{method}: {v}");
            return v["result"].clone();
        }
    }

    /// A new tab on `about:blank`.
    pub fn tab(&self) -> Tab<'_> {
        let made = self.call("browsingContext.create", json!({"type": "tab"}));
        Tab { firefox: self, context: made["context"].as_str().expect("a context id").to_owned() }
    }
}

impl Drop for Firefox {
    fn drop(&mut self) {
        // The browser and every content process it started.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }
}

/// A BiDi remote value as JSON (primitives, arrays and plain objects).
fn plain(v: &Value) -> Value {
    match v["type"].as_str() {
        Some("string" | "boolean") => v["value"].clone(),
        Some("number") => match &v["value"] {
            Value::String(_) => Value::Null, // NaN, Infinity, -0
            n => n.clone(),
        },
        Some("array") => Value::Array(v["value"].as_array().map(|a| a.iter().map(plain).collect()).unwrap_or_default()),
        Some("object") => Value::Object(
            v["value"]
                .as_array()
                .map(|pairs| pairs.iter().filter_map(|p| Some((p[0].as_str()?.to_owned(), plain(&p[1])))).collect())
                .unwrap_or_default(),
        ),
        _ => Value::Null,
    }
}

impl Page for Tab<'_> {
    fn goto(&self, url: &str) {
        self.firefox.call("browsingContext.navigate", json!({"context": self.context, "url": url, "wait": "complete"}));
        self.settle();
    }

    fn eval(&self, js: &str) -> Value {
        let r = self.firefox.call(
            "script.evaluate",
            json!({"expression": js, "target": {"context": self.context}, "awaitPromise": true}),
        );
        if r["type"] == "success" {
            plain(&r["result"])
        } else {
            Value::Null
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        self.firefox.call("browsingContext.activate", json!({"context": self.context}));
        let shot = self.firefox.call("browsingContext.captureScreenshot", json!({"context": self.context}));
        base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().expect("PNG data")).expect("base64")
    }
}
