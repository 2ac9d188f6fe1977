//! Skills end to end: validation (offline and at agent start), execution in
//! core jobs with the scripted model — per-state tool lists, refusals with
//! structured errors, the retry budget and its fail edge, max_steps,
//! cancellation of interruptible and non-interruptible skills — and an
//! adversarial model that tries every tool and event in every state of
//! `build_feature`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use choir_common::commit::{CommitEvent, EventKind, Outcome};
use choir_tests::fake_llm::{FakeLlm, Step};
use choir_tests::harness::{bin, two_lane_config, Choird};
use choir_tests::observe::{job_of, last_tool_result, notices, state_of, system_of, tool_names, wait_for};
use choir_tests::pg::TestPg;
use choir_tests::scenario::Scenario;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::e2e::replicated_events;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/skills").join(name).display().to_string()
}

/// Puts a skill into the agent's repository (`repos/agents/demo/skills`).
fn install_skill(choird: &Choird, skill: &Value) {
    let dir = choird.tools_dir("demo").parent().unwrap().join("skills");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{}.json", skill["name"].as_str().unwrap())), skill.to_string()).unwrap();
}

/// The workflow summary a core job reported to the edge (from the edge's requests).
fn core_report(edge: &FakeLlm, job: &str) -> Value {
    let prefix = format!("Core job '{job}' finished.");
    for r in edge.requests().iter().rev() {
        for m in r.body["messages"].as_array().into_iter().flatten() {
            let text = m["content"].as_str().unwrap_or_default();
            if m["role"] == "system" && text.starts_with(&prefix) {
                return serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
            }
        }
    }
    panic!("no report of job {job} reached the edge")
}

fn edit_notes() -> Value {
    json!({
        "name": "edit_notes",
        "description": "Read a note, then rewrite it.",
        "initial_state": "read",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false},
        "output_schema": {"type": "object", "properties": {"written": {"type": "string"}}, "required": ["written"], "additionalProperties": false},
        "states": {
            "read": {"objective": "Read the note.", "allowed_tools": ["choir.fs.read"], "transitions": [{"on": "complete", "to": "write"}]},
            "write": {"objective": "Rewrite it.", "allowed_tools": ["choir.fs.write"],
                      "transitions": [{"on": "complete", "to": "done"}, {"on": "fail", "to": "read"}]},
            "done": {"terminal": true}
        },
        "max_steps": 20,
        "interruptible": true
    })
}

fn transition(event: &str, note: Option<&str>) -> Step {
    let mut args = json!({"event": event});
    if let Some(n) = note {
        args["note"] = json!(n);
    }
    Step::call("choir.skill.transition", args)
}

fn finish(output: Value) -> Step {
    Step::call("choir.skill.finish", json!({"output": output}))
}

fn skill_events(events: &[CommitEvent], kind: EventKind) -> Vec<&CommitEvent> {
    events.iter().filter(|e| e.kind == kind).collect()
}

#[test]
fn choirctl_skill_validate_names_the_file_the_state_and_the_reason() {
    let home = tempfile::tempdir().unwrap();
    let ctl = |file: &str| {
        std::process::Command::new(bin("choirctl"))
            .arg("--home")
            .arg(home.path())
            .args(["skill", "validate", &fixture(file)])
            .output()
            .unwrap()
    };
    for (file, expected) in [
        ("dangling.json", "state \"plan\": transition \"complete\" goes to \"ship\", which is not a state"),
        ("no_terminal.json", "a skill needs at least one terminal state"),
        ("unreachable.json", "state \"orphan\": unreachable from initial_state \"start\""),
        ("unknown_tool.json", "state \"start\": tool choir.teleport.now is not a registered tool"),
        ("bad_schema.json", "output_schema is not a valid JSON Schema"),
        ("terminal_exit.json", "state \"done\": a terminal state cannot have transitions"),
        ("not_json.json", "not valid JSON: EOF while parsing"),
    ] {
        let out = ctl(file);
        assert!(!out.status.success(), "{file} passed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&fixture(file)) && err.contains(expected), "{file}: {err}");
    }
    let out = ctl("good.json");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("skill triage is valid: 3 states from start, terminal done"));
    // Tools of the home's repositories count as registered: an agent's own tool too.
    let tools = home.path().join("repos/agents/demo/tools");
    std::fs::create_dir_all(&tools).unwrap();
    let manifest = json!({"llm": {"name": "choir.teleport.now", "description": "Teleport.", "parameters": {"type": "object"}},
                          "runtime": {"exec_path": "teleport", "timeout_ms": 1000, "side_effect": "read", "version": "1"}});
    std::fs::write(tools.join("teleport.json"), manifest.to_string()).unwrap();
    std::fs::write(tools.join("teleport"), "#!/bin/sh\necho '{}'\n").unwrap();
    std::fs::set_permissions(tools.join("teleport"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert!(!ctl("unknown_tool.json").status.success(), "the agent's tool is not the global layer's");
    let out = std::process::Command::new(bin("choirctl"))
        .arg("--home")
        .arg(home.path())
        .args(["skill", "validate", &fixture("unknown_tool.json"), "--agent", "demo"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_invalid_skill_in_the_agents_repository_fails_its_start_and_the_build() {
    let Some(Scenario { pg: _pg, llm: fake, choird }) = Scenario::new().secrets(json!({"llm_key": "k"})).build() else {
        return;
    };
    let dir = choird.tools_dir("demo").parent().unwrap().join("skills");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("dangling.json"), dir.join("dangling.json")).unwrap();
    let err = choird.ctl_err(&["agent", "start", "demo"]);
    assert!(
        err.contains("dangling.json") && err.contains("state \"plan\": transition \"complete\" goes to \"ship\""),
        "{err}"
    );
    // The image build runs the same checks before it touches the engine.
    let out = choird.ctl(&["agent", "build", "demo"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !out.status.success() && text.contains("state \"plan\": transition \"complete\" goes to \"ship\""),
        "{text}"
    );
    assert_eq!(fake.requests().len(), 0);
}

#[test]
fn a_skill_offers_only_its_states_tools_and_refuses_everything_else_with_a_structured_error() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::start(vec![
        // Input that does not match the input schema: refused before anything starts.
        Step::call(
            "choir.core.start",
            json!({"name": "notes", "objective": "Rewrite the note.", "skill": "edit_notes", "input": {}}),
        ),
        Step::call(
            "choir.core.start",
            json!({"name": "notes", "objective": "Rewrite the note.", "skill": "edit_notes", "input": {"path": "notes/a.md"}}),
        ),
        Step::Text("Started.".into()),
        Step::Text("The note is rewritten.".into()),
    ]);
    let core = FakeLlm::start(vec![
        Step::call("choir.fs.write", json!({"path": "notes/a.md", "content": "too early"})), // 1: not allowed in read
        transition("finish_line", None),                                                     // 2: no such event
        Step::call("choir.fs.read", json!({"path": "notes/a.md"})),                          // 3: fine
        finish(json!({"written": "x"})),                                                     // 4: not terminal
        transition("complete", Some("the note says hello")),                                 // 5: -> write
        Step::call("choir.fs.write", json!({"path": "notes/a.md", "content": "rewritten\n"})), // 6
        transition("complete", None),                                                        // 7: -> done
        finish(json!({})),                                                                   // 8: invalid output
        finish(json!({"written": "notes/a.md"})),                                            // 9: finished
    ]);
    let (_choird, ws) = start_rewriting_a_note(&pg, &edge, &core);
    wait_for("the job's report", Duration::from_secs(30), || notices(&pg).len() == 1);

    // The bad input was refused by the skill's input schema, and nothing ran for it.
    let ereqs = edge.requests();
    let refused = last_tool_result(&ereqs[1].body);
    assert_eq!(refused["error"]["code"], "invalid_input", "{refused}");
    assert!(refused["summary"].as_str().unwrap().contains("edit_notes's input_schema"), "{refused}");

    let r = core.requests();
    assert_eq!(r.len(), 9);
    // State read: exactly its allowlist plus the transition control.
    assert_eq!(tool_names(&r[0].body), ["choir__fs__read", "choir__skill__transition"]);
    let control = r[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "choir__skill__transition")
        .unwrap();
    assert_eq!(control["function"]["parameters"]["properties"]["event"]["enum"], json!(["complete"]));
    assert!(system_of(&r[0].body).contains("Current state: read. Objective: Read the note."));
    // A forbidden tool: structured error listing tools and transitions.
    let e = last_tool_result(&r[1].body);
    assert_eq!(e["status"], "rejected");
    assert_eq!(e["error"]["code"], "tool_not_allowed");
    assert_eq!(e["error"]["allowed_tools"], json!(["choir.fs.read"]));
    assert_eq!(e["error"]["allowed_transitions"], json!(["complete"]));
    assert_eq!(e["error"]["state"], "read");
    // An event the state does not have.
    let e = last_tool_result(&r[2].body);
    assert_eq!(e["error"]["code"], "invalid_transition", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("\"finish_line\" is not a transition of state read"));
    // Finish outside a terminal state.
    let e = last_tool_result(&r[4].body);
    assert_eq!(e["error"]["code"], "not_terminal", "{e}");
    // State write: its own tools and events, the note of read, not read's objective.
    assert_eq!(tool_names(&r[5].body), ["choir__fs__write", "choir__skill__transition"]);
    let sys = system_of(&r[5].body);
    assert!(sys.contains("Current state: write. Objective: Rewrite it."), "{sys}");
    assert!(sys.contains("Notes from earlier states:\n- read: the note says hello"), "{sys}");
    assert!(!sys.contains("Read the note."), "{sys}");
    // The terminal state offers finish only, with the output schema.
    assert_eq!(tool_names(&r[7].body), ["choir__skill__finish"]);
    assert_eq!(r[7].body["tools"][0]["function"]["parameters"]["properties"]["output"], edit_notes()["output_schema"]);
    let e = last_tool_result(&r[8].body);
    assert_eq!(e["error"]["code"], "invalid_output", "{e}");

    assert_eq!(std::fs::read_to_string(ws.join("notes/a.md")).unwrap(), "rewritten\n");
    let report = core_report(&edge, "notes");
    assert_eq!(report["status"], "done", "{report}");
    assert_eq!(report["skill"]["status"], "finished");
    assert_eq!(report["skill"]["output"], json!({"written": "notes/a.md"}));

    // Every transition and every refusal is committed, with the skill and state.
    let events = replicated_events(&pg, "demo", 12);
    assert_eq!(skill_events(&events, EventKind::SkillStart).len(), 1);
    let moves: Vec<(String, String)> = skill_events(&events, EventKind::SkillTransition)
        .iter()
        .map(|e| (e.result["from"].as_str().unwrap().to_owned(), e.result["to"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(moves, [("read".to_owned(), "write".to_owned()), ("write".to_owned(), "done".to_owned())]);
    let refusals: Vec<&CommitEvent> = events.iter().filter(|e| e.outcome == Outcome::Rejected).collect();
    assert_eq!(refusals.len(), 4, "{refusals:?}");
    assert!(refusals.iter().all(|e| e.skill.as_deref() == Some("edit_notes") && e.state.is_some()));
    let write_in_read = refusals.iter().find(|e| e.kind == EventKind::ToolCall).unwrap();
    assert_eq!((write_in_read.tool.as_str(), write_in_read.state.as_deref()), ("choir.fs.write", Some("read")));
    let end = skill_events(&events, EventKind::SkillEnd);
    assert_eq!(end[0].result["status"], "finished");
}

#[test]
fn the_retry_budget_takes_the_fail_edge_and_max_steps_ends_a_skill() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "user" {
            let text = last["content"].as_str()?;
            let (name, skill, input) = if text == "budget" {
                ("budget", "edit_notes", json!({"path": "a.md"}))
            } else {
                ("steps", "loop", json!({}))
            };
            return Some(Step::call(
                "choir.core.start",
                json!({"name": name, "objective": "Work.", "skill": skill, "input": input}),
            ));
        }
        Some(Step::Text("ok".into()))
    });
    let steps: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let core = FakeLlm::with_responder(move |req, _| {
        let job = job_of(req);
        let n = {
            let mut s = steps.lock();
            let n = s.entry(job.clone()).or_default();
            *n += 1;
            *n
        };
        if job == "steps" {
            return Some(Step::call("choir.fs.read", json!({"path": "a.md"})));
        }
        Some(match n {
            1 => transition("complete", None),                         // read -> write
            2 => Step::call("choir.fs.read", json!({"path": "a.md"})), // refused in write (1)
            3 => Step::Text("I would rather chat.".into()),            // no proposal (2)
            4 => transition("nope", None),                             // no such event (3): fail edge -> read
            5..=7 => Step::call("choir.fs.write", json!({"path": "a.md", "content": "x"})), // refused in read, no fail edge
            _ => Step::Text("unexpected".into()),
        })
    });
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    install_skill(&choird, &edit_notes());
    install_skill(
        &choird,
        &json!({"name": "loop", "description": "Reads forever.", "initial_state": "s",
                "states": {"s": {"objective": "Read.", "allowed_tools": ["choir.fs.read"], "transitions": [{"on": "complete", "to": "done"}]},
                           "done": {"terminal": true}},
                "max_steps": 3}),
    );
    std::fs::create_dir_all(choird.workspace("demo")).unwrap();
    std::fs::write(choird.workspace("demo").join("a.md"), "a\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["chat", "demo", "budget"]);
    choird.ctl_ok(&["chat", "demo", "steps"]);
    wait_for("both reports", Duration::from_secs(30), || notices(&pg).len() == 2);

    let budget = core_report(&edge, "budget");
    assert_eq!(budget["status"], "failed");
    assert_eq!(budget["skill"]["status"], "failed");
    assert_eq!(budget["skill"]["state"], "read");
    assert!(budget["skill"]["reason"].as_str().unwrap().contains("retry budget exhausted in state read"), "{budget}");
    let requests = core.requests();
    let budget_reqs: Vec<&Value> = requests.iter().map(|r| &r.body).filter(|b| job_of(b) == "budget").collect();
    assert_eq!(budget_reqs.len(), 7, "no step after the budget ran out");
    assert_eq!(state_of(budget_reqs[4]), "read", "the fail edge led back to read");
    assert!(budget_reqs[4]["messages"].to_string().contains("the skill took its fail transition to state read"));

    let steps = core_report(&edge, "steps");
    assert_eq!(steps["skill"]["status"], "failed");
    assert!(steps["skill"]["reason"].as_str().unwrap().contains("max_steps (3) reached"), "{steps}");
    assert_eq!(requests.iter().filter(|r| job_of(&r.body) == "steps").count(), 3);

    let events = replicated_events(&pg, "demo", 10);
    let fail_edge = events
        .iter()
        .find(|e| e.kind == EventKind::SkillTransition && e.result["why"] == "retry budget exhausted")
        .expect("the fail edge is committed");
    assert_eq!((fail_edge.result["from"].as_str(), fail_edge.result["to"].as_str()), (Some("write"), Some("read")));
}

/// A holder job keeps `workspace` locked while the skill job's write waits
/// for its lock; then the operator cancels the skill job.
fn cancel_while_a_write_waits_for_its_lock(interruptible: bool) {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        match last["content"].as_str() {
            Some("hold") => {
                Some(Step::call("choir.core.start", json!({"name": "holder", "objective": "Hold the workspace."})))
            }
            Some("edit") => Some(Step::call(
                "choir.core.start",
                json!({"name": "editor", "objective": "Edit.", "skill": "careful", "input": {}}),
            )),
            _ => Some(Step::Text("noted".into())),
        }
    });
    let core = FakeLlm::with_responder(|req, _| {
        let job = job_of(req);
        let first = !req["messages"].to_string().contains("\"role\":\"tool\"");
        Some(match (job.as_str(), first) {
            ("holder", true) => Step::call("choir.exec", json!({"command": "touch held; sleep 3"})),
            ("editor", true) => Step::call("choir.fs.write", json!({"path": "edited.txt", "content": "x"})),
            ("editor", false) => transition("complete", None),
            _ => Step::Text("held".into()),
        })
    });
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    install_skill(
        &choird,
        &json!({"name": "careful", "description": "One careful edit.", "initial_state": "edit",
                "states": {"edit": {"objective": "Edit.", "allowed_tools": ["choir.fs.write"], "transitions": [{"on": "complete", "to": "done"}]},
                           "done": {"terminal": true}},
                "max_steps": 5, "interruptible": interruptible}),
    );
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(&ws).unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["chat", "demo", "hold"]);
    wait_for("the holder to hold the workspace", Duration::from_secs(20), || ws.join("held").exists());
    choird.ctl_ok(&["chat", "demo", "edit"]);
    wait_for("the editor's write to be proposed", Duration::from_secs(20), || {
        core.requests().iter().any(|r| job_of(&r.body) == "editor" && r.answered_at.is_some())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!ws.join("edited.txt").exists(), "the write must still wait for the holder's lock");
    choird.ctl_ok(&["agent", "cancel", "demo", "core:editor"]);
    wait_for("both reports", Duration::from_secs(30), || notices(&pg).len() == 2);

    let report = core_report(&edge, "editor");
    assert_eq!(report["status"], "cancelled", "{report}");
    assert_eq!(report["skill"]["status"], "cancelled");
    let editor_requests = core.requests().iter().filter(|r| job_of(&r.body) == "editor").count();
    assert_eq!(editor_requests, 1, "no model step after the cancel");
    let events = replicated_events(&pg, "demo", 4);
    let write = events.iter().find(|e| e.lane == "core:editor" && e.tool == "choir.fs.write").unwrap();
    if interruptible {
        // Cut at the tool boundary: the write waited, then was refused.
        assert!(!ws.join("edited.txt").exists());
        assert_eq!(write.outcome, Outcome::Rejected);
        assert_eq!(write.result["error"]["code"], "cancelled");
    } else {
        // The step finishes first: the write ran, then the skill stopped.
        assert_eq!(std::fs::read_to_string(ws.join("edited.txt")).unwrap(), "x");
        assert_eq!(write.outcome, Outcome::Ok);
    }
}

#[test]
fn cancelling_an_interruptible_skill_stops_it_at_the_next_tool_boundary() {
    cancel_while_a_write_waits_for_its_lock(true);
}

#[test]
fn cancelling_a_non_interruptible_skill_lets_its_current_step_finish() {
    cancel_while_a_write_waits_for_its_lock(false);
}

/// Valid arguments for every registered tool; paths carry the state so
/// effects can be traced to where they happened.
fn every_tool_call(state: &str) -> Vec<(String, String)> {
    let tool = json!({"llm": {"name": "x.adv.tool", "description": "Adversarial.", "parameters": {"type": "object"}},
                      "runtime": {"exec_path": "adv", "timeout_ms": 1000, "side_effect": "read", "version": "1"}});
    let skill = json!({"name": "adv", "description": "d", "initial_state": "a",
                       "states": {"a": {"objective": "o", "transitions": [{"on": "complete", "to": "b"}]}, "b": {"terminal": true}},
                       "max_steps": 2});
    let calls = vec![
        ("choir.core.cancel", json!({"name": "x"})),
        ("choir.core.start", json!({"name": format!("adv-{state}"), "objective": "escape"})),
        ("choir.core.status", json!({})),
        ("choir.exec", json!({"command": format!("touch adv_exec_{state}")})),
        ("choir.fs.read", json!({"path": "seed.txt"})),
        ("choir.fs.search", json!({"pattern": "seed"})),
        ("choir.fs.write", json!({"path": format!("adv_{state}.txt"), "content": "x"})),
        ("choir.memory.compact", json!({})),
        ("choir.memory.query", json!({"mode": "semantic", "query": "x"})),
        ("choir.memory.upsert", json!({"tier": "working", "content": "x"})),
        ("choir.plan", json!({"tools": ["choir.exec"]})),
        ("choir.propose.config_change", json!({"changes": {"max_steps_per_turn": 3}, "reason": "r"})),
        (
            "choir.propose.schedule",
            json!({"job": {"name": format!("adv-{state}"), "every_s": 60, "prompt": "escape"}, "reason": "r"}),
        ),
        ("choir.propose.skill", json!({"skill": skill, "reason": "r"})),
        ("choir.propose.tool", json!({"manifest": tool, "executable": "#!/bin/sh\necho '{}'\n", "reason": "r"})),
        ("choir.skill.run", json!({"skill": "build_feature", "input": {"feature": "x"}})),
        ("choir.tools.find", json!({"query": "anything"})),
    ];
    calls.into_iter().map(|(n, a)| (n.to_owned(), a.to_string())).collect()
}

#[test]
fn an_adversarial_model_gets_nothing_outside_the_allowlist_in_any_state_of_build_feature() {
    let Some(pg) = TestPg::start() else { return };
    let registered: Vec<String> = choir_common::manifest::BUILTIN_TOOLS
        .iter()
        .chain(choir_common::host_tools::HOST_TOOLS)
        .map(|s| (*s).to_owned())
        .collect();
    let mut tried: Vec<String> = every_tool_call("x").into_iter().map(|(n, _)| n).collect();
    let mut all = registered.clone();
    tried.sort();
    all.sort();
    assert_eq!(tried, all, "the adversary tries every registered tool");
    let edge = FakeLlm::with_responder(|req, _| {
        let last = req["messages"].as_array()?.last()?.clone();
        if last["role"] == "user" {
            return Some(Step::call(
                "choir.core.start",
                json!({"name": "feature", "objective": "Build it.", "skill": "build_feature", "input": {"feature": "greeting"}}),
            ));
        }
        Some(Step::Text("ok".into()))
    });
    // The walk: each visit tries every tool (A), one event the state does not
    // have (B), then moves on (C). Revisits exercise revise and fail edges.
    // (state, try every tool first, a wrong event or finish, the way on);
    // 19 steps, within build_feature's max_steps of 20.
    let plan: Vec<(&str, bool, &str, &str)> = vec![
        ("understand", true, "revise", "complete"),
        ("plan", true, "fail", "complete"),
        ("modify", true, "revise", "complete"),
        ("validate", true, "revise", "fail"),
        ("modify", false, "finish", "complete"),
        ("validate", false, "jump", "complete"),
        ("done", true, "complete", "finish"),
    ];
    let cursor: Arc<Mutex<(usize, usize)>> = Arc::default();
    let seen_states: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = seen_states.clone();
    let core = FakeLlm::with_responder(move |req, _| {
        let mut c = cursor.lock();
        let (visit, mut phase) = *c;
        let (state, every_tool, bad, good) = *plan.get(visit)?;
        if phase == 0 && !every_tool {
            phase = 1;
        }
        assert_eq!(state_of(req), state, "the adversary expected to be in {state}");
        seen.lock().push(state.to_owned());
        let step = match phase {
            0 => Step::ToolCalls(every_tool_call(state)),
            1 if bad == "finish" => finish(json!({"summary": "s", "files_changed": []})),
            1 => transition(bad, None),
            _ if good == "finish" => finish(json!({"summary": "greeting added", "files_changed": ["adv_modify.txt"]})),
            _ => transition(good, Some("next")),
        };
        *c = if phase == 2 { (visit + 1, 0) } else { (visit, phase + 1) };
        Some(step)
    });
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("seed.txt"), "seed\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    choird.ctl_ok(&["chat", "demo", "build the greeting feature"]);
    wait_for("the report", Duration::from_secs(60), || notices(&pg).len() == 1);

    let report = core_report(&edge, "feature");
    assert_eq!(report["skill"]["status"], "finished", "{report}");
    assert_eq!(seen_states.lock().len(), 19, "every planned step was taken");

    // Side effects: only fs.write in modify (allowed there) left a file.
    let mut files: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("adv"))
        .collect();
    files.sort();
    assert_eq!(files, ["adv_modify.txt"]);
    let proposals: i64 = pg.client().query_one("SELECT count(*) FROM approvals", &[]).unwrap().get(0);
    assert_eq!(proposals, 0, "no proposal reached choird");
    assert!(core.requests().iter().all(|r| job_of(&r.body) == "feature"), "no other job was started");

    // From the log: no call outside its state's allowlist executed.
    let spec: Value = serde_json::from_str(include_str!("../../skills/build_feature.json")).unwrap();
    let events = replicated_events(&pg, "demo", 100);
    let calls: Vec<&CommitEvent> = events
        .iter()
        .filter(|e| e.kind == EventKind::ToolCall && e.skill.as_deref() == Some("build_feature"))
        .collect();
    assert_eq!(calls.len(), 5 * registered.len(), "every attempt is committed");
    let mut executed_outside = 0;
    for e in &calls {
        let state = e.state.as_deref().unwrap();
        let allowed: Vec<&str> = spec["states"][state]["allowed_tools"]
            .as_array()
            .map(|a| a.iter().map(|t| t.as_str().unwrap()).collect())
            .unwrap_or_default();
        let tool = e.tool.trim_start_matches('?');
        if e.outcome != Outcome::Rejected && !allowed.contains(&tool) {
            executed_outside += 1;
        }
    }
    assert_eq!(executed_outside, 0);
    let moves: Vec<String> = skill_events(&events, EventKind::SkillTransition)
        .iter()
        .map(|e| format!("{}>{}", e.result["from"].as_str().unwrap(), e.result["to"].as_str().unwrap()))
        .collect();
    assert_eq!(
        moves,
        ["understand>plan", "plan>modify", "modify>validate", "validate>modify", "modify>validate", "validate>done"]
    );
}

#[test]
fn the_edge_runs_research_and_summarize_in_its_turn_with_read_only_tools() {
    let Some(Scenario { pg, llm: edge, choird }) = Scenario::new()
        .model(vec![
        Step::call(
            "choir.skill.run",
            json!({"skill": "research_and_summarize", "input": {"question": "What colour is the sky, by my notes?"}}),
        ),
        Step::call("choir.fs.search", json!({"pattern": "sky"})),
        Step::call("choir.fs.write", json!({"path": "notes/sky.md", "content": "green"})), // read-only skill: refused
        Step::call("choir.fs.read", json!({"path": "notes/sky.md"})),
        transition("complete", Some("notes/sky.md says the sky is blue")),
        transition("complete", None),
        finish(json!({"summary": "The sky is blue.", "sources": ["notes/sky.md"]})),
        Step::Text("By your notes the sky is blue (notes/sky.md).".into()),
    ])
        .secrets(json!({"llm_key": "k"}))
        .build()
    else {
        return;
    };
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::write(ws.join("notes/sky.md"), "The sky is blue.\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(
        choird.ctl_ok(&["chat", "demo", "what colour is the sky?"]),
        "By your notes the sky is blue (notes/sky.md).\n"
    );
    let r = edge.requests();
    assert_eq!(r.len(), 8);
    assert_eq!(tool_names(&r[1].body), ["choir__fs__read", "choir__fs__search", "choir__skill__transition"]);
    assert_eq!(last_tool_result(&r[3].body)["error"]["code"], "tool_not_allowed");
    assert_eq!(std::fs::read_to_string(ws.join("notes/sky.md")).unwrap(), "The sky is blue.\n");
    assert_eq!(tool_names(&r[5].body), ["choir__fs__read", "choir__skill__transition"]);
    // Back in the edge's own turn: every tool again, and the skill's outcome.
    assert!(tool_names(&r[7].body).contains(&"choir__exec".to_owned()));
    let note = r[7].body["messages"].as_array().unwrap().last().unwrap().clone();
    let text = note["content"].as_str().unwrap();
    assert!(
        text.starts_with("The skill research_and_summarize ended: {\"output\":{\"sources\":[\"notes/sky.md\"]"),
        "{text}"
    );
    let events = replicated_events(&pg, "demo", 8);
    let end = events.iter().find(|e| e.kind == EventKind::SkillEnd).unwrap();
    assert_eq!((end.lane.as_str(), end.result["status"].as_str()), ("edge", Some("finished")));
    assert!(end.turn.is_some(), "the skill's events belong to the user's message");
}

/// choird with both lanes on `edge` and `core`, the `edit_notes` skill
/// installed and `notes/a.md` saying hello; the user has asked demo to
/// rewrite it (the edge answers "Started."). Returns choird and demo's
/// workspace.
fn start_rewriting_a_note(pg: &TestPg, edge: &FakeLlm, core: &FakeLlm) -> (Choird, std::path::PathBuf) {
    let choird = Choird::start(
        &two_lane_config(&edge.base_url(), &core.base_url(), &pg.url(), &["demo"]),
        &json!({"llm_key": "k"}),
    );
    install_skill(&choird, &edit_notes());
    let ws = choird.workspace("demo");
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::write(ws.join("notes/a.md"), "hello\n").unwrap();
    choird.ctl_ok(&["agent", "start", "demo"]);
    assert_eq!(choird.ctl_ok(&["chat", "demo", "rewrite notes/a.md"]), "Started.\n");
    (choird, ws)
}

#[test]
fn a_skill_in_a_job_with_allowed_tools_gets_its_states_tools_only_within_them() {
    let Some(pg) = TestPg::start() else { return };
    let edge = FakeLlm::start(vec![
        Step::call(
            "choir.core.start",
            json!({"name": "notes", "objective": "Rewrite the note.", "skill": "edit_notes",
                   "input": {"path": "notes/a.md"}, "allowed_tools": ["choir.fs.read"]}),
        ),
        Step::Text("Started.".into()),
        Step::Text("Reported.".into()),
    ]);
    let core = FakeLlm::start(vec![
        Step::call("choir.fs.read", json!({"path": "notes/a.md"})),
        transition("complete", Some("read it")),
        // The write state allows fs.write; the task does not.
        Step::call("choir.fs.write", json!({"path": "notes/a.md", "content": "rewritten\n"})),
    ]);
    let (_choird, ws) = start_rewriting_a_note(&pg, &edge, &core);
    wait_for("the write to be refused", Duration::from_secs(30), || core.requests().len() >= 4);
    let r = core.requests();
    // In the write state the model is offered no file tool at all.
    assert_eq!(tool_names(&r[2].body), ["choir__skill__transition"], "write state within the task's list");
    let refused = last_tool_result(&r[3].body);
    assert_eq!(refused["error"]["code"], "tool_not_allowed", "{refused}");
    assert_eq!(std::fs::read_to_string(ws.join("notes/a.md")).unwrap(), "hello\n");
}
