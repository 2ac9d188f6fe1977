//! Speech out: `choir.tts.speak` (espeak-ng and opusenc on the host, a
//! voice note into the agent's `.choirtmp/send/`). The transcription of voice
//! notes users send is the Telegram gateway's (`telegram::transcribe`).

pub mod tts;
