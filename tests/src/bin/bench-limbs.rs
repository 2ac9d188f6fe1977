//! `bench-limbs` (`make bench`): the limbs (the host tools that act) — text to speech
//! (seconds of audio made per second of wall time, real espeak-ng and
//! opusenc), mail send and receive latency against real local servers
//! (dovecot, an SMTP submission server), and the overhead choird adds per
//! host-tool call (registry, audit, at-most-once record, the agent socket)
//! against the bare client call, as a ratio. DESIGN.md records the numbers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::process::Command;
use std::time::Instant;

use choir_tests::bench::{compare, ms, pct, timed, HostToolClient as Client};
use choir_tests::fake_notion::FakeNotion;
use choir_tests::harness::{bin, test_config, Choird};
use choir_tests::mail_servers::{MailServers, PASSWORD, USER};
use choir_tests::pg::TestPg;
use serde_json::{json, Value};

const NOTION_TOKEN: &str = "bench-notion-token";

fn opus_seconds(path: &std::path::Path) -> f64 {
    let out = Command::new("opusinfo").arg(path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.contains("Playback length")).unwrap();
    let t = line.split(": ").nth(1).unwrap().trim().trim_end_matches('s');
    let (m, s) = t.split_once("m:").unwrap();
    m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
}

fn main() {
    let pg = TestPg::start().expect("PostgreSQL is needed (make deps)");
    let mail = MailServers::start().expect("dovecot and python3-aiosmtpd are needed (make deps)");
    let notion = FakeNotion::start(NOTION_TOKEN);
    let mut config = test_config("http://127.0.0.1:9", Some(&pg.url()), &["evil1"]);
    config["agent_binary"] = json!(bin("hostile-agent"));
    config["agents"]["evil1"]["voice"] = json!({"voice": "en"});
    config["agents"]["evil1"]["notion"] = json!({"token_secret": "notion", "base_url": notion.base_url()});
    config["agents"]["evil1"]["email"] = json!({
        "smtp": {"host": "localhost", "port": mail.smtp_port, "security": "starttls"},
        "imap": {"host": "localhost", "port": mail.imaps_port, "security": "tls"},
        "username": USER, "password_secret": "mail", "from": format!("{USER}@localhost"), "ca_file": mail.ca_file()});
    let choird = Choird::start(&config, &json!({"llm_key": "k", "notion": NOTION_TOKEN, "mail": PASSWORD}));
    choird.ctl_ok(&["agent", "start", "evil1"]);
    let c = Client::of(&choird, "evil1");
    let ws = choird.workspace("evil1");
    let mut ids = 0u64;
    let mut id = || {
        ids += 1;
        format!("b{ids}")
    };

    // Text to speech.
    let text = "Choir agents can speak: this sentence is rendered by espeak-ng and encoded with opusenc. ".repeat(6);
    let mut audio = 0.0;
    let t = Instant::now();
    for i in 0..10 {
        let r = c.tool("choir.tts.speak", json!({"text": text}), &format!("tts{i}"));
        audio += opus_seconds(&ws.join(r["path"].as_str().unwrap()));
    }
    let wall = t.elapsed().as_secs_f64();
    choir_tests::report!(
        "choir.tts.speak, 10 calls of {} characters: {audio:.1} s of audio in {wall:.2} s: {:.1} s of audio per second",
        text.len(),
        audio / wall
    );

    // Mail: send through choird vs the same lettre transport directly.
    let account = choird::host_tools::mail::account::Account {
        cfg: serde_json::from_value(config["agents"]["evil1"]["email"].clone()).unwrap(),
        password: PASSWORD.to_owned(),
    };
    let transport = choird::host_tools::mail::send::transport(&account).unwrap();
    let direct = timed(50, |i| {
        use lettre::Transport;
        let m = lettre::Message::builder()
            .from(format!("{USER}@localhost").parse().unwrap())
            .to(format!("{USER}@localhost").parse().unwrap())
            .subject(format!("direct {i}"))
            .body("x".to_owned())
            .unwrap();
        transport.send(&m).unwrap();
    });
    let via = timed(50, |i| {
        let r = c.tool(
            "choir.email.send",
            json!({"to": [format!("{USER}@localhost")], "subject": format!("via {i}"), "body": "x"}),
            &id(),
        );
        assert!(r["message_id"].is_string(), "{r}");
    });
    compare("email.send (SMTP STARTTLS + AUTH, delivered through LMTP)", direct, via);

    // Receive: one message fetched, through choird vs the same IMAP session code directly.
    let uid = {
        let mut s = choird::host_tools::mail::imap_session::open(&account).unwrap();
        s.examine("INBOX").unwrap();
        s.uid_search("ALL").unwrap().into_iter().max().unwrap()
    };
    let direct = timed(50, |_| {
        let mut s = choird::host_tools::mail::imap_session::open(&account).unwrap();
        s.examine("INBOX").unwrap();
        let f = s.uid_fetch(uid.to_string(), "(UID BODY.PEEK[])").unwrap();
        let raw = f.iter().next().and_then(|f| f.body()).unwrap().to_vec();
        choird::host_tools::mail::parse::message(&raw).unwrap();
        let _ = s.logout();
    });
    let via = timed(50, |_| {
        let r = c.tool("choir.email.receive", json!({"id": uid}), &id());
        assert!(r["content"].is_string(), "{r}");
    });
    compare("email.receive {id} (IMAPS login, fetch, parse)", direct, via);
    let mut check = timed(50, |_| {
        c.tool("choir.email.check", json!({}), &id());
    });
    choir_tests::report!(
        "email.check (IMAPS login, {} messages, newest 10 headers), n=50: p50 {}, p99 {}",
        mail.delivered(),
        ms(pct(&mut check, 0.5)),
        ms(pct(&mut check, 0.99))
    );

    // Notion: a search through choird vs the same request directly.
    let http = ureq::Agent::new_with_config(ureq::config::Config::builder().http_status_as_error(false).build());
    let direct = timed(200, |_| {
        let mut r = http
            .post(&format!("{}/v1/search", notion.base_url()))
            .header("Authorization", &format!("Bearer {NOTION_TOKEN}"))
            .header("Notion-Version", "2022-06-28")
            .header("Content-Type", "application/json")
            .send(json!({"query": "plan", "page_size": 20}).to_string())
            .unwrap();
        let _: Value = r.body_mut().read_json().unwrap();
    });
    let via = timed(200, |_| {
        c.tool("choir.notion.query", json!({"mode": "search", "query": "plan"}), &id());
    });
    compare("notion.query search (fake Notion on loopback)", direct, via);
}
