//! Agent memory (R-MEM-1..3, R-TOOL-5): the host side of `choir.memory.upsert`
//! and `choir.memory.query`, reached by agents through EXECUTE_HOST_TOOL.
//!
//! Each agent's items live in its own schema `agent_<id>` (made on its first
//! start by the per-agent migrations), in three tiers (working, session,
//! knowledge), deduplicated by sha256 within a tier, with a `vector(N)`
//! embedding under a vector index (cosine; HNSW while small, IVFFlat once
//! large: `lifecycle`). Queries: `semantic` (embed the
//! query, nearest neighbours, tier and metadata filters), `hash` (exact
//! content hash), `range` (commit sequence or time).
//!
//! **Invariant:** an agent reaches only its own schema: the schema comes
//! from the authenticated session, never from the request; inputs are
//! validated here against the same manifests the agent validated them with.
//! **Invariant:** an item is stored before its embedding exists; the
//! embedding outbox guarantees it gets one (the `memory-embed` thread), so an
//! embedding endpoint that is down delays semantic search but loses nothing.
//! A stored vector is searchable at once: fresh (exact scan) until the
//! `memory-index` thread has put it into the vector index.

pub mod batcher;
pub mod embeddings;
pub mod indexer;
pub mod lifecycle;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use crossbeam_channel::{bounded, Sender};
use parking_lot::Mutex;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use self::batcher::Progress;
use self::embeddings::{EmbedError, Embedder};
use self::lifecycle::Kind;
use crate::config::MemoryConfig;
use crate::error::Error;
use crate::host_tools::{HostCall, HostTool, Registry, RegistryError, ToolStatus};
use crate::http::Caller as Authed;
use crate::shared::Shared;
use crate::store::memory::{Breadth, NewItem, Range};
use crate::store::memory_index::BuildCancel;

/// What choird serves agents when memory is configured: the memory host
/// tools, the host half of `choir.memory.compact`, and the ranking behind
/// `choir.tools.find`.
pub const SERVED: &[&str] = &["choir.memory.query", "choir.memory.upsert", "choir.memory.compact", "choir.tools.find"];

/// One memory tool in the host-tool registry (the memory service serves
/// several names).
struct MemoryTool {
    memory: Arc<Memory>,
    name: &'static str,
}

impl HostTool for MemoryTool {
    fn name(&self) -> &str {
        self.name
    }

    fn manifest(&self) -> Option<choir_common::manifest::ToolManifest> {
        // compact and tools.find are the host halves of agent built-ins.
        choir_common::host_tools::manifests().into_iter().find(|m| m.llm.name == self.name)
    }

    fn status(
        &self,
        _config: &crate::config::Config,
        _secrets: &crate::secrets::Secrets,
        _agent: &AgentId,
    ) -> ToolStatus {
        // Registered only when memory is configured.
        ToolStatus::Connected
    }

    fn prepare(&self, agent: &AgentId) -> Result<(), Error> {
        self.memory.ensure(agent)
    }

    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        self.memory.execute(call)
    }
}

/// Registers the memory tools ([`SERVED`]) with the host-tool registry.
pub fn register(memory: &Arc<Memory>, registry: &mut Registry) -> Result<(), RegistryError> {
    for name in SERVED {
        registry.register(Arc::new(MemoryTool { memory: memory.clone(), name }))?;
    }
    Ok(())
}

/// Session items folded into one summary at most.
const FOLD_MAX: i64 = 200;
/// Tools ranked at most per `choir.tools.find`.
const RANK_MAX: usize = 1000;

/// Items returned by a query at most.
const MAX_K: i64 = 100;
/// Characters of an item's content shown to a model (the rest is elided).
const SHOWN: usize = 4000;

/// Cosine similarity.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// Whether `t` is an RFC 3339 date or time (`2026-11-22`, `2026-11-22T10:00:00Z`, …).
fn looks_like_time(t: &str) -> bool {
    let b = t.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let date = b.len() >= 10 && digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10);
    // `get`, not indexing: byte 10 of a hostile string may fall inside a character.
    let rest = t.get(10..).unwrap_or("");
    date && (rest.is_empty()
        || (rest.len() >= 6
            && matches!(rest.as_bytes()[0], b'T' | b't' | b' ')
            && rest
                .get(1..)
                .unwrap_or("")
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, ':' | '.' | 'Z' | 'z' | '+' | '-'))))
}

/// The memory service.
pub struct Memory {
    shared: Arc<Shared>,
    cfg: MemoryConfig,
    embedder: Arc<Embedder>,
    progress: Arc<Progress>,
    poke: Sender<()>,
    index_poke: Sender<()>,
    /// Cancels the index build running now, at stop.
    build_cancel: Arc<BuildCancel>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Agents whose schema is known to be migrated (by this process).
    ready: Arc<Mutex<HashSet<AgentId>>>,
    /// Items per agent (counted once, then kept up to date), for the quota.
    counts: Mutex<std::collections::HashMap<AgentId, u64>>,
}

fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl Memory {
    /// After a HEARTBEAT's events are stored: records, on the items each
    /// `choir.memory.upsert` that succeeded stored, the commit sequence of
    /// that call (known only once its event replicates), so an item names
    /// the call that made it. Memory's own hook on replication: the
    /// generic path knows nothing of it.
    pub fn note_sources(&self, agent: &AgentId, events: &[choir_common::commit::CommitEvent]) {
        let stored =
            events.iter().filter(|e| e.tool == "choir.memory.upsert" && e.outcome == choir_common::commit::Outcome::Ok);
        for e in stored {
            if let Some(call) = &e.call_id {
                if let Err(err) = self.shared.store.memory_set_commit_seq(agent, call, e.seq as i64) {
                    log::warn!("memory: commit sequence of {call} not recorded: {err}");
                }
            }
        }
    }

    /// Starts memory when configured: checks the embedding dimension against
    /// the endpoint (a mismatch is an error; an endpoint that does not answer
    /// is only a warning, since items are queued until it does) and starts the
    /// batcher.
    pub fn start(d: &Arc<Shared>) -> anyhow::Result<Option<Arc<Memory>>> {
        let Some(cfg) = d.config().memory.clone() else { return Ok(None) };
        let embedder = Arc::new(Embedder::new(&cfg, &d.secrets()));
        match embedder.embed(&["choir: checking the embedding dimension".to_owned()]) {
            Ok(_) => log::info!(
                "memory: {}-dimensional embeddings from {} ({})",
                embedder.dims(),
                cfg.embeddings.base_url,
                embedder.model()
            ),
            Err(e @ EmbedError::Dimensions { .. }) => anyhow::bail!("memory.embeddings: {e}"),
            Err(e) => log::warn!(
                "memory: {e}; the dimension will be checked on first use, and items are queued for embedding until \
                 the endpoint answers"
            ),
        }
        // Bounded(1): one pending poke means "look at the outbox" (or "look
        // for fresh vectors").
        let (poke, poked) = bounded::<()>(1);
        let (index_poke, index_poked) = bounded::<()>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        // Agents whose schema is up to date, as `ensure` and the batcher
        // (for queued embeddings) found them: each migrates an agent once.
        let ready = Arc::new(Mutex::new(HashSet::new()));
        let embed = {
            let (d, embedder, cfg, progress, stop, ready) =
                (d.clone(), embedder.clone(), cfg.clone(), progress.clone(), stop.clone(), ready.clone());
            let pokes = batcher::Pokes { outbox: poked, index: index_poke.clone() };
            std::thread::Builder::new()
                .name("memory-embed".into())
                .spawn(move || batcher::run(&d.store, &embedder, &cfg, &progress, &pokes, &ready, &stop))?
        };
        let build_cancel = Arc::new(BuildCancel::default());
        let index = {
            let (d, stop, cancel) = (d.clone(), stop.clone(), build_cancel.clone());
            std::thread::Builder::new()
                .name("memory-index".into())
                .spawn(move || indexer::run(&d.store, &index_poked, &cancel, &stop))
        };
        let index = match index {
            Ok(t) => t,
            Err(e) => {
                // Not left running without a way to stop it.
                stop.store(true, Ordering::SeqCst);
                let _ = poke.try_send(());
                let _ = embed.join();
                return Err(e.into());
            }
        };
        let _ = poke.try_send(());
        Ok(Some(Arc::new(Memory {
            shared: d.clone(),
            cfg,
            embedder,
            progress,
            poke,
            index_poke,
            build_cancel,
            stop,
            threads: Mutex::new(vec![embed, index]),
            ready,
            counts: Mutex::new(std::collections::HashMap::new()),
        })))
    }

    /// The agent's items (all tiers), counted once and kept up to date.
    pub fn count(&self, agent: &AgentId) -> Result<u64, Error> {
        if let Some(n) = self.counts.lock().get(agent) {
            return Ok(*n);
        }
        let n = self.shared.store.memory_count(agent)?;
        self.counts.lock().insert(agent.clone(), n);
        Ok(n)
    }

    /// How wide semantic queries search, as configured.
    fn breadth(&self) -> Breadth {
        Breadth { ef_search: self.cfg.ef_search, probes: self.cfg.probes }
    }

    /// Stops the batcher and the indexer (what the one has not embedded
    /// stays in the outbox, what the other has not indexed stays fresh).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.poke.try_send(());
        let _ = self.index_poke.try_send(());
        self.build_cancel.cancel();
        for t in std::mem::take(&mut *self.threads.lock()) {
            let _ = t.join();
        }
    }

    /// Makes (or checks) `agent`'s schema.
    pub fn ensure(&self, agent: &AgentId) -> Result<(), Error> {
        if self.ready.lock().contains(agent) {
            return Ok(());
        }
        for name in self.shared.store.db.migrate_agent(agent, self.cfg.embeddings.dimensions)? {
            log::info!("memory: applied {name}");
        }
        self.ready.lock().insert(agent.clone());
        Ok(())
    }

    /// Runs one memory host tool call for the authenticated agent.
    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        let agent = &call.caller.agent;
        match call.tool {
            "choir.memory.compact" => {
                self.ensure(agent)?;
                self.fold(call.caller, call.lane, call.call_id)
            }
            "choir.tools.find" => self.rank_tools(call.input),
            "choir.memory.upsert" => {
                self.ensure(agent)?;
                self.upsert(agent, call.input, call.lane, call.call_id)
            }
            "choir.memory.query" => {
                self.ensure(agent)?;
                self.query(agent, call.input)
            }
            other => Err(Error::NotFound(format!("{other} is not a memory tool"))),
        }
    }

    fn upsert(&self, agent: &AgentId, input: &Value, lane: &str, call_id: Option<&str>) -> Result<Value, Error> {
        let one = input.get("content").is_some();
        let many = input.get("items").is_some();
        let raw: Vec<Value> = match (one, many) {
            (true, false) => vec![input.clone()],
            (false, true) => input["items"].as_array().cloned().unwrap_or_default(),
            _ => {
                return Err(Error::Malformed(
                    "give either content (with tier) or items (a list of {tier, content, metadata})".into(),
                ))
            }
        };
        let quotas = self.shared.config().agents.get(agent).map(|a| a.quotas).unwrap_or_default();
        let mut items = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let Some(tier) = r["tier"].as_str() else {
                return Err(Error::Malformed(format!("item {i}: tier is required (working, session or knowledge)")));
            };
            let content = r["content"].as_str().unwrap_or_default().to_owned();
            if content.len() as u64 > quotas.memory_item_bytes {
                return Err(Error::TooLarge(format!(
                    "item {i} is {} bytes; a memory item may be at most {} bytes (quotas.memory_item_bytes): store \
                     a summary, or split it",
                    content.len(),
                    quotas.memory_item_bytes
                )));
            }
            let metadata = r.get("metadata").cloned().unwrap_or_else(|| json!({}));
            items.push(NewItem { tier: tier.to_owned(), sha256: sha256(&content), content, metadata });
        }
        let held = self.count(agent)?;
        if held + items.len() as u64 > quotas.memory_items {
            return Err(Error::Invalid(format!(
                "memory holds {held} item(s); {} more would pass the quota of {} (quotas.memory_items): fold or \
                 drop items first",
                items.len(),
                quotas.memory_items
            )));
        }
        let seen = self.progress.count();
        let stored = self.shared.store.memory_upsert(agent, &items, lane, call_id)?;
        let new: Vec<i64> = stored.iter().filter(|s| s.inserted).map(|s| s.id).collect();
        if let Some(n) = self.counts.lock().get_mut(agent) {
            *n += new.len() as u64;
        }
        let mut pending = new.len() as i64;
        if pending > 0 {
            let _ = self.poke.try_send(());
            // Wait (a little) so a query right after finds the new items by meaning.
            let deadline = Instant::now() + Duration::from_millis(self.cfg.upsert_wait_ms);
            let mut last = seen;
            while pending > 0 && Instant::now() < deadline {
                self.progress.wait_after(last, deadline.saturating_duration_since(Instant::now()));
                last = self.progress.count();
                pending = self.shared.store.outbox_pending(agent, &new)?;
            }
        }
        let inserted = new.len();
        let updated = stored.len() - inserted;
        let embedding = if pending == 0 { "done" } else { "pending" };
        Ok(json!({
            "summary": format!(
                "stored {} item(s): {inserted} new, {updated} already known (metadata merged); embeddings {embedding}",
                stored.len()
            ),
            "items": stored.iter().map(|s| json!({"id": s.id, "tier": s.tier, "sha256": s.sha256,
                                                   "status": if s.inserted { "inserted" } else { "updated" }})).collect::<Vec<_>>(),
            "embedding": embedding,
        }))
    }

    fn query(&self, agent: &AgentId, input: &Value) -> Result<Value, Error> {
        let s = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
        let tier = s("tier");
        let metadata = input.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let mode = s("mode").unwrap_or_default();
        let (items, scores): (Vec<_>, Vec<Option<f64>>) = match mode.as_str() {
            "semantic" => {
                let Some(q) = s("query") else {
                    return Err(Error::Malformed("mode semantic needs a query".into()));
                };
                let k = input["k"].as_i64().unwrap_or(5).clamp(1, MAX_K);
                let v = self.embed_one(&q)?;
                self.shared
                    .store
                    .memory_semantic(agent, v, tier.as_deref(), &metadata, k, self.breadth())?
                    .into_iter()
                    .map(|(i, score)| (i, Some(score)))
                    .unzip()
            }
            "hash" => {
                let Some(h) = s("hash") else { return Err(Error::Malformed("mode hash needs a hash".into())) };
                self.shared.store.memory_by_hash(agent, &h, tier.as_deref())?.into_iter().map(|i| (i, None)).unzip()
            }
            "range" => {
                let range = Range {
                    tier: tier.clone(),
                    from_seq: input["from_seq"].as_i64(),
                    to_seq: input["to_seq"].as_i64(),
                    since: s("since"),
                    until: s("until"),
                    metadata,
                };
                for (name, t) in [("since", &range.since), ("until", &range.until)] {
                    if t.as_ref().is_some_and(|t| !looks_like_time(t)) {
                        return Err(Error::Malformed(format!("{name} must be an RFC 3339 time")));
                    }
                }
                let k = input["k"].as_i64().unwrap_or(20).clamp(1, MAX_K);
                self.shared.store.memory_range(agent, &range, k)?.into_iter().map(|i| (i, None)).unzip()
            }
            other => return Err(Error::Malformed(format!("no mode {other:?}; use semantic, hash or range"))),
        };
        let shown: Vec<Value> = items
            .iter()
            .zip(&scores)
            .map(|(i, score)| {
                let mut v = i.to_json();
                if i.content.chars().count() > SHOWN {
                    v["content"] = json!(format!("{}…", i.content.chars().take(SHOWN).collect::<String>()));
                    v["truncated"] = json!(true);
                }
                if let Some(sc) = score {
                    v["score"] = json!((sc * 10_000.0).round() / 10_000.0);
                }
                v
            })
            .collect();
        Ok(json!({"summary": format!("{} item(s) found ({mode})", shown.len()), "items": shown}))
    }

    /// Folds the agent's session items (oldest first, at most [`FOLD_MAX`])
    /// into one knowledge item: a summary written by the agent's core model.
    fn fold(&self, who: &Authed, lane: &str, call_id: Option<&str>) -> Result<Value, Error> {
        let agent = &who.agent;
        let range = Range { tier: Some("session".into()), metadata: json!({}), ..Range::default() };
        let items = self.shared.store.memory_range(agent, &range, FOLD_MAX)?;
        if items.is_empty() {
            return Ok(json!({"summary": "no session items to fold", "folded": 0}));
        }
        let notes: String = items.iter().enumerate().map(|(i, it)| format!("{}. {}\n", i + 1, it.content)).collect();
        let messages = json!([
            {"role": "system", "content": "You fold an agent's session notes into durable knowledge. Write one concise \
              summary that keeps every fact, decision, preference and open question in the notes; no preamble."},
            {"role": "user", "content": format!("Session notes, oldest first:\n{notes}")}
        ]);
        let text = crate::api::relay::complete_for(&self.shared, who, crate::config::Lane::Core, messages)?;
        let ids: Vec<i64> = items.iter().map(|i| i.id).collect();
        let summary = NewItem {
            tier: "knowledge".into(),
            sha256: sha256(&text),
            metadata: json!({"kind": "summary", "folded": ids.len(),
                             "from": items.first().map(|i| i.created_at.clone()),
                             "to": items.last().map(|i| i.created_at.clone())}),
            content: text,
        };
        let id = self.shared.store.memory_fold(agent, &ids, &summary, lane, call_id)?;
        self.counts.lock().remove(agent);
        let _ = self.poke.try_send(());
        Ok(json!({"summary": format!("folded {} session item(s) into knowledge item {id}", ids.len()),
                  "folded": ids.len(), "item_id": id}))
    }

    /// Ranks tools (`{query, k, tools: [{name, description}]}`) by the
    /// similarity of their descriptions to the query. Each description is
    /// embedded once per model (cached by its hash).
    fn rank_tools(&self, input: &Value) -> Result<Value, Error> {
        let query = input["query"].as_str().filter(|q| !q.trim().is_empty());
        let Some(query) = query else { return Err(Error::Malformed("query is required".into())) };
        let k = input["k"].as_u64().unwrap_or(5).clamp(1, 50) as usize;
        let tools: Vec<(String, String)> = input["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["name"].as_str()?.to_owned(), t["description"].as_str()?.to_owned())))
            .take(RANK_MAX)
            .collect();
        let texts: Vec<String> = tools.iter().map(|(n, desc)| format!("{n}: {desc}")).collect();
        let shas: Vec<String> = texts.iter().map(|t| sha256(t)).collect();
        let model = self.embedder.model().to_owned();
        let mut known: std::collections::HashMap<String, Vec<f32>> =
            self.shared.store.tool_embeddings(&shas, &model)?.into_iter().collect();
        let missing: Vec<(String, String)> = shas
            .iter()
            .zip(&texts)
            .filter(|(s, _)| !known.contains_key(*s))
            .map(|(s, t)| (s.clone(), t.clone()))
            .collect();
        for chunk in missing.chunks(self.cfg.batch_size.max(1)) {
            let texts: Vec<String> = chunk.iter().map(|(_, t)| t.clone()).collect();
            let vectors = self
                .embedder
                .embed(&texts)
                .map_err(|e| Error::Unavailable(format!("tool ranking is unavailable right now ({e})")))?;
            let rows: Vec<(String, Vec<f32>)> = chunk.iter().map(|(s, _)| s.clone()).zip(vectors).collect();
            self.shared.store.put_tool_embeddings(&rows, &model)?;
            known.extend(rows);
        }
        let q = self.embed_one(query)?;
        let mut ranked: Vec<(String, f64)> = tools
            .iter()
            .zip(&shas)
            .filter_map(|((name, _), sha)| Some((name.clone(), cosine(&q, known.get(sha)?))))
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(k);
        Ok(json!({"ranked": ranked.iter().map(|(n, s)| json!({"name": n, "score": s})).collect::<Vec<_>>()}))
    }

    /// Embeds one text now (for a query), retrying a transient failure once.
    pub fn embed_one(&self, text: &str) -> Result<Vec<f32>, Error> {
        let texts = [text.to_owned()];
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.embedder.embed(&texts) {
                Ok(mut v) => return v.pop().ok_or_else(|| Error::Internal("no embedding returned".into())),
                Err(e) if e.retryable() && attempt < 2 => std::thread::sleep(Duration::from_millis(300)),
                Err(e) => {
                    return Err(Error::Unavailable(format!(
                        "semantic search is unavailable right now ({e}); hash and range queries still work"
                    )))
                }
            }
        }
    }

    /// `choirctl memory stats ID`.
    pub fn stats(&self, agent: &AgentId) -> Result<Value, Error> {
        self.ensure(agent)?;
        let st = self.shared.store.memory_stats(agent)?;
        let (kind, lists) = match self.shared.store.memory_index_shape(agent)?.kind {
            Kind::None => ("none".to_owned(), None),
            Kind::IvfFlat(lists) => ("ivfflat".to_owned(), Some(lists)),
            Kind::Other(am) => (am, None),
        };
        let tiers: serde_json::Map<String, Value> = st.tiers.iter().map(|(t, n)| (t.clone(), json!(n))).collect();
        Ok(json!({"agent": agent, "schema": format!("agent_{agent}"), "tiers": tiers,
                  "items": st.tiers.iter().map(|(_, n)| n).sum::<i64>(), "pending_embeddings": st.pending,
                  "failed_embeddings": st.failed, "fresh_embeddings": st.fresh,
                  "index": {"kind": kind, "lists": lists},
                  "index_bytes": st.index_bytes, "total_bytes": st.total_bytes,
                  "dimensions": self.cfg.embeddings.dimensions, "model": self.embedder.model()}))
    }

    /// `choirctl memory search ID TEXT`: a semantic query, for debugging.
    pub fn search(&self, agent: &AgentId, text: &str, k: i64) -> Result<Value, Error> {
        self.ensure(agent)?;
        let input = json!({"mode": "semantic", "query": text, "k": k.clamp(1, MAX_K)});
        self.query(agent, &input)
    }

    /// A page of `choirctl memory export ID` (items with `id > after`).
    pub fn export(&self, agent: &AgentId, after: i64, limit: i64) -> Result<Vec<Value>, Error> {
        self.ensure(agent)?;
        Ok(self.shared.store.memory_export(agent, after, limit)?)
    }

    /// The embedder (tool discovery shares it).
    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_a_multibyte_since_does_not_panic() {
        // Byte 10 falls inside "é": slicing there used to panic the worker.
        assert!(!looks_like_time("aaaaaaaaaé"));
        assert!(!looks_like_time("2026-11-22é"));
        assert!(!looks_like_time("2026-11-22Té"));
        assert!(looks_like_time("2026-11-22"));
        assert!(looks_like_time("2026-11-22T10:00:00Z"));
    }
}
