//! Agent image builds (R-LIFE-4): `/choir` is assembled from `repos/global/`
//! and `repos/agents/<id>/` (tools, skills, identity, MCP servers; the agent's layer
//! overrides the global one by name when the agent loads them), every manifest
//! is validated *before* the engine is touched, and the image is tagged with
//! the hash of its inputs, so the same inputs give the same tag and nothing is
//! rebuilt when nothing changed.
//!
//! **Invariant:** the build context is deterministic: entries sorted, owned by
//! root, mtime 0, modes 0644/0755, no symlinks (a link could pull host files
//! into the image).

use std::path::{Path, PathBuf};

use choir_common::ids::AgentId;
use choir_common::skill::load_skills;
use choir_common::tool_layers::known_tool_names;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Engine, EngineError};
use crate::home::Home;

/// The top-level Dockerfile, compiled in.
pub const DOCKERFILE: &str = include_str!("../../../Dockerfile");

/// An image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// An input file is invalid; nothing was sent to the engine.
    #[error("{file}: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// The base image is missing.
    #[error("the base image {0} is missing: build it with `make base-image` (scripts/build-base-image.sh)")]
    NoBase(String),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What goes into one agent's image.
pub struct ImageInputs {
    /// The build context (a tar).
    pub context: Vec<u8>,
    /// `<prefix>-agent-<id>:<hash>`.
    pub tag: String,
    /// The full input hash.
    pub hash: String,
}

/// The repository name of an agent's images.
pub fn repository(prefix: &str, id: &AgentId) -> String {
    format!("{prefix}-agent-{id}")
}

/// Checks every input without building anything: tool manifests (the same
/// checks the agent makes at start), skill files, and the agent binary.
pub fn validate(home: &Home, id: &AgentId, agent_binary: &Path) -> Result<(), BuildError> {
    let global = home.repos().join("global");
    let agent = home.repos().join("agents").join(id.as_str());
    let invalid = |file: &Path, reason: String| BuildError::Invalid { file: file.display().to_string(), reason };
    // The same checks the agent makes at start: tools, then skills against them.
    let known = known_tool_names(&[global.join("tools"), agent.join("tools")])
        .map_err(|e| BuildError::Invalid { file: e.file, reason: e.reason })?;
    choir_common::mcp::load_servers(&[global.join("mcp"), agent.join("mcp")])
        .map_err(|e| BuildError::Invalid { file: e.file, reason: e.reason })?;
    load_skills(&[global.join("skills"), agent.join("skills")], &|t| known.contains(t))
        .map_err(|e| BuildError::Invalid { file: e.file, reason: e.error.to_string() })?;
    if !agent_binary.is_file() {
        return Err(invalid(agent_binary, "the choir-agent binary is missing; set agent_binary in config.json".into()));
    }
    Ok(())
}

/// Checks every input and assembles the build context.
pub fn assemble(
    home: &Home,
    id: &AgentId,
    agent_binary: &Path,
    base_id: &str,
    prefix: &str,
) -> Result<ImageInputs, BuildError> {
    validate(home, id, agent_binary)?;
    let global = home.repos().join("global");
    let agent = home.repos().join("agents").join(id.as_str());
    let invalid = |file: &Path, reason: String| BuildError::Invalid { file: file.display().to_string(), reason };

    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, mode: u32, data: &[u8]| -> std::io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut h, path, data)
    };
    let io = |what: &Path, e: std::io::Error| invalid(what, e.to_string());
    add("Dockerfile", 0o644, DOCKERFILE.as_bytes()).map_err(|e| io(Path::new("Dockerfile"), e))?;
    let binary = std::fs::read(agent_binary).map_err(|e| {
        invalid(agent_binary, format!("cannot read the choir-agent binary ({e}); set agent_binary in config.json"))
    })?;
    add("choir-agent", 0o755, &binary).map_err(|e| io(agent_binary, e))?;
    for kind in ["tools", "skills", "identity", "mcp"] {
        for (layer, root) in [("global", global.join(kind)), ("agent", agent.join(kind))] {
            for (rel, file) in walk(&root).map_err(|e| io(&root, e))? {
                let meta = std::fs::symlink_metadata(&file).map_err(|e| io(&file, e))?;
                if meta.file_type().is_symlink() {
                    return Err(invalid(&file, "symbolic links are not allowed in agent images".into()));
                }
                let data = std::fs::read(&file).map_err(|e| io(&file, e))?;
                let mode = if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                };
                add(&format!("choir/{kind}/{layer}/{rel}"), mode, &data).map_err(|e| io(&file, e))?;
            }
        }
    }
    // An empty /choir still exists in the image.
    add("choir/.choir-image", 0o644, b"assembled by choird\n").map_err(|e| io(Path::new("choir"), e))?;
    let context = builder.into_inner().map_err(|e| io(Path::new("context"), e))?;
    let mut hasher = Sha256::new();
    hasher.update(base_id.as_bytes());
    hasher.update(b"\n");
    hasher.update(&context);
    let hash = hex::encode(hasher.finalize());
    let tag = format!("{}:{}", repository(prefix, id), &hash[..16]);
    Ok(ImageInputs { context, tag, hash })
}

/// Builds (or finds) the image for the agent's current inputs; returns its tag.
pub fn build(
    engine: &Engine,
    home: &Home,
    id: &AgentId,
    agent_binary: &Path,
    base_image: &str,
    prefix: &str,
    mut progress: impl FnMut(&str),
) -> Result<String, BuildError> {
    // Validation first: a bad manifest fails before the engine is asked anything.
    validate(home, id, agent_binary)?;
    let base = engine.image(base_image)?.ok_or_else(|| BuildError::NoBase(base_image.to_owned()))?;
    let base_id = base["Id"].as_str().unwrap_or_default().to_owned();
    let inputs = assemble(home, id, agent_binary, &base_id, prefix)?;
    if engine.image(&inputs.tag)?.is_some() {
        progress(&format!("image {} is up to date (inputs unchanged)", inputs.tag));
        return Ok(inputs.tag);
    }
    progress(&format!("building {} from {base_image} ({} KiB of context)", inputs.tag, inputs.context.len() / 1024));
    let labels = json!({"choir.agent": id.as_str(), "choir.inputs": inputs.hash});
    let args = json!({"BASE": base_image});
    engine.build(inputs.context, &inputs.tag, &labels, &args, &mut progress)?;
    progress(&format!("built {}", inputs.tag));
    Ok(inputs.tag)
}

/// Every file under `root` as (relative path, full path), sorted.
fn walk(root: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    if !root.exists() {
        return Ok(out);
    }
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let ty = std::fs::symlink_metadata(&path)?.file_type();
            if ty.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
                out.push((rel, path));
            }
        }
    }
    out.sort();
    Ok(out)
}
