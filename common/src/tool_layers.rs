//! What a set of repository layers gives an agent, by name: the tools a
//! skill may name. Built on both kinds of tool files (manifests and MCP
//! server files), so it lives above both.

use std::path::PathBuf;

/// Every tool name an agent loading these tool layers (global, then agent)
/// registers: built-ins, host tools, the layers' external tools, and the
/// pinned tools of the MCP servers beside them. Skills
/// are validated against this set outside the agent (image builds, proposal
/// review, `choirctl skill validate`).
pub fn known_tool_names(
    layers: &[PathBuf],
) -> Result<std::collections::BTreeSet<String>, crate::manifest::ToolFileError> {
    let mut names: std::collections::BTreeSet<String> = crate::tool_names::BUILTIN_TOOLS
        .iter()
        .chain(crate::tool_names::HOST_TOOLS)
        .chain(crate::tool_names::CHOIRD_TOOLS)
        .map(|s| (*s).to_owned())
        .collect();
    for dir in layers {
        names.extend(crate::manifest::load_tool_layer(dir)?.into_iter().map(|t| t.manifest.llm.name));
    }
    // A repository layer's MCP servers (`<layer>/mcp`, beside `<layer>/tools`).
    let mcp: Vec<PathBuf> = layers
        .iter()
        .filter(|d| d.file_name().is_some_and(|n| n == "tools"))
        .filter_map(|d| d.parent().map(|p| p.join("mcp")))
        .collect();
    for server in crate::mcp::load_servers(&mcp)? {
        names.extend(server.server.manifests().into_iter().map(|(_, m)| m.llm.name));
        names.extend(server.server.grant_tools().into_iter().map(|(_, m)| m.llm.name));
    }
    Ok(names)
}
