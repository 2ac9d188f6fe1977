//! `memory`: long-term memory's embeddings endpoint and index tuning.

use super::*;

/// Agent memory (R-MEM): Postgres + pgvector, with embeddings from an
/// OpenAI-compatible endpoint. Without this section the memory tools are not
/// served (agents see them as available, not connected).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// The embeddings endpoint.
    pub embeddings: EmbeddingsConfig,
    /// Most texts per embeddings request.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// How long the batcher waits to fill a batch, in milliseconds.
    #[serde(default = "default_batch_ms")]
    pub batch_ms: u64,
    /// How long an upsert waits for its embeddings before answering
    /// "pending" (they are made later either way), in milliseconds.
    #[serde(default = "default_upsert_wait_ms")]
    pub upsert_wait_ms: u64,
    /// HNSW search breadth (`hnsw.ef_search`) for semantic queries.
    #[serde(default = "default_ef_search")]
    pub ef_search: u32,
    /// IVFFlat search breadth (`ivfflat.probes`: lists read) for semantic
    /// queries once an agent's memory is large enough for its IVFFlat index.
    #[serde(default = "default_probes")]
    pub probes: u32,
    /// Most items per agent whose vectors wait outside the vector index (found
    /// by an exact scan) for the `memory-index` thread to index them; beyond
    /// it new vectors go straight into the index. 0 indexes every vector as
    /// it is stored. Bounds what a burst of upserts adds to a query.
    #[serde(default = "default_fresh_max")]
    pub fresh_max: u32,
}

fn default_batch_size() -> usize {
    64
}
fn default_batch_ms() -> u64 {
    20
}
fn default_upsert_wait_ms() -> u64 {
    5000
}
fn default_ef_search() -> u32 {
    crate::store::memory::Breadth::DEFAULT.ef_search
}
fn default_probes() -> u32 {
    crate::store::memory::Breadth::DEFAULT.probes
}
fn default_fresh_max() -> u32 {
    DEFAULT_FRESH_MAX
}

/// `memory.fresh_max` when unset: an exact scan costs a query about 0.7-2 µs
/// per waiting vector (`bench-memory`), so a full set adds 1.5-4 ms to a
/// query that takes 4-8 ms through the index.
pub const DEFAULT_FRESH_MAX: u32 = 2_000;

/// An OpenAI-compatible `/v1/embeddings` endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// Base URL including the version; choird posts to `<base_url>/embeddings`.
    pub base_url: String,
    /// The embedding model.
    pub model: String,
    /// Name of the API key in `secrets.json` (none for keyless servers).
    #[serde(default)]
    pub api_key_secret: Option<String>,
    /// The model's output dimension; the `vector(N)` of every agent schema.
    /// Checked against the endpoint at start: a mismatch is an error.
    pub dimensions: u32,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_embed_timeout")]
    pub timeout_s: u64,
}

fn default_embed_timeout() -> u64 {
    30
}
