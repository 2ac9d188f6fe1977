//! The tool names Choir reserves for itself: its built-ins, the host tools
//! choird runs, the proposal meta-tools and the edge-only lane tools. A
//! leaf module (it depends on nothing), so that manifests (which refuse
//! these names to external tools) and host tool definitions can both use it.

/// Names of the tools built into choir-agent; no external tool may take one.
pub const BUILTIN_TOOLS: &[&str] = &[
    "choir.core.cancel",
    "choir.core.start",
    "choir.core.status",
    "choir.exec",
    "choir.fs.read",
    "choir.fs.search",
    "choir.fs.write",
    "choir.memory.compact",
    "choir.plan",
    "choir.propose.config_change",
    "choir.propose.schedule",
    "choir.propose.skill",
    "choir.propose.tool",
    "choir.skill.run",
    "choir.tools.find",
];

/// The tool a model names its plan with before it reads anything from
/// outside (the turn's trusted intent).
pub const PLAN_TOOL: &str = "choir.plan";

/// Names of the host tools (run by choird, see `host_tools`).
pub const HOST_TOOLS: &[&str] = &["choir.memory.query", "choir.memory.upsert"];

/// Tools choird runs on the host whose manifests choird itself defines (its
/// host-tool registry sends them to the agents it serves them to). Reserved
/// like every other Choir name, and known to skills.
pub const CHOIRD_TOOLS: &[&str] = &[
    "choir.email.check",
    "choir.email.receive",
    "choir.email.send",
    "choir.http.post",
    "choir.notion.query",
    "choir.tts.speak",
    "choir.web.browse",
    "choir.web.search",
];

/// Proposal meta-tools (R-TOOL-8): never executed; the arbiter hands their
/// input to a human through REQUEST_APPROVAL.
pub const PROPOSAL_TOOLS: &[&str] =
    &["choir.propose.config_change", "choir.propose.schedule", "choir.propose.skill", "choir.propose.tool"];

/// Tools that only the edge lane may use (core jobs cannot start core jobs,
/// and a skill never starts a skill).
pub const EDGE_ONLY_TOOLS: &[&str] = &["choir.core.cancel", "choir.core.start", "choir.core.status", "choir.skill.run"];

/// Whether `name` is reserved for Choir itself: a built-in, a host tool, or a
/// skill control (`choir.skill.*`). No external tool may take such a name.
pub fn reserved_tool_name(name: &str) -> bool {
    BUILTIN_TOOLS.contains(&name)
        || HOST_TOOLS.contains(&name)
        || CHOIRD_TOOLS.contains(&name)
        || name.starts_with("choir.skill.")
}
