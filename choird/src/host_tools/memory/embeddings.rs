//! The embeddings client (R-MEM-2): OpenAI-compatible `POST
//! <base_url>/embeddings` (<https://platform.openai.com/docs/api-reference/embeddings>),
//! `{"model", "input": [texts], "encoding_format": "float"}` →
//! `{"data": [{"index", "embedding": [...]}], ...}`. The API key is added
//! here, in choird; it never reaches an agent.
//!
//! **Invariant:** every vector returned has exactly the configured dimension;
//! anything else is an error, never truncated or padded.

use std::time::Duration;

use serde_json::{json, Value};

use crate::config::MemoryConfig;
use crate::secrets::Secrets;

/// Why texts could not be embedded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedError {
    /// The endpoint is unreachable, rate limited or failing (5xx): retry later.
    #[error("the embedding endpoint is unavailable: {0}")]
    Unavailable(String),
    /// The endpoint refused the request (4xx other than 429); not retried.
    #[error("the embedding endpoint refused the request: {0}")]
    Refused(String),
    /// The endpoint returns vectors of another dimension than configured.
    #[error(
        "the embedding model returns {got}-dimensional vectors, but memory.embeddings.dimensions is {want}; \
         set it to {got} (vectors are never truncated)"
    )]
    Dimensions {
        /// What the endpoint returned.
        got: usize,
        /// What config says.
        want: usize,
    },
}

impl EmbedError {
    /// Whether trying again later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, EmbedError::Unavailable(_))
    }
}

/// The client.
pub struct Embedder {
    agent: ureq::Agent,
    url: String,
    model: String,
    key: Option<String>,
    dims: usize,
}

impl Embedder {
    /// A client for the configured endpoint.
    pub fn new(cfg: &MemoryConfig, secrets: &Secrets) -> Embedder {
        let em = &cfg.embeddings;
        let agent = crate::resolver::agent(
            ureq::config::Config::builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(em.timeout_s))),
        );
        Embedder {
            agent,
            url: format!("{}/embeddings", em.base_url.trim_end_matches('/')),
            model: em.model.clone(),
            key: em.api_key_secret.as_ref().and_then(|n| secrets.get(n)).map(str::to_owned),
            dims: em.dimensions as usize,
        }
    }

    /// The model's name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The configured dimension.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Embeds `texts` in one request, in order.
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let mut req = self.agent.post(&self.url).header("Content-Type", "application/json");
        if let Some(k) = &self.key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let body = json!({"model": self.model, "input": texts, "encoding_format": "float"}).to_string();
        let mut resp = req.send(body.as_bytes()).map_err(|e| EmbedError::Unavailable(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(256 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| EmbedError::Unavailable(format!("reading the answer: {e}")))?;
        // 401/403/404 say the endpoint or its key is wrong, not an item:
        // kept and retried like an outage, never held against the items.
        if status == 429 || status >= 500 || matches!(status, 401 | 403 | 404) {
            return Err(EmbedError::Unavailable(format!("{status}: {}", choir_common::text::clipped(&text, 300))));
        }
        if status != 200 {
            return Err(EmbedError::Refused(format!("{status}: {}", choir_common::text::clipped(&text, 300))));
        }
        let v: Value =
            serde_json::from_str(&text).map_err(|e| EmbedError::Unavailable(format!("the answer is not JSON: {e}")))?;
        let mut out: Vec<(usize, Vec<f32>)> = Vec::with_capacity(texts.len());
        for d in v["data"].as_array().into_iter().flatten() {
            let index = d["index"].as_u64().unwrap_or(out.len() as u64) as usize;
            let vector: Vec<f32> =
                d["embedding"].as_array().into_iter().flatten().filter_map(Value::as_f64).map(|x| x as f32).collect();
            if vector.len() != self.dims {
                return Err(EmbedError::Dimensions { got: vector.len(), want: self.dims });
            }
            out.push((index, vector));
        }
        if out.len() != texts.len() {
            return Err(EmbedError::Unavailable(format!("{} embeddings for {} inputs", out.len(), texts.len())));
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out.into_iter().map(|(_, v)| v).collect())
    }
}
