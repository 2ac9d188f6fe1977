//! A protocol-exact fake of the Telegram Bot API
//! (<https://core.telegram.org/bots/api>), for the gateway's tests.
//!
//! It serves `POST|GET /bot<token>/<method>` with parameters as JSON, query
//! string, `application/x-www-form-urlencoded` or `multipart/form-data`, and
//! file downloads at `/file/bot<token>/<file_path>`. Answers follow the
//! documented envelope: `{"ok": true, "result": …}`, or `{"ok": false,
//! "error_code": N, "description": "…"[, "parameters": {"retry_after": S}]}`
//! with the same HTTP status. `getUpdates` implements offsets as documented
//! (an update is confirmed, and never returned again, once a call passes an
//! offset above its id) and long polling (`timeout`). Methods used by the
//! gateway are implemented with the documented result objects and the errors
//! Telegram gives for the same mistakes (empty or over-long text, unknown
//! chat, edits that change nothing). Faults can be injected per method.
//!
//! Every call is recorded (method, parameters, uploaded files, time).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};

/// An injected failure of one call.
#[derive(Debug, Clone)]
pub enum Fault {
    /// 429 with `parameters.retry_after`.
    RetryAfter(u64),
    /// A bare HTTP status with Telegram's error envelope (e.g. 502).
    Status(u16),
    /// A 200 whose body is not JSON.
    Malformed,
    /// The connection is closed without an answer.
    Drop,
}

/// A call the fake received.
#[derive(Debug, Clone)]
pub struct Call {
    /// The bot token in the path.
    pub token: String,
    /// The method, e.g. `sendMessage`.
    pub method: String,
    /// Its parameters (file parts replaced by `{"file_name", "size"}`).
    pub params: Value,
    /// Uploaded files: (parameter, file name, bytes).
    pub files: Vec<(String, String, Vec<u8>)>,
    /// When it arrived.
    pub at: Instant,
    /// The HTTP status answered (0 for a dropped connection).
    pub status: u16,
}

struct Bot {
    id: i64,
    username: String,
    updates: VecDeque<Value>,
    next_update: i64,
    /// Updates returned by getUpdates: (update id, when).
    delivered: Vec<(i64, Instant)>,
    /// While set, getUpdates holds new updates back (so several arrive in
    /// one batch once it is cleared).
    held: bool,
}

#[derive(Default)]
struct State {
    bots: HashMap<String, Bot>,
    calls: Vec<Call>,
    /// Successful calls so far, by method (kept also when calls are not).
    counts: HashMap<String, u64>,
    /// For load tests: keep no per-call record (calls, delivery times, more
    /// than the latest sent message per chat), only `counts`.
    forget: bool,
    faults: HashMap<String, VecDeque<Fault>>,
    next_message: i64,
    /// (chat, message id) → text, of messages the bots sent.
    sent: HashMap<(i64, i64), String>,
    files: HashMap<String, (String, Vec<u8>)>,
    next_file: u64,
    /// How long a file download takes (a slow network).
    download_delay: Duration,
}

/// The fake server.
pub struct FakeTelegram {
    shared: Arc<(Mutex<State>, Condvar)>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: String,
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn ok(result: Value) -> (u16, String) {
    (200, json!({"ok": true, "result": result}).to_string())
}

fn err(code: u16, description: &str) -> (u16, String) {
    (code, json!({"ok": false, "error_code": code, "description": description}).to_string())
}

impl FakeTelegram {
    /// Starts on a free loopback port.
    pub fn start() -> FakeTelegram {
        let server = Arc::new(crate::loopback::server().expect("bind the fake Bot API"));
        let addr = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_default();
        let shared = Arc::new((Mutex::new(State { next_message: 1000, ..State::default() }), Condvar::new()));
        let (s2, srv2) = (shared.clone(), server.clone());
        let thread = std::thread::Builder::new()
            .name("fake-telegram".into())
            .spawn(move || {
                while let Ok(rq) = srv2.recv() {
                    let s2 = s2.clone();
                    // One thread per request: long polls must not hold up others.
                    std::thread::spawn(move || serve(&s2, rq));
                }
            })
            .expect("spawn the fake Bot API");
        FakeTelegram { shared, server, thread: Some(thread), addr }
    }

    /// The base URL to configure as `telegram.api_base`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Registers a bot token (its bot user gets `id`).
    pub fn add_bot(&self, token: &str, id: i64, username: &str) {
        self.shared.0.lock().bots.insert(
            token.to_owned(),
            Bot {
                id,
                username: username.to_owned(),
                updates: VecDeque::new(),
                next_update: 1,
                delivered: Vec::new(),
                held: false,
            },
        );
    }

    /// Makes every file download take `delay` (a slow network), so an
    /// update with a file stays with the dispatcher that long.
    pub fn slow_downloads(&self, delay: Duration) {
        self.shared.0.lock().download_delay = delay;
    }

    /// Holds updates back (`true`) until released (`false`): what users
    /// send meanwhile reaches the bot in one getUpdates batch.
    pub fn hold_updates(&self, token: &str, held: bool) {
        let mut g = self.shared.0.lock();
        g.bots.get_mut(token).expect("unknown bot token").held = held;
        self.shared.1.notify_all();
    }

    fn push_update(&self, token: &str, make: impl FnOnce(i64) -> Value) -> i64 {
        let mut g = self.shared.0.lock();
        let bot = g.bots.get_mut(token).expect("unknown bot token");
        let id = bot.next_update;
        bot.next_update += 1;
        let update = make(id);
        bot.updates.push_back(update);
        self.shared.1.notify_all();
        id
    }

    fn user(id: i64) -> Value {
        json!({"id": id, "is_bot": false, "first_name": format!("User{id}"), "username": format!("user{id}"), "language_code": "en"})
    }

    fn private_chat(id: i64) -> Value {
        json!({"id": id, "type": "private", "first_name": format!("User{id}"), "username": format!("user{id}")})
    }

    fn next_message_id(&self) -> i64 {
        let mut g = self.shared.0.lock();
        g.next_message += 1;
        g.next_message
    }

    /// A private text message from `user` to the bot; returns the update id.
    pub fn user_says(&self, token: &str, user: i64, text: &str) -> i64 {
        let mid = self.next_message_id();
        self.push_update(token, |id| {
            json!({"update_id": id, "message": {"message_id": mid, "from": Self::user(user), "date": now_s(),
                   "chat": Self::private_chat(user), "text": text}})
        })
    }

    /// A message in a group chat.
    pub fn group_says(&self, token: &str, group: i64, user: i64, text: &str) -> i64 {
        let mid = self.next_message_id();
        self.push_update(token, |id| {
            json!({"update_id": id, "message": {"message_id": mid, "from": Self::user(user), "date": now_s(),
                   "chat": {"id": group, "type": "group", "title": "A group"}, "text": text}})
        })
    }

    /// Stores a file as Telegram would (for `getFile` and the download).
    pub fn add_file(&self, name: &str, data: &[u8]) -> (String, String) {
        let mut g = self.shared.0.lock();
        g.next_file += 1;
        let file_id = format!("BQACAgIAAxkBAAI{}", g.next_file);
        let unique = format!("AgAD{}", g.next_file);
        let path = format!("documents/file_{}_{name}", g.next_file);
        g.files.insert(file_id.clone(), (path, data.to_vec()));
        (file_id, unique)
    }

    /// A document sent by `user`, with an optional caption.
    pub fn user_sends_document(&self, token: &str, user: i64, name: &str, data: &[u8], caption: Option<&str>) -> i64 {
        let (file_id, unique) = self.add_file(name, data);
        let mid = self.next_message_id();
        self.push_update(token, |id| {
            let mut m = json!({"message_id": mid, "from": Self::user(user), "date": now_s(), "chat": Self::private_chat(user),
                               "document": {"file_name": name, "mime_type": "application/octet-stream",
                                            "file_id": file_id, "file_unique_id": unique, "file_size": data.len()}});
            if let Some(c) = caption {
                m["caption"] = json!(c);
            }
            json!({"update_id": id, "message": m})
        })
    }

    /// A voice note sent by `user` (OGG/Opus, `duration` seconds).
    pub fn user_sends_voice(&self, token: &str, user: i64, data: &[u8], duration: u64) -> i64 {
        let (file_id, unique) = self.add_file("voice.oga", data);
        let mid = self.next_message_id();
        self.push_update(token, |id| {
            json!({"update_id": id, "message": {"message_id": mid, "from": Self::user(user), "date": now_s(),
                   "chat": Self::private_chat(user),
                   "voice": {"duration": duration, "mime_type": "audio/ogg", "file_id": file_id,
                             "file_unique_id": unique, "file_size": data.len()}}})
        })
    }

    /// `user` presses an inline button with `data` under the bot's message
    /// `message_id` in their private chat.
    pub fn user_presses(&self, token: &str, user: i64, message_id: i64, data: &str) -> i64 {
        let (text, bot_user) = {
            let g = self.shared.0.lock();
            let text = g.sent.get(&(user, message_id)).cloned().unwrap_or_default();
            let b = g.bots.get(token).expect("unknown bot token");
            (text, json!({"id": b.id, "is_bot": true, "first_name": b.username, "username": b.username}))
        };
        self.push_update(token, |id| {
            json!({"update_id": id, "callback_query": {"id": format!("{}", 4_000_000 + id), "from": Self::user(user),
                   "message": {"message_id": message_id, "from": bot_user, "date": now_s(), "chat": Self::private_chat(user), "text": text},
                   "chat_instance": format!("{}", -7_000_000 - user), "data": data}})
        })
    }

    /// Makes the next call(s) of `method` fail, in order.
    pub fn fail_next(&self, method: &str, faults: Vec<Fault>) {
        self.shared.0.lock().faults.entry(method.to_owned()).or_default().extend(faults);
    }

    /// Stops keeping a record of every call (they are still answered and
    /// counted): for load tests, whose waits would otherwise scan and copy
    /// an ever longer list.
    pub fn forget_calls(&self) {
        self.shared.0.lock().forget = true;
    }

    /// Forgets the calls recorded so far (later ones are recorded): for
    /// benches that wait for one call at a time and would otherwise copy an
    /// ever longer list after each.
    pub fn clear_calls(&self) {
        self.shared.0.lock().calls.clear();
    }

    /// Waits until at least `n` calls of `method` have succeeded, or fails
    /// after `timeout`.
    pub fn wait_count(&self, method: &str, n: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.0.lock();
        loop {
            let have = g.counts.get(method).copied().unwrap_or(0);
            if have >= n {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {n} {method} calls; {have} so far");
            self.shared.1.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.0.lock().calls.clone()
    }

    /// Successful calls of `method`.
    pub fn sent(&self, method: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.method == method && c.status == 200).collect()
    }

    /// When each update id was first returned by getUpdates.
    pub fn delivered(&self, token: &str) -> Vec<(i64, Instant)> {
        self.shared.0.lock().bots.get(token).map(|b| b.delivered.clone()).unwrap_or_default()
    }

    /// The id of the (latest) message a bot sent to `chat` with `text`.
    pub fn message_id_of(&self, chat: i64, text: &str) -> Option<i64> {
        let g = self.shared.0.lock();
        g.sent.iter().filter(|((c, _), t)| *c == chat && t.as_str() == text).map(|((_, m), _)| *m).max()
    }

    /// Updates not yet confirmed by an offset.
    pub fn unconfirmed(&self, token: &str) -> usize {
        self.shared.0.lock().bots.get(token).map(|b| b.updates.len()).unwrap_or(0)
    }

    /// Waits until `cond` holds over the calls, or fails after `timeout`.
    pub fn wait_calls(&self, what: &str, timeout: Duration, cond: impl Fn(&[Call]) -> bool) -> Vec<Call> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.0.lock();
        loop {
            if cond(&g.calls) {
                return g.calls.clone();
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; calls: {:#?}", summary(&g.calls));
            self.shared.1.wait_for(&mut g, Duration::from_millis(100));
        }
    }
}

fn summary(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.method != "getUpdates")
        .map(|c| format!("{} {} {}", c.status, c.method, c.params))
        .collect()
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                    out.push(b);
                    i += 2;
                } else {
                    out.push(b'%');
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A form value as Telegram reads it: JSON-looking values are JSON.
fn form_value(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()))
}

fn parse_urlencoded(s: &str, into: &mut serde_json::Map<String, Value>) {
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        into.insert(percent_decode(k), form_value(&percent_decode(v)));
    }
}

/// Splits a multipart/form-data body into fields and files.
fn parse_multipart(
    body: &[u8],
    boundary: &str,
    params: &mut serde_json::Map<String, Value>,
) -> Vec<(String, String, Vec<u8>)> {
    let delim = format!("--{boundary}");
    let mut files = Vec::new();
    let mut rest = body;
    while let Some(start) = find(rest, delim.as_bytes()) {
        rest = &rest[start + delim.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let Some(head_end) = find(rest, b"\r\n\r\n") else { break };
        let head = String::from_utf8_lossy(&rest[..head_end]).into_owned();
        let content_start = head_end + 4;
        let Some(next) = find(&rest[content_start..], format!("\r\n{delim}").as_bytes()) else { break };
        let content = &rest[content_start..content_start + next];
        let attr = |key: &str| {
            let marker = format!("{key}=\"");
            head.find(&marker).map(|i| head[i + marker.len()..].split('"').next().unwrap_or("").to_owned())
        };
        let name = attr("name").unwrap_or_default();
        match attr("filename") {
            Some(file_name) => {
                params.insert(name.clone(), json!({"file_name": file_name, "size": content.len()}));
                files.push((name, file_name, content.to_vec()));
            }
            None => {
                params.insert(name, form_value(&String::from_utf8_lossy(content)));
            }
        }
        rest = &rest[content_start + next..];
    }
    files
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn serve(shared: &Arc<(Mutex<State>, Condvar)>, mut rq: tiny_http::Request) {
    let url = rq.url().to_owned();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let content_type = rq
        .headers()
        .iter()
        .find(|h| h.field.equiv("Content-Type"))
        .map(|h| h.value.as_str().to_owned())
        .unwrap_or_default();
    let mut body = Vec::new();
    let _ = rq.as_reader().read_to_end(&mut body);

    if let Some(rest) = path.strip_prefix("/file/bot") {
        let (token, file_path) = rest.split_once('/').unwrap_or((rest, ""));
        let (data, delay) = {
            let g = shared.0.lock();
            let data = g
                .bots
                .contains_key(token)
                .then(|| g.files.values().find(|(p, _)| p == file_path).map(|(_, d)| d.clone()))
                .flatten();
            (data, g.download_delay)
        };
        std::thread::sleep(delay);
        let resp = match data {
            Some(d) => tiny_http::Response::from_data(d).with_status_code(200),
            None => tiny_http::Response::from_data(err(404, "Not Found").1.into_bytes()).with_status_code(404),
        };
        let _ = rq.respond(resp);
        return;
    }
    let Some(rest) = path.strip_prefix("/bot") else {
        let (status, out) = err(404, "Not Found");
        let _ = rq.respond(tiny_http::Response::from_string(out).with_status_code(status));
        return;
    };
    let (token, method) = rest.split_once('/').unwrap_or((rest, ""));
    let (token, method) = (token.to_owned(), method.to_owned());

    let mut params = serde_json::Map::new();
    parse_urlencoded(query, &mut params);
    let mut files = Vec::new();
    if content_type.starts_with("application/json") {
        if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&body) {
            params.extend(m);
        }
    } else if content_type.starts_with("application/x-www-form-urlencoded") {
        parse_urlencoded(&String::from_utf8_lossy(&body), &mut params);
    } else if let Some(b) = content_type.split("boundary=").nth(1) {
        files = parse_multipart(&body, b.trim_matches('"'), &mut params);
    }
    let params = Value::Object(params);

    let fault = shared.0.lock().faults.get_mut(&method).and_then(VecDeque::pop_front);
    let record = |status: u16| {
        let mut g = shared.0.lock();
        if status == 200 {
            *g.counts.entry(method.clone()).or_default() += 1;
        }
        if !g.forget {
            g.calls.push(Call {
                token: token.clone(),
                method: method.clone(),
                params: params.clone(),
                files: files.clone(),
                at: Instant::now(),
                status,
            });
        }
        shared.1.notify_all();
    };
    let (status, out) = match fault {
        Some(Fault::Drop) => {
            record(0);
            // The connection is taken over and closed: the client gets no
            // HTTP answer it can use (tiny_http has no other way to hang up).
            let stream = rq.upgrade("close", tiny_http::Response::empty(101));
            drop(stream);
            return;
        }
        Some(Fault::Malformed) => (200, "{\"ok\": true, \"result\": [{\"update_id\": ".to_owned()),
        Some(Fault::RetryAfter(s)) => (
            429,
            json!({"ok": false, "error_code": 429, "description": format!("Too Many Requests: retry after {s}"),
                   "parameters": {"retry_after": s}})
            .to_string(),
        ),
        Some(Fault::Status(code)) => err(code, "Bad Gateway"),
        None => call(shared, &token, &method, &params, &files),
    };
    record(status);
    let mut resp = tiny_http::Response::from_string(out).with_status_code(status);
    resp.add_header(tiny_http::Header::from_bytes("Content-Type", "application/json").expect("static header"));
    let _ = rq.respond(resp);
}

fn int(params: &Value, key: &str) -> Option<i64> {
    params.get(key).and_then(|v| v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
}

fn call(
    shared: &Arc<(Mutex<State>, Condvar)>,
    token: &str,
    method: &str,
    params: &Value,
    files: &[(String, String, Vec<u8>)],
) -> (u16, String) {
    let mut g = shared.0.lock();
    let Some(bot) = g.bots.get(token) else { return err(401, "Unauthorized") };
    let bot_user = json!({"id": bot.id, "is_bot": true, "first_name": bot.username, "username": bot.username});
    match method {
        "getMe" => ok(bot_user),
        "getUpdates" => {
            let offset = int(params, "offset").unwrap_or(0);
            let limit = int(params, "limit").unwrap_or(100).clamp(1, 100) as usize;
            let timeout = Duration::from_secs(int(params, "timeout").unwrap_or(0).max(0) as u64);
            let deadline = Instant::now() + timeout;
            let forget = g.forget;
            loop {
                let bot = g.bots.get_mut(token).expect("bot vanished");
                // Passing an offset confirms every update below it, for good.
                bot.updates.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= offset);
                if !bot.updates.is_empty() && !bot.held {
                    let out: Vec<Value> = bot.updates.iter().take(limit).cloned().collect();
                    for u in &out {
                        let id = u["update_id"].as_i64().unwrap_or(0);
                        if !forget && !bot.delivered.iter().any(|(d, _)| *d == id) {
                            bot.delivered.push((id, Instant::now()));
                        }
                    }
                    return ok(Value::Array(out));
                }
                if Instant::now() >= deadline {
                    return ok(json!([]));
                }
                shared.1.wait_until(&mut g, deadline);
            }
        }
        "sendMessage" | "editMessageText" => {
            let Some(chat) = int(params, "chat_id") else { return err(400, "Bad Request: chat_id is empty") };
            let text = params.get("text").and_then(Value::as_str).unwrap_or("");
            if text.trim().is_empty() {
                return err(400, "Bad Request: message text is empty");
            }
            if text.encode_utf16().count() > 4096 {
                return err(400, "Bad Request: message is too long");
            }
            if chat == 0 {
                return err(400, "Bad Request: chat not found");
            }
            let message_id = if method == "sendMessage" {
                g.next_message += 1;
                g.next_message
            } else {
                let Some(mid) = int(params, "message_id") else {
                    return err(400, "Bad Request: message identifier is not specified");
                };
                match g.sent.get(&(chat, mid)) {
                    None => return err(400, "Bad Request: message to edit not found"),
                    Some(old) if old == text => return err(400, "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message"),
                    Some(_) => mid,
                }
            };
            if g.forget {
                g.sent.retain(|(c, _), _| *c != chat);
            }
            g.sent.insert((chat, message_id), text.to_owned());
            let mut m = json!({"message_id": message_id, "from": bot_user, "chat": FakeTelegram::private_chat(chat),
                               "date": now_s(), "text": text});
            if let Some(markup) = params.get("reply_markup") {
                m["reply_markup"] = markup.clone();
            }
            if method == "editMessageText" {
                m["edit_date"] = json!(now_s());
            }
            ok(m)
        }
        "sendChatAction" => match params.get("action").and_then(Value::as_str) {
            Some("typing" | "upload_document" | "record_voice" | "upload_voice") => ok(json!(true)),
            _ => err(400, "Bad Request: wrong parameter action in request"),
        },
        "answerCallbackQuery" => match params.get("callback_query_id") {
            Some(_) => ok(json!(true)),
            None => err(400, "Bad Request: query_id is empty"),
        },
        "getFile" => {
            let id = params.get("file_id").and_then(Value::as_str).unwrap_or("");
            match g.files.get(id) {
                Some((path, data)) => ok(
                    json!({"file_id": id, "file_unique_id": format!("u{id}"), "file_size": data.len(), "file_path": path}),
                ),
                None => err(400, "Bad Request: invalid file_id"),
            }
        }
        "sendVoice" | "sendAudio" | "sendDocument" => {
            let field = match method {
                "sendVoice" => "voice",
                "sendAudio" => "audio",
                _ => "document",
            };
            let Some(chat) = int(params, "chat_id") else { return err(400, "Bad Request: chat_id is empty") };
            let Some((_, name, data)) = files.iter().find(|(p, _, _)| p == field) else {
                return err(400, &format!("Bad Request: there is no {field} in the request"));
            };
            g.next_message += 1;
            let message_id = g.next_message;
            let file = match field {
                "voice" => {
                    json!({"duration": 1, "mime_type": "audio/ogg", "file_id": format!("voice{message_id}"), "file_unique_id": format!("v{message_id}"), "file_size": data.len()})
                }
                "audio" => {
                    json!({"duration": 1, "file_name": name, "file_id": format!("audio{message_id}"), "file_unique_id": format!("a{message_id}"), "file_size": data.len()})
                }
                _ => {
                    json!({"file_name": name, "file_id": format!("doc{message_id}"), "file_unique_id": format!("d{message_id}"), "file_size": data.len()})
                }
            };
            ok(
                json!({"message_id": message_id, "from": bot_user, "chat": FakeTelegram::private_chat(chat), "date": now_s(), field: file}),
            )
        }
        _ => err(404, "Not Found"),
    }
}

/// Messages (text) a bot sent, per chat, in order.
pub fn texts_by_chat(calls: &[Call]) -> BTreeMap<i64, Vec<String>> {
    let mut out: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.method == "sendMessage" && c.status == 200) {
        let chat = int(&c.params, "chat_id").unwrap_or(0);
        out.entry(chat).or_default().push(c.params["text"].as_str().unwrap_or("").to_owned());
    }
    out
}
