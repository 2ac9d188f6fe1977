//! `choir.tts.speak {text, voice?, speed?, pitch?}`: espeak-ng renders the
//! text with the agent's voice profile (`agents.<id>.voice`; a call may
//! override it within limits), opusenc encodes it as OGG/Opus, and the file
//! is written into the agent's `.choirtmp/send/` through descriptors — the
//! Telegram sender sends an `.ogg` there as a voice message with the next
//! answer. Served to agents with a `voice` section when both programs are
//! installed.
//!
//! **Invariants:** the text reaches espeak-ng through a file of choird's,
//! never its command line; it is capped at [`MAX_CHARS`]; voice names are
//! checked against a strict pattern (they become an argument); both programs
//! run through `spawn::Cmd` with a scrubbed environment and are killed at
//! their deadline.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use crate::config::Config;
use crate::error::Error;
use crate::host_tools::{HostCall, HostTool, ToolStatus};
use crate::secrets::Secrets;
use crate::shared::Shared;
use crate::spawn::Cmd;

/// Longest text spoken.
pub const MAX_CHARS: usize = 5000;
/// Largest voice note written.
const MAX_OGG: u64 = 20 * 1024 * 1024;
/// How long rendering may take.
const DEADLINE: Duration = Duration::from_secs(60);
const ESPEAK: &str = "/usr/bin/espeak-ng";
const OPUSENC: &str = "/usr/bin/opusenc";

/// The tool.
pub struct Speak {
    shared: Arc<Shared>,
}

impl Speak {
    /// The tool over `shared`'s config.
    pub fn new(shared: Arc<Shared>) -> Speak {
        Speak { shared }
    }
}

pub use crate::config::valid_voice;

/// Runs `cmd` to completion within `deadline`, killing it after.
fn run_within(mut cmd: Cmd, deadline: Instant) -> Result<(), String> {
    let mut child = cmd
        .spawn(std::process::Stdio::null(), std::process::Stdio::null(), std::process::Stdio::piped())
        .map_err(|e| e.to_string())?;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = (&mut e).take(4096).read_to_string(&mut err);
                }
                return Err(format!("{} failed ({status}): {}", cmd.display(), err.trim()));
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} took too long", cmd.display()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Renders `text` to an OGG/Opus file in `dir`; returns its path.
fn render(dir: &Path, text: &str, voice: &str, speed: u64, pitch: u64) -> Result<std::path::PathBuf, String> {
    let deadline = Instant::now() + DEADLINE;
    let input = dir.join("text.txt");
    let wav = dir.join("speech.wav");
    let ogg = dir.join("speech.ogg");
    std::fs::write(&input, text).map_err(|e| e.to_string())?;
    let mut espeak = Cmd::new(ESPEAK);
    // espeak-ng loads libpulse, which makes a runtime directory even when
    // writing a file: in `dir` (removed with it), not /tmp/pulse-<id>,
    // which the scrubbed environment would leave behind for good.
    espeak
        .env("PULSE_RUNTIME_PATH", dir.join("pulse"))
        .args(["-v", voice, "-s", &speed.to_string(), "-p", &pitch.to_string(), "-w"])
        .arg(wav.as_os_str())
        .arg("-f")
        .arg(input.as_os_str());
    run_within(espeak, deadline)?;
    let mut opus = Cmd::new(OPUSENC);
    opus.args(["--quiet", "--bitrate", "32"]).arg(wav.as_os_str()).arg(ogg.as_os_str());
    run_within(opus, deadline)?;
    Ok(ogg)
}

impl HostTool for Speak {
    fn name(&self) -> &str {
        "choir.tts.speak"
    }

    fn manifest(&self) -> Option<ToolManifest> {
        serde_json::from_value(json!({
            "llm": {
                "name": "choir.tts.speak",
                "description": "Say something out loud: the text becomes a voice message sent to the user with your answer.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS},
                        "voice": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9+_-]{0,39}$", "description": "espeak-ng voice, e.g. en, en-us, de, fr"},
                        "speed": {"type": "integer", "minimum": 80, "maximum": 400, "description": "words per minute"},
                        "pitch": {"type": "integer", "minimum": 0, "maximum": 99}
                    },
                    "required": ["text"],
                    "additionalProperties": false
                }
            },
            "runtime": {"timeout_ms": 90000, "network": true, "side_effect": "write", "idempotent": true,
                        "locks": [{"resource": "choirtmp", "mode": "X"}], "version": "1", "output_trust": "trusted"}
        }))
        .ok()
    }

    fn status(&self, config: &Config, _secrets: &Secrets, agent: &AgentId) -> ToolStatus {
        if config.agents.get(agent).and_then(|a| a.voice.as_ref()).is_none() {
            return ToolStatus::Available(format!("agents.{agent}.voice is not configured"));
        }
        for (bin, package) in [(ESPEAK, "espeak-ng"), (OPUSENC, "opus-tools")] {
            if !Path::new(bin).is_file() {
                return ToolStatus::Available(format!("{bin} is not installed (Debian's {package} package)"));
            }
        }
        ToolStatus::Connected
    }

    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        let config = self.shared.config();
        let agent = &call.caller.agent;
        let profile = config.agents.get(agent).and_then(|a| a.voice.clone()).unwrap_or_default();
        let text = call.input["text"].as_str().unwrap_or_default();
        if text.trim().is_empty() {
            return Err(Error::Malformed("text must not be blank".into()));
        }
        if text.chars().count() > MAX_CHARS {
            return Err(Error::TooLarge(format!("at most {MAX_CHARS} characters are spoken")));
        }
        let voice = call.input["voice"].as_str().unwrap_or(&profile.voice).to_owned();
        if !valid_voice(&voice) {
            return Err(Error::Malformed(format!("{voice:?} is not a voice name")));
        }
        let speed = call.input["speed"].as_u64().unwrap_or(profile.speed).clamp(80, 400);
        let pitch = call.input["pitch"].as_u64().unwrap_or(profile.pitch).min(99);
        let dir = tempfile::Builder::new()
            .prefix("choird-tts-")
            .tempdir()
            .map_err(|e| Error::Internal(format!("no room to render speech: {e}")))?;
        let ogg = render(dir.path(), text, &voice, speed, pitch).map_err(|e| {
            log::warn!("agent {agent}: speech: {e}");
            Error::Invalid(format!("the text could not be spoken with voice {voice}"))
        })?;
        let size = std::fs::metadata(&ogg).map(|m| m.len()).unwrap_or(0);
        if size == 0 || size > MAX_OGG {
            return Err(Error::Invalid(format!("the voice note came out at {size} bytes")));
        }
        let data = std::fs::read(&ogg).map_err(|e| Error::Internal(e.to_string()))?;
        let stamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        let workspace = config.workspace(&self.shared.home, agent);
        let path =
            crate::workspace_files::store_outgoing(&workspace, &format!("voice-{stamp}.ogg"), &data).map_err(|e| {
                log::warn!("agent {agent}: the voice note could not be written: {e}");
                Error::Conflict("the voice note could not be written into .choirtmp/send".into())
            })?;
        Ok(json!({
            "summary": format!("voice note {path} ({} bytes, voice {voice}); it goes to the user with your answer", data.len()),
            "path": path,
            "bytes": data.len(),
            "voice": voice,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_espeak_keeps_the_sound_servers_runtime_dir_in_the_render_dir_not_in_tmp() {
        if !Path::new(ESPEAK).exists() || !Path::new(OPUSENC).exists() {
            // `make test` installs both, and tests/tests/speech.rs fails
            // there without them; plain `cargo test` may go without.
            eprintln!("skipped: espeak-ng or opus-tools missing");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ogg = render(dir.path(), "hello", "en", 175, 50).unwrap();
        assert!(std::fs::metadata(&ogg).unwrap().len() > 0);
        // Without the variable libpulse made /tmp/pulse-<id> and nothing
        // ever removed it.
        assert!(dir.path().join("pulse").is_dir(), "the runtime dir is the render's");
    }

    #[test]
    fn voice_names_cannot_become_options_or_paths() {
        for ok in ["en", "en-us", "de+f3", "mb-en1", "en_GB"] {
            assert!(valid_voice(ok), "{ok}");
        }
        for bad in ["", "-w", "--stdout", "../x", "en us", "a;rm", &"a".repeat(41)] {
            assert!(!valid_voice(bad), "{bad}");
        }
    }
}
