//! Host tools (R-TOOL-5b): tools an agent calls like any other, through its
//! arbiter, but that choird runs on the host through EXECUTE_HOST_TOOL
//! (memory lives in choird's database). Their manifests are defined here once:
//! the agent registers them (offered only when choird says it serves them for
//! this agent, see [`crate::rpc::Bindings::host_tools`]), and choird validates
//! what it is asked to run against the same schemas.

use serde_json::json;

use crate::manifest::ToolManifest;

/// Names of the host tools.
pub use crate::tool_names::HOST_TOOLS;

/// The host tools' manifests.
pub fn manifests() -> Vec<ToolManifest> {
    let tier = json!({"type": "string", "enum": ["working", "session", "knowledge"]});
    let defs = [
        json!({
            "llm": {
                "name": "choir.memory.query",
                "description": "Look things up in your long-term memory: by meaning (mode semantic, with a query), by exact content hash (mode hash), or by time or commit sequence (mode range).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "mode": {"type": "string", "enum": ["semantic", "hash", "range"]},
                        "query": {"type": "string", "minLength": 1, "description": "What to look for (semantic)"},
                        "hash": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "sha256 of the content (hash)"},
                        "tier": tier,
                        "metadata": {"type": "object", "description": "Only items whose metadata contains these keys and values"},
                        "k": {"type": "integer", "minimum": 1, "maximum": 100},
                        "from_seq": {"type": "integer", "minimum": 0},
                        "to_seq": {"type": "integer", "minimum": 0},
                        "since": {"type": "string", "description": "RFC 3339 time (range)"},
                        "until": {"type": "string", "description": "RFC 3339 time (range)"}
                    },
                    "required": ["mode"],
                    "additionalProperties": false
                }
            },
            // What memory holds was written from anything an agent read:
            // untrusted; and it is the user's: private.
            "runtime": {"timeout_ms": 30000, "network": true, "side_effect": "read", "idempotent": true, "version": "1",
                        "output_trust": "untrusted", "private_fields": [""]}
        }),
        json!({
            "llm": {
                "name": "choir.memory.upsert",
                "description": "Remember something: store content in a memory tier (working, session or knowledge) with optional metadata; identical content is stored once. Use items to store several at once.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "tier": tier,
                        "content": {"type": "string", "minLength": 1},
                        "metadata": {"type": "object"},
                        "items": {
                            "type": "array", "minItems": 1, "maxItems": 100,
                            "items": {
                                "type": "object",
                                "properties": {"tier": tier, "content": {"type": "string", "minLength": 1}, "metadata": {"type": "object"}},
                                "required": ["tier", "content"],
                                "additionalProperties": false
                            }
                        }
                    },
                    "additionalProperties": false
                }
            },
            // It answers with what was stored (hashes, merged metadata): memory, untrusted.
            "runtime": {"timeout_ms": 30000, "network": true, "side_effect": "write", "idempotent": true, "version": "1",
                        "output_trust": "untrusted"}
        }),
    ];
    defs.into_iter().filter_map(|d| serde_json::from_value(d).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_host_tool_has_a_valid_manifest() {
        let m = manifests();
        let names: Vec<&str> = m.iter().map(|m| m.llm.name.as_str()).collect();
        assert_eq!(names, HOST_TOOLS);
        for manifest in &m {
            manifest.validate().unwrap();
            assert!(manifest.runtime.network && manifest.runtime.exec_path.is_none());
            assert_eq!(manifest.runtime.output_trust, crate::trust::OutputTrust::Untrusted, "memory is untrusted");
        }
    }
}
