//! The operator's console as an attacker or a bench drives it: raw HTTP
//! over its socket, each header as given, and its login.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::harness::Choird;

/// The port the tests say they forward (nothing listens on it: the
/// requests go to the socket directly, naming it as a browser would).
pub const PORT: u16 = 45_123;

/// An answer: status, headers (lowercased names), body.
pub struct Answer {
    /// Status.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: String,
}

impl Answer {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One request over the console socket, headers as given.
pub fn send(socket: &Path, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers, body: body.to_owned() }
}

/// `choirctl console --no-forward --port PORT`: (the socket, the code).
pub fn open(choird: &Choird) -> (PathBuf, String) {
    let out: Value =
        serde_json::from_str(&choird.ctl_ok(&["--json", "console", "--no-forward", "--port", &PORT.to_string()]))
            .unwrap();
    let url = out["url"].as_str().unwrap();
    let code = url.split("code=").nth(1).unwrap().to_owned();
    (PathBuf::from(out["socket"].as_str().unwrap()), code)
}

/// The Host a browser at the forwarded port sends.
pub const HOST: &str = "127.0.0.1:45123";
/// Its Origin.
pub const ORIGIN: &str = "http://127.0.0.1:45123";

/// Logs in with `code`: the session cookie (`name=value`).
pub fn login(socket: &Path, code: &str) -> String {
    let a = send(socket, "GET", &format!("/login?code={code}"), &[("Host", HOST)], "");
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(a.header("location"), Some("/"), "the code leaves the address bar");
    let cookie = a.header("set-cookie").unwrap();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    cookie.split(';').next().unwrap().to_owned()
}

/// The CSRF token a page carries.
pub fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" content=\"").unwrap() + "name=\"csrf\" content=\"".len();
    page[at..].split('"').next().unwrap().to_owned()
}
