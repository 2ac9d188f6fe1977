//! The operator's console, end to end: opened only by `choirctl console`,
//! logged into once with its one-time code, every request's Host, Origin,
//! session and CSRF token checked, approvals decided bound to their sha256,
//! an agent's markup rendered inert — over raw HTTP here (each hostile
//! request as an attacker would send it) and in a real Chromium.

use std::time::Duration;

use choir_tests::fake_llm::Step;
use choir_tests::harness::Choird;
use choir_tests::observe::wait_for;
use choir_tests::page::Page;
use choir_tests::scenario::Scenario;
use serde_json::{json, Value};

use choir_tests::console::{csrf_of, login, open, send, HOST, ORIGIN};

fn kill_switch(choird: &Choird) -> bool {
    let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "status"])).unwrap();
    v["kill_switch"].as_bool().unwrap()
}

/// The markup a hostile agent writes into what the console shows.
const HOSTILE: &str = "</textarea><script>alert(1)</script><a href=\"javascript:alert(2)\">x</a>\u{202E}gnp.exe";

fn echo_scenario() -> Option<Scenario> {
    let s = Scenario::new()
        .responder(|req, _| {
            let last = req["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
            Some(if last["role"] == "tool" {
                Step::Text("done".into())
            } else {
                // A value the user never gave: the call waits for a human.
                Step::call("choir.test.echo_once", json!({"text": HOSTILE}))
            })
        })
        .running()
        .build()?;
    // The test tool is served once its counter exists.
    std::fs::write(s.choird.home.path().join("test-echo-once.count"), "0").unwrap();
    s.choird.ctl_ok(&["agent", "stop", "demo"]);
    s.choird.ctl_ok(&["agent", "start", "demo"]);
    s.choird.wait_running("demo");
    Some(s)
}

fn pending_call(choird: &Choird) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list"])).ok()?;
    v["approvals"]
        .as_array()?
        .iter()
        .find(|a| a["kind"] == "call" && a["status"] == "pending")
        .map(|a| (a["id"].to_string(), a["sha256"].as_str().unwrap_or_default().to_owned()))
}

fn runs(choird: &Choird) -> String {
    std::fs::read_to_string(choird.home.path().join("test-echo-once.count")).unwrap()
}

#[test]
fn the_console_is_closed_until_opened_and_refuses_every_request_it_should() {
    let Some(s) = echo_scenario() else { return };
    let choird = &s.choird;
    let socket = choird.home.path().join("socks/console.sock");
    assert!(!socket.exists(), "no console listener until it is opened");
    let (at, code) = open(choird);
    assert_eq!(at, socket);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // Without a session: nothing but the way in.
    let a = send(&socket, "GET", "/", &[("Host", HOST)], "");
    assert_eq!(a.status, 401, "{}", a.body);
    let csp = a.header("content-security-policy").unwrap().to_owned();
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'") && !csp.contains("unsafe"));
    assert_eq!(a.header("referrer-policy"), Some("same-origin"));

    // DNS rebinding: the right code, a foreign Host — refused, and the code is not spent.
    let a = send(&socket, "GET", &format!("/login?code={code}"), &[("Host", "evil.example:45123")], "");
    assert_eq!(a.status, 403, "{}", a.body);
    let cookie = login(&socket, &code);
    let replay = send(&socket, "GET", &format!("/login?code={code}"), &[("Host", HOST)], "");
    assert_eq!(replay.status, 401, "a code works once");
    assert!(!replay.headers.iter().any(|(k, _)| k == "set-cookie"));

    let home = send(&socket, "GET", "/", &[("Host", HOST), ("Cookie", &cookie)], "");
    assert_eq!(home.status, 200, "{}", home.body);
    assert!(home.body.contains("href=\"/agents/demo\""), "{}", home.body);
    let csrf = csrf_of(&home.body);

    // A foreign Host or Origin with a valid cookie.
    let a = send(&socket, "GET", "/", &[("Host", "evil.example:45123"), ("Cookie", &cookie)], "");
    assert_eq!(a.status, 403);
    let a =
        send(&socket, "GET", "/events", &[("Host", HOST), ("Origin", "http://evil.example"), ("Cookie", &cookie)], "");
    assert_eq!(a.status, 403, "an event stream opened from another origin");

    // A cross-site form post, a post without the token, a post without an Origin: none switches anything.
    let form = format!("csrf={csrf}&on=1&confirm=yes");
    let cross = [("Host", HOST), ("Origin", "http://evil.example"), ("Cookie", cookie.as_str())];
    assert_eq!(send(&socket, "POST", "/kill-switch", &cross, &form).status, 403);
    let no_token = [("Host", HOST), ("Origin", ORIGIN), ("Cookie", cookie.as_str())];
    assert_eq!(send(&socket, "POST", "/kill-switch", &no_token, "on=1&confirm=yes").status, 403);
    let no_origin = [("Host", HOST), ("Cookie", cookie.as_str())];
    assert_eq!(send(&socket, "POST", "/kill-switch", &no_origin, &form).status, 403);
    assert!(!kill_switch(choird), "nothing switched");
    // Negative control: the same post from the console's own page does switch it — and back.
    assert_eq!(send(&socket, "POST", "/kill-switch", &no_token, &form).status, 303);
    assert!(kill_switch(choird));
    let off = format!("csrf={csrf}&on=0&confirm=yes");
    assert_eq!(send(&socket, "POST", "/kill-switch", &no_token, &off).status, 303);
    assert!(!kill_switch(choird));

    // The live feed, as the page's script reads it.
    let feed = {
        use std::io::{Read, Write};
        let mut page = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        write!(page, "GET /events HTTP/1.1\r\nHost: {HOST}\r\nCookie: {cookie}\r\n\r\n").unwrap();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            page.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
            while let Ok(n) = page.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
                if n == 0 || String::from_utf8_lossy(&got).contains("choir.test.echo_once") {
                    break;
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        })
    };
    // A confirmation whose call carries markup: shown inert, decided bound to its sha256.
    std::thread::scope(|scope| {
        let chat = scope.spawn(|| choird.ctl_ok(&["chat", "demo", "say something"]));
        wait_for("the confirmation", Duration::from_secs(30), || pending_call(choird).is_some());
        let (id, sha) = pending_call(choird).unwrap();
        let page = send(&socket, "GET", &format!("/approvals/{id}"), &[("Host", HOST), ("Cookie", &cookie)], "");
        assert_eq!(page.status, 200);
        assert!(page.body.contains(&sha), "the page shows the sha256 it binds");
        assert!(!page.body.contains("<script>alert") && !page.body.contains("</textarea><"), "{}", page.body);
        assert!(!page.body.contains("href=\"javascript:"), "{}", page.body);
        assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{}", page.body);
        assert!(page.body.contains("U+202E") && !page.body.contains('\u{202E}'), "bidi shown, not applied");
        // A stale sha256 decides nothing.
        let stale = format!("csrf={csrf}&sha256={}", "0".repeat(64));
        let a = send(&socket, "POST", &format!("/approvals/{id}/approve"), &no_token, &stale);
        assert_eq!(a.status, 409, "{}", a.body);
        assert_eq!(runs(choird), "0");
        let yes = format!("csrf={csrf}&sha256={sha}");
        let a = send(&socket, "POST", &format!("/approvals/{id}/approve"), &no_token, &yes);
        assert_eq!(a.status, 303, "{}", a.body);
        assert_eq!(chat.join().unwrap().trim(), "done");
        assert_eq!(runs(choird), "1", "the call ran exactly once");
        let again = send(&socket, "POST", &format!("/approvals/{id}/approve"), &no_token, &yes);
        assert_ne!(again.status, 303, "a decided approval is not decided again");
        assert_eq!(runs(choird), "1");
    });
    let fed = feed.join().unwrap();
    assert!(fed.contains("text/event-stream") && fed.contains("event: agents"), "{fed}");
    assert!(fed.contains("event: commit") && fed.contains("choir.test.echo_once"), "the turn's events: {fed}");
    let audit = choird.ctl_ok(&["audit"]);
    assert!(audit.contains("console.login") && audit.contains("console:"), "decisions carry the session: {audit}");

    // Every page draws, each with what it is about.
    for (path, holds) in [
        ("/agents/demo", "choir.test.echo_once"),
        ("/agents/demo/tools", "choir.exec"),
        ("/agents/demo/skills", "built-in"),
        ("/approvals?status=approved", "call choir.test.echo_once"),
        ("/usage?by=day", "<svg"),
        ("/schedule", "next"),
        ("/sessions", "process"),
        ("/logs?agent=demo&level=info", "commit log:"),
        ("/audit", "console.login"),
        ("/kill-switch", "I mean it"),
    ] {
        let a = send(&socket, "GET", path, &[("Host", HOST), ("Cookie", &cookie)], "");
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        assert!(a.body.contains(holds), "{path} holds {holds:?}: {}", a.body);
    }
    // A skill file whose name and content are markup: listed (invalid), inert.
    let skills = choird.home.path().join("repos/agents/demo/skills");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(
        skills.join("<img src=x onerror=alert(3)>.json"),
        format!("{{\"name\": \"{}\", \"description\": \"{}\"}}", "x</textarea>", "<script>alert(4)</script>"),
    )
    .unwrap();
    let a = send(&socket, "GET", "/agents/demo/skills", &[("Host", HOST), ("Cookie", &cookie)], "");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("&lt;img src=x onerror=alert(3)&gt;") && a.body.contains("invalid"), "{}", a.body);
    assert!(!a.body.contains("<img") && !a.body.contains("<script>alert(4)") && !a.body.contains("x</textarea>"));
    let a = send(&socket, "GET", "/usage?by=nonsense", &[("Host", HOST), ("Cookie", &cookie)], "");
    assert_eq!(a.status, 400, "a bad parameter is said: {}", a.body);

    // Revoked: the cookie is dead.
    choird.ctl_ok(&["console", "--revoke"]);
    let a = send(&socket, "GET", "/", &[("Host", HOST), ("Cookie", &cookie)], "");
    assert_eq!(a.status, 401);
}

/// `choirctl console` running (it forwards while it runs): (it, the login URL).
fn console_forward(choird: &Choird) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(choir_tests::harness::bin("choirctl"))
        .arg("--home")
        .arg(choird.home.path())
        .arg("console")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("Console: ").unwrap_or_else(|| panic!("{line}")).to_owned();
    (child, url)
}

/// Whether a PNG shows more than a few colours (decoded by Chromium itself
/// on a blank page, where no CSP forbids a `data:` image: the test draws it
/// on a canvas and counts distinct pixels). Leaves the tab on that page.
fn not_blank(tab: &dyn Page, png: &[u8]) -> bool {
    use base64::Engine;
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    tab.goto("about:blank");
    let data = base64::engine::general_purpose::STANDARD.encode(png);
    let js = format!(
        "new Promise(ok => {{ const i = new Image(); i.onload = () => {{ const c = document.createElement('canvas'); \
         c.width = i.width; c.height = i.height; const x = c.getContext('2d'); x.drawImage(i, 0, 0); \
         const d = x.getImageData(0, 0, i.width, i.height).data; const seen = new Set(); \
         for (let p = 0; p < d.length && seen.size < 50; p += 4 * 97) seen.add(d[p] * 65536 + d[p+1] * 256 + d[p+2]); \
         ok(seen.size); }}; i.onerror = () => ok(0); i.src = 'data:image/png;base64,{data}'; }})"
    );
    tab.eval(&js).as_u64().unwrap_or(0) > 3
}

#[test]
fn the_console_in_a_real_browser_logs_in_once_shows_a_turn_live_and_decides_a_confirmation() {
    let Some(s) = echo_scenario() else { return };
    let Some(browser) = choir_tests::browser::Browser::open() else { return };
    let (tab, watch) = (browser.tab(), browser.tab());
    in_a_browser(&s, &tab, &watch);
}

#[test]
fn the_console_in_firefox_logs_in_once_shows_a_turn_live_and_decides_a_confirmation() {
    let Some(s) = echo_scenario() else { return };
    let Some(firefox) = choir_tests::firefox::Firefox::open() else { return };
    let (tab, watch) = (firefox.tab(), firefox.tab());
    in_a_browser(&s, &tab, &watch);
}

/// The browser test, in two tabs of one browser (they share its cookies).
fn in_a_browser(s: &Scenario, tab: &dyn Page, watch: &dyn Page) {
    let choird = &s.choird;
    let (mut forward, url) = console_forward(choird);
    let base = url.split("/login").next().unwrap().to_owned();
    tab.goto(&url);
    // Logged in; the code left the address bar and the cookie is out of script's reach.
    let href = tab.eval("location.href").as_str().unwrap().to_owned();
    assert!(!href.contains("code="), "{href}");
    assert_eq!(tab.eval("document.cookie === ''"), json!(true), "the session cookie is HttpOnly");
    assert!(tab.eval("document.body.innerText").as_str().unwrap().contains("demo"));
    let agents_png = tab.screenshot();
    if let Ok(to) = std::env::var("CHOIR_CONSOLE_SCREENSHOT") {
        std::fs::write(to, &agents_png).unwrap();
    }
    assert!(not_blank(tab, &agents_png), "the agents page is drawn");
    // The same address again: used.
    tab.goto(&url);
    assert!(tab.eval("document.body.innerText").as_str().unwrap().contains("used or expired"));

    // One tab watches the agents page while a turn runs and waits for a human.
    watch.goto(&base);
    std::thread::scope(|scope| {
        let chat = scope.spawn(|| choird.ctl_ok(&["chat", "demo", "say something"]));
        wait_for("the confirmation", Duration::from_secs(30), || pending_call(choird).is_some());
        watch.wait_until(
            "the lane's state, live",
            "document.querySelector('[data-agent-lanes=\"demo\"]').textContent.includes('WAITING_APPROVAL')",
            Duration::from_secs(20),
        );
        // The other tab decides it.
        let (id, _) = pending_call(choird).unwrap();
        tab.goto(&format!("{base}/approvals/{id}"));
        // The hostile markup is text on the page, not elements.
        let elements = "document.querySelectorAll('main script, main textarea, a[href^=javascript]').length";
        assert_eq!(tab.eval(elements), json!(0));
        assert!(tab.eval("document.body.innerText").as_str().unwrap().contains("<script>alert(1)</script>"));
        let approval_png = tab.screenshot();
        tab.eval("document.getElementById('approve').click(); true");
        tab.settle();
        assert_eq!(chat.join().unwrap().trim(), "done");
        assert!(tab.eval("document.getElementById('status').textContent").as_str().unwrap().contains("approved"));
        assert!(not_blank(tab, &approval_png), "the approval page is drawn");
        // The turn's commit events reach the watching page as they replicate.
        watch.wait_until(
            "the turn's events on the page",
            "[...document.querySelectorAll('#live li')].some(li => li.textContent.includes('choir.test.echo_once'))",
            Duration::from_secs(30),
        );
    });
    assert_eq!(runs(choird), "1", "approved once in the page, run once");

    // Another confirmation, rejected from the page with a reason: the call never runs.
    std::thread::scope(|scope| {
        let chat = scope.spawn(|| choird.ctl_ok(&["chat", "demo", "say something else"]));
        wait_for("the second confirmation", Duration::from_secs(30), || pending_call(choird).is_some());
        let (id, _) = pending_call(choird).unwrap();
        tab.goto(&format!("{base}/approvals/{id}"));
        tab.eval("document.querySelector('form[action$=\"/reject\"] input[name=reason]').value = 'not today'; true");
        tab.eval("document.getElementById('reject').click(); true");
        tab.settle();
        chat.join().unwrap();
        assert!(tab.eval("document.getElementById('status').textContent").as_str().unwrap().contains("rejected"));
        let shown: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "show", &id])).unwrap();
        assert_eq!(shown["info"]["status"], "rejected", "{shown}");
        assert_eq!(shown["info"]["decision_reason"], "not today", "the reason is kept: {shown}");
    });
    assert_eq!(runs(choird), "1", "rejected in the page: the call did not run");
    tab.goto(&format!("{base}/usage?by=agent"));
    assert!(tab.eval("document.querySelectorAll('svg.plot rect').length").as_u64().unwrap() >= 1, "a usage bar");
    let usage_png = tab.screenshot();
    assert!(not_blank(tab, &usage_png));
    assert_ne!(usage_png, agents_png);
    let _ = forward.kill();
    let _ = forward.wait();
}
