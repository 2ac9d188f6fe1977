//! The skill registry (R-SKILL-1): built-in skills, then
//! `<choir>/skills/global/*.json`, then `<choir>/skills/agent/*.json` (the
//! agent's layer replaces a global skill of the same name; nothing replaces a
//! built-in). Every skill is validated against the tool registry at start; any
//! error fails start-up with the file, the state and the reason.
//!
//! **Invariant:** the registry is immutable after start; a skill's schemas
//! are compiled once, here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use choir_common::skill::{load_skills, SkillFileError, SkillSpec};
use serde_json::Value;

use crate::tools::{Registry, ToolError};

/// A loaded skill with its compiled schemas.
pub struct Skill {
    /// The spec.
    pub spec: SkillSpec,
    /// `built-in:<file>` or the file it came from.
    pub source: String,
    /// Compiled `input_schema`.
    pub input: jsonschema::Validator,
    /// Compiled `output_schema`.
    pub output: jsonschema::Validator,
}

/// Every skill of the agent, by name.
#[derive(Default)]
pub struct SkillBook {
    skills: BTreeMap<String, Arc<Skill>>,
    /// The edge prompt's list of them (`\n- name: the first sentence of
    /// its description`, sorted by name), made once when they are loaded.
    summary: String,
}

/// Schema problems of `value`, as one line each (empty when valid).
pub fn problems(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|e| {
            let at = e.instance_path().to_string();
            format!("{}: {e}", if at.is_empty() { "(root)".to_owned() } else { at })
        })
        .collect()
}

impl SkillBook {
    /// Loads and validates the skills under `choir_dir/skills/{global,agent}`
    /// against `registry`.
    pub fn load(choir_dir: &Path, registry: &Registry) -> Result<SkillBook, SkillFileError> {
        let layers = [choir_dir.join("skills").join("global"), choir_dir.join("skills").join("agent")];
        let loaded = load_skills(&layers, &|t| registry.contains(t))?;
        let mut skills = BTreeMap::new();
        for l in loaded {
            let fail = |reason: String| SkillFileError {
                file: l.source.clone(),
                error: choir_common::skill::SkillError { state: None, reason },
            };
            // Validation compiled both schemas already; this cannot fail for a valid spec.
            let input = jsonschema::validator_for(&l.spec.input_schema).map_err(|e| fail(e.to_string()))?;
            let output = jsonschema::validator_for(&l.spec.output_schema).map_err(|e| fail(e.to_string()))?;
            skills.insert(l.spec.name.clone(), Arc::new(Skill { spec: l.spec, source: l.source, input, output }));
        }
        let summary = skills.values().map(|s| crate::tools::list_line(&s.spec.name, &s.spec.description)).collect();
        Ok(SkillBook { skills, summary })
    }

    /// The lines of a prompt's list of every skill, sorted by name (empty
    /// when there are none).
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Names of every skill, sorted.
    pub fn names(&self) -> Vec<String> {
        self.skills.keys().cloned().collect()
    }

    /// Every skill, sorted by name.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Skill>> {
        self.skills.values()
    }

    /// The skill `name`, with `input` checked against its input schema:
    /// what a lane needs before it starts a run.
    pub fn prepare(&self, name: &str, input: &Value) -> Result<Arc<Skill>, ToolError> {
        let skill = self.skills.get(name).ok_or_else(|| {
            ToolError::new(
                "unknown_skill",
                format!("there is no skill named {name:?}; skills: {}", self.names().join(", ")),
            )
        })?;
        let bad = problems(&skill.input, input);
        if !bad.is_empty() {
            return Err(ToolError::new(
                "invalid_input",
                format!("the input does not match skill {name}'s input_schema: {}", bad.join("; ")),
            ));
        }
        Ok(skill.clone())
    }
}
