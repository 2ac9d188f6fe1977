//! `llm`: the model endpoints of the edge and core lanes, and their prices.

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
    /// Upstream timeout in seconds.
    #[serde(default = "default_llm_timeout")]
    pub timeout_s: u64,
}

fn default_llm_timeout() -> u64 {
    120
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
