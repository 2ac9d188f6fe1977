//! choirctl's command line, defined once: parsing, every command's `--help`
//! and usage line, the shell completions (`choirctl completions SHELL`) and
//! the man page (`choirctl man`) all come from these definitions.
//!
//! **Invariant:** a usage error (an unknown command or flag, a flag the
//! command does not take, a missing or malformed argument) exits 2 with the
//! command's usage line; an error doing the work exits 1 (`main`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// The operator's command line for choird.
#[derive(Debug, Parser)]
#[command(
    name = "choirctl",
    version,
    about = "The operator's command line for choird: agents, approvals, policies, logs, backups.",
    after_long_help = "\
The home is --home DIR, else $CHOIR_HOME, else ~/.choir.d; when that holds no
choird and /var/lib/choir does (the systemd unit's home), that one.

Exit status: 0 done; 1 the work failed (choird refused it, or could not be
reached; the message says why and what to do); 2 a usage error.

Every command prints for people by default and JSON with --json. Logs and
events follow with -f. `choirctl help COMMAND` shows a command's own help;
`choirctl completions bash|zsh|fish` and `choirctl man` print what `make
install` installs."
)]
pub struct Cli {
    /// The Choir home (state directory) of the choird to talk to.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Print JSON instead of text (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Every command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// choird's state, its agents, and each agent's use of its quotas and budget.
    Status,
    /// Read config.json and secrets.json again (as SIGHUP does): what applies now, what at a restart, or why it
    /// was refused (exit 1, nothing changed).
    Reload,
    /// End the hold a restore leaves (Telegram polling and the scheduler wait after a restore, so the host the
    /// backup came from and this one never poll the same bot or fire the same job); stop choird there first.
    Resume,
    /// Remove the agent images no agent needs (superseded ones, those of removed agents); list what removed
    /// agents left (workspaces, repository clones), which stays for you to remove.
    Prune,
    /// Check what a deployment needs (config, secrets, disk, sockets, Docker, PostgreSQL, model endpoints, bot
    /// tokens, host tools), naming the fix for each problem; exit 1 if something failed.
    Doctor,
    /// A consistent archive of the home: config, secrets, repos/, the database and, with --workspaces, the
    /// workspaces. FILE is new, mode 0600: it holds the secrets.
    Backup {
        /// The archive to write (must not exist; it appears only when complete), or `-` for standard output.
        file: PathBuf,
        /// Include the agents' workspaces.
        #[arg(long)]
        workspaces: bool,
    },
    /// Unpack a backup into an empty home (--home) and load its database; offline, before choird starts there.
    Restore {
        /// The archive.
        file: PathBuf,
        /// Load into the empty database at URL (`-`: read it from a prompt or stdin, out of ps and history).
        #[arg(long, value_name = "URL", conflicts_with = "managed")]
        database_url: Option<String>,
        /// Load into a new managed cluster.
        #[arg(long)]
        managed: bool,
    },
    /// Agents: list, status, start, stop, restart, build, update, cancel, events.
    #[command(subcommand)]
    Agent(AgentCmd),
    /// choird's log, or an agent's output and what choird said about it, archives included; with choird down,
    /// read from the files.
    Logs(LogsArgs),
    /// Relayed model calls, tokens and estimated cost (prices: config.json llm.prices).
    Usage {
        /// One agent only.
        id: Option<String>,
        /// From this time or age (10m, 2h, 3d, 2026-11-23).
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Group by day, model, lane, agent or job.
        #[arg(long, value_name = "GROUP")]
        by: Option<String>,
    },
    /// Scheduled jobs: list, add, show, rm, pause, resume, run-now.
    #[command(subcommand)]
    Schedule(Box<ScheduleCmd>),
    /// Every session (of one agent), newest first: start, how long, what it ran in, commits, tokens, how it ended.
    Sessions {
        /// One agent only.
        id: Option<String>,
        /// At most this many.
        #[arg(long, short = 'n', default_value_t = 100)]
        limit: u64,
    },
    /// Proposals of tools, skills, settings and calls waiting for a human.
    #[command(subcommand)]
    Approvals(ApprovalsCmd),
    /// An agent's long-term memory: stats, search, export.
    #[command(subcommand)]
    Memory(MemoryCmd),
    /// The Telegram gateway: status, pairings, pair.
    #[command(subcommand)]
    Telegram(TelegramCmd),
    /// Skills: validate (offline), list, add.
    #[command(subcommand, alias = "skill")]
    Skills(SkillsCmd),
    /// Tools: list, check, validate (offline), add.
    #[command(subcommand)]
    Tools(ToolsCmd),
    /// MCP servers: add one, list them, show one's pinned tools.
    #[command(subcommand)]
    Mcp(McpCmd),
    /// Open the operator's console: forwards a loopback port to choird's console socket while it runs and
    /// prints an address that logs you in once.
    Console {
        /// The loopback port to listen on (default: any free one).
        #[arg(long)]
        port: Option<u16>,
        /// Do not forward (you forward the socket yourself, e.g. over SSH, to --port).
        #[arg(long)]
        no_forward: bool,
        /// End every console session instead.
        #[arg(long)]
        revoke: bool,
    },
    /// Send MESSAGE and print the answer; without MESSAGE, one message per line from stdin. Exit 1 when the turn
    /// failed.
    Chat {
        /// The agent.
        id: String,
        /// The message (its words are joined by spaces).
        message: Vec<String>,
        /// Show the answer as it is written (the default on a terminal).
        #[arg(long)]
        stream: bool,
    },
    /// Secrets: list, set (from stdin or a prompt, never the command line), rm.
    #[command(subcommand)]
    Secrets(SecretsCmd),
    /// The audit trail.
    Audit {
        /// One agent only.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        /// At most this many records.
        #[arg(long, short = 'n', default_value_t = 100)]
        limit: u64,
    },
    /// Policies: kill-switch, reload, show, tools, test.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Print a shell completion script (install it where your shell looks; `make install` does).
    Completions {
        /// bash, zsh or fish.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) made from these definitions.
    Man,
}

/// `agent …`.
#[derive(Debug, Subcommand)]
pub enum AgentCmd {
    /// Configured agents.
    List,
    /// One agent: state, session, lanes.
    Status {
        /// The agent.
        id: String,
    },
    /// Start an agent (those running when choird stopped are started again when it starts).
    Start {
        /// The agent.
        id: String,
    },
    /// Stop an agent (it finishes its current message); a stopped agent is left as it is (exit 0).
    Stop {
        /// The agent.
        id: String,
    },
    /// Stop it if it runs, then start it.
    Restart {
        /// The agent.
        id: String,
    },
    /// Build the agent's image from repos/ (validates first).
    Build {
        /// The agent.
        id: String,
    },
    /// Rebuild and roll the running agent onto the new image (process runtime: restart it).
    Update {
        /// The agent.
        id: String,
    },
    /// Stop the agent's current work at its next step.
    Cancel {
        /// The agent.
        id: String,
        /// edge (its current turn or skill), core:JOB, or all.
        #[arg(default_value = "edge")]
        lane: String,
    },
    /// The agent's replicated commit log.
    Events {
        /// The agent.
        id: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Keep printing new events as they are replicated.
        #[arg(long, short = 'f')]
        follow: bool,
    },
}

/// `logs`' arguments.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// An agent: its output and what choird said about it (default: choird's own log).
    pub id: Option<String>,
    /// Keep printing new records.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// From this time or age (10m, 2h, 3d, 2026-11-23T08:00Z).
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
    /// The least severe level shown: error, warn, info, debug, trace.
    #[arg(long, value_name = "L")]
    pub level: Option<String>,
    /// Records whose message or component contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub grep: Option<String>,
    /// The newest N records.
    #[arg(long, short = 'n', visible_alias = "tail", value_name = "N")]
    pub limit: Option<u64>,
}

/// `schedule …`.
#[derive(Debug, Subcommand)]
pub enum ScheduleCmd {
    /// Scheduled jobs: when, next firing, precondition, state.
    List {
        /// One agent only.
        id: Option<String>,
    },
    /// A job run as a core job at each firing; its result goes to the chat or the log.
    Add {
        /// The agent.
        id: String,
        /// The job's name.
        name: String,
        #[command(flatten)]
        job: Box<JobArgs>,
    },
    /// The job, its next firings, the last ten with outcome, duration and tokens.
    Show {
        /// ID/NAME, or ID NAME.
        #[arg(num_args = 1..=2, required = true)]
        job: Vec<String>,
    },
    /// Remove a job.
    Rm {
        /// ID/NAME, or ID NAME.
        #[arg(num_args = 1..=2, required = true)]
        job: Vec<String>,
    },
    /// Pause a job.
    Pause {
        /// ID/NAME, or ID NAME.
        #[arg(num_args = 1..=2, required = true)]
        job: Vec<String>,
    },
    /// Resume a job (its failures reset).
    Resume {
        /// ID/NAME, or ID NAME.
        #[arg(num_args = 1..=2, required = true)]
        job: Vec<String>,
    },
    /// Fire a job now.
    RunNow {
        /// ID/NAME, or ID NAME.
        #[arg(num_args = 1..=2, required = true)]
        job: Vec<String>,
    },
}

/// `schedule add`'s job description.
#[derive(Debug, Args, Default)]
pub struct JobArgs {
    /// When: a cron expression (5 fields, or 6 with seconds first).
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    /// The cron expression's time zone (e.g. Europe/Berlin).
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// When: every DUR (90s, 30m, 2h, 1d).
    #[arg(long, value_name = "DUR")]
    pub every: Option<String>,
    /// What the job asks the agent.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Run this skill instead of a prompt.
    #[arg(long, value_name = "S")]
    pub skill: Option<String>,
    /// The skill's input (JSON).
    #[arg(long, value_name = "JSON")]
    pub input: Option<String>,
    /// The only tools the job may use (T1,T2).
    #[arg(long, value_name = "LIST")]
    pub tools: Option<String>,
    /// Most model steps.
    #[arg(long, value_name = "N")]
    pub steps: Option<String>,
    /// Most tokens.
    #[arg(long, value_name = "N")]
    pub tokens: Option<String>,
    /// Longest run (DUR).
    #[arg(long, value_name = "DUR")]
    pub wall: Option<String>,
    /// Where the result goes: tg:BOT:USER (default: the log only).
    #[arg(long, value_name = "TO")]
    pub deliver: Option<String>,
    /// Missed firings: skip or run_once.
    #[arg(long, value_name = "HOW")]
    pub missed: Option<String>,
    /// What choird looks at first (nothing new, no model call): mail, memory, file:PATH, url:URL.
    #[arg(long, value_name = "WHAT")]
    pub precondition: Option<String>,
    /// Failures in a row that pause the job.
    #[arg(long, value_name = "N")]
    pub breaker: Option<String>,
    /// The whole job as a JSON file instead of the flags.
    #[arg(long, value_name = "JOB.json")]
    pub file: Option<String>,
}

/// `approvals …`.
#[derive(Debug, Subcommand)]
pub enum ApprovalsCmd {
    /// Proposals waiting for a decision (or of status S).
    List {
        /// Only proposals of this status.
        #[arg(long, value_name = "S")]
        status: Option<String>,
        /// Every proposal, decided ones too.
        #[arg(long)]
        all: bool,
        /// One agent only.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
    },
    /// A proposal's full content and what it would change.
    Show {
        /// The proposal.
        id: String,
    },
    /// Approve and apply it; prints the sha256 of the content approved.
    Approve {
        /// The proposal.
        id: String,
        /// Approve only content with this sha256 (the one `show` printed).
        #[arg(long, value_name = "HASH")]
        sha256: Option<String>,
        /// For a call: keep its destinations as the operator's for N days (1-365).
        #[arg(long, value_name = "N")]
        remember_days: Option<u64>,
        /// For an MCP catalog: a choice for one tool, repeatable: TOOL:skip, TOOL:side_effect=read|write|external,
        /// TOOL:idempotent=true, TOOL:timeout_ms=N, TOOL:description=TEXT, TOOL:role=/POINTER=destination|target|
        /// payload|locator|inert, TOOL:lock=RESOURCE=S|X. A tool not named is pinned external, not idempotent, with
        /// no roles.
        #[arg(long, value_name = "TOOL:CHOICE")]
        pin: Vec<String>,
    },
    /// Reject it; the agent is told why.
    Reject {
        /// The proposal.
        id: String,
        /// Why (the agent is told).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
}

/// `memory …`.
#[derive(Debug, Subcommand)]
pub enum MemoryCmd {
    /// Items per tier, pending embeddings, index size.
    Stats {
        /// The agent.
        id: String,
    },
    /// The items nearest to TEXT (semantic), for debugging.
    Search {
        /// The agent.
        id: String,
        /// What to look for.
        #[arg(required = true)]
        text: Vec<String>,
        /// How many.
        #[arg(long, default_value_t = 5)]
        k: u64,
    },
    /// Every item as JSON lines (with embeddings), to stdout.
    Export {
        /// The agent.
        id: String,
    },
}

/// `telegram …`.
#[derive(Debug, Subcommand)]
pub enum TelegramCmd {
    /// Bots, last poll, queued updates and messages, errors.
    Status,
    /// Users who asked a bot (with pairing) to be let in.
    Pairings {
        /// Decided requests too.
        #[arg(long)]
        all: bool,
    },
    /// Let a user in (adds them to config.json), or refuse them.
    Pair {
        /// The bot.
        bot: String,
        /// The Telegram user id.
        user: String,
        /// Refuse instead.
        #[arg(long)]
        refuse: bool,
    },
}

/// `skills …`.
#[derive(Debug, Subcommand)]
pub enum SkillsCmd {
    /// Check a skill file, or a directory of them, as agents do at start (offline).
    Validate {
        /// A file or directory.
        path: String,
        /// Against this agent's tools too.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
    },
    /// Every skill the agent has, with status and file.
    List {
        /// The agent.
        id: String,
    },
    /// Put a skill you reviewed into repos/ as an approved proposal: validated, committed, rolled out.
    Add {
        /// The agent.
        id: String,
        /// The skill file.
        file: String,
        /// Into the global layer.
        #[arg(long)]
        global: bool,
    },
}

/// `mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpCmd {
    /// Add an MCP server (stdio) for an agent; it starts with no tool: the agent files what the server lists
    /// for your approval (choirctl approvals show).
    Add {
        /// The agent.
        id: String,
        /// The server's name in Choir (a-z, 0-9, _): its tools are mcp.NAME.TOOL.
        name: String,
        /// The server's program (stdio), an absolute path inside the agent's container (or on the host, process
        /// runtime).
        #[arg(long, value_name = "PATH", required_unless_present = "url", conflicts_with = "url")]
        command: Option<String>,
        /// The server's Streamable-HTTP endpoint (https://, or http:// to loopback), reached by choird through the
        /// agent's egress policy.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// A choird secret (secrets.json) sent to this HTTP server only, as Authorization: Bearer.
        #[arg(long, value_name = "NAME", requires = "url")]
        auth_secret: Option<String>,
        /// An argument, repeatable.
        #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
        args: Vec<String>,
        /// A plain environment variable, repeatable (its environment is otherwise cleared).
        #[arg(long, value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// A secret bound to the agent that the server receives as CHOIR_SECRET_<NAME>, repeatable.
        #[arg(long, value_name = "NAME")]
        secret: Vec<String>,
        /// Its calls' default timeout.
        #[arg(long, value_name = "MS")]
        timeout_ms: Option<u64>,
        /// A host a stdio server may reach (HOST means port 443, or HOST:PORT; names beneath it too), through
        /// choird and the agent's egress policy; repeatable. Without one it has no network.
        #[arg(long, value_name = "HOST[:PORT]", conflicts_with = "url")]
        network: Vec<String>,
        /// Grant a stdio server resources, prompts or sampling (answered by the agent's core model, charged to
        /// its budget); repeatable. Without one it has tools only.
        #[arg(long, value_name = "resources|prompts|sampling", conflicts_with = "url")]
        grant: Vec<String>,
        /// Into the global layer (every agent).
        #[arg(long)]
        global: bool,
    },
    /// Set what a stdio server is granted beyond its tools, keeping its pins (an approval you make at once, then
    /// a rollout): exactly the hosts and grants given (none given: none).
    Grant {
        /// The agent.
        id: String,
        /// The server.
        name: String,
        /// A host it may reach (HOST or HOST:PORT), repeatable.
        #[arg(long, value_name = "HOST[:PORT]")]
        network: Vec<String>,
        /// resources, prompts or sampling, repeatable.
        #[arg(long, value_name = "resources|prompts|sampling")]
        grant: Vec<String>,
        /// In the global layer.
        #[arg(long)]
        global: bool,
    },
    /// Remove a server: its tools are no longer offered (an approval you make at once, then a rollout).
    Rm {
        /// The agent.
        id: String,
        /// The server.
        name: String,
        /// From the global layer.
        #[arg(long)]
        global: bool,
    },
    /// Ask a server now: an HTTP one is reached by choird and its tools compared with the pins (exit 1 when they
    /// differ or it cannot be reached).
    Check {
        /// The agent.
        id: String,
        /// The server.
        name: String,
    },
    /// Read an HTTP server's catalog again now: a changed tool is switched off and its change filed for approval.
    Refresh {
        /// The agent.
        id: String,
        /// The server.
        name: String,
    },
    /// The agent's MCP servers, their pinned tools and the catalogs waiting for approval.
    List {
        /// The agent.
        id: String,
    },
    /// One server: its command and each pinned tool with its sha256, settings and description.
    Show {
        /// The agent.
        id: String,
        /// The server.
        name: String,
    },
}

/// `tools …`.
#[derive(Debug, Subcommand)]
pub enum ToolsCmd {
    /// Every tool the agent has: built-in, host and external, with status and where it runs.
    List {
        /// The agent.
        id: String,
    },
    /// Try a host tool's connection now (a login, a token).
    Check {
        /// The agent.
        id: String,
        /// The tool.
        tool: String,
    },
    /// Check a tool manifest, or a directory of them, as an agent does at start (offline).
    Validate {
        /// A file or directory.
        path: String,
    },
    /// Put a tool you reviewed into repos/: its manifest and its (text) executable.
    Add {
        /// The agent.
        id: String,
        /// The manifest.
        manifest: String,
        /// The executable.
        executable: String,
        /// Into the global layer.
        #[arg(long)]
        global: bool,
    },
}

/// `secrets …`.
#[derive(Debug, Subcommand)]
pub enum SecretsCmd {
    /// Every secret: set or missing, length, what uses it (never a value).
    List,
    /// Set a secret from stdin or a prompt (never the command line).
    Set {
        /// The secret's name.
        name: String,
        /// Refused: a value on the command line is kept by ps and the shell's history.
        #[arg(hide = true)]
        value: Vec<String>,
    },
    /// Remove a secret nothing uses (else says what does).
    Rm {
        /// The secret's name.
        name: String,
    },
}

/// `policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Stop (or allow again) all tool execution, for every agent.
    KillSwitch {
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Reload the argument policies; a refused file keeps the policy in force.
    Reload,
    /// The argument policy in force for an agent.
    Show {
        /// The agent.
        id: String,
    },
    /// The agent's tool policy; changes rewrite config.json and reach a running agent at once.
    Tools {
        /// The agent.
        id: String,
        /// Allow only these (P: a tool name or prefix.*).
        #[arg(long, value_name = "P")]
        allow: Vec<String>,
        /// Never these.
        #[arg(long, value_name = "P")]
        deny: Vec<String>,
        /// Take P out of both lists.
        #[arg(long, value_name = "P")]
        remove: Vec<String>,
        /// Start from no policy.
        #[arg(long)]
        reset: bool,
        /// Keep a pattern that matches none of the agent's tools (one not installed yet).
        #[arg(long)]
        force: bool,
    },
    /// The decision on TOOL called with the JSON ARGS, the rules that held and each value's provenance.
    Test {
        /// The agent.
        id: String,
        /// The tool.
        tool: String,
        /// Its arguments (JSON).
        args: String,
        /// POINTER=SOURCE[,SOURCE]: where a value came from (user, operator, trusted, untrusted).
        #[arg(long, value_name = "POINTER=SOURCES")]
        from: Vec<String>,
        /// Judge as if untrusted content had been read.
        #[arg(long)]
        after_untrusted: bool,
        /// Judge as if the tool was not part of the turn's plan.
        #[arg(long)]
        outside_intent: bool,
    },
}
