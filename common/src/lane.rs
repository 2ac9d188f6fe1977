//! The two kinds of lane, one definition for every crate: the edge (the
//! user-facing lane, one per agent, living as long as the agent) and core
//! jobs (one piece of long work each, then a terminal state). choird routes
//! a lane's model calls by it; the agent's arbiter and status board decide
//! by it.

/// A lane's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The user-facing lane.
    Edge,
    /// A core job.
    Core,
}

impl Lane {
    /// Parses `edge` / `core`.
    pub fn parse(s: &str) -> Option<Lane> {
        match s {
            "edge" => Some(Lane::Edge),
            "core" => Some(Lane::Core),
            _ => None,
        }
    }

    /// The name: `edge` or `core`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Edge => "edge",
            Lane::Core => "core",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_nothing_else_parses() {
        for lane in [Lane::Edge, Lane::Core] {
            assert_eq!(Lane::parse(lane.as_str()), Some(lane));
        }
        assert_eq!(Lane::parse("Edge"), None);
        assert_eq!(Lane::parse("core:job"), None);
    }
}
