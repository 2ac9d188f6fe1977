//! What a test observes of a running system: the requests a fake model
//! received (system prompt, offered tools, the tool results and the calls
//! they answer, the skill state and core job they were made in), the notices
//! an agent sent on its own, the confirmations waiting for a human, and
//! waiting until something holds.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::pg::TestPg;

/// Waits until `cond` holds, failing the test after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The threads of process `pid`: (name, nice value), from `/proc`.
pub fn thread_nices(pid: u32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // `pid (comm) state ...`: the name may hold spaces and parentheses;
        // the fields after its last `)` start with the state (field 3), the
        // nice value being field 19.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name = stat[open + 1..close].to_owned();
        let nice = stat[close + 1..].split_whitespace().nth(16).and_then(|n| n.parse().ok());
        if let Some(nice) = nice {
            out.push((name, nice));
        }
    }
    out
}

/// The records of `logs/<stream>.log` under `home` (one JSON object per
/// line, as choird's log manager writes them).
pub fn log_records(home: &std::path::Path, stream: &str) -> Vec<Value> {
    std::fs::read_to_string(home.join("logs").join(format!("{stream}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until a record of `logs/<stream>.log` has a message containing
/// `needle`; the records then.
pub fn wait_for_log(home: &std::path::Path, stream: &str, needle: &str) -> Vec<Value> {
    let has = |r: &Vec<Value>| r.iter().any(|r| r["msg"].as_str().is_some_and(|m| m.contains(needle)));
    wait_for(&format!("{needle:?} in logs/{stream}.log"), Duration::from_secs(15), || has(&log_records(home, stream)));
    log_records(home, stream)
}

/// The system prompt of a chat-completions request.
pub fn system_of(req: &Value) -> String {
    req["messages"][0]["content"].as_str().unwrap_or_default().to_owned()
}

/// The (wire) names of the tools a request offers, sorted.
pub fn tool_names(req: &Value) -> Vec<String> {
    let mut v: Vec<String> = req["tools"]
        .as_array()
        .map(|t| t.iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The last tool result a request carries, parsed.
pub fn last_tool_result(req: &Value) -> Value {
    let m = req["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap();
    serde_json::from_str(m["content"].as_str().unwrap()).unwrap()
}

/// Every tool result a request carries, in order: (call id, parsed content).
pub fn tool_results(req: &Value) -> Vec<(String, Value)> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let id = m["tool_call_id"].as_str().unwrap_or_default().to_owned();
            (id, serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        })
        .collect()
}

/// The (wire) tool name an assistant message of the request gave call `id`.
pub fn tool_of_call(req: &Value, id: &str) -> String {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .find(|c| c["id"] == id)
        .map(|c| c["function"]["name"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// The skill state a request was made in (from its system prompt).
pub fn state_of(req: &Value) -> String {
    let s = system_of(req);
    let at = s.find("Current state: ").map(|i| i + "Current state: ".len()).unwrap_or(0);
    s[at..].split('.').next().unwrap_or("").to_owned()
}

/// The core job a request belongs to (from its system prompt).
pub fn job_of(req: &Value) -> String {
    let s = system_of(req);
    let at = s.find("on the job '").map(|i| i + "on the job '".len()).unwrap_or(0);
    s[at..].split('\'').next().unwrap_or("").to_owned()
}

/// What agents said on their own (relayed core-job results, decisions), oldest first.
pub fn notices(pg: &TestPg) -> Vec<String> {
    pg.client().query("SELECT text FROM notices ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

/// The live (not zombie) Chromium processes among `pid`'s descendants.
pub fn chromium_processes(pid: u32) -> Vec<i32> {
    choir_common::proc_tree::descendants_of(pid as i32, 4096)
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim().starts_with("chrom")))
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
        })
        .collect()
}

/// The pending confirmations (approvals of kind `call`).
pub fn pending_calls(choird: &crate::harness::Choird) -> Vec<Value> {
    let v: Value =
        serde_json::from_str(&choird.ctl_ok(&["--json", "approvals", "list", "--status", "pending"])).unwrap();
    v["approvals"].as_array().unwrap().iter().filter(|a| a["kind"] == "call").cloned().collect()
}

/// Waits for the one confirmation the lane asks for; returns its id.
pub fn the_confirmation(choird: &crate::harness::Choird) -> String {
    let mut found = Vec::new();
    wait_for("a confirmation to be asked for", Duration::from_secs(30), || {
        found = pending_calls(choird);
        !found.is_empty()
    });
    assert_eq!(found.len(), 1, "{found:?}");
    found[0]["id"].to_string()
}

/// The rows of `table` each scan in `plan` (EXPLAIN's JSON) read: what it
/// returned over all its loops plus what its filters threw away.
pub fn rows_read(plan: &Value, table: &str, out: &mut Vec<(String, f64)>) {
    if plan["Relation Name"] == table {
        let n = |k: &str| plan[k].as_f64().unwrap_or(0.0);
        let read = n("Actual Rows") * n("Actual Loops").max(1.0) + n("Rows Removed by Filter");
        out.push((plan["Node Type"].as_str().unwrap_or("?").to_owned(), read));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        rows_read(child, table, out);
    }
}

/// The rows of `table` each scan reads when `execute(mode)` (an `EXECUTE`
/// of a prepared statement) runs under each plan PostgreSQL may give it:
/// (mode, node, rows read), for `force_custom_plan` then
/// `force_generic_plan`. Fails if a plan does not touch `table` at all.
pub fn rows_read_under_both_plans(
    c: &mut postgres::Client,
    table: &str,
    execute: impl Fn(&str) -> String,
) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        c.batch_execute(&format!("SET plan_cache_mode = {mode}")).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let statement = execute(mode);
        let plan: Value = c
            .query_one(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {statement}"), &[])
            .unwrap_or_else(|e| panic!("{statement}: {e}"))
            .get(0);
        let mut scans = Vec::new();
        rows_read(&plan[0]["Plan"], table, &mut scans);
        assert!(!scans.is_empty(), "{statement} ({mode}) reads {table}: {plan}");
        out.extend(scans.into_iter().map(|(node, read)| (mode.to_owned(), node, read)));
    }
    out
}
