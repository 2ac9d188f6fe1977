//! Speech, both ways: `choir.tts.speak` (espeak-ng and opusenc on the host,
//! a voice note into the agent's `.choirtmp/send/`) and the transcription of
//! voice notes users send (an OpenAI-compatible `/audio/transcriptions`
//! endpoint), which the Telegram gateway uses.

pub mod transcribe;
pub mod tts;
