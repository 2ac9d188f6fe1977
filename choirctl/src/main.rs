//! `choirctl`: the operator's command line for choird. Stateless: every command
//! is one or a few admin API calls over choird's Unix socket. Human-readable
//! output by default, `--json` for scripts.

#[macro_use]
mod term;
mod backup;
mod cli;
mod client;
mod console;
mod ctx;
mod doctor;
mod logs;
mod mcp;
mod offline;
mod policy;
mod proposals;
mod schedule;
mod secrets;
mod sessions;
mod skills;
mod usage;

use std::io::{BufRead, Write};
use std::path::PathBuf;

use choir_common::admin::{
    AgentList, AgentSummary, CancelRequest, ChatRequest, ChatResponse, StatusResponse, TelegramStatus,
};
use serde_json::Value;

use client::Client;
use ctx::{print_json, Ctx};

fn main() {
    if let Err(e) = real_main() {
        say_err!("choirctl: {}", choir_common::text::causes_once(e.chain()));
        std::process::exit(1);
    }
}

/// The home: --home, else $CHOIR_HOME, else ~/.choir.d; when that has no
/// admin socket and the systemd unit's home has one, that (an operator
/// running choirctl as root or as a member of the `choir` group reaches the
/// system instance without naming it).
fn home_of(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    const SYSTEM_HOME: &str = "/var/lib/choir";
    if let Some(h) = given {
        return Ok(h);
    }
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    if let Some(h) = std::env::var_os("CHOIR_HOME") {
        return Ok(PathBuf::from(h));
    }
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let own = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".choir.d"));
    let system = PathBuf::from(SYSTEM_HOME);
    let has_socket = |h: &std::path::Path| h.join("socks/choird.sock").exists();
    match own {
        Some(own) if has_socket(&own) || !has_socket(&system) => Ok(own),
        _ if has_socket(&system) => Ok(system),
        _ => anyhow::bail!("no --home given and neither CHOIR_HOME nor HOME is set"),
    }
}

fn real_main() -> anyhow::Result<()> {
    use clap::{CommandFactory, Parser};
    use cli::{
        AgentCmd, ApprovalsCmd, Command as C, McpCmd, MemoryCmd, PolicyCmd, ScheduleCmd, SecretsCmd, SkillsCmd,
        TelegramCmd, ToolsCmd,
    };
    // A usage error exits 2 with the command's usage; --help and --version 0.
    let args = cli::Cli::try_parse().unwrap_or_else(|e| e.exit());
    let json = args.json;
    // What needs neither a home nor choird.
    match &args.command {
        C::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut cli::Cli::command(), "choirctl", &mut out);
            term::out(&String::from_utf8_lossy(&out));
            return Ok(());
        }
        C::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cli::Cli::command()).render(&mut out)?;
            term::out(&String::from_utf8_lossy(&out));
            return Ok(());
        }
        _ => {}
    }
    let home = home_of(args.home)?;
    // Offline: no choird needed.
    match &args.command {
        C::Skills(SkillsCmd::Validate { path, agent }) => return skills::validate(&home, json, path, agent.as_deref()),
        C::Tools(ToolsCmd::Validate { path }) => return proposals::tools_validate(json, path),
        C::Restore { file, database_url, managed } => {
            let into = match (database_url, managed) {
                (Some(url), _) => backup::RestoreInto::Url(if url == "-" {
                    secrets::read_hidden("the database's connection string")?
                } else {
                    url.clone()
                }),
                (None, true) => backup::RestoreInto::Managed,
                (None, false) => backup::RestoreInto::AsBackedUp,
            };
            return backup::restore(json, &home, &file.to_string_lossy(), &into);
        }
        _ => {}
    }
    let stream_flag = matches!(&args.command, C::Chat { stream: true, .. });
    let stream = !json && (stream_flag || std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let ctx = Ctx { client: Client::new(&home), json, stream };
    match args.command {
        C::Status => status(&ctx),
        C::Reload => reload(&ctx),
        C::Prune => {
            let r: serde_json::Value = ctx.client.post("prune", &serde_json::json!({}))?;
            if ctx.json {
                return print_json(&r);
            }
            let list = |k: &str| r[k].as_array().cloned().unwrap_or_default();
            for i in list("removed") {
                say!("removed  {}", i.as_str().unwrap_or(""));
            }
            for i in list("kept") {
                say!("kept     {}", i.as_str().unwrap_or(""));
            }
            for i in list("left") {
                say!("left     {} (remove it yourself when you no longer need it)", i.as_str().unwrap_or(""));
            }
            if list("removed").is_empty() && list("left").is_empty() {
                say!("nothing to prune");
            }
            Ok(())
        }
        C::Resume => {
            let r: serde_json::Value = ctx.client.post("resume", &serde_json::json!({}))?;
            if ctx.json {
                return print_json(&r);
            }
            say!("{}", r["done"].as_str().unwrap_or(""));
            Ok(())
        }
        C::Backup { file, workspaces } => backup::backup(&ctx, &file.to_string_lossy(), workspaces),
        C::Doctor => {
            if !doctor::run(&ctx, &home)? {
                std::process::exit(1);
            }
            Ok(())
        }
        C::Agent(a) => match a {
            AgentCmd::List => agent_list(&ctx),
            AgentCmd::Status { id } => agent_status(&ctx, &id),
            AgentCmd::Start { id } => agent_action(&ctx, &id, "start"),
            AgentCmd::Stop { id } => agent_action(&ctx, &id, "stop"),
            AgentCmd::Restart { id } => agent_restart(&ctx, &id),
            AgentCmd::Build { id } => build(&ctx, &id, "build"),
            AgentCmd::Update { id } => build(&ctx, &id, "update"),
            AgentCmd::Cancel { id, lane } => cancel(&ctx, &id, &lane),
            AgentCmd::Events { id, after, follow } => sessions::events(&ctx, &id, after, follow),
        },
        C::Logs(l) => logs::run(
            &ctx,
            &logs::Args {
                agent: l.id.as_deref(),
                since: l.since.as_deref(),
                level: l.level.as_deref(),
                grep: l.grep.as_deref(),
                limit: l.limit,
                follow: l.follow,
            },
        ),
        C::Usage { id, since, by } => usage::run(&ctx, id.as_deref(), since.as_deref(), by.as_deref()),
        C::Schedule(s) => match *s {
            ScheduleCmd::List { id } => schedule::list(&ctx, id.as_deref()),
            ScheduleCmd::Add { id, name, job } => schedule::add(&ctx, &id, &name, &job),
            ScheduleCmd::Show { job } => {
                let words: Vec<&str> = job.iter().map(String::as_str).collect();
                let (a, n) = schedule::job_ref(&words)?;
                schedule::show(&ctx, a, n)
            }
            ScheduleCmd::Rm { job } => schedule_act(&ctx, "rm", &job),
            ScheduleCmd::Pause { job } => schedule_act(&ctx, "pause", &job),
            ScheduleCmd::Resume { job } => schedule_act(&ctx, "resume", &job),
            ScheduleCmd::RunNow { job } => schedule_act(&ctx, "run-now", &job),
        },
        C::Sessions { id, limit } => sessions::list(&ctx, id.as_deref(), limit),
        C::Approvals(a) => match a {
            ApprovalsCmd::List { status, all, agent } => {
                proposals::list(&ctx, status.as_deref(), agent.as_deref(), all)
            }
            ApprovalsCmd::Show { id } => proposals::show(&ctx, &id),
            ApprovalsCmd::Approve { id, sha256, remember_days, pin } => {
                proposals::approve(&ctx, &id, sha256, remember_days, &pin)
            }
            ApprovalsCmd::Reject { id, reason } => proposals::reject(&ctx, &id, reason),
        },
        C::Memory(m) => match m {
            MemoryCmd::Stats { id } => memory_stats(&ctx, &id),
            MemoryCmd::Search { id, text, k } => memory_search(&ctx, &id, &text.join(" "), k),
            MemoryCmd::Export { id } => {
                let out = std::io::stdout();
                ctx.client.get_to(&format!("agents/{id}/memory/export"), &mut out.lock())?;
                Ok(())
            }
        },
        C::Telegram(t) => match t {
            TelegramCmd::Status => telegram_status(&ctx),
            TelegramCmd::Pairings { all } => telegram_pairings(&ctx, all),
            TelegramCmd::Pair { bot, user, refuse } => {
                let r: serde_json::Value = ctx.client.post(
                    &format!("telegram/pairings/{bot}/{user}"),
                    &choir_common::admin::PairDecision { approve: !refuse },
                )?;
                if ctx.json {
                    return print_json(&r);
                }
                say!("{}", r["done"].as_str().unwrap_or(""));
                Ok(())
            }
        },
        C::Skills(s) => match s {
            SkillsCmd::List { id } => skills::list(&ctx, &id),
            SkillsCmd::Add { id, file, global } => skills::add(&ctx, "skill", &id, &[file.as_str()], global),
            SkillsCmd::Validate { .. } => unreachable!("done offline above"),
        },
        C::Console { port, no_forward, revoke } => console::run(&ctx, port, !no_forward, revoke),
        C::Mcp(m) => match m {
            McpCmd::Add {
                id,
                name,
                command,
                url,
                auth_secret,
                args,
                env,
                secret,
                timeout_ms,
                network,
                grant,
                global,
            } => {
                let to = match (command, url) {
                    (Some(c), _) => mcp::Reach::Command(c, mcp::Granted { network, grants: grant }),
                    (None, Some(u)) => mcp::Reach::Url(u, auth_secret),
                    (None, None) => anyhow::bail!("give --command (stdio) or --url (HTTP)"),
                };
                mcp::add(&ctx, &id, &name, to, args, &env, secret, timeout_ms, global)
            }
            McpCmd::Grant { id, name, network, grant, global } => {
                mcp::grant(&ctx, &id, &name, mcp::Granted { network, grants: grant }, global)
            }
            McpCmd::Rm { id, name, global } => mcp::rm(&ctx, &id, &name, global),
            McpCmd::Check { id, name } => mcp::check(&ctx, &id, &name),
            McpCmd::Refresh { id, name } => {
                let r: Value = ctx.client.post(&format!("agents/{id}/mcp/{name}/refresh"), &serde_json::json!({}))?;
                if ctx.json {
                    return print_json(&r);
                }
                say!("{name}: {}", term::one_line(r["found"].as_str().unwrap_or("")));
                Ok(())
            }
            McpCmd::List { id } => mcp::list(&ctx, &id, None),
            McpCmd::Show { id, name } => mcp::list(&ctx, &id, Some(&name)),
        },
        C::Tools(t) => match t {
            ToolsCmd::List { id } => tools_list(&ctx, &id),
            ToolsCmd::Add { id, manifest, executable, global } => {
                skills::add(&ctx, "tool", &id, &[manifest.as_str(), executable.as_str()], global)
            }
            ToolsCmd::Check { id, tool } => {
                let r: serde_json::Value =
                    ctx.client.post(&format!("agents/{id}/tools/{tool}/check"), &serde_json::json!({}))?;
                if ctx.json {
                    return print_json(&r);
                }
                say!("{tool}: {}", r["said"].as_str().unwrap_or("ok"));
                Ok(())
            }
            ToolsCmd::Validate { .. } => unreachable!("done offline above"),
        },
        C::Chat { id, message, .. } if message.is_empty() => chat_repl(&ctx, &id),
        C::Chat { id, message, .. } => chat_once(&ctx, &id, &message.join(" ")),
        C::Secrets(s) => match s {
            SecretsCmd::List => secrets::list(&ctx),
            SecretsCmd::Set { value, .. } if !value.is_empty() => {
                anyhow::bail!("a secret's value is read from stdin or a prompt, never from the command line (where ps and shell history keep it): echo VALUE | choirctl secrets set NAME")
            }
            SecretsCmd::Set { name, .. } => secrets::set(&ctx, &name),
            SecretsCmd::Rm { name } => secrets::rm(&ctx, &name),
        },
        C::Audit { agent, limit } => audit(&ctx, agent.as_deref(), limit),
        C::Policy(p) => match p {
            PolicyCmd::KillSwitch { state } => kill_switch(&ctx, state == "on"),
            PolicyCmd::Reload => policy::reload(&ctx),
            PolicyCmd::Show { id } => policy::show(&ctx, &id),
            PolicyCmd::Tools { id, allow, deny, remove, reset, force } => {
                policy::tools(&ctx, &id, &policy::ToolChanges { allow, deny, remove, reset, force })
            }
            PolicyCmd::Test { id, tool, args, from, after_untrusted, outside_intent } => {
                policy::test(&ctx, &id, &tool, &args, &from, policy::CallFlags { after_untrusted, outside_intent })
            }
        },
        C::Completions { .. } | C::Man | C::Restore { .. } => unreachable!("done above"),
    }
}

fn schedule_act(ctx: &Ctx, verb: &str, job: &[String]) -> anyhow::Result<()> {
    let words: Vec<&str> = job.iter().map(String::as_str).collect();
    let (a, n) = schedule::job_ref(&words)?;
    schedule::act(ctx, verb, a, n)
}

fn memory_stats(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let s: serde_json::Value = ctx.client.get(&format!("agents/{id}/memory/stats"))?;
    if ctx.json {
        return print_json(&s);
    }
    say!("agent {id}: {} item(s) in schema {}", s["items"], s["schema"].as_str().unwrap_or("?"));
    for tier in ["working", "session", "knowledge"] {
        say!("  {tier:<10} {}", s["tiers"][tier].as_i64().unwrap_or(0));
    }
    say!("pending embeddings: {}", s["pending_embeddings"]);
    let fresh = s["fresh_embeddings"].as_i64().unwrap_or(0);
    if fresh > 0 {
        say!("not yet in the vector index: {fresh} (searchable by exact scan; the memory-index thread indexes them)");
    }
    let failed = s["failed_embeddings"].as_i64().unwrap_or(0);
    if failed > 0 {
        say!("failed embeddings: {failed} (the endpoint refused them every time; set aside, not searchable)");
    }
    let index = match (s["index"]["kind"].as_str().unwrap_or("?"), s["index"]["lists"].as_u64()) {
        ("none", _) => "no vector index (exact scans)".to_owned(),
        (kind, Some(lists)) => format!("{} index, {lists} lists", kind.to_uppercase()),
        (kind, None) => format!("{} index", kind.to_uppercase()),
    };
    say!(
        "{index}: {} KiB; table with indexes: {} KiB; {}-dimensional {}",
        s["index_bytes"].as_i64().unwrap_or(0) / 1024,
        s["total_bytes"].as_i64().unwrap_or(0) / 1024,
        s["dimensions"],
        s["model"].as_str().unwrap_or("?")
    );
    Ok(())
}

fn memory_search(ctx: &Ctx, id: &str, text: &str, k: u64) -> anyhow::Result<()> {
    let q = choir_common::unix_http::query_value(text);
    let r: serde_json::Value = ctx.client.get(&format!("agents/{id}/memory/search?q={q}&k={k}"))?;
    if ctx.json {
        return print_json(&r);
    }
    let items = r["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        say!("nothing found");
    }
    for i in items {
        say!(
            "{:.4}  #{:<6} {:<9} {}",
            i["score"].as_f64().unwrap_or(0.0),
            i["id"],
            i["tier"].as_str().unwrap_or(""),
            i["content"].as_str().unwrap_or("").lines().next().unwrap_or("")
        );
    }
    Ok(())
}

fn telegram_pairings(ctx: &Ctx, all: bool) -> anyhow::Result<()> {
    let l: choir_common::admin::PairingList =
        ctx.client.get(&format!("telegram/pairings{}", if all { "?all=1" } else { "" }))?;
    if ctx.json {
        return print_json(&l);
    }
    if l.pairings.is_empty() {
        say!("no {}requests to be let in", if all { "" } else { "pending " });
        return Ok(());
    }
    say!("{:<14} {:>14} {:<20} {:<9} {:<19}  DECIDED BY", "BOT", "USER", "USERNAME", "STATUS", "ASKED");
    for p in &l.pairings {
        say!(
            "{:<14} {:>14} {:<20} {:<9} {:<19}  {}",
            p.bot,
            p.user_id,
            p.username.as_deref().map(|u| format!("@{u}")).unwrap_or_else(|| "-".into()),
            p.status,
            p.requested_at.chars().take(19).collect::<String>(),
            p.decided_by.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

fn telegram_status(ctx: &Ctx) -> anyhow::Result<()> {
    let t: TelegramStatus = ctx.client.get("telegram")?;
    if ctx.json {
        return print_json(&t);
    }
    if t.bots.is_empty() {
        say!("no Telegram bots configured (add them under \"telegram\".\"bots\" in config.json)");
        return Ok(());
    }
    say!("Bot API: {}", t.api_base);
    say!(
        "{:<14} {:<4} {:>6} {:>10} {:>8} {:>8} {:>7} {:>9} {:>9}  LAST ERROR",
        "BOT",
        "ON",
        "USERS",
        "LAST POLL",
        "UPDATES",
        "SENT",
        "ERRORS",
        "QUEUED IN",
        "QUEUED OUT"
    );
    for b in &t.bots {
        say!(
            "{:<14} {:<4} {:>6} {:>10} {:>8} {:>8} {:>7} {:>9} {:>9}  {}",
            b.bot,
            if b.enabled { "yes" } else { "no" },
            format!("{} ({}a)", b.users, b.admins),
            b.last_poll_s_ago.map(|s| format!("{s} s ago")).unwrap_or_else(|| "never".into()),
            b.updates,
            b.sent,
            b.errors,
            b.queued_updates,
            b.queued_outbox,
            b.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

fn cancel(ctx: &Ctx, id: &str, lane: &str) -> anyhow::Result<()> {
    let r: Value = ctx.client.post(&format!("agents/{id}/cancel"), &CancelRequest { lane: lane.to_owned() })?;
    if ctx.json {
        return print_json(&r);
    }
    say!("asked agent {id} to cancel {lane}; it stops at its next step");
    Ok(())
}

fn agents_table(agents: &[AgentSummary]) {
    if agents.is_empty() {
        say!("no agents configured (add one under \"agents\" in config.json)");
        return;
    }
    say!("{:<16} {:<8} {:<9} {:>8} {:>8} {:>9}  LAST EXIT", "AGENT", "RUNTIME", "STATE", "SESSION", "PID", "COMMITS");
    for a in agents {
        say!(
            "{:<16} {:<8} {:<9} {:>8} {:>8} {:>9}  {}",
            a.id,
            a.runtime,
            a.state,
            a.session_id.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            a.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            a.replicated_seq,
            term::one_line(a.last_exit.as_deref().unwrap_or("-"))
        );
    }
}

fn status(ctx: &Ctx) -> anyhow::Result<()> {
    let s: StatusResponse = ctx.client.get("status")?;
    if ctx.json {
        return print_json(&s);
    }
    say!(
        "choird {} (pid {}), up {}",
        s.version,
        s.pid,
        choir_common::text::human_duration(std::time::Duration::from_secs(s.uptime_s))
    );
    say!("home:     {}", s.home);
    say!("database: {}", s.database);
    if let Some(why) = &s.config_on_disk {
        say!("config:   {why}");
    }
    if let Some(why) = &s.held {
        say!("HELD:     {why}");
    }
    for line in &s.disk {
        say!("disk:     {line}");
    }
    if s.kill_switch {
        say!("kill switch: ON (no agent runs any tool; `choirctl policy kill-switch off` to allow again)");
    }
    say!();
    agents_table(&s.agents);
    if !s.usage.is_empty() {
        say!();
        usage_table(&s.usage);
    }
    Ok(())
}

/// `reload`: config.json and secrets.json read again, as SIGHUP does; what
/// was applied, what waits for a restart, or why it was refused (exit 1).
fn reload(ctx: &Ctx) -> anyhow::Result<()> {
    let r: choir_common::admin::ReloadReport = ctx.client.post("reload", &serde_json::json!({}))?;
    if ctx.json {
        print_json(&r)?;
    } else if r.refused.is_none() {
        let list = |v: &[String]| if v.is_empty() { "nothing".to_owned() } else { v.join(", ") };
        say!("applied now: {}", list(&r.applied));
        if !r.after_agent_restart.is_empty() {
            say!("at each agent's next start (choirctl agent restart ID): {}", list(&r.after_agent_restart));
        }
        if !r.after_choird_restart.is_empty() {
            say!("only after choird restarts (systemctl restart choird): {}", list(&r.after_choird_restart));
        }
        if r.secrets_changed {
            say!("secrets.json: changed (in use from now on)");
        }
        if r.applied.iter().any(|p| p.starts_with("agents.") && p.matches('.').count() == 1) {
            say!("a new agent with a workspace quota needs its image mounted as root first: systemctl reload choird");
        }
    }
    match r.refused {
        Some(why) => anyhow::bail!("reload refused, choird keeps running with its config: {why}"),
        None => Ok(()),
    }
}

/// Each agent's use of its quotas and budget, `used/limit` (`-` unknown,
/// `∞` unlimited).
fn usage_table(usage: &[choir_common::admin::AgentUsage]) {
    let cell = |u: &choir_common::admin::Use| {
        let used = u.used.map_or("-".to_owned(), |n| n.to_string());
        let limit = u.limit.map_or("∞".to_owned(), |n| n.to_string());
        format!("{used}/{limit}")
    };
    let bytes_cell = |u: &choir_common::admin::Use| {
        let used = u.used.map_or("-".to_owned(), choir_common::text::human_bytes);
        let limit = u.limit.map_or("∞".to_owned(), choir_common::text::human_bytes);
        format!("{used}/{limit}")
    };
    say!(
        "{:<16} {:>17} {:>17} {:>15} {:>9} {:>11} {:>21} {:>13} {:>23} {:>15}",
        "QUOTAS",
        "TOKENS TODAY",
        "TOKENS TOTAL",
        "MEMORY ITEMS",
        "PROPOSALS",
        "NOTICES/H",
        "SPOOL BYTES",
        "AUDIT/H",
        "WORKSPACE",
        "FILES"
    );
    for u in usage {
        say!(
            "{:<16} {:>17} {:>17} {:>15} {:>9} {:>11} {:>21} {:>13} {:>23} {:>15}",
            u.id,
            cell(&u.tokens_today),
            cell(&u.tokens_total),
            cell(&u.memory_items),
            cell(&u.pending_proposals),
            cell(&u.notices_this_hour),
            cell(&u.spool_bytes),
            cell(&u.audit_this_hour),
            bytes_cell(&u.workspace_bytes),
            cell(&u.workspace_inodes)
        );
    }
}

fn agent_list(ctx: &Ctx) -> anyhow::Result<()> {
    let l: AgentList = ctx.client.get("agents")?;
    if ctx.json {
        return print_json(&l);
    }
    agents_table(&l.agents);
    Ok(())
}

fn agent_status(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let a: AgentSummary = ctx.client.get(&format!("agents/{id}"))?;
    if ctx.json {
        return print_json(&a);
    }
    agents_table(std::slice::from_ref(&a));
    if let Some(c) = &a.configured_runtime {
        say!(
            "\nruns in the {} runtime; config.json now says {c}, which applies at its next start (agent restart)",
            a.runtime
        );
    }
    if let Some(s) = &a.session_state {
        say!("\nsession state: {s}");
    }
    if let Some(c) = &a.container {
        say!("container: {}", &c[..12.min(c.len())]);
    }
    if let Some(i) = &a.image {
        say!("image: {i}");
    }
    if let Some(ms) = a.last_heartbeat_ms {
        say!("last heartbeat: {ms} ms ago");
    }
    if let Some(f) = &a.fallbacks {
        say!("model fallbacks: {f}");
    }
    if !a.lanes.is_empty() {
        say!("\n{:<20} {:<16} {:>12} {:>16} {:>9}  DETAIL", "LANE", "STATE", "STEPS", "TOKENS", "ELAPSED");
        for l in &a.lanes {
            let of = |used: u64, max: Option<u64>| match max {
                Some(m) => format!("{used}/{m}"),
                None => used.to_string(),
            };
            let elapsed = l.elapsed_ms.map(|ms| format!("{} s", ms / 1000)).unwrap_or_else(|| "-".into());
            say!(
                "{:<20} {:<16} {:>12} {:>16} {:>9}  {}",
                term::one_line(&l.lane),
                term::one_line(&l.state),
                of(l.steps, l.max_steps),
                of(l.tokens, l.max_tokens),
                elapsed,
                term::one_line(l.detail.as_deref().unwrap_or(""))
            );
            if let Some(s) = &l.skill {
                say!(
                    "{:<20} skill {} in state {} ({}/{} steps)",
                    "",
                    term::one_line(&s.name),
                    term::one_line(&s.state),
                    s.steps,
                    s.max_steps
                );
            }
        }
    }
    Ok(())
}

/// `agent start|stop`. Stopping an agent that is not running is done
/// already (exit 0, as `systemctl stop` of an inactive unit).
fn agent_action(ctx: &Ctx, id: &str, action: &str) -> anyhow::Result<()> {
    let was_stopped =
        action == "stop" && ctx.client.get::<AgentSummary>(&format!("agents/{id}")).is_ok_and(|a| a.state == "stopped");
    let a: AgentSummary = ctx.client.post(&format!("agents/{id}/{action}"), &serde_json::json!({}))?;
    if ctx.json {
        return print_json(&a);
    }
    match action {
        "start" => say!("agent {} started ({}; session {})", a.id, runtime_words(&a), a.session_id.unwrap_or(0)),
        _ if was_stopped => say!("agent {} was not running; nothing to stop", a.id),
        _ => say!("agent {} stopped", a.id),
    }
    Ok(())
}

fn runtime_words(a: &AgentSummary) -> String {
    let sandbox = if a.runtime == "process" { ": UNSANDBOXED, for development" } else { "" };
    format!("{} runtime{sandbox}", a.runtime)
}

/// `agent restart`: stop (when running), then start, as `systemctl restart`
/// does; a stopped agent is started.
fn agent_restart(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let _: AgentSummary = ctx.client.post(&format!("agents/{id}/stop"), &serde_json::json!({}))?;
    let a: AgentSummary = ctx.client.post(&format!("agents/{id}/start"), &serde_json::json!({}))?;
    if ctx.json {
        return print_json(&a);
    }
    say!("agent {} restarted ({}; session {})", a.id, runtime_words(&a), a.session_id.unwrap_or(0));
    Ok(())
}

/// `agent build|update`: choird's own lines as they come; the engine's
/// build steps on one line that updates in place on a terminal (every line
/// elsewhere); with --json, one object at the end.
fn build(ctx: &Ctx, id: &str, action: &str) -> anyhow::Result<()> {
    let terminal = !ctx.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut output: Vec<String> = Vec::new();
    let mut on_step = false;
    let image = ctx.client.post_streaming(&format!("agents/{id}/{action}"), |line| {
        if ctx.json {
            output.push(line.to_owned());
            return;
        }
        if !terminal {
            say!("{line}");
            return;
        }
        let engine_detail = line.starts_with(" ---> ")
            || line.starts_with("Removing intermediate")
            || line.starts_with("Successfully")
            || line.trim().is_empty();
        if line.starts_with("Step ") {
            let shown: String = term::one_line(line).chars().take(100).collect();
            term::out(&format!("\r\x1b[K{shown}"));
            on_step = true;
        } else if !engine_detail {
            if on_step {
                term::out("\n");
                on_step = false;
            }
            say!("{line}");
        }
    })?;
    if on_step {
        term::out("\n");
    }
    if ctx.json {
        return print_json(&serde_json::json!({"agent": id, "image": image, "output": output}));
    }
    if action == "build" {
        say!("image: {image}");
    } else {
        say!("agent {id} runs {image}");
    }
    Ok(())
}

fn kill_switch(ctx: &Ctx, on: bool) -> anyhow::Result<()> {
    let v: Value = ctx.client.post("policy/kill-switch", &serde_json::json!({ "on": on }))?;
    if ctx.json {
        return print_json(&v);
    }
    if on {
        say!("kill switch ON: every agent refuses all tool calls from its next step (calls in flight finish)");
    } else {
        say!("kill switch off: tools run again");
    }
    Ok(())
}

fn chat_once(ctx: &Ctx, id: &str, message: &str) -> anyhow::Result<()> {
    if ctx.stream {
        return chat_streamed(ctx, id, message, "");
    }
    let req = ChatRequest { text: message.to_owned(), conversation: None, timeout_s: None, stream: false };
    let r: ChatResponse = ctx.client.post(&format!("agents/{id}/chat"), &req)?;
    if ctx.json {
        return print_json(&r);
    }
    say!("{}", r.reply);
    Ok(())
}

/// Prints the answer while the agent writes it: each partial extends what is
/// shown; a partial that does not (a new model step) starts a fresh line.
fn chat_streamed(ctx: &Ctx, id: &str, message: &str, prefix: &str) -> anyhow::Result<()> {
    let req = ChatRequest { text: message.to_owned(), conversation: None, timeout_s: None, stream: true };
    let mut shown = String::new();
    let mut error = None;
    let mut out = std::io::stdout();
    say_raw!("{prefix}");
    ctx.client.post_ndjson(&format!("agents/{id}/chat"), &req, |line| {
        let text = line.get("partial").or_else(|| line.get("reply")).and_then(Value::as_str).map(str::to_owned);
        if let Some(text) = text {
            match text.strip_prefix(shown.as_str()) {
                Some(rest) => say_raw!("{rest}"),
                None => say_raw!("\n{prefix}{text}"),
            }
            shown = text;
            let _ = out.flush();
        }
        if let Some(e) = line.get("error").and_then(Value::as_str) {
            error = Some(e.to_owned());
        }
    })?;
    say!();
    match error {
        Some(e) => anyhow::bail!("{e}"),
        None => Ok(()),
    }
}

fn chat_repl(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let interactive = stdin_is_terminal();
    loop {
        if interactive {
            say_raw!("you> ");
            std::io::stdout().flush()?;
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if matches!(line, "/quit" | "/exit") {
            return Ok(());
        }
        if ctx.stream {
            if let Err(e) = chat_streamed(ctx, id, line, &format!("{id}> ")) {
                say_err!("choirctl: {e:#}");
            }
            continue;
        }
        match ctx.client.post::<_, ChatResponse>(
            &format!("agents/{id}/chat"),
            &ChatRequest { text: line.to_owned(), conversation: None, timeout_s: None, stream: false },
        ) {
            Ok(r) if ctx.json => print_json(&r)?,
            Ok(r) => say!("{id}> {}", r.reply),
            Err(e) => say_err!("choirctl: {e:#}"),
        }
    }
}

fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

fn tools_list(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let list: choir_common::admin::ToolList = ctx.client.get(&format!("agents/{id}/tools"))?;
    if ctx.json {
        return print_json(&list);
    }
    let p = &list.policy;
    if p.allow.is_some() || !p.deny.is_empty() {
        let allow = p.allow.as_ref().map_or("every tool".to_owned(), |a| a.join(", "));
        say!(
            "tool policy: allow {allow}; deny {}",
            if p.deny.is_empty() { "nothing".into() } else { p.deny.join(", ") }
        );
    }
    // The API's `available` (known, but not usable until set up) reads as
    // what it means; the JSON keeps the API's words.
    let status = |s: &str| match s {
        "available" => "not set up".to_owned(),
        "system" => "ready".to_owned(),
        other => other.to_owned(),
    };
    let name_w = list.tools.iter().map(|t| t.name.chars().count()).max().unwrap_or(4).max(4);
    say!("{:<name_w$} {:<9} {:<10} {:<7} SOURCE", "TOOL", "KIND", "STATUS", "RUNS");
    for t in &list.tools {
        say!(
            "{:<name_w$} {:<9} {:<10} {:<7} {}",
            term::one_line(&t.name),
            t.kind,
            status(&t.status),
            t.runs,
            term::one_line(&t.source)
        );
        if let Some(why) = &t.why {
            say!("{:<name_w$}   why: {}", "", term::one_line(why));
        }
    }
    if list.tools.iter().any(|t| t.status == "available") {
        say!("\nnot set up: the agent knows the tool but cannot use it until what `why` names is configured");
    }
    Ok(())
}

fn audit(ctx: &Ctx, agent: Option<&str>, limit: u64) -> anyhow::Result<()> {
    let mut path = format!("audit?limit={limit}");
    if let Some(a) = agent {
        path.push_str(&format!("&agent={a}"));
    }
    let v: Value = ctx.client.get(&path)?;
    if ctx.json {
        return print_json(&v);
    }
    let records: Vec<&Value> = v["records"].as_array().into_iter().flatten().collect();
    let width = |key: &str, min: usize| {
        records.iter().map(|r| r[key].as_str().unwrap_or("-").chars().count()).max().unwrap_or(0).max(min)
    };
    let (actor, agent, action, outcome) =
        (width("actor", 5), width("agent_id", 5), width("action", 6), width("outcome", 7));
    say!("{:<23} {:<actor$} {:<agent$} {:<action$} {:<outcome$} DETAIL", "AT", "ACTOR", "AGENT", "ACTION", "OUTCOME");
    for r in records {
        let detail = match &r["detail"] {
            Value::Object(m) if m.is_empty() => String::new(),
            Value::Null => String::new(),
            d => choir_common::text::clipped(&d.to_string(), 160),
        };
        say!(
            "{:<23} {:<actor$} {:<agent$} {:<action$} {:<outcome$} {}",
            term::moment(r["at"].as_str().unwrap_or("")),
            term::one_line(r["actor"].as_str().unwrap_or("")),
            term::one_line(r["agent_id"].as_str().unwrap_or("-")),
            term::one_line(r["action"].as_str().unwrap_or("")),
            term::one_line(r["outcome"].as_str().unwrap_or("")),
            term::one_line(&detail)
        );
    }
    Ok(())
}
