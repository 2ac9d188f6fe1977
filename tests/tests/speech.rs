//! Speech both ways through the real pipeline: `choir.tts.speak` with real
//! espeak-ng and opusenc (the voice note decodes, its length follows the
//! text, and it reaches the Telegram fake as `sendVoice`), and voice notes
//! from users transcribed through a fake of the documented
//! `/audio/transcriptions` endpoint — or, when that fails, a polite request
//! for text instead of an empty turn.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::fake_telegram::FakeTelegram;
use choir_tests::fake_transcription::FakeTranscription;
use choir_tests::harness::{test_config, Choird};
use choir_tests::observe::wait_for;
use choir_tests::pg::TestPg;
use choir_tests::tool_calls::{call, caller, failed, ok};
use serde_json::{json, Value};

const TOKEN: &str = "333333:CCCC-secret-token-c";

/// Seconds of audio in an OGG/Opus file, as `opusinfo` reports it.
fn duration_s(file: &Path) -> f64 {
    let out = Command::new("opusinfo").arg(file).output().expect("opusinfo (opus-tools)");
    assert!(out.status.success(), "opusinfo refused {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.contains("Playback length")).unwrap_or_else(|| panic!("{text}"));
    // "Playback length: 0m:01.527s"
    let t = line.split(": ").nth(1).unwrap().trim().trim_end_matches('s');
    let (m, s) = t.split_once("m:").unwrap();
    m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
}

fn tools_required() -> bool {
    let there = Path::new("/usr/bin/espeak-ng").exists() && Path::new("/usr/bin/opusenc").exists();
    if !there {
        assert!(!choir_tests::services_required(), "espeak-ng and opus-tools are required (make test installs them)");
        eprintln!("skipped: espeak-ng or opus-tools missing");
    }
    there
}

#[test]
fn spoken_text_becomes_a_voice_note_that_decodes_and_reaches_telegram_as_send_voice() {
    let Some(pg) = TestPg::start() else { return };
    if !tools_required() {
        return;
    }
    let llm = caller();
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 333333, "voice_bot");
    let mut c = test_config(&llm.base_url(), Some(&pg.url()), &["demo", "mute"]);
    c["agents"]["demo"]["voice"] = json!({"voice": "en", "speed": 175});
    c["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 50,
                           "bots": {"v": {"token_secret": "tg", "users": {"501": {"agent": "demo"}}}}});
    let choird = Choird::start(&c, &json!({"llm_key": "k", "tg": TOKEN}));
    choird.ctl_ok(&["agent", "start", "demo"]);
    let ws = choird.workspace("demo");

    let short = ok(&call(&choird, "demo", "choir.tts.speak", json!({"text": "Hello there."}))).clone();
    assert_eq!(short.get("output_trust"), None, "Choir's own words: {short}");
    let long_text = "The quick brown fox jumps over the lazy dog. ".repeat(4);
    let long =
        ok(&call(&choird, "demo", "choir.tts.speak", json!({"text": long_text, "voice": "en-us", "speed": 200})))
            .clone();
    let (a, b) = (ws.join(short["path"].as_str().unwrap()), ws.join(long["path"].as_str().unwrap()));
    assert!(a.starts_with(ws.join(".choirtmp/send")) && a.extension().is_some_and(|e| e == "ogg"), "{a:?}");
    let (da, db) = (duration_s(&a), duration_s(&b));
    assert!(da > 0.3 && da < 5.0, "{da}");
    assert!(db > 3.0 * da, "four sentences last longer than two words: {db} vs {da}");

    // Bad input: refused, nothing written.
    let before = std::fs::read_dir(ws.join(".choirtmp/send")).unwrap().count();
    for (args, expect) in [
        (json!({"text": "x", "voice": "-w"}), "voice"),
        (json!({"text": "x".repeat(5001)}), "text"),
        (json!({"text": "x", "speed": 5}), "speed"),
        (json!({"text": "   "}), "blank"),
        (json!({"text": "x", "voice": "zz-nonexistent"}), "could not be spoken"),
    ] {
        let e = failed(&call(&choird, "demo", "choir.tts.speak", args.clone()));
        assert!(e.contains(expect), "{args}: {e}");
    }
    assert_eq!(std::fs::read_dir(ws.join(".choirtmp/send")).unwrap().count(), before);
    for f in std::fs::read_dir(ws.join(".choirtmp/send")).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }

    // A user asks on Telegram: the voice note follows the answer.
    tg.user_says(TOKEN, 501, &json!({"tool": "choir.tts.speak", "args": {"text": "Good morning."}}).to_string());
    let calls = tg.wait_calls("the voice note", Duration::from_secs(30), |c| c.iter().any(|c| c.method == "sendVoice"));
    let voice = calls.iter().find(|c| c.method == "sendVoice").unwrap();
    assert_eq!(voice.params["chat_id"], 501);
    assert!(voice.files[0].2.starts_with(b"OggS"), "an OGG file");

    // An agent without a voice is not given the tool, and is told why.
    let tools: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "tools", "list", "mute"])).unwrap();
    let tts = tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == "choir.tts.speak").unwrap().clone();
    assert_eq!(
        (tts["status"].as_str(), tts["why"].as_str()),
        (Some("available"), Some("agents.mute.voice is not configured"))
    );
}

#[test]
fn a_voice_note_is_transcribed_for_the_agent_or_the_user_is_asked_for_text() {
    let Some(pg) = TestPg::start() else { return };
    let llm = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        Some(Step::Text(format!("heard: {}", last["content"].as_str()?)))
    });
    let tg = FakeTelegram::start();
    tg.add_bot(TOKEN, 333333, "voice_bot");
    let stt = FakeTranscription::start("please summarise my inbox");
    let mut c = test_config(&llm.base_url(), Some(&pg.url()), &["demo"]);
    c["telegram"] = json!({"api_base": tg.base_url(), "poll_timeout_s": 1, "per_chat_interval_ms": 50,
                           "transcription": {"base_url": stt.base_url(), "model": "whisper-1", "api_key_secret": "stt_key"},
                           "bots": {"v": {"token_secret": "tg", "users": {"501": {"agent": "demo"}}}}});
    let choird = Choird::start(&c, &json!({"llm_key": "k", "tg": TOKEN, "stt_key": "stt-secret"}));
    choird.ctl_ok(&["agent", "start", "demo"]);

    let audio = b"OggS\x00\x02fake opus voice note".to_vec();
    tg.user_sends_voice(TOKEN, 501, &audio, 2);
    let calls = tg.wait_calls("the answer", Duration::from_secs(30), |c| c.iter().any(|c| c.method == "sendMessage"));
    let answer = calls.iter().find(|c| c.method == "sendMessage").unwrap().params["text"].as_str().unwrap().to_owned();
    assert!(answer.contains("please summarise my inbox") && answer.contains("automatic transcription"), "{answer}");
    let heard = stt.heard();
    assert_eq!(heard.len(), 1);
    assert_eq!((heard[0].model.as_str(), heard[0].file.as_slice()), ("whisper-1", audio.as_slice()));
    assert_eq!(heard[0].authorization.as_deref(), Some("Bearer stt-secret"));
    // The audio is kept for the agent.
    let recv = choird.workspace("demo").join(".choirtmp/recv");
    let kept: Vec<_> = std::fs::read_dir(&recv).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(kept.iter().any(|p| std::fs::read(p).unwrap() == audio), "{kept:?}");
    assert!(answer.contains(".choirtmp/recv/"), "{answer}");

    // The service fails: the user is asked for text; the agent gets no empty turn.
    stt.set_down(true);
    let asked = llm.requests().len();
    tg.user_sends_voice(TOKEN, 501, &audio, 2);
    let calls = tg.wait_calls("the polite reply", Duration::from_secs(30), |c| {
        c.iter().filter(|c| c.method == "sendMessage").count() >= 2
    });
    let reply = calls.iter().rfind(|c| c.method == "sendMessage").unwrap().params["text"].as_str().unwrap().to_owned();
    assert!(reply.contains("could not make out your voice message") && reply.contains("as text"), "{reply}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(llm.requests().len(), asked, "no turn for the agent");
    let status: Value = serde_json::from_str(&choird.ctl_ok(&["--json", "telegram", "status"])).unwrap();
    let err = status["bots"][0]["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(err.contains("transcription") && err.contains("503"), "{status}");
    assert!(!status.to_string().contains("stt-secret"));
    wait_for("nothing else to be sent", Duration::from_secs(2), || true);
}
