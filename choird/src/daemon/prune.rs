//! What accumulates as an operator lives with Choir: every approval that
//! rolls an agent onto a new image leaves the previous one, and an agent
//! taken out of config.json leaves its images, workspace and repository
//! clone. `choirctl prune` removes the images no agent needs; the rest
//! (files an operator may still want) is listed with where it is, never
//! deleted here.
//!
//! **Invariant:** an image is kept when a container uses it or it is what a
//! configured agent's current inputs give (the next start's image); only
//! images of this home's prefix (`<prefix>-agent-<id>:<hash>`) are looked at.

use std::collections::BTreeSet;
use std::sync::Arc;

use choir_common::ids::AgentId;
use serde::Serialize;
use serde_json::json;

use super::Daemon;
use crate::error::Error;

/// What a prune did and what it left.
#[derive(Debug, Default, Serialize)]
pub struct Pruned {
    /// Images removed.
    pub removed: Vec<String>,
    /// Images kept, each with why.
    pub kept: Vec<String>,
    /// What agents no longer configured left, with where (not removed).
    pub left: Vec<String>,
}

impl Daemon {
    /// Removes this home's agent images that no agent needs (see the module
    /// doc); lists what removed agents left behind. Audited.
    pub fn prune(self: &Arc<Self>) -> Result<Pruned, Error> {
        let config = self.config();
        let mut out = Pruned::default();
        let prefix = &config.docker.image_prefix;
        let engine = self.engine();
        let images = match engine.ping().and_then(|()| engine.images_of(&format!("{prefix}-agent-*"))) {
            Ok(i) => i,
            Err(e) => {
                out.kept.push(format!("(images not looked at: {e})"));
                Vec::new()
            }
        };
        let running: BTreeSet<String> = self.summaries().into_iter().filter_map(|s| s.image).collect();
        for image in images {
            let agent = image
                .split_once(':')
                .and_then(|(repo, _)| repo.strip_prefix(&format!("{prefix}-agent-")))
                .and_then(|a| AgentId::parse(a).ok());
            let needed = match &agent {
                _ if running.contains(&image) => Some("a container runs it"),
                Some(a) if config.agents.contains_key(a) => {
                    self.current_tag(a).map_or(Some("its agent's current inputs could not be read"), |t| {
                        (t == image).then_some("its agent's current inputs give it")
                    })
                }
                _ => None,
            };
            match needed {
                Some(why) => out.kept.push(format!("{image} ({why})")),
                None => match engine.remove_image(&image) {
                    Ok(()) => out.removed.push(image),
                    Err(e) => out.kept.push(format!("{image} (the engine keeps it: {e})")),
                },
            }
        }
        out.left = self.left_by_removed_agents();
        self.audit("admin", None, "images.prune", "ok", json!({"removed": out.removed}));
        Ok(out)
    }

    /// The tag the agent's current inputs give, when they can be read.
    fn current_tag(&self, id: &AgentId) -> Option<String> {
        let config = self.config();
        let engine = self.engine();
        let base = engine.image(&config.docker.base_image).ok().flatten()?;
        let base_id = base["Id"].as_str()?.to_owned();
        crate::docker::build::assemble(&self.home, id, &self.agent_binary, &base_id, &config.docker.image_prefix)
            .ok()
            .map(|i| i.tag)
    }

    /// Workspaces and repository clones of agents no longer in config.json.
    pub fn left_by_removed_agents(&self) -> Vec<String> {
        let config = self.config();
        let mut left = Vec::new();
        for (what, dir) in
            [("workspace", self.home.root().join("workspaces")), ("repository clone", self.home.repos().join("agents"))]
        {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if AgentId::parse(&name).is_ok_and(|id| !config.agents.contains_key(&id)) {
                    left.push(format!("{what} of removed agent {name}: {}", entry.path().display()));
                }
            }
        }
        left
    }

    /// After an agent moved onto `tag`: its other images go (those a
    /// container still uses stay).
    pub fn prune_superseded(&self, id: &AgentId, tag: &str) {
        let config = self.config();
        let engine = self.engine();
        let repo = crate::docker::build::repository(&config.docker.image_prefix, id);
        for image in engine.images_of(&repo).unwrap_or_default() {
            if image != tag {
                match engine.remove_image(&image) {
                    Ok(()) => log::info!("agent {id}: removed the superseded image {image}"),
                    Err(e) => log::debug!("agent {id}: {image} kept: {e}"),
                }
            }
        }
    }
}
