//! `llm`: the model endpoints of the edge and core lanes, what each endpoint
//! can do, and the models' prices.
//!
//! An endpoint's capabilities come from its `preset` (a provider whose
//! documented behaviour differs from OpenAI's), each overridable by its own
//! field. Two patiences bound a call: `timeout_s` is the longest *silence*
//! (before the answer's first byte and between any two), `answer_timeout_s`
//! the longest whole answer, so a healthy stream delivering a token a second
//! is never cut at `timeout_s`.

use super::*;

/// An OpenAI-compatible endpoint for one lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmEndpoint {
    /// Base URL including the version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name sent upstream.
    pub model: String,
    /// Name of the API key in `secrets.json`; absent for keyless local servers.
    #[serde(default)]
    pub api_key_secret: Option<String>,
    /// The longest silence from the endpoint while it answers, in seconds:
    /// before its first byte, and between any two.
    #[serde(default = "default_llm_timeout")]
    pub timeout_s: u64,
    /// The longest a whole answer may take, in seconds (absent: 900, or
    /// `timeout_s` when that is longer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_timeout_s: Option<u64>,
    /// The API the endpoint speaks: `openai` (chat completions, the default)
    /// or `anthropic` (the Messages API, translated by choird).
    #[serde(default, skip_serializing_if = "Protocol::is_openai")]
    pub protocol: Protocol,
    /// For an `anthropic` endpoint: extended thinking with this many tokens
    /// (at least 1024); absent, off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget_tokens: Option<u64>,
    /// Which provider's documented behaviour to expect (see [`Preset`]);
    /// absent: OpenAI's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// Ask for streamed answers (absent: the preset's choice). When off,
    /// choird asks for whole answers and streams each to the agent itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Send `stream_options: {"include_usage": true}` with streamed requests
    /// (absent: the preset's choice). Off for endpoints that refuse it;
    /// their streamed calls' usage is then estimated unless they report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<bool>,
    /// Whether the model may propose several tool calls in one answer
    /// (absent: the endpoint's default); `false` sends
    /// `parallel_tool_calls: false` with every request that offers tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The endpoints (each with its model) tried in order when this one is
    /// down, rate limited or overloaded — never when it refused the request
    /// itself. Only the operator's config names them: an agent cannot add
    /// one, and no model outside this list is used. A fallback has no
    /// fallbacks of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<LlmEndpoint>,
}

/// Fallbacks a lane may have.
pub const MAX_FALLBACKS: usize = 4;

fn default_llm_timeout() -> u64 {
    120
}

/// `answer_timeout_s` when absent (or `timeout_s`, when that is longer).
const DEFAULT_ANSWER_S: u64 = 900;

/// The longest `timeout_s` (silence) accepted.
pub const MAX_SILENCE_S: u64 = 1800;
/// The longest `answer_timeout_s` accepted.
pub const MAX_ANSWER_S: u64 = 3600;

/// The API an endpoint speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OpenAI's chat completions (and every compatible server).
    #[default]
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

impl Protocol {
    fn is_openai(&self) -> bool {
        *self == Protocol::Openai
    }
}

/// A provider whose OpenAI-compatible endpoint is known to differ from
/// OpenAI's in what it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// api.openai.com.
    Openai,
    /// openrouter.ai (mid-stream errors, `: OPENROUTER PROCESSING`).
    Openrouter,
    /// Gemini's OpenAI-compatible endpoint (calls without `index`,
    /// thought signatures that must come back).
    Gemini,
    /// api.mistral.ai: refuses unknown fields, `stream_options` among them
    /// (422 `extra_forbidden`; BerriAI/litellm #8978).
    Mistral,
    /// api.groq.com (usage in `x_groq.usage`).
    Groq,
    /// A vLLM server.
    Vllm,
    /// llama.cpp's `llama-server`.
    Llamacpp,
    /// Ollama's `/v1`.
    Ollama,
    /// api.deepseek.com (`reasoning_content`, keep-alive comments).
    Deepseek,
}

impl Preset {
    /// Every preset, for messages and `doctor`.
    pub const ALL: [Preset; 9] = [
        Preset::Openai,
        Preset::Openrouter,
        Preset::Gemini,
        Preset::Mistral,
        Preset::Groq,
        Preset::Vllm,
        Preset::Llamacpp,
        Preset::Ollama,
        Preset::Deepseek,
    ];

    /// Its name in config.json.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Openai => "openai",
            Preset::Openrouter => "openrouter",
            Preset::Gemini => "gemini",
            Preset::Mistral => "mistral",
            Preset::Groq => "groq",
            Preset::Vllm => "vllm",
            Preset::Llamacpp => "llamacpp",
            Preset::Ollama => "ollama",
            Preset::Deepseek => "deepseek",
        }
    }

    /// Whether its endpoint accepts `stream_options` (vLLM since 0.5.0,
    /// Ollama since 0.5.2, llama.cpp's server; Mistral refuses it).
    fn takes_stream_options(self) -> bool {
        !matches!(self, Preset::Mistral)
    }
}

impl LlmEndpoint {
    /// The longest a whole answer may take, in seconds.
    pub fn answer_timeout_s(&self) -> u64 {
        self.answer_timeout_s.unwrap_or(DEFAULT_ANSWER_S.max(self.timeout_s))
    }

    /// Whether requests to this endpoint are streamed.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(true)
    }

    /// Whether streamed requests carry `stream_options`.
    pub fn sends_stream_options(&self) -> bool {
        self.stream_options.unwrap_or_else(|| self.preset.is_none_or(Preset::takes_stream_options))
    }
}

/// Endpoints per lane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The fast, user-facing lane.
    pub edge: LlmEndpoint,
    /// Core jobs.
    pub core: LlmEndpoint,
    /// Prices by model name, for the cost ledger (a model without one is
    /// recorded without a cost).
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
}

/// A model's price, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million prompt (input) tokens.
    pub prompt_per_mtok: f64,
    /// Per million completion (output) tokens.
    pub completion_per_mtok: f64,
}

impl LlmConfig {
    /// The estimated cost of a call to `model`, if it has a price.
    pub fn cost(&self, model: &str, prompt: u64, completion: u64) -> Option<f64> {
        let p = self.prices.get(model)?;
        Some((prompt as f64 * p.prompt_per_mtok + completion as f64 * p.completion_per_mtok) / 1_000_000.0)
    }
}
