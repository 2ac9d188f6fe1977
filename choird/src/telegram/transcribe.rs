//! Transcription of a voice note through an OpenAI-compatible endpoint:
//! `POST {base_url}/audio/transcriptions`, `multipart/form-data` with
//! `file` (the audio, with its file name), `model` and
//! `response_format=json`; the answer is `{"text": "…"}` (OpenAI, Groq and
//! local whisper servers speak this). The key stays in choird.
//!
//! **Invariant:** an error names neither the endpoint's address nor its key
//! (both go only to choird's log, the address only there).

use std::time::Duration;

use ureq::unversioned::multipart::{Form, Part};

use crate::config::TranscriptionConfig;
use crate::secrets::Secrets;

/// Longest transcript kept (characters).
pub const MAX_TEXT: usize = 20_000;
/// Bytes of an answer read at most.
const MAX_ANSWER: u64 = 1024 * 1024;

/// The text of `audio` (named `file_name`), or why not (for the operator;
/// users get a polite request for text instead).
pub fn transcribe(
    cfg: &TranscriptionConfig,
    secrets: &Secrets,
    audio: &[u8],
    file_name: &str,
) -> Result<String, String> {
    let http = crate::resolver::agent(
        ureq::config::Config::builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(cfg.timeout_s))),
    );
    let mime = match file_name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).as_deref() {
        Some("ogg" | "oga" | "opus") => "audio/ogg",
        Some("mp3") => "audio/mpeg",
        Some("m4a") => "audio/mp4",
        Some("wav") => "audio/wav",
        _ => "application/octet-stream",
    };
    let part = Part::bytes(audio).file_name(file_name).mime_str(mime).map_err(|e| e.to_string())?;
    let mut form = Form::new().part("file", part).text("model", &cfg.model).text("response_format", "json");
    if let Some(lang) = &cfg.language {
        form = form.text("language", lang);
    }
    let mut req = http.post(&format!("{}/audio/transcriptions", cfg.base_url.trim_end_matches('/')));
    if let Some(name) = &cfg.api_key_secret {
        let key = secrets.get(name).ok_or_else(|| format!("the transcription key {name:?} is not in secrets.json"))?;
        req = req.header("Authorization", &format!("Bearer {key}"));
    }
    let mut resp = req.send(form).map_err(|e| {
        log::warn!("transcription endpoint {}: {e}", cfg.base_url);
        match e {
            ureq::Error::Timeout(_) => format!("the transcription service did not answer within {} s", cfg.timeout_s),
            _ => "the transcription service cannot be reached".to_owned(),
        }
    })?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER)
        .read_json()
        .map_err(|_| format!("the transcription service answered {status} without JSON"))?;
    if status != 200 {
        let msg = body["error"]["message"].as_str().unwrap_or("no message");
        return Err(format!("the transcription service answered {status}: {}", choir_common::text::clipped(msg, 200)));
    }
    let text = body["text"].as_str().unwrap_or_default().trim();
    if text.is_empty() {
        return Err("the transcription came back empty".into());
    }
    Ok(choir_common::text::cap_with_note(text, MAX_TEXT).0)
}
