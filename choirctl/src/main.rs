//! `choirctl`: the operator's command line for choird. Stateless: every command
//! is one or a few admin API calls over choird's Unix socket. Human-readable
//! output by default, `--json` for scripts.

#[macro_use]
mod term;
mod backup;
mod client;
mod ctx;
mod doctor;
mod logs;
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

const USAGE: &str = "\
usage: choirctl [--home DIR] [--json] COMMAND

commands:
  status                        choird's state and its agents
  backup FILE [--workspaces]    a consistent archive of the home: config, secrets, repos/, the
                                database (pg_dump) and, with --workspaces, the agents' workspaces;
                                FILE is new and mode 0600 (it holds the secrets)
  restore FILE [--database-url URL | --managed]
                                unpack a backup into an empty home (--home) and load its database
                                (a new managed cluster, or database_url's empty database; or
                                the empty database at URL, or a new managed cluster, which the
                                restored config.json then names; URL - reads it from stdin, out
                                of ps and the shell's history); offline: run it before choird
                                starts there
  doctor                        check what a deployment needs (config, secrets, disk, sockets,
                                Docker and the base image, PostgreSQL and pgvector, each
                                model endpoint, embeddings, bot tokens, host tools' logins),
                                naming the fix for each problem; exits 1 if something failed
  reload                        read config.json and secrets.json again (as SIGHUP does):
                                prints what applies now, what at an agent's or choird's
                                restart, or why it was refused (exit 1, nothing changed)
  agent list                    configured agents
  agent status ID               one agent: state, session, lanes
  agent start ID                start an agent (agents running when choird stopped are
                                started again when it starts)
  agent build ID                build the agent's image from repos/ (validates first)
  agent update ID               rebuild and roll the running agent onto the new image
                                (process runtime: restart it on the installed binary)
  agent stop ID                 stop an agent (finishes its current message); a stopped
                                agent is left as it is (exit 0)
  agent restart ID              stop it if it runs, then start it
  agent events ID [--after N] [--follow]
                                the agent's replicated commit log; --follow keeps
                                printing new events as they are replicated
  logs [ID] [--follow] [--since T] [--level L] [--grep S] [--limit N]
                                choird's log, or agent ID's output and what choird said
                                about it, archives included; T: a time or an age (10m, 2h,
                                3d); L: error, warn, info, debug, trace; -f: keep printing;
                                with choird down, read from the files
  usage [ID] [--since T] [--by day|model|lane|agent|job]
                                relayed model calls, tokens and estimated cost (prices:
                                config.json llm.prices), per group and in total
  schedule list [ID]            scheduled jobs: when, next firing, precondition, state
  schedule add ID NAME (--cron EXPR [--tz ZONE] | --every DUR) --prompt TEXT
               [--skill S --input JSON] [--tools T1,T2] [--steps N] [--tokens N] [--wall DUR]
               [--deliver tg:BOT:USER] [--missed skip|run_once] [--breaker N]
               [--precondition mail|memory|file:PATH|url:URL]   (or --file JOB.json)
                                a job run as a core job at each firing (EXPR: 5 fields, or 6
                                with seconds first; DUR: 90s, 30m, 2h, 1d); its result goes
                                to the chat, or only to the log; the precondition is looked
                                at by choird first, and nothing new means no model call
  schedule show ID/NAME         the job, its next firings, the last ten with outcome,
                                duration and tokens
  schedule rm|pause|resume|run-now ID/NAME
                                remove, pause, resume (failures reset) or fire it now
  sessions [ID] [--limit N]     every session (of one agent), newest first: start, how
                                long it ran, what it ran in, commits, tokens, how it ended
  agent cancel ID [LANE]        stop the agent's current work: LANE is edge
                                (default: its current turn or skill), core:JOB, or all
  approvals list [--status S] [--all] [--agent ID]
                                proposals waiting for a decision (or of status S)
  approvals show ID             a proposal's full content and what it would change
  approvals approve ID [--sha256 HASH] [--remember-days N]
                                approve (bound to the content's sha256) and apply it; for
                                a call, --remember-days keeps its destinations as the
                                operator's for this agent for N days (1-365: no
                                confirmation for them; policy show lists them; delete one
                                from HOME/remembered/ID.json and policy reload to forget it)
  approvals reject ID --reason TEXT
                                reject it; the agent is told why
  memory stats ID               items per tier, pending embeddings, index size
  memory search ID TEXT [--k N] the items nearest to TEXT (semantic), for debugging
  memory export ID              every item as JSON lines (with embeddings), to stdout
  telegram status               the Telegram gateway: bots, last poll, queues, errors
  telegram pairings [--all]     users who asked a bot (with pairing) to be let in
  telegram pair BOT USER [--refuse]
                                let a user in (adds them to config.json), or refuse them
  skills validate PATH [--agent ID]
                                check a skill file, or a directory of them, as agents do
                                at start, offline (against the global tools, and the
                                agent's with --agent)
  skills list ID                every skill the agent has: built-in, global or agent, with
                                status (ok, invalid and why, replaced) and its file
  skills add ID FILE [--global] put a skill you reviewed into repos/ (the agent's layer, or
                                global), as an approved proposal: validated, committed
                                with git, rolled out to the running agent
  tools add ID MANIFEST EXECUTABLE [--global]
                                the same for a tool: its manifest and its (text) executable
  chat ID [MESSAGE] [--stream]  send MESSAGE and print the answer; without
                                MESSAGE, read messages line by line; the answer
                                is shown as it is written on a terminal or with
                                --stream
  tools list ID                 every tool the agent has: built-in, host (run by
                                choird) and external, with status (system,
                                available and why, connected) and where it runs
  tools check ID TOOL           try a host tool's connection now (a login, a token)
  tools validate PATH           check a tool manifest, or a directory of them, offline,
                                as an agent does at start
  secrets list                  every secret: set or missing, length, what uses it (never a value)
  secrets set NAME              set a secret from stdin or a prompt (never the command line);
                                choird uses it at once, agents bound to it when they start
  secrets rm NAME               remove a secret nothing uses (else says what does)
  audit [--agent ID] [--limit N]  the audit trail
  policy kill-switch on|off     stop (or allow again) all tool execution, for every agent
  policy reload                 reload the argument policies (repos/global/policy.json,
                                repos/agents/ID/policy.json); a refused file keeps the
                                policy in force and is named with its rule and example
  policy show ID                the argument policy in force for an agent
  policy tools ID [--allow P]... [--deny P]... [--remove P]... [--reset] [--force]
                                the agent's tool policy (P: a tool name or prefix.*);
                                changes rewrite config.json and reach a running agent
                                at once: it is never offered, and never runs, the rest
  policy test ID TOOL ARGS [--from POINTER=SOURCE[,SOURCE]]... [--after-untrusted] [--outside-intent]
                                the decision on TOOL called with the JSON ARGS, the rules
                                that held and each value's provenance (user, operator,
                                trusted, untrusted; a value not named: model); the two
                                flags judge rules about the call itself as if untrusted
                                content had been read / the tool was not part of the plan

DIR defaults to $CHOIR_HOME, then ~/.choir.d.";

fn main() {
    if let Err(e) = real_main() {
        say_err!("choirctl: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    use lexopt::prelude::*;
    let mut home: Option<PathBuf> = None;
    let mut json = false;
    let mut stream = false;
    let mut words: Vec<String> = Vec::new();
    let mut after: u64 = 0;
    let mut limit: u64 = 100;
    let mut agent_filter: Option<String> = None;
    let mut status_filter: Option<String> = None;
    let mut all = false;
    let mut sha256: Option<String> = None;
    let mut reason: Option<String> = None;
    let mut refuse = false;
    let mut k: u64 = 5;
    let mut from: Vec<String> = Vec::new();
    let mut remember_days: Option<u64> = None;
    let mut call_facts = policy::CallFlags::default();
    let mut follow = false;
    let mut limit_set = false;
    let mut tool_changes = policy::ToolChanges::default();
    let mut since: Option<String> = None;
    let mut level: Option<String> = None;
    let mut grep: Option<String> = None;
    let mut by: Option<String> = None;
    let mut workspaces = false;
    let mut restore_into = backup::RestoreInto::AsBackedUp;
    let mut global = false;
    let mut job = schedule::AddArgs::default();
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("home") => home = Some(parser.value()?.into()),
            Long("json") => json = true,
            Long("stream") => stream = true,
            Long("after") => after = parser.value()?.parse()?,
            Long("limit") => {
                limit = parser.value()?.parse()?;
                limit_set = true;
            }
            Long("allow") => tool_changes.allow.push(parser.value()?.string()?),
            Long("deny") => tool_changes.deny.push(parser.value()?.string()?),
            Long("remove") => tool_changes.remove.push(parser.value()?.string()?),
            Long("reset") => tool_changes.reset = true,
            Long("force") => tool_changes.force = true,
            Long("since") => since = Some(parser.value()?.string()?),
            Long("level") => level = Some(parser.value()?.string()?),
            Long("by") => by = Some(parser.value()?.string()?),
            Long("grep") => grep = Some(parser.value()?.string()?),
            Long("agent") => agent_filter = Some(parser.value()?.string()?),
            Long("status") => status_filter = Some(parser.value()?.string()?),
            Long("all") => all = true,
            Long("workspaces") => workspaces = true,
            Long(name @ ("database-url" | "managed")) => {
                if restore_into != backup::RestoreInto::AsBackedUp {
                    anyhow::bail!("give one of --database-url and --managed, once");
                }
                restore_into = if name == "managed" {
                    backup::RestoreInto::Managed
                } else {
                    // Never echoed: the string may hold a password.
                    let url =
                        parser.value()?.into_string().map_err(|_| anyhow::anyhow!("--database-url is not UTF-8"))?;
                    backup::RestoreInto::Url(if url == "-" {
                        secrets::read_hidden("the database's connection string")?
                    } else {
                        url
                    })
                };
            }
            Long("global") => global = true,
            Long("sha256") => sha256 = Some(parser.value()?.string()?),
            Long("remember-days") => remember_days = Some(parser.value()?.parse()?),
            Long("reason") => reason = Some(parser.value()?.string()?),
            Long("refuse") => refuse = true,
            Long("k") => k = parser.value()?.parse()?,
            Long("from") => from.push(parser.value()?.string()?),
            Long("after-untrusted") => call_facts.after_untrusted = true,
            Long("outside-intent") => call_facts.outside_intent = true,
            Long("follow") | Short('f') => follow = true,
            Long(name) if schedule::AddArgs::takes(name) => {
                let name = name.to_owned();
                job.set(&name, parser.value()?.string()?);
            }
            Long("help") | Short('h') => {
                say!("{USAGE}");
                return Ok(());
            }
            Long("version") | Short('V') => {
                say!("choirctl {}", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            Value(v) => words.push(v.string()?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    #[allow(clippy::disallowed_methods)] // The binary's edge: the only environment reads.
    let home = home
        .or_else(|| std::env::var_os("CHOIR_HOME").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".choir.d")))
        .ok_or_else(|| anyhow::anyhow!("no --home given and neither CHOIR_HOME nor HOME is set"))?;
    let stream = !json && (stream || std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    // Offline: no choird needed.
    if let ["skill" | "skills", "validate", path] = w.as_slice() {
        return skills::validate(&home, json, path, agent_filter.as_deref());
    }
    if let ["tools", "validate", path] = w.as_slice() {
        return proposals::tools_validate(json, path);
    }
    if let ["restore", file] = w.as_slice() {
        return backup::restore(json, &home, file, &restore_into);
    }
    let ctx = Ctx { client: Client::new(&home), json, stream };
    match w.as_slice() {
        ["status"] => status(&ctx),
        ["reload"] => reload(&ctx),
        ["backup", file] => backup::backup(&ctx, file, workspaces),
        ["doctor"] => {
            if !doctor::run(&ctx, &home)? {
                std::process::exit(1);
            }
            Ok(())
        }
        ["agent", "list"] => agent_list(&ctx),
        ["agent", "status", id] => agent_status(&ctx, id),
        ["agent", "start", id] => agent_action(&ctx, id, "start"),
        ["agent", "stop", id] => agent_action(&ctx, id, "stop"),
        ["agent", "restart", id] => agent_restart(&ctx, id),
        ["agent", "events", id] => sessions::events(&ctx, id, after, follow),
        ["logs"] | ["logs", _] => logs::run(
            &ctx,
            &logs::Args {
                agent: w.get(1).copied(),
                since: since.as_deref(),
                level: level.as_deref(),
                grep: grep.as_deref(),
                limit: limit_set.then_some(limit),
                follow,
            },
        ),
        ["schedule"] | ["schedule", "list"] => schedule::list(&ctx, None),
        ["schedule", "list", id] => schedule::list(&ctx, Some(id)),
        ["schedule", "add", id, name] => schedule::add(&ctx, id, name, &job),
        ["schedule", "show", rest @ ..] => {
            let (a, n) = schedule::job_ref(rest)?;
            schedule::show(&ctx, a, n)
        }
        ["schedule", verb @ ("rm" | "pause" | "resume" | "run-now"), rest @ ..] => {
            let (a, n) = schedule::job_ref(rest)?;
            schedule::act(&ctx, verb, a, n)
        }
        ["usage"] => usage::run(&ctx, None, since.as_deref(), by.as_deref()),
        ["usage", id] => usage::run(&ctx, Some(id), since.as_deref(), by.as_deref()),
        ["sessions"] => sessions::list(&ctx, None, limit),
        ["sessions", id] => sessions::list(&ctx, Some(id), limit),
        ["agent", "cancel", id] => cancel(&ctx, id, "edge"),
        ["agent", "cancel", id, lane] => cancel(&ctx, id, lane),
        ["approvals"] | ["approvals", "list"] => {
            proposals::list(&ctx, status_filter.as_deref(), agent_filter.as_deref(), all)
        }
        ["approvals", "show", id] => proposals::show(&ctx, id),
        ["memory", "stats", id] => memory_stats(&ctx, id),
        ["memory", "search", id, text @ ..] if !text.is_empty() => memory_search(&ctx, id, &text.join(" "), k),
        ["memory", "export", id] => {
            let out = std::io::stdout();
            ctx.client.get_to(&format!("agents/{id}/memory/export"), &mut out.lock())?;
            Ok(())
        }
        ["telegram", "status"] => telegram_status(&ctx),
        ["telegram", "pairings"] => telegram_pairings(&ctx, all),
        ["telegram", "pair", bot, user] => {
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
        ["approvals", "approve", id] => proposals::approve(&ctx, id, sha256, remember_days),
        ["approvals", "reject", id] => proposals::reject(&ctx, id, reason),
        ["agent", action @ ("build" | "update"), id] => build(&ctx, id, action),
        ["chat", id] => chat_repl(&ctx, id),
        ["chat", id, message @ ..] => chat_once(&ctx, id, &message.join(" ")),
        ["audit"] => audit(&ctx, agent_filter.as_deref(), limit),
        ["tools", "list", id] => tools_list(&ctx, id),
        ["skills", "list", id] => skills::list(&ctx, id),
        ["tools", "add", id, files @ ..] => skills::add(&ctx, "tool", id, files, global),
        ["skills", "add", id, files @ ..] => skills::add(&ctx, "skill", id, files, global),
        ["tools", "check", id, tool] => {
            let r: serde_json::Value =
                ctx.client.post(&format!("agents/{id}/tools/{tool}/check"), &serde_json::json!({}))?;
            if ctx.json {
                return print_json(&r);
            }
            say!("{tool}: {}", r["said"].as_str().unwrap_or("ok"));
            Ok(())
        }
        ["policy", "kill-switch", state @ ("on" | "off")] => kill_switch(&ctx, *state == "on"),
        ["policy", "reload"] => policy::reload(&ctx),
        ["secrets"] | ["secrets", "list"] => secrets::list(&ctx),
        ["secrets", "set", name] => secrets::set(&ctx, name),
        ["secrets", "set", _, _, ..] => {
            anyhow::bail!("a secret's value is read from stdin or a prompt, never from the command line (where ps and shell history keep it): echo VALUE | choirctl secrets set NAME")
        }
        ["secrets", "rm", name] => secrets::rm(&ctx, name),
        ["policy", "show", id] => policy::show(&ctx, id),
        ["policy", "tools", id] => policy::tools(&ctx, id, &tool_changes),
        ["policy", "test", id, tool, args] => policy::test(&ctx, id, tool, args, &from, call_facts),
        [] => anyhow::bail!("no command given\n{USAGE}"),
        _ => anyhow::bail!("unknown command `{}`\n{USAGE}", words.join(" ")),
    }
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

fn build(ctx: &Ctx, id: &str, action: &str) -> anyhow::Result<()> {
    let image = ctx.client.post_streaming(&format!("agents/{id}/{action}"), |line| say!("{line}"))?;
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
    say!("{:<32} {:<9} {:<10} {:<7} SOURCE", "TOOL", "KIND", "STATUS", "RUNS");
    for t in &list.tools {
        say!("{:<32} {:<9} {:<10} {:<7} {}", t.name, t.kind, t.status, t.runs, t.source);
        if let Some(why) = &t.why {
            say!("{:<32}   why: {why}", "");
        }
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
    for r in v["records"].as_array().into_iter().flatten() {
        say!(
            "{} {:<10} {:<10} {:<16} {:<12} {}",
            r["at"].as_str().unwrap_or(""),
            r["actor"].as_str().unwrap_or(""),
            r["agent_id"].as_str().unwrap_or("-"),
            r["action"].as_str().unwrap_or(""),
            r["outcome"].as_str().unwrap_or(""),
            r["detail"]
        );
    }
    Ok(())
}
