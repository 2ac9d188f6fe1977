//! `choirctl doctor`: choird's offline checks (`choird doctor`, run from the
//! home's files, so they work when choird does not start), then what
//! only a running choird can answer: whether it answers at all, and each
//! connected host tool's login (`POST agents/<id>/tools/<tool>/check`).
//! Each finding is printed as it is made; the exit code is non-zero when any
//! check failed.

use std::path::Path;

use choir_common::admin::{Check, CheckOutcome as Outcome};
use choir_common::admin::{StatusResponse, ToolList};

use crate::ctx::Ctx;

/// Runs the checks; `Ok(false)` when something failed.
pub(crate) fn run(ctx: &Ctx, home: &Path) -> anyhow::Result<bool> {
    let mut all: Vec<Check> = Vec::new();
    let json = ctx.json;
    let mut report = |c: Check| {
        if !json {
            print(&c);
        }
        all.push(c);
    };
    let offline =
        crate::offline::run_lines(&["doctor"], home, None, &mut |line| match serde_json::from_value::<Check>(line) {
            Ok(check) => report(check),
            Err(e) => report(Check::fail(
                "offline checks",
                format!("choird doctor said something else: {e}"),
                "use a choird of the same version as choirctl",
            )),
        });
    if let Err(e) = offline {
        report(Check::fail("offline checks", format!("{e:#}"), "install choird beside choirctl (make install)"));
    }
    match ctx.client.get::<StatusResponse>("status") {
        Ok(s) => {
            report(Check::ok(
                "choird",
                format!("{} running (pid {}, up {} s), {} agent(s)", s.version, s.pid, s.uptime_s, s.agents.len()),
            ));
            for agent in &s.agents {
                host_tools(ctx, &agent.id, &mut report);
            }
        }
        Err(e) => {
            report(Check::warn(
                "choird",
                format!("not answering on its admin socket: {e:#}"),
                "start it (systemctl start choird) and read why it stopped (journalctl -u choird, choirctl logs)",
            ));
            report(Check::skip("host tools", "their logins are checked by a running choird"));
        }
    }
    let ok = !all.iter().any(|c| c.outcome == Outcome::Fail);
    if json {
        crate::ctx::print_json(&serde_json::json!({"ok": ok, "checks": all}))?;
    } else {
        let failed = all.iter().filter(|c| c.outcome == Outcome::Fail).count();
        let warned = all.iter().filter(|c| c.outcome == Outcome::Warn).count();
        say!();
        say!("{} checks: {failed} failed, {warned} warnings", all.len());
    }
    Ok(ok)
}

/// Checks each host tool that is connected for `agent` and has something to check.
fn host_tools(ctx: &Ctx, agent: &str, report: &mut dyn FnMut(Check)) {
    let list: ToolList = match ctx.client.get(&format!("agents/{agent}/tools")) {
        Ok(l) => l,
        Err(e) => {
            report(Check::fail(&format!("host tools of {agent}"), format!("{e:#}"), "see choirctl logs"));
            return;
        }
    };
    for row in list.tools.iter().filter(|t| t.kind == "host" && t.status == "connected") {
        let name = format!("{agent}: {}", row.name);
        let r: anyhow::Result<serde_json::Value> =
            ctx.client.post(&format!("agents/{agent}/tools/{}/check", row.name), &serde_json::json!({}));
        match r {
            Ok(v) => report(Check::ok(&name, v["said"].as_str().unwrap_or("ok").to_owned())),
            // A tool with nothing to check (no login of its own).
            Err(e) if format!("{e:#}").contains("has nothing to check") => {}
            Err(e) => report(Check::fail(
                &name,
                format!("{e:#}"),
                format!(
                    "fix its settings or secret (choirctl secrets list), then: choirctl tools check {agent} {}",
                    row.name
                ),
            )),
        }
    }
}

fn print(c: &Check) {
    say!(
        "{:<5} {:<22} {}",
        c.outcome.label(),
        choir_common::text::one_line(&c.name),
        choir_common::text::one_line(&c.detail)
    );
    if let Some(fix) = &c.fix {
        say!("{:<5} {:<22} fix: {}", "", "", choir_common::text::one_line(fix));
    }
}
