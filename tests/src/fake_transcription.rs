//! A fake of OpenAI's `POST /v1/audio/transcriptions`: `multipart/form-data`
//! with `file` (with a file name) and `model` (required), `response_format`
//! (`json` → `{"text": …}`); errors in OpenAI's error format. It answers
//! with the text set for it and records what it got.

use std::io::Read;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::json;

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Heard {
    /// The `model` field.
    pub model: String,
    /// The file's name.
    pub file_name: String,
    /// The file's bytes.
    pub file: Vec<u8>,
    /// The `Authorization` header.
    pub authorization: Option<String>,
}

struct State {
    text: String,
    down: bool,
    heard: Vec<Heard>,
}

/// The fake.
pub struct FakeTranscription {
    server: Arc<tiny_http::Server>,
    state: Arc<Mutex<State>>,
    addr: String,
}

/// The parts of a multipart body: (name, file name, bytes).
pub fn parts(content_type: &str, body: &[u8]) -> Vec<(String, Option<String>, Vec<u8>)> {
    let Some(boundary) = content_type.split("boundary=").nth(1).map(|b| b.trim_matches('"').to_owned()) else {
        return Vec::new();
    };
    let delim = format!("--{boundary}").into_bytes();
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = find(rest, &delim) {
        rest = &rest[i + delim.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let Some(h) = find(rest, b"\r\n\r\n") else { break };
        let head = String::from_utf8_lossy(&rest[..h]).to_string();
        let content = &rest[h + 4..];
        let end = find(content, &delim).unwrap_or(content.len());
        let data = content[..end].strip_suffix(b"\r\n").unwrap_or(&content[..end]).to_vec();
        let attr = |k: &str| {
            head.split(';')
                .find_map(|p| p.trim().strip_prefix(&format!("{k}=\"")).map(|v| v.trim_end_matches('"').to_owned()))
        };
        if let Some(name) = attr("name") {
            out.push((name, attr("filename"), data));
        }
        rest = &content[end..];
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl FakeTranscription {
    /// Starts the fake, answering with `text`.
    pub fn start(text: &str) -> FakeTranscription {
        let server = Arc::new(crate::loopback::server().expect("bind"));
        let addr = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_default();
        let state = Arc::new(Mutex::new(State { text: text.to_owned(), down: false, heard: Vec::new() }));
        let (srv, st) = (server.clone(), state.clone());
        std::thread::spawn(move || {
            while let Ok(mut rq) = srv.recv() {
                let mut body = Vec::new();
                let _ = rq.as_reader().take(32 << 20).read_to_end(&mut body);
                let header =
                    |n: &'static str| rq.headers().iter().find(|h| h.field.equiv(n)).map(|h| h.value.to_string());
                let ct = header("Content-Type").unwrap_or_default();
                let p = parts(&ct, &body);
                let field = |n: &str| p.iter().find(|(k, _, _)| k == n);
                let err = |status: u16, msg: &str| {
                    (
                        status,
                        json!({"error": {"message": msg, "type": "invalid_request_error", "param": null, "code": null}}),
                    )
                };
                let (status, out) = if rq.url() != "/v1/audio/transcriptions" {
                    err(404, "Unknown request URL")
                } else if st.lock().down {
                    (
                        503,
                        json!({"error": {"message": "The server is overloaded or not ready yet.", "type": "server_error", "param": null, "code": null}}),
                    )
                } else if !ct.starts_with("multipart/form-data") {
                    err(400, "Expected multipart/form-data")
                } else if field("model").is_none() {
                    err(400, "you must provide a model parameter")
                } else if field("file").and_then(|f| f.1.as_ref()).is_none() {
                    err(400, "Could not parse multipart form: file is missing")
                } else {
                    let (_, name, file) = field("file").cloned().unwrap_or_default();
                    let model =
                        String::from_utf8_lossy(&field("model").map(|f| f.2.clone()).unwrap_or_default()).to_string();
                    let mut s = st.lock();
                    s.heard.push(Heard {
                        model,
                        file_name: name.unwrap_or_default(),
                        file,
                        authorization: header("Authorization"),
                    });
                    (200, json!({"text": s.text}))
                };
                let resp = tiny_http::Response::from_string(out.to_string())
                    .with_status_code(status)
                    .with_header(tiny_http::Header::from_bytes("Content-Type", "application/json").expect("static"));
                let _ = rq.respond(resp);
            }
        });
        FakeTranscription { server, state, addr }
    }

    /// The base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Makes every request fail with 503 (true) or work again (false).
    pub fn set_down(&self, down: bool) {
        self.state.lock().down = down;
    }

    /// What it was sent.
    pub fn heard(&self) -> Vec<Heard> {
        self.state.lock().heard.clone()
    }
}

impl Drop for FakeTranscription {
    fn drop(&mut self) {
        self.server.unblock();
    }
}
