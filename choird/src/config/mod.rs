//! `config.json`: choird's static configuration, the source of truth for which
//! agents exist and where every external endpoint is. Parsed strictly (unknown
//! fields are errors) and validated before anything starts; every error names
//! the offending field by its dotted path.
//!
//! The top-level `Config`, loading and the cross-section checks are here;
//! each section's types and defaults are in a file named for it: [`agent`],
//! [`llm`], [`docker`], [`telegram`], [`memory`], [`operations`] (approvals,
//! logs), [`web`], [`speech`], [`accounts`] (mail, Notion).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use choir_common::ids::AgentId;
use serde::{Deserialize, Serialize};

use crate::home::Home;
use crate::secrets::Secrets;

mod accounts;
mod agent;
pub mod diff;
mod docker;
pub mod edit;
mod llm;
mod memory;
mod operations;
pub mod problems;
mod speech;
mod telegram;
mod web;
pub use accounts::{EmailConfig, MailServer, NotionConfig, Security};
pub use agent::{AgentConfig, ModelOverrides, NetworkMode, Quotas, Resources, TokenBudget, ToolExposure, Transport};
pub use docker::DockerConfig;
pub use llm::{LlmConfig, LlmEndpoint, Preset, Price, Protocol};
pub use memory::{EmbeddingsConfig, MemoryConfig, DEFAULT_FRESH_MAX};
pub use operations::{ApprovalsConfig, LogsConfig};
pub use speech::{valid_voice, AgentVoice, TranscriptionConfig};
pub use telegram::{BotConfig, BotGroup, BotUser, TelegramConfig};
pub use web::{AgentWeb, BraveConfig, BrowserConfig, PostSecret, WebConfig};

/// How agents are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A hardened Docker container per agent.
    Docker,
    /// A plain child process: unsandboxed, for development.
    Process,
}

impl RuntimeKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Docker => "docker",
            RuntimeKind::Process => "process",
        }
    }
}

/// The whole `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How agents run.
    #[serde(default = "default_runtime")]
    pub runtime: RuntimeKind,
    /// External Postgres (`postgres://...` or key=value); none = managed cluster.
    #[serde(default)]
    pub database_url: Option<String>,
    /// Directory with `initdb`, `pg_ctl` (managed cluster); default: newest
    /// `/usr/lib/postgresql/*/bin`.
    #[serde(default)]
    pub postgres_bin_dir: Option<PathBuf>,
    /// Also serve the agent RPC on TCP at this address (loopback unless
    /// `http_allow_non_loopback`).
    #[serde(default)]
    pub http_listen: Option<String>,
    /// Allow `http_listen` on a non-loopback address.
    #[serde(default)]
    pub http_allow_non_loopback: bool,
    /// A system group whose members may use the admin socket (mode 0660 in
    /// a 0710 directory of that group); none: choird's user alone.
    #[serde(default)]
    pub admin_group: Option<String>,
    /// Serve Prometheus metrics (`GET /metrics`) at this address (loopback
    /// unless `metrics_allow_non_loopback`).
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Allow `metrics_listen` on a non-loopback address.
    #[serde(default)]
    pub metrics_allow_non_loopback: bool,
    /// A loopback address the operator's console listens on from choird's
    /// start (`127.0.0.1:PORT`; never another address). Without it the
    /// console listens only once `choirctl console` opens it, on a socket.
    #[serde(default)]
    pub console_listen: Option<String>,
    /// The `choir-agent` binary for the process runtime; default: next to choird,
    /// then `PATH`.
    #[serde(default)]
    pub agent_binary: Option<PathBuf>,
    /// The docker runtime's settings.
    #[serde(default)]
    pub docker: DockerConfig,
    /// LLM endpoints.
    pub llm: LlmConfig,
    /// Agents by id.
    #[serde(default)]
    pub agents: BTreeMap<AgentId, AgentConfig>,
    /// The Telegram gateway (no bots: off).
    #[serde(default)]
    pub telegram: TelegramConfig,
    /// Agent memory (none: memory tools are not served).
    #[serde(default)]
    pub memory: Option<MemoryConfig>,
    /// The web tools' services (search, browser).
    #[serde(default)]
    pub web: WebConfig,
    /// Log rotation and retention.
    #[serde(default)]
    pub logs: LogsConfig,
    /// What follows an approval.
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    /// Tokens all agents together may spend (per UTC day, in total), next
    /// to each agent's own `token_budget`.
    #[serde(default)]
    pub token_budget: TokenBudget,
}

fn default_runtime() -> RuntimeKind {
    RuntimeKind::Docker
}

/// A configuration's problems (every one found, up to
/// [`problems::MAX_PROBLEMS`]), naming the file and each field.
#[derive(Debug)]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// Dotted path of the first problem's field.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
    /// The other problems found, (field, reason) each.
    pub more: Vec<problems::Problem>,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.field, self.reason)?;
        for (field, reason) in &self.more {
            write!(f, "\n{}: {field}: {reason}", self.file)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads, parses and validates `config.json`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let what = |reason: String| ConfigError { file: file.clone(), field: "the file".into(), reason, more: vec![] };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
                return Err(what("is a directory, not a file".into()))
            }
            Err(e) => return Err(what(format!("cannot be read: {e}"))),
        };
        Config::parse_all(&text).map_err(|mut all| {
            let (field, reason) = all.remove(0);
            ConfigError { file, field, reason, more: all }
        })
    }

    /// Parses and validates a document; the error is the first problem's
    /// (field, reason).
    pub fn parse(text: &str) -> Result<Config, (String, String)> {
        Config::parse_all(text).map_err(|mut all| all.remove(0))
    }

    /// Parses and validates a document; the error names every problem
    /// found (see [`problems`]).
    pub fn parse_all(text: &str) -> Result<Config, Vec<problems::Problem>> {
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| vec![("the file".to_owned(), format!("is not valid JSON: {e}"))])?;
        let config: Config = problems::read(doc)?;
        config.validate().map_err(|p| vec![p])?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let e = |field: &str, reason: &str| Err((field.to_owned(), reason.to_owned()));
        for (lane, first) in [("edge", &self.llm.edge), ("core", &self.llm.core)] {
            if first.fallbacks.len() > llm::MAX_FALLBACKS {
                return e(
                    &format!("llm.{lane}.fallbacks"),
                    &format!("may name at most {} endpoints", llm::MAX_FALLBACKS),
                );
            }
            let chain = std::iter::once((format!("llm.{lane}"), first))
                .chain(first.fallbacks.iter().enumerate().map(|(i, f)| (format!("llm.{lane}.fallbacks[{i}]"), f)));
            for (at, ep) in chain {
                let lane = at.as_str();
                if !std::ptr::eq(ep, first) && !ep.fallbacks.is_empty() {
                    return e(&format!("{lane}.fallbacks"), "a fallback has no fallbacks of its own");
                }
                if !(ep.base_url.starts_with("http://") || ep.base_url.starts_with("https://")) {
                    return e(&format!("{lane}.base_url"), "must start with http:// or https://");
                }
                if ep.model.trim().is_empty() {
                    return e(&format!("{lane}.model"), "must not be empty");
                }
                if ep.timeout_s == 0 || ep.timeout_s > llm::MAX_SILENCE_S {
                    return e(&format!("{lane}.timeout_s"), &format!("must be between 1 and {}", llm::MAX_SILENCE_S));
                }
                if let Some(b) = ep.thinking_budget_tokens {
                    if ep.protocol != Protocol::Anthropic || b < 1024 {
                        return e(
                            &format!("{lane}.thinking_budget_tokens"),
                            "is for an endpoint with \"protocol\": \"anthropic\" and must be at least 1024",
                        );
                    }
                }
                if ep.answer_timeout_s() < ep.timeout_s || ep.answer_timeout_s() > llm::MAX_ANSWER_S {
                    return e(
                        &format!("{lane}.answer_timeout_s"),
                        &format!("must be between timeout_s ({}) and {}", ep.timeout_s, llm::MAX_ANSWER_S),
                    );
                }
            }
        }
        if let Some(listen) = &self.http_listen {
            match listen.parse::<SocketAddr>() {
                Err(_) => return e("http_listen", "must be an address like 127.0.0.1:9400"),
                Ok(addr) if !addr.ip().is_loopback() && !self.http_allow_non_loopback => {
                    return e(
                        "http_listen",
                        "is not a loopback address; set http_allow_non_loopback to true if you really mean it",
                    )
                }
                Ok(_) => {}
            }
        }
        if let Some(listen) = &self.console_listen {
            match listen.parse::<SocketAddr>() {
                Ok(addr) if addr.ip().is_loopback() => {}
                _ => {
                    return e(
                        "console_listen",
                        "must be a loopback address like 127.0.0.1:8765 (from elsewhere, forward it over SSH)",
                    )
                }
            }
        }
        if let Some(listen) = &self.metrics_listen {
            match listen.parse::<SocketAddr>() {
                Err(_) => return e("metrics_listen", "must be an address like 127.0.0.1:9464"),
                Ok(addr) if !addr.ip().is_loopback() && !self.metrics_allow_non_loopback => {
                    return e(
                        "metrics_listen",
                        "is not a loopback address; set metrics_allow_non_loopback to true if you really mean it",
                    )
                }
                Ok(_) => {}
            }
        }
        for (model, p) in &self.llm.prices {
            let ok = |v: f64| v.is_finite() && (0.0..=10_000.0).contains(&v);
            if !ok(p.prompt_per_mtok) || !ok(p.completion_per_mtok) {
                return e(&format!("llm.prices.{model}"), "prices must be dollars per million tokens, 0 to 10000");
            }
        }
        let logs = &self.logs;
        if !logs.max_file_mb.is_finite() || logs.max_file_mb < 0.01 {
            return e("logs.max_file_mb", "must be at least 0.01 (10 KB)");
        }
        if !logs.max_total_mb.is_finite() || logs.max_total_mb < 4.0 * logs.max_file_mb {
            return e("logs.max_total_mb", "must be at least four times logs.max_file_mb");
        }
        if logs.max_age_days == 0 {
            return e("logs.max_age_days", "must be at least 1");
        }
        for (id, agent) in &self.agents {
            if let Err(why) = agent.tools.check() {
                return Err((format!("agents.{id}.tools"), why));
            }
            if let Err((field, why)) = agent.quotas.check_workspace() {
                return Err((format!("agents.{id}.quotas.{field}"), why));
            }
            if agent.transport == Transport::Http {
                if self.http_listen.is_none() {
                    return e(&format!("agents.{id}.transport"), "is http, but http_listen is not set");
                }
                if self.runtime == RuntimeKind::Docker {
                    return e(
                        &format!("agents.{id}.transport"),
                        "is http, but a container reaches choird only through its own socket; use unix",
                    );
                }
            }
        }
        if self.agents.keys().any(|a| a.as_str() == crate::logs::CHOIRD) {
            return e("agents.choird", "is reserved: it is the name of choird's own log");
        }
        let prefix = &self.docker.image_prefix;
        if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
            return e("docker.image_prefix", "must be lowercase letters, digits and '-'");
        }
        if self.docker.tmp_mb < 8 {
            return e("docker.tmp_mb", "must be at least 8");
        }
        if self.database_url.as_deref().is_some_and(|u| u.trim().is_empty()) {
            return e("database_url", "must not be empty (remove it to use the managed cluster)");
        }
        for (id, agent) in &self.agents {
            let at = |f: &str| format!("agents.{id}.{f}");
            if let Some(ws) = &agent.workspace {
                if !ws.is_absolute() {
                    return e(&at("workspace"), "must be an absolute path");
                }
            }
            if agent.max_steps_per_turn == 0 || agent.max_steps_per_turn > 256 {
                return e(&at("max_steps_per_turn"), "must be between 1 and 256");
            }
            if agent.retry_budget > 16 {
                return e(&at("retry_budget"), "must be at most 16");
            }
            if agent.context_tokens < 1000 {
                return e(&at("context_tokens"), "must be at least 1000");
            }
            if agent.max_core_jobs > 64 {
                return e(&at("max_core_jobs"), "must be at most 64");
            }
            let b = &agent.core_budget;
            if b.steps == 0 || b.tokens == 0 || b.wall_s == 0 {
                return e(&at("core_budget"), "steps, tokens and wall_s must all be above 0");
            }
            let r = &agent.resources;
            if r.memory_mb < 64 {
                return e(&at("resources.memory_mb"), "must be at least 64");
            }
            if !(r.cpus > 0.0 && r.cpus <= 1024.0) {
                return e(&at("resources.cpus"), "must be greater than 0");
            }
            if r.pids < 16 {
                return e(&at("resources.pids"), "must be at least 16");
            }
            for (i, s) in agent.secrets.iter().enumerate() {
                if s.is_empty() {
                    return e(&at(&format!("secrets[{i}]")), "must not be empty");
                }
            }
            if let Some(w) = &agent.web {
                web::validate_agent(&at("web"), w, &agent.secrets)?;
            }
            if let Some(v) = &agent.voice {
                speech::validate_voice(&at("voice"), v)?;
            }
            accounts::validate(&format!("agents.{id}"), agent.notion.as_ref(), agent.email.as_ref(), &agent.secrets)?;
        }
        web::validate(&self.web)?;
        if let Some(m) = &self.memory {
            let em = &m.embeddings;
            if !(em.base_url.starts_with("http://") || em.base_url.starts_with("https://")) {
                return e("memory.embeddings.base_url", "must start with http:// or https://");
            }
            if em.model.trim().is_empty() {
                return e("memory.embeddings.model", "must not be empty");
            }
            if em.dimensions == 0 || em.dimensions > 2000 {
                return e("memory.embeddings.dimensions", "must be between 1 and 2000 (pgvector's HNSW limit)");
            }
            if m.batch_size == 0 || m.batch_size > 2048 {
                return e("memory.batch_size", "must be between 1 and 2048");
            }
            if m.ef_search == 0 || m.ef_search > 1000 {
                return e("memory.ef_search", "must be between 1 and 1000");
            }
            if m.probes == 0 || m.probes > 1000 {
                return e("memory.probes", "must be between 1 and 1000");
            }
            if m.fresh_max > 100_000 {
                return e("memory.fresh_max", "must be at most 100000 (each query scans that many vectors exactly)");
            }
        }
        self.validate_telegram()
    }

    fn validate_telegram(&self) -> Result<(), (String, String)> {
        let e = |field: &str, reason: &str| Err((field.to_owned(), reason.to_owned()));
        let t = &self.telegram;
        if let Some(tr) = &t.transcription {
            speech::validate_transcription(tr)?;
        }
        if !(t.api_base.starts_with("http://") || t.api_base.starts_with("https://")) {
            return e("telegram.api_base", "must start with http:// or https://");
        }
        if t.poll_timeout_s == 0 || t.poll_timeout_s > 50 {
            return e("telegram.poll_timeout_s", "must be between 1 and 50");
        }
        if t.per_bot_per_s == 0 {
            return e("telegram.per_bot_per_s", "must be at least 1");
        }
        if t.max_file_mb == 0 || t.max_file_mb > 2000 {
            return e("telegram.max_file_mb", "must be between 1 and 2000");
        }
        for (name, bot) in &t.bots {
            let at = |f: &str| format!("telegram.bots.{name}.{f}");
            if AgentId::parse(name).is_err() {
                return e(
                    &format!("telegram.bots.{name}"),
                    "bot names use 1-32 characters: a lowercase letter, then lowercase letters, digits or '_'",
                );
            }
            if bot.token_secret.is_empty() {
                return e(&at("token_secret"), "must name a secret in secrets.json");
            }
            for (user, u) in &bot.users {
                if user.parse::<i64>().map_or(true, |id| id <= 0) {
                    return e(&at(&format!("users.{user}")), "must be a Telegram user id (a positive number)");
                }
                if !self.agents.contains_key(&u.agent) {
                    return e(&at(&format!("users.{user}.agent")), &format!("no agent {} in agents", u.agent));
                }
            }
            if let Some(agent) = &bot.pairing {
                if !self.agents.contains_key(agent) {
                    return e(&at("pairing"), &format!("no agent {agent} in agents"));
                }
            }
            for (group, g) in &bot.groups {
                if group.parse::<i64>().map_or(true, |id| id >= 0) {
                    return e(&at(&format!("groups.{group}")), "must be a Telegram group chat id (a negative number)");
                }
                if !self.agents.contains_key(&g.agent) {
                    return e(&at(&format!("groups.{group}.agent")), &format!("no agent {} in agents", g.agent));
                }
            }
        }
        Ok(())
    }

    /// Cross-checks against `secrets.json`: names referenced but missing are
    /// reported as warnings (a secret can be added later; the tool or lane that
    /// needs it reports the gap when used).
    pub fn missing_secrets(&self, secrets: &Secrets) -> Vec<String> {
        let mut out = Vec::new();
        for (lane, ep) in [("edge", &self.llm.edge), ("core", &self.llm.core)] {
            if let Some(name) = &ep.api_key_secret {
                if !secrets.contains(name) {
                    out.push(format!("llm.{lane}.api_key_secret: secret {name:?} is not in secrets.json; set it with `choirctl secrets set {name}`"));
                }
            }
        }
        for (id, agent) in &self.agents {
            for (i, name) in agent.secrets.iter().enumerate() {
                if !secrets.contains(name) {
                    out.push(format!("agents.{id}.secrets[{i}]: secret {name:?} is not in secrets.json; set it with `choirctl secrets set {name}`"));
                }
            }
        }
        if let Some(name) = self.memory.as_ref().and_then(|m| m.embeddings.api_key_secret.as_ref()) {
            if !secrets.contains(name) {
                out.push(format!("memory.embeddings.api_key_secret: secret {name:?} is not in secrets.json; set it with `choirctl secrets set {name}`"));
            }
        }
        for (name, bot) in &self.telegram.bots {
            if !secrets.contains(&bot.token_secret) {
                out.push(format!(
                    "telegram.bots.{name}.token_secret: secret {:?} is not in secrets.json; the bot stays off until `choirctl \
                     secrets set {}`",
                    bot.token_secret, bot.token_secret
                ));
            }
        }
        out
    }

    /// Whether `agent` may send to `chat` through Telegram bot `bot`: the
    /// chat is a private chat of a user bound to this agent on that bot, or
    /// a group the bot routes to this agent.
    pub fn serves_chat(&self, bot: &str, chat: i64, agent: &AgentId) -> bool {
        let Some(b) = self.telegram.bots.get(bot) else { return false };
        let key = chat.to_string();
        b.users.get(&key).is_some_and(|u| &u.agent == agent) || b.groups.get(&key).is_some_and(|g| &g.agent == agent)
    }

    /// The workspace directory of an agent.
    pub fn workspace(&self, home: &Home, id: &AgentId) -> PathBuf {
        self.agents.get(id).and_then(|a| a.workspace.clone()).unwrap_or_else(|| home.default_workspace(id))
    }

    /// The model for an agent's lane, with overrides applied.
    pub fn model(&self, id: &AgentId, lane: Lane) -> String {
        let over = self.agents.get(id).map(|a| &a.models);
        match lane {
            Lane::Edge => over.and_then(|o| o.edge.clone()).unwrap_or_else(|| self.llm.edge.model.clone()),
            Lane::Core => over.and_then(|o| o.core.clone()).unwrap_or_else(|| self.llm.core.model.clone()),
        }
    }

    /// The endpoints an agent's `lane` may use, in the order they are
    /// tried, each with its model: the lane's (with the agent's model
    /// override), then its fallbacks.
    pub fn chain(&self, id: &AgentId, lane: Lane) -> Vec<(&LlmEndpoint, String)> {
        let first = self.endpoint(lane);
        std::iter::once((first, self.model(id, lane)))
            .chain(first.fallbacks.iter().map(|f| (f, f.model.clone())))
            .collect()
    }

    /// The endpoint of a lane.
    pub fn endpoint(&self, lane: Lane) -> &LlmEndpoint {
        match lane {
            Lane::Edge => &self.llm.edge,
            Lane::Core => &self.llm.core,
        }
    }
}

pub use choir_common::lane::Lane;

/// A serde default of `true`, for any section.
fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_starter_config_is_valid() {
        let c = Config::parse(crate::home::STARTER_CONFIG).unwrap();
        assert_eq!(c.runtime, RuntimeKind::Docker);
        assert!(c.agents.is_empty());
    }

    fn field_of(text: &str) -> String {
        Config::parse(text).unwrap_err().0
    }

    #[test]
    fn fresh_max_and_probes_are_bounded_and_default_to_the_measured_values() {
        let llm = r#""llm": {"edge": {"base_url": "http://x/v1", "model": "m"}, "core": {"base_url": "http://x/v1", "model": "m"}}"#;
        let memory = |extra: &str| {
            format!(
                r#"{{{llm}, "memory": {{"embeddings": {{"base_url": "http://e/v1", "model": "m", "dimensions": 3}}{extra}}}}}"#
            )
        };
        let c = Config::parse(&memory("")).unwrap();
        assert_eq!(c.memory.map(|m| m.fresh_max), Some(DEFAULT_FRESH_MAX));
        let (field, why) = Config::parse(&memory(r#", "fresh_max": 100001"#)).unwrap_err();
        assert_eq!(field, "memory.fresh_max");
        assert!(why.contains("at most 100000"), "{why}");
        assert_eq!(field_of(&memory(r#", "fresh_max": -1"#)), "memory.fresh_max");
        assert_eq!(Config::parse(&memory(r#", "fresh_max": 0"#)).unwrap().memory.map(|m| m.fresh_max), Some(0));
        let defaults = Config::parse(&memory("")).unwrap().memory.map(|m| (m.ef_search, m.probes));
        let breadth = crate::store::memory::Breadth::DEFAULT;
        assert_eq!(defaults, Some((breadth.ef_search, breadth.probes)), "Breadth::DEFAULT is the config's");
        for bad in ["0", "1001", "-1"] {
            assert_eq!(field_of(&memory(&format!(r#", "probes": {bad}"#))), "memory.probes", "{bad}");
        }
        for good in [1, 1000] {
            let c = Config::parse(&memory(&format!(r#", "probes": {good}"#))).unwrap();
            assert_eq!(c.memory.map(|m| m.probes), Some(good));
        }
    }

    #[test]
    fn an_endpoints_patience_protocol_and_fallbacks_are_checked_naming_the_field() {
        let with = |edge_extra: &str| {
            format!(
                r#"{{"llm": {{"edge": {{"base_url": "http://x/v1", "model": "m"{edge_extra}}}, "core": {{"base_url": "http://x/v1", "model": "m"}}}}}}"#
            )
        };
        let c = Config::parse(&with("")).unwrap();
        assert_eq!((c.llm.edge.timeout_s, c.llm.edge.answer_timeout_s()), (120, 900));
        let c = Config::parse(&with(r#", "timeout_s": 1200"#)).unwrap();
        assert_eq!(c.llm.edge.answer_timeout_s(), 1200, "a longer silence lengthens the default whole");
        assert_eq!(field_of(&with(r#", "timeout_s": 0"#)), "llm.edge.timeout_s");
        assert_eq!(field_of(&with(r#", "timeout_s": 60, "answer_timeout_s": 30"#)), "llm.edge.answer_timeout_s");
        assert_eq!(field_of(&with(r#", "thinking_budget_tokens": 2048"#)), "llm.edge.thinking_budget_tokens");
        assert!(Config::parse(&with(r#", "protocol": "anthropic", "thinking_budget_tokens": 2048"#)).is_ok());
        assert_eq!(field_of(&with(r#", "preset": "openia""#)), "llm.edge.preset");
        let fb = |extra: &str| format!(r#", "fallbacks": [{{"base_url": "http://y/v1", "model": "n"{extra}}}]"#);
        let c = Config::parse(&with(&fb(""))).unwrap();
        let id = AgentId::parse("a").unwrap();
        let chain: Vec<String> = c.chain(&id, Lane::Edge).into_iter().map(|(_, m)| m).collect();
        assert_eq!(chain, ["m", "n"]);
        assert_eq!(field_of(&with(&fb(r#", "base_url": "ftp://y""#))), "llm.edge.fallbacks[0].base_url");
        let nested = fb(r#", "fallbacks": [{"base_url": "http://z/v1", "model": "o"}]"#);
        assert_eq!(field_of(&with(&nested)), "llm.edge.fallbacks[0].fallbacks");
        let five = format!(r#", "fallbacks": [{}]"#, [r#"{"base_url": "http://y/v1", "model": "n"}"#; 5].join(", "));
        assert_eq!(field_of(&with(&five)), "llm.edge.fallbacks");
    }

    #[test]
    fn errors_name_the_field() {
        let llm = r#""llm": {"edge": {"base_url": "http://x/v1", "model": "m"}, "core": {"base_url": "http://x/v1", "model": "m"}}"#;
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "agents": {{"demo": {{"max_steps_per_turn": "many"}}}}}}"#)),
            "agents.demo.max_steps_per_turn"
        );
        assert_eq!(field_of(&format!(r#"{{{llm}, "runtime": "vm"}}"#)), "runtime");
        assert_eq!(field_of(&format!(r#"{{{llm}, "bogus": 1}}"#)), "bogus");
        assert_eq!(field_of(&format!(r#"{{{llm}, "http_listen": "0.0.0.0:9400"}}"#)), "http_listen");
        assert_eq!(field_of(&format!(r#"{{{llm}, "agents": {{"Bad Id": {{}}}}}}"#)), "agents.Bad Id");
        assert_eq!(field_of(&format!(r#"{{{llm}, "agents": {{"a": {{"workspace": "rel"}}}}}}"#)), "agents.a.workspace");
        assert_eq!(
            field_of(
                r#"{"llm": {"edge": {"base_url": "ftp://x", "model": "m"}, "core": {"base_url": "http://x", "model": "m"}}}"#
            ),
            "llm.edge.base_url"
        );
        assert_eq!(field_of(r#"{"llm": {"edge": {"base_url": "http://x", "model": 5}}}"#), "llm.edge.model");
        assert_eq!(field_of(&format!(r#"{{{llm}, "logs": {{"max_file_mb": 0}}}}"#)), "logs.max_file_mb");
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "logs": {{"max_file_mb": 10, "max_total_mb": 20}}}}"#)),
            "logs.max_total_mb"
        );
        assert_eq!(field_of(&format!(r#"{{{llm}, "agents": {{"choird": {{}}}}}}"#)), "agents.choird");
        let quotas = |q: &str| format!(r#"{{{llm}, "agents": {{"a": {{"quotas": {q}}}}}}}"#);
        assert_eq!(field_of(&quotas(r#"{"workspace_mb": 8}"#)), "agents.a.quotas.workspace_mb");
        assert_eq!(field_of(&quotas(r#"{"workspace_mb": 16}"#)), "agents.a.quotas.workspace_inodes", "too many");
        assert_eq!(field_of(&quotas(r#"{"workspace_inodes": 10}"#)), "agents.a.quotas.workspace_inodes");
        Config::parse(&quotas(r#"{"workspace_mb": 16, "workspace_inodes": 4096}"#)).unwrap();
        Config::parse(&quotas(r#"{"workspace_mb": 0, "workspace_inodes": 1}"#)).unwrap();
        Config::parse(&quotas("{}")).unwrap();
        let priced = r#""llm": {"edge": {"base_url": "http://x/v1", "model": "m"}, "core": {"base_url": "http://x/v1", "model": "m"},
                        "prices": {"m": {"prompt_per_mtok": -1, "completion_per_mtok": 1}}}"#;
        assert_eq!(field_of(&format!("{{{priced}}}")), "llm.prices.m");
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "runtime": "process", "agents": {{"a": {{"transport": "http"}}}}}}"#)),
            "agents.a.transport"
        );
        assert_eq!(
            field_of(&format!(r#"{{{llm}, "agents": {{"a": {{"tools": {{"deny": ["*"]}}}}}}}}"#)),
            "agents.a.tools"
        );
    }

    #[test]
    fn unknown_field_message_lists_it() {
        let err = Config::parse(r#"{"llm": {"edge": {"base_url": "http://x", "model": "m", "key": 1}, "core": {"base_url": "http://x", "model": "m"}}}"#).unwrap_err();
        assert_eq!(err.0, "llm.edge.key");
        assert!(err.1.contains("unknown field `key`"), "{}", err.1);
    }

    #[test]
    fn missing_secrets_are_listed() {
        let c = Config::parse(crate::home::STARTER_CONFIG).unwrap();
        assert_eq!(c.missing_secrets(&Secrets::from_pairs(&[("openai_api_key", "k")])), Vec::<String>::new());
        assert_eq!(c.missing_secrets(&Secrets::default()).len(), 2);
    }
}
