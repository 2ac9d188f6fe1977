//! MCP servers' tools as Choir tools (`mcp.<server>.<tool>`): each pinned
//! tool of each server file under `<choir>/mcp/{global,agent}` is registered
//! with the manifest its pin makes ([`choir_common::mcp`]), and runs through
//! the arbiter like any tool — schema (the pinned one, unknown fields
//! refused), allowlists, skills, locks, the argument policy, the commit log —
//! before [`McpTool`] hands it to its server ([`server::McpServer`]).
//!
//! Servers run under the agent: in its container (docker runtime), or as
//! its children (process runtime: unsandboxed, like every tool there), with
//! the environment every tool gets and only the secrets the server declares.
//! Streamable-HTTP servers are choird's, not these.

pub mod conn;
pub mod host;
pub mod proxy;
pub mod server;

use std::path::Path;
use std::sync::Arc;

use choir_common::manifest::ToolManifest;
use choir_common::mcp::{load_servers, GrantTool};
use serde_json::Value;

use super::tool::{ExecContext, Tool, ToolError};
pub use host::{AgentHost, McpHost};
pub use server::McpServer;

/// One pinned tool of one server, or one its grants add.
pub struct McpTool {
    server: Arc<McpServer>,
    tool: Which,
}

enum Which {
    Pinned(String),
    Granted(GrantTool),
}

impl Tool for McpTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        // The server holds the secrets it declares; `ctx.secrets` are the same.
        match &self.tool {
            Which::Pinned(tool) => self.server.call(tool, input, ctx.deadline),
            Which::Granted(tool) => self.server.call_granted(*tool, input, ctx.deadline),
        }
    }

    fn unavailable(&self) -> Option<String> {
        match &self.tool {
            Which::Pinned(tool) => self.server.disabled(tool),
            Which::Granted(_) => None,
        }
    }
}

/// A pinned tool ready to register: (its source, its manifest, the tool).
pub type Pinned = (String, ToolManifest, McpTool);

/// The servers of `<choir_dir>/mcp/{global,agent}` (an agent's replaces a
/// global one of the same name) and their pinned tools, ready to register.
pub fn load(
    choir_dir: &Path,
    workspace: &Path,
    secrets: &crate::secrets::SecretStore,
    host: Option<Arc<dyn McpHost>>,
) -> Result<(Vec<Arc<McpServer>>, Vec<Pinned>), choir_common::manifest::ToolFileError> {
    let layers = [choir_dir.join("mcp").join("global"), choir_dir.join("mcp").join("agent")];
    let mut servers = Vec::new();
    let mut tools = Vec::new();
    // A server reached over HTTP is choird's: its tools come as host tools.
    for loaded in load_servers(&layers)?.into_iter().filter(|l| !l.server.server.is_http()) {
        let server = McpServer::new(loaded.server, workspace.to_owned(), secrets, host.clone());
        let source = format!("{} (MCP server {})", loaded.file.display(), server.name());
        for (tool, manifest) in server.file().manifests() {
            tools.push((source.clone(), manifest, McpTool { server: server.clone(), tool: Which::Pinned(tool) }));
        }
        for (tool, manifest) in server.file().grant_tools() {
            tools.push((source.clone(), manifest, McpTool { server: server.clone(), tool: Which::Granted(tool) }));
        }
        servers.push(server);
    }
    Ok((servers, tools))
}
