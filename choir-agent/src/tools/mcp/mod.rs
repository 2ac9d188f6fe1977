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
pub mod server;

use std::path::Path;
use std::sync::Arc;

use choir_common::manifest::ToolManifest;
use choir_common::mcp::load_servers;
use serde_json::Value;

use super::tool::{ExecContext, Tool, ToolError};
pub use server::{CatalogFiler, McpServer};

/// One pinned tool of one server.
pub struct McpTool {
    server: Arc<McpServer>,
    tool: String,
}

impl Tool for McpTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        // The server holds the secrets it declares; `ctx.secrets` are the same.
        self.server.call(&self.tool, input, ctx.deadline)
    }

    fn unavailable(&self) -> Option<String> {
        self.server.disabled(&self.tool)
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
    filer: Option<Arc<dyn CatalogFiler>>,
) -> Result<(Vec<Arc<McpServer>>, Vec<Pinned>), choir_common::manifest::ToolFileError> {
    let layers = [choir_dir.join("mcp").join("global"), choir_dir.join("mcp").join("agent")];
    let mut servers = Vec::new();
    let mut tools = Vec::new();
    // A server reached over HTTP is choird's: its tools come as host tools.
    for loaded in load_servers(&layers)?.into_iter().filter(|l| !l.server.server.is_http()) {
        let server = McpServer::new(loaded.server, workspace.to_owned(), secrets, filer.clone());
        for (tool, manifest) in server.file().manifests() {
            let source = format!("{} (MCP server {})", loaded.file.display(), server.name());
            tools.push((source, manifest, McpTool { server: server.clone(), tool }));
        }
        servers.push(server);
    }
    Ok((servers, tools))
}

impl CatalogFiler for crate::rpc::Rpc {
    fn file(&self, content: Value, reason: String) -> Result<(), String> {
        use choir_common::rpc::{ApprovalRequest, ApprovalResponse, ProposalKind, ProposalScope, Verb};
        let req = ApprovalRequest {
            kind: ProposalKind::Mcp,
            scope: ProposalScope::Agent,
            content,
            reason,
            lane: "mcp".into(),
            skill: None,
            state: None,
            conversation: None,
        };
        self.call::<_, ApprovalResponse>(Verb::RequestApproval, &req, std::time::Duration::from_secs(30))
            .map(|r| log::info!("MCP catalog filed for approval as proposal {}", r.approval_id))
            .map_err(|e| e.to_string())
    }
}
