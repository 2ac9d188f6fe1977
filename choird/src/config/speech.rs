//! Speech in `config.json`: `agents.<id>.voice` (how `choir.tts.speak`
//! sounds for the agent) and `telegram.transcription` (the endpoint that
//! turns users' voice notes into text).

use serde::{Deserialize, Serialize};

/// Whether a voice name is one espeak-ng could have (`en`, `en-us`,
/// `de+f3`, `mb-en1`): letters, digits, `-`, `+`, `_`, at most 40.
pub fn valid_voice(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 40
        && !v.starts_with('-')
        && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '_'))
}

/// A config problem: (dotted field, reason).
type Problem = (String, String);

/// `agents.<id>.voice`: how `choir.tts.speak` sounds for the agent (without
/// it the tool is not served to the agent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentVoice {
    /// espeak-ng voice (`en`, `en-us`, `de`, `fr+f3`, …).
    #[serde(default = "default_voice")]
    pub voice: String,
    /// Words per minute (80–400).
    #[serde(default = "default_speed")]
    pub speed: u64,
    /// Pitch (0–99).
    #[serde(default = "default_pitch")]
    pub pitch: u64,
}

fn default_voice() -> String {
    "en".into()
}
fn default_speed() -> u64 {
    175
}
fn default_pitch() -> u64 {
    50
}

impl Default for AgentVoice {
    fn default() -> Self {
        AgentVoice { voice: default_voice(), speed: default_speed(), pitch: default_pitch() }
    }
}

/// `telegram.transcription`: an OpenAI-compatible transcription endpoint
/// for the voice notes users send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscriptionConfig {
    /// Base URL including the version; choird posts to `<base_url>/audio/transcriptions`.
    pub base_url: String,
    /// The model (`whisper-1`, `whisper-large-v3`, …).
    pub model: String,
    /// Name of the key in `secrets.json` (none for keyless servers).
    #[serde(default)]
    pub api_key_secret: Option<String>,
    /// The language of the audio (ISO-639-1), when known.
    #[serde(default)]
    pub language: Option<String>,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_transcription_timeout")]
    pub timeout_s: u64,
}

fn default_transcription_timeout() -> u64 {
    60
}

/// Checks `agents.<id>.voice`.
pub fn validate_voice(at: &str, v: &AgentVoice) -> Result<(), Problem> {
    if !valid_voice(&v.voice) {
        return Err((format!("{at}.voice"), "must be an espeak-ng voice name like en or en-us".into()));
    }
    if !(80..=400).contains(&v.speed) {
        return Err((format!("{at}.speed"), "must be between 80 and 400 (words per minute)".into()));
    }
    if v.pitch > 99 {
        return Err((format!("{at}.pitch"), "must be between 0 and 99".into()));
    }
    Ok(())
}

/// Checks `telegram.transcription`.
pub fn validate_transcription(t: &TranscriptionConfig) -> Result<(), Problem> {
    let e = |f: &str, r: &str| Err((format!("telegram.transcription.{f}"), r.to_owned()));
    if !(t.base_url.starts_with("http://") || t.base_url.starts_with("https://")) {
        return e("base_url", "must start with http:// or https://");
    }
    if t.model.trim().is_empty() {
        return e("model", "must not be empty");
    }
    if t.timeout_s == 0 || t.timeout_s > 600 {
        return e("timeout_s", "must be between 1 and 600");
    }
    Ok(())
}
