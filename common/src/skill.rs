//! Skills (R-SKILL-1): a SkillSpec is a small, explicit state machine that
//! narrows which tools a model may call at each step. This module holds the
//! spec's types, its validation, and the loading of skill files; the agent
//! (at start), choird (at image build and proposal review) and choirctl
//! (`skill validate`, offline) all use the same checks, so a skill that passes
//! one passes all.
//!
//! **Invariant:** a [`SkillSpec`] returned by [`parse_skill`] followed by
//! [`SkillSpec::validate`] has an existing initial state, only transitions to
//! existing states, at least one terminal state, no transitions out of a
//! terminal state, every state reachable from the initial one, only registered
//! tools in its allowlists (and never a tool that could start a skill), and
//! valid JSON Schemas for its input and output. There is no graph DSL: the
//! whole machine is this data.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::manifest::EDGE_ONLY_TOOLS;

/// The skills compiled into choir-agent (shipped in the repository's
/// `skills/`): (file name, JSON text). No loaded skill may take their names.
pub const BUILTIN_SKILLS: &[(&str, &str)] = &[
    ("build_feature.json", include_str!("../../skills/build_feature.json")),
    ("research_and_summarize.json", include_str!("../../skills/research_and_summarize.json")),
    ("skill-builder.json", include_str!("../../skills/skill-builder.json")),
    ("tool-builder.json", include_str!("../../skills/tool-builder.json")),
];

/// Tools that drive a running skill (offered by the skill engine, never
/// listed in a state's `allowed_tools`).
pub const TRANSITION_TOOL: &str = "choir.skill.transition";
/// See [`TRANSITION_TOOL`].
pub const FINISH_TOOL: &str = "choir.skill.finish";
/// The edge lane's tool to run a skill in its own turn.
pub const RUN_TOOL: &str = "choir.skill.run";

/// Retries per step when a skill does not set `retry_budget`.
pub const DEFAULT_RETRY_BUDGET: u32 = 2;
/// Largest `max_steps` a skill may ask for.
pub const MAX_STEPS_LIMIT: u32 = 1000;

/// A skill: a named state machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillSpec {
    /// Unique name, `[a-z][a-z0-9_-]{0,63}`.
    pub name: String,
    /// What the skill is for (shown to the model that may start it).
    pub description: String,
    /// Where a run begins.
    pub initial_state: String,
    /// JSON Schema of the input a run starts with.
    #[serde(default = "any_object")]
    pub input_schema: Value,
    /// JSON Schema of the output `finish` must carry.
    #[serde(default = "any_object")]
    pub output_schema: Value,
    /// The states, by name.
    pub states: BTreeMap<String, StateSpec>,
    /// Model steps a run may take before it is stopped.
    pub max_steps: u32,
    /// Whether a run may be cancelled mid-step (true), or finishes its current
    /// step first (false).
    #[serde(default = "yes")]
    pub interruptible: bool,
    /// Invalid proposals tolerated in a row in one state before the skill's
    /// error path (a `fail` transition, else FAILED).
    #[serde(default)]
    pub retry_budget: Option<u32>,
    /// After a proposal (`choir.propose.*`), wait for the human's decision
    /// (true) or carry on (false).
    #[serde(default = "yes")]
    pub wait_for_approval: bool,
}

fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

fn yes() -> bool {
    true
}

/// One state of a skill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// What the model must achieve here (required unless terminal).
    #[serde(default)]
    pub objective: String,
    /// The tools the model may call here, and no others.
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// The ways out.
    #[serde(default)]
    pub transitions: Vec<Transition>,
    /// An end state: the run may finish here, and nothing leads out.
    #[serde(default)]
    pub terminal: bool,
}

/// An edge of the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    /// The event the model names to take it.
    pub on: String,
    /// The target state.
    pub to: String,
}

/// Why a skill is invalid; the state, when one is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", state.as_ref().map(|s| format!("state {s:?}: ")).unwrap_or_default())]
pub struct SkillError {
    /// The offending state, if any.
    pub state: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// A skill file could not be used: the file, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {error}")]
pub struct SkillFileError {
    /// The file (or `built-in:<name>`).
    pub file: String,
    /// What is wrong.
    pub error: SkillError,
}

fn whole(reason: impl Into<String>) -> SkillError {
    SkillError { state: None, reason: reason.into() }
}

fn in_state(state: &str, reason: impl Into<String>) -> SkillError {
    SkillError { state: Some(state.to_owned()), reason: reason.into() }
}

/// Checks a skill name.
pub fn validate_skill_name(name: &str) -> Result<(), SkillError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 64
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(whole(format!(
            "name {name:?} is invalid: use 1-64 characters, a lowercase letter first, then lowercase letters, digits, '_' or '-'"
        )))
    }
}

fn event_name_ok(e: &str) -> bool {
    let mut chars = e.chars();
    matches!(chars.next(), Some('a'..='z')) && e.len() <= 32 && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// Parses a skill strictly: unknown fields are errors, and errors name the field.
pub fn parse_skill(text: &str) -> Result<SkillSpec, SkillError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        whole(if !inner.is_data() {
            format!("not valid JSON: {inner}")
        } else if at == "?" || at == "." {
            format!("not a valid skill: {inner}")
        } else {
            format!("{at}: {inner}")
        })
    })
}

impl SkillSpec {
    /// The state named `name`.
    pub fn state(&self, name: &str) -> Option<&StateSpec> {
        self.states.get(name)
    }

    /// The retry budget per step.
    pub fn retry_budget(&self) -> u32 {
        self.retry_budget.unwrap_or(DEFAULT_RETRY_BUDGET)
    }

    /// Every check of R-SKILL-1. `registered` says whether a tool name is
    /// registered with the agent (whatever its status).
    pub fn validate(&self, registered: &dyn Fn(&str) -> bool) -> Result<(), SkillError> {
        validate_skill_name(&self.name)?;
        if self.description.trim().is_empty() {
            return Err(whole("description must not be empty"));
        }
        if self.max_steps == 0 || self.max_steps > MAX_STEPS_LIMIT {
            return Err(whole(format!("max_steps must be between 1 and {MAX_STEPS_LIMIT}")));
        }
        if self.retry_budget.is_some_and(|r| r > 100) {
            return Err(whole("retry_budget must be at most 100"));
        }
        for (field, schema) in [("input_schema", &self.input_schema), ("output_schema", &self.output_schema)] {
            if !schema.is_object() {
                return Err(whole(format!("{field} must be a JSON Schema object")));
            }
            jsonschema::meta::validate(schema)
                .map_err(|e| whole(format!("{field} is not a valid JSON Schema: {e}")))?;
            jsonschema::validator_for(schema).map_err(|e| whole(format!("{field} cannot be compiled: {e}")))?;
        }
        if self.states.is_empty() {
            return Err(whole("a skill needs at least one state"));
        }
        if !self.states.contains_key(&self.initial_state) {
            return Err(whole(format!("initial_state {:?} is not a state", self.initial_state)));
        }
        for (name, state) in &self.states {
            if !event_name_ok(name) {
                return Err(in_state(
                    name,
                    "state names use 1-32 characters: a lowercase letter, then lowercase letters, digits or '_'",
                ));
            }
            let mut events = BTreeSet::new();
            for t in &state.transitions {
                if !event_name_ok(&t.on) {
                    return Err(in_state(name, format!("event {:?} is not a valid event name", t.on)));
                }
                if !events.insert(t.on.as_str()) {
                    return Err(in_state(name, format!("event {:?} is defined twice", t.on)));
                }
                if !self.states.contains_key(&t.to) {
                    return Err(in_state(
                        name,
                        format!("transition {:?} goes to {:?}, which is not a state", t.on, t.to),
                    ));
                }
            }
            if state.terminal && !state.transitions.is_empty() {
                return Err(in_state(name, "a terminal state cannot have transitions"));
            }
            if !state.terminal && state.transitions.is_empty() {
                return Err(in_state(name, "a state that is not terminal needs at least one transition"));
            }
            if !state.terminal && state.objective.trim().is_empty() {
                return Err(in_state(name, "objective must not be empty"));
            }
            let mut seen = BTreeSet::new();
            for tool in &state.allowed_tools {
                if !seen.insert(tool.as_str()) {
                    return Err(in_state(name, format!("tool {tool} is listed twice")));
                }
                if tool.starts_with("choir.skill.") || EDGE_ONLY_TOOLS.contains(&tool.as_str()) {
                    return Err(in_state(
                        name,
                        format!("tool {tool} cannot be allowed in a skill (skills never start skills or jobs)"),
                    ));
                }
                if !registered(tool) {
                    return Err(in_state(name, format!("tool {tool} is not a registered tool")));
                }
            }
        }
        if !self.states.values().any(|s| s.terminal) {
            return Err(whole("a skill needs at least one terminal state"));
        }
        let mut reached = BTreeSet::from([self.initial_state.as_str()]);
        let mut queue = VecDeque::from([self.initial_state.as_str()]);
        while let Some(s) = queue.pop_front() {
            for t in self.states.get(s).map(|s| s.transitions.as_slice()).unwrap_or_default() {
                if reached.insert(t.to.as_str()) {
                    queue.push_back(t.to.as_str());
                }
            }
        }
        if let Some(lost) = self.states.keys().find(|s| !reached.contains(s.as_str())) {
            return Err(in_state(lost, format!("unreachable from initial_state {:?}", self.initial_state)));
        }
        Ok(())
    }
}

/// A skill that passed every check, with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedSkill {
    /// `built-in:<file>` or the file's path.
    pub source: String,
    /// The spec.
    pub spec: SkillSpec,
}

/// Parses and validates one skill file.
pub fn load_skill_file(file: &Path, registered: &dyn Fn(&str) -> bool) -> Result<LoadedSkill, SkillFileError> {
    let fail = |error: SkillError| SkillFileError { file: file.display().to_string(), error };
    let text = std::fs::read_to_string(file).map_err(|e| fail(whole(e.to_string())))?;
    let spec = parse_skill(&text).map_err(fail)?;
    spec.validate(registered).map_err(fail)?;
    Ok(LoadedSkill { source: file.display().to_string(), spec })
}

/// The built-in skills, validated.
pub fn builtin_skills(registered: &dyn Fn(&str) -> bool) -> Result<Vec<LoadedSkill>, SkillFileError> {
    BUILTIN_SKILLS
        .iter()
        .map(|(file, text)| {
            let fail = |error: SkillError| SkillFileError { file: format!("built-in:{file}"), error };
            let spec = parse_skill(text).map_err(fail)?;
            spec.validate(registered).map_err(fail)?;
            Ok(LoadedSkill { source: format!("built-in:{file}"), spec })
        })
        .collect()
}

/// Names of the built-in skills.
pub fn builtin_skill_names() -> Vec<String> {
    BUILTIN_SKILLS.iter().filter_map(|(_, text)| parse_skill(text).ok().map(|s| s.name)).collect()
}

/// Loads the skills an agent runs with: built-ins, then every `*.json` of each
/// directory in `layers` (global, then agent), a later layer replacing an
/// earlier one by name. A built-in cannot be replaced; two files of one layer
/// naming the same skill are an error.
pub fn load_skills(layers: &[PathBuf], registered: &dyn Fn(&str) -> bool) -> Result<Vec<LoadedSkill>, SkillFileError> {
    let builtins = builtin_skills(registered)?;
    let builtin_names: BTreeSet<String> = builtins.iter().map(|s| s.spec.name.clone()).collect();
    let mut by_name: BTreeMap<String, LoadedSkill> = builtins.into_iter().map(|s| (s.spec.name.clone(), s)).collect();
    for dir in layers {
        let mut in_layer: BTreeMap<String, String> = BTreeMap::new();
        for file in json_files(dir)? {
            let skill = load_skill_file(&file, registered)?;
            let name = skill.spec.name.clone();
            let fail = |reason: String| SkillFileError { file: file.display().to_string(), error: whole(reason) };
            if builtin_names.contains(&name) {
                return Err(fail(format!("{name} is a built-in skill and cannot be replaced")));
            }
            if let Some(prev) = in_layer.insert(name.clone(), skill.source.clone()) {
                return Err(fail(format!("skill {name} is also defined by {prev}")));
            }
            by_name.insert(name, skill);
        }
    }
    Ok(by_name.into_values().collect())
}

/// The `*.json` files of a directory, sorted; a missing directory has none.
fn json_files(dir: &Path) -> Result<Vec<PathBuf>, SkillFileError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let io = |e: std::io::Error| SkillFileError { file: dir.display().to_string(), error: whole(e.to_string()) };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn known(t: &str) -> bool {
        [
            "choir.fs.read",
            "choir.fs.write",
            "choir.memory.query",
            "choir.propose.tool",
            "choir.propose.skill",
            "choir.fs.search",
        ]
        .contains(&t)
    }

    fn good() -> Value {
        json!({
            "name": "demo", "description": "A demo.", "initial_state": "a",
            "states": {
                "a": {"objective": "Do a.", "allowed_tools": ["choir.fs.read"], "transitions": [{"on": "complete", "to": "b"}]},
                "b": {"objective": "Do b.", "transitions": [{"on": "complete", "to": "done"}, {"on": "fail", "to": "a"}]},
                "done": {"terminal": true}
            },
            "max_steps": 5
        })
    }

    fn check(v: Value) -> Result<(), SkillError> {
        parse_skill(&v.to_string())?.validate(&known)
    }

    #[test]
    fn the_shipped_skills_validate() {
        let skills = builtin_skills(&known).unwrap();
        let names: Vec<&str> = skills.iter().map(|s| s.spec.name.as_str()).collect();
        assert_eq!(names, ["build_feature", "research_and_summarize", "skill-builder", "tool-builder"]);
        check(good()).unwrap();
    }

    #[test]
    fn each_kind_of_invalid_skill_names_its_fault() {
        let cases: Vec<(Value, Option<&str>, &str)> = vec![
            (
                json!({"states": {"a": {"objective": "x", "transitions": [{"on": "complete", "to": "nowhere"}]}}}),
                Some("a"),
                "transition \"complete\" goes to \"nowhere\", which is not a state",
            ),
            (
                json!({"states": {"a": {"objective": "x", "transitions": [{"on": "go", "to": "b"}]}, "b": {"objective": "y", "transitions": [{"on": "back", "to": "a"}]}}}),
                None,
                "a skill needs at least one terminal state",
            ),
            (
                json!({"states": {"a": {"objective": "x", "transitions": [{"on": "complete", "to": "done"}]}, "done": {"terminal": true}, "island": {"objective": "z", "transitions": [{"on": "complete", "to": "done"}]}}}),
                Some("island"),
                "unreachable from initial_state \"a\"",
            ),
            (
                json!({"states": {"a": {"objective": "x", "allowed_tools": ["choir.nope.tool"], "transitions": [{"on": "complete", "to": "done"}]}, "done": {"terminal": true}}}),
                Some("a"),
                "tool choir.nope.tool is not a registered tool",
            ),
            (json!({"input_schema": {"type": "objekt"}}), None, "input_schema is not a valid JSON Schema"),
            (
                json!({"output_schema": {"type": "object", "properties": {"x": {"minLength": "three"}}}}),
                None,
                "output_schema is not a valid JSON Schema",
            ),
            (
                json!({"states": {"a": {"objective": "x", "transitions": [{"on": "complete", "to": "done"}]}, "done": {"terminal": true, "transitions": [{"on": "again", "to": "a"}]}}}),
                Some("done"),
                "a terminal state cannot have transitions",
            ),
            (json!({"initial_state": "zz"}), None, "initial_state \"zz\" is not a state"),
            (
                json!({"states": {"a": {"objective": "x", "allowed_tools": ["choir.core.start"], "transitions": [{"on": "complete", "to": "done"}]}, "done": {"terminal": true}}}),
                Some("a"),
                "skills never start skills or jobs",
            ),
            (
                json!({"states": {"a": {"objective": "x", "allowed_tools": ["choir.skill.transition"], "transitions": [{"on": "complete", "to": "done"}]}, "done": {"terminal": true}}}),
                Some("a"),
                "cannot be allowed in a skill",
            ),
            (
                json!({"states": {"a": {"objective": "x", "transitions": [{"on": "go", "to": "done"}, {"on": "go", "to": "a"}]}, "done": {"terminal": true}}}),
                Some("a"),
                "event \"go\" is defined twice",
            ),
            (json!({"max_steps": 0}), None, "max_steps must be between 1 and 1000"),
            (json!({"name": "Bad Name"}), None, "name \"Bad Name\" is invalid"),
        ];
        for (patch, state, reason) in cases {
            let mut v = good();
            for (k, val) in patch.as_object().unwrap() {
                v[k] = val.clone();
            }
            let err = check(v.clone()).expect_err(&v.to_string());
            assert_eq!(err.state.as_deref(), state, "{err}");
            assert!(err.reason.contains(reason), "{err} (wanted {reason})");
        }
        let err = parse_skill(
            r#"{"name": "x", "description": "d", "initial_state": "a", "states": {}, "max_steps": 1, "colour": 1}"#,
        )
        .unwrap_err();
        assert!(err.reason.contains("unknown field `colour`"), "{err}");
        let err = parse_skill(r#"{"name": "x", "description": "d", "initial_state": "a", "states": {"a": {"transitions": [{"on": 1, "to": "b"}]}}, "max_steps": 1}"#).unwrap_err();
        assert!(err.reason.starts_with("states.a.transitions[0].on:"), "{err}");
    }

    #[test]
    fn layers_override_by_name_but_never_a_builtin() {
        let dir = tempfile::tempdir().unwrap();
        let (global, agent) = (dir.path().join("global"), dir.path().join("agent"));
        std::fs::create_dir_all(&global).unwrap();
        std::fs::create_dir_all(&agent).unwrap();
        let mut v = good();
        std::fs::write(global.join("demo.json"), v.to_string()).unwrap();
        v["description"] = json!("The agent's own demo.");
        std::fs::write(agent.join("demo.json"), v.to_string()).unwrap();
        let skills = load_skills(&[global.clone(), agent.clone()], &known).unwrap();
        let demo = skills.iter().find(|s| s.spec.name == "demo").unwrap();
        assert_eq!(demo.spec.description, "The agent's own demo.");
        assert!(demo.source.ends_with("agent/demo.json"));
        v["name"] = json!("tool-builder");
        std::fs::write(agent.join("demo.json"), v.to_string()).unwrap();
        let err = load_skills(&[global, agent], &known).unwrap_err();
        assert!(err.to_string().contains("tool-builder is a built-in skill and cannot be replaced"), "{err}");
    }
}
