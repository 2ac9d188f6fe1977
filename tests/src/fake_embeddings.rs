//! A deterministic fake of OpenAI's embeddings endpoint
//! (`POST /v1/embeddings`, <https://platform.openai.com/docs/api-reference/embeddings/create>):
//! `{"model", "input": string | [string], "encoding_format"?}` →
//! `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
//! "model", "usage": {"prompt_tokens", "total_tokens"}}`, errors in OpenAI's
//! `{"error": {...}}` shape.
//!
//! Vectors are feature-hashed bags of content words (lowercase, three letters
//! or more, common function words left out, a plural `s` dropped),
//! normalised: texts that share content words are close, and the same text
//! always gives the same vector. It can
//! be switched "down" (503) to test the outbox, and records each request's
//! batch size.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

struct State {
    down: bool,
    batches: Vec<usize>,
    /// Inputs longer than this (in words, the fake's tokens) are refused with
    /// the API's 400 for a too-long input, failing the whole request.
    max_input_tokens: usize,
}

/// The fake server.
pub struct FakeEmbeddings {
    state: Arc<Mutex<State>>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: String,
    dims: usize,
}

const STOP: &[&str] = &[
    "the", "and", "for", "with", "from", "into", "this", "that", "what", "which", "are", "was", "will", "our", "your",
    "how", "its", "has", "have", "can", "some", "all", "out", "not", "but", "you",
];

/// The fake's vector for `text` in `dims` dimensions.
pub fn embed(text: &str, dims: usize) -> Vec<f32> {
    let mut v = vec![0f32; dims];
    let lower = text.to_lowercase();
    let words = lower.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() >= 3 && !STOP.contains(w)).map(|w| {
        if w.len() > 3 {
            w.strip_suffix('s').unwrap_or(w)
        } else {
            w
        }
    });
    for word in words {
        let h = Sha256::digest(word.as_bytes());
        let i = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize % dims;
        v[i] += if h[4] & 1 == 0 { 1.0 } else { -1.0 };
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    } else {
        v[0] = 1.0;
    }
    v
}

impl FakeEmbeddings {
    /// Starts on a free loopback port, answering with `dims`-dimensional vectors.
    pub fn start(dims: usize) -> FakeEmbeddings {
        let server = Arc::new(crate::loopback::server().expect("bind the fake embeddings"));
        let addr = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_default();
        let state = Arc::new(Mutex::new(State { down: false, batches: Vec::new(), max_input_tokens: 8191 }));
        let (s2, srv2) = (state.clone(), server.clone());
        let thread = std::thread::Builder::new()
            .name("fake-embeddings".into())
            .spawn(move || {
                while let Ok(mut rq) = srv2.recv() {
                    let mut body = String::new();
                    let _ = rq.as_reader().read_to_string(&mut body);
                    let (status, out) = answer(&s2, rq.url(), &body, dims);
                    let mut resp = tiny_http::Response::from_string(out).with_status_code(status);
                    resp.add_header(tiny_http::Header::from_bytes("Content-Type", "application/json").expect("static"));
                    let _ = rq.respond(resp);
                }
            })
            .expect("spawn the fake embeddings");
        FakeEmbeddings { state, server, thread: Some(thread), addr, dims }
    }

    /// The base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The dimension it answers with.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Makes every request fail with 503 (true) or work again (false).
    pub fn set_down(&self, down: bool) {
        self.state.lock().down = down;
    }

    /// Sets the longest input (in words) accepted; a request with a longer
    /// one is refused whole (400), as the real endpoint does.
    pub fn set_max_input_tokens(&self, n: usize) {
        self.state.lock().max_input_tokens = n;
    }

    /// The number of texts of each request answered so far.
    pub fn batches(&self) -> Vec<usize> {
        self.state.lock().batches.clone()
    }
}

fn error(status: u16, message: &str, kind: &str) -> (u16, String) {
    (status, json!({"error": {"message": message, "type": kind, "param": null, "code": null}}).to_string())
}

fn answer(state: &Mutex<State>, url: &str, body: &str, dims: usize) -> (u16, String) {
    if url != "/v1/embeddings" {
        return error(404, &format!("Unknown request URL: POST {url}"), "invalid_request_error");
    }
    if state.lock().down {
        return error(503, "The server is overloaded or not ready yet.", "server_error");
    }
    let Ok(req) = serde_json::from_str::<Value>(body) else {
        return error(400, "We could not parse the JSON body of your request.", "invalid_request_error");
    };
    let inputs: Vec<String> = match &req["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    };
    if inputs.is_empty() || inputs.iter().any(String::is_empty) {
        return error(400, "'input' cannot be an empty string or list", "invalid_request_error");
    }
    let max = state.lock().max_input_tokens;
    if let Some(long) = inputs.iter().map(|t| t.split_whitespace().count()).find(|n| *n > max) {
        return error(
            400,
            &format!(
                "This model's maximum context length is {} tokens, however you requested {long} tokens ({long} in your \
                 prompt; 0 for the completion). Please reduce your prompt; or completion length.",
                max + 1
            ),
            "invalid_request_error",
        );
    }
    state.lock().batches.push(inputs.len());
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": embed(t, dims)}))
        .collect();
    (
        200,
        json!({"object": "list", "data": data, "model": req["model"], "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
            .to_string(),
    )
}

impl Drop for FakeEmbeddings {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
