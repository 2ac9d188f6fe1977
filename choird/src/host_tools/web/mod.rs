//! The web tools (R-TOOL-5b): `choir.web.search` (Brave Search API),
//! `choir.web.browse` (Chromium on the host, one isolated context per
//! agent) and `choir.http.post`, run by choird for agents on the host-tool
//! registry. Containers keep `network: none`; every request leaves through
//! the agent's egress policy ([`crate::egress`]).
//!
//! **Invariants:**
//! - A web tool is served to an agent only when the agent has a `web`
//!   section (and, for search, `web.brave` and its key exist).
//! - Outside content reaches the model only inside the one untrusted
//!   wrapper (`choir_common::trust::wrap_untrusted`), with its source URL,
//!   and capped in length; the tools' manifests declare their output
//!   untrusted, so the agent marks every result.
//! - Secrets (the Brave key, post secrets) never appear in a result or an
//!   error.

use std::sync::Arc;

use crate::host_tools::{Registry, RegistryError};
use crate::shared::Shared;

pub mod browse;
pub mod common;
pub mod post;
pub mod search;

/// Registers the web tools.
pub fn register(shared: &Arc<Shared>, registry: &mut Registry) -> Result<(), RegistryError> {
    registry.register(Arc::new(search::Search::new(shared.clone())))?;
    registry.register(Arc::new(post::Post::new(shared.clone())))?;
    registry.register(Arc::new(browse::Browse::new(shared.clone())))?;
    Ok(())
}
