//! Scheduled jobs in the daemon (R-SCHED-1): the operator's verbs
//! (`choirctl schedule …`), the checks a job passes against its agent, the
//! scheduler thread (claim what is due, look at preconditions, tidy firings
//! whose session is gone), and the HEARTBEAT's part (offer firings, accept
//! their start, record their outcome, deliver it, trip the breaker).
//!
//! **Invariant:** a job exists only because a person made it — `choirctl
//! schedule add` (admin socket) or the approval of a `schedule` proposal
//! whose exact spec the approver saw; nothing an agent sends on its own
//! creates, changes or resumes one. A firing's outcome is accepted only for
//! a running firing of the reporting agent.

use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use choir_common::rpc::OutboundReply;
use choir_common::rpc::{FiringOffer, FiringReport};
use choir_common::schedule::{JobDetail, JobList, JobRow, JobSpec, Missed, Precondition};
use jiff::Timestamp;
use serde_json::{json, Value};

use super::{Authed, Daemon};
use crate::error::Error;
use crate::schedule::precondition;
use crate::schedule::spec::{self, When};
use crate::store::schedule::{DueJob, Ended, Plan, MAX_MISSED_ROWS};

/// A due time claimed later than this after it passed (choird was down, or
/// stopped) counts as missed and follows the job's missed-run policy.
pub const GRACE_S: i64 = 30;
/// Jobs claimed per look.
const CLAIM_BATCH: i64 = 500;
/// While a firing moves (offered, running, or due to a running agent), the
/// firings whose session is gone or whose time ran out are tidied this
/// often; a precondition look that could not be recorded is retried so.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// With nothing moving and nothing due, the scheduler reads the schedule
/// only this often (a backstop: every change to a job or a firing wakes
/// it at once), so an idle choird leaves the database alone and its pooled
/// connection closes after [`crate::db::IDLE_CLOSE`].
pub const QUIET_LOOK: Duration = Duration::from_secs(300);
/// Days the firings' record is kept.
pub const KEEP_FIRINGS_DAYS: i64 = 90;
/// How often old firings are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Firings listed by `schedule show`.
const SHOWN_FIRINGS: i64 = 10;
/// Next firings listed by `schedule show`.
const SHOWN_NEXT: usize = 5;
/// Characters of a result delivered to a chat.
const MAX_DELIVERED: usize = 3500;

impl Daemon {
    /// Checks `spec` completely for `agent`: the spec itself, then what it
    /// names against the agent — the chat it reports to (a Telegram user of
    /// one of its bots, bound to it), its tools and skill (ones the agent
    /// has), its precondition's source (mail, web, memory configured).
    pub fn check_job(&self, agent: &AgentId, spec: &JobSpec) -> Result<When, String> {
        let when = spec::check(spec)?;
        let config = self.config();
        let Some(agent_cfg) = config.agents.get(agent) else {
            return Err(format!("no agent {agent} in config.json"));
        };
        if let Some(to) = &spec.deliver_to {
            let (bot, chat) = crate::conversations::telegram_chat(to).unwrap_or_default();
            let bound = config
                .telegram
                .bots
                .get(&bot)
                .and_then(|b| b.users.get(&chat.to_string()))
                .is_some_and(|u| &u.agent == agent);
            if !bound {
                return Err(format!(
                    "deliver_to {to}: user {chat} of bot {bot} is not a Telegram user of agent {agent} (config.json \
                     telegram.bots.{bot}.users)"
                ));
            }
        }
        if spec.allowed_tools.is_some() || spec.skill.is_some() {
            let (tools, skills) =
                crate::skill_list::of_agent(self.shared(), &self.host_tools, agent).map_err(|e| e.to_string())?;
            // A tool the agent has and may use: not merely available, not off by policy.
            let has =
                |t: &str| tools.tools.iter().any(|r| r.name == t && !matches!(r.status.as_str(), "available" | "off"));
            if let Some(bad) = spec.allowed_tools.iter().flatten().find(|t| !has(t)) {
                return Err(format!("allowed_tools: agent {agent} has no tool {bad} (choirctl tools list {agent})"));
            }
            if let Some(skill) = &spec.skill {
                if !skills.skills.iter().any(|s| &s.name == skill && s.status == "ok") {
                    return Err(format!("agent {agent} has no usable skill {skill} (choirctl skills list {agent})"));
                }
            }
        }
        match &spec.precondition {
            Some(Precondition::NewMail) if agent_cfg.email.is_none() => {
                return Err(format!("a new_mail precondition needs agents.{agent}.email"))
            }
            Some(Precondition::UrlChanged { url }) => {
                let Some(web) = agent_cfg.web.as_ref() else {
                    return Err(format!("a url_changed precondition needs agents.{agent}.web (its egress policy)"));
                };
                crate::egress::Policy::new(web).check_url(url).map_err(|e| format!("precondition url: {}", e.0))?;
            }
            Some(Precondition::MemoryDue) if self.memory.is_none() => {
                return Err("a memory_due precondition needs memory (config.json memory)".into())
            }
            _ => {}
        }
        Ok(when)
    }

    /// `schedule add`: a job made by `by` (`admin`, or `approval #N`).
    pub fn schedule_add(&self, agent: &str, spec: &JobSpec, by: &str) -> Result<JobRow, Error> {
        let agent = self.known_agent(agent)?;
        let when = self.check_job(&agent, spec).map_err(Error::Invalid)?;
        let now = self.schedule.clock.now();
        let next = when.next_after(now, None).ok_or_else(|| Error::Invalid("the job never fires".into()))?;
        let row = self.store.add_job(&agent, spec, next, by)?.ok_or_else(|| {
            Error::Conflict(format!(
                "agent {agent} already has a job named {}; remove it first (choirctl schedule rm {agent}/{})",
                spec.name, spec.name
            ))
        })?;
        self.audit(
            by,
            Some(&agent),
            "schedule.add",
            "added",
            json!({"job": spec.name, "spec": spec, "next_due": next.to_string()}),
        );
        log::info!("agent {agent}: scheduled job {} added by {by}, first firing {next}", spec.name);
        self.schedule.poke();
        Ok(row)
    }

    /// `schedule list`.
    pub fn schedule_list(&self, agent: Option<&str>) -> Result<JobList, Error> {
        let agent = agent.map(|a| self.known_agent(a)).transpose()?;
        Ok(JobList { jobs: self.store.jobs(agent.as_ref())? })
    }

    fn job_of(&self, agent: &str, name: &str) -> Result<(AgentId, JobRow), Error> {
        let agent = self.known_agent(agent)?;
        let row = self
            .store
            .job(&agent, name)?
            .ok_or_else(|| Error::NotFound(format!("agent {agent} has no scheduled job {name:?}")))?;
        Ok((agent, row))
    }

    /// `schedule show`: the job, its next firings and its last ten.
    pub fn schedule_show(&self, agent: &str, name: &str) -> Result<JobDetail, Error> {
        let (_, job) = self.job_of(agent, name)?;
        let mut next = Vec::new();
        if let (Some(due), Ok(when)) = (job.next_due.as_deref(), When::of(&job.spec)) {
            let mut t: Option<Timestamp> = due.parse().ok();
            while let Some(at) = t.filter(|_| next.len() < SHOWN_NEXT) {
                next.push(match &when {
                    When::Cron(_, tz) => at.to_zoned(tz.clone()).to_string(),
                    When::Every(_) => at.to_string(),
                });
                t = when.next_after(at, Some(at));
            }
        }
        let last = self.store.firings(job.id, SHOWN_FIRINGS)?;
        Ok(JobDetail { job, next, last })
    }

    /// `schedule rm`.
    pub fn schedule_remove(&self, agent: &str, name: &str) -> Result<(), Error> {
        let (agent, _) = self.job_of(agent, name)?;
        self.store.remove_job(&agent, name)?;
        self.audit("admin", Some(&agent), "schedule.rm", "removed", json!({"job": name}));
        Ok(())
    }

    /// `schedule pause` / `resume` (resuming clears the failure count; the
    /// next firing is the first after now).
    pub fn schedule_pause(&self, agent: &str, name: &str, pause: bool) -> Result<JobRow, Error> {
        let (agent, job) = self.job_of(agent, name)?;
        let next = if pause {
            None
        } else {
            let when = self.check_job(&agent, &job.spec).map_err(Error::Invalid)?;
            Some(
                when.next_after(self.schedule.clock.now(), None)
                    .ok_or_else(|| Error::Invalid("the job never fires again".into()))?,
            )
        };
        let reason = pause.then_some("paused by the operator");
        self.store.set_job_paused(&agent, name, reason, next)?;
        let action = if pause { "schedule.pause" } else { "schedule.resume" };
        self.audit("admin", Some(&agent), action, "done", json!({"job": name}));
        self.schedule.poke();
        Ok(self.job_of(agent.as_str(), name)?.1)
    }

    /// `schedule run-now`: one firing due now (its precondition is not
    /// asked: the operator asked).
    pub fn schedule_run_now(&self, agent: &str, name: &str) -> Result<(), Error> {
        let (agent, job) = self.job_of(agent, name)?;
        if !self.store.fire_now(job.id, self.schedule.clock.now())? {
            return Err(Error::Conflict("a firing for this very time exists already".into()));
        }
        self.audit("admin", Some(&agent), "schedule.run_now", "due", json!({"job": name}));
        self.sessions.firing_due(&agent);
        // A firing moves: the scheduler's sweep watches it.
        self.schedule.poke();
        Ok(())
    }

    /// The scheduler thread: until shutdown, claims what is due, looks at
    /// preconditions, tidies firings, and sleeps until the next due time
    /// or until poked. It reads the database only when woken by a change,
    /// when a due time it knows of has come, every [`SWEEP_EVERY`] while a
    /// firing moves, and every [`QUIET_LOOK`] otherwise.
    pub fn run_scheduler(&self) {
        // Preconditions are looked at on their own thread: a slow look (a
        // URL or a mail server taking its time) never delays a claim.
        std::thread::scope(|s| {
            let looker = std::thread::Builder::new().name("schedule-looks".into()).spawn_scoped(s, || {
                // Looks when poked (a claim made a firing wait for its
                // look), every SWEEP_EVERY while the last pass found some
                // (one whose outcome could not be recorded is retried), and
                // every QUIET_LOOK else; a nap ends early on a clock's cap.
                let (mut poked, mut found, mut last) = (true, true, Instant::now());
                while !self.schedule.stopping() {
                    if self.held().is_some() {
                        poked |= self.schedule.nap_looks(SWEEP_EVERY);
                        continue;
                    }
                    let pace = if found { SWEEP_EVERY } else { QUIET_LOOK };
                    if poked || last.elapsed() >= pace {
                        let now = self.schedule.clock.now();
                        found = guarded("precondition looks", || self.look_at_preconditions(now)).unwrap_or(true);
                        last = Instant::now();
                    }
                    let pace = if found { SWEEP_EVERY } else { QUIET_LOOK };
                    poked = self.schedule.nap_looks(pace.saturating_sub(last.elapsed()));
                }
            });
            if let Err(e) = looker {
                log::error!("scheduler: cannot start the precondition thread: {e}");
            }
            self.claim_loop();
        });
    }

    fn claim_loop(&self) {
        let mut last_sweep: Option<Instant> = None;
        let mut last_prune: Option<Instant> = None;
        // What the last read of the schedule found, and when it was made
        // (`None`: read at the next turn).
        let mut next_due: Option<Timestamp> = None;
        let mut last_read: Option<Instant> = None;
        // Whether the last sweep found a firing to watch (at start: look).
        let mut moving = true;
        let mut poked = true;
        while !self.schedule.stopping() {
            let now = self.schedule.clock.now();
            // Held after a restore: nothing fires until `choirctl resume`
            // (firings missed meanwhile follow each job's `missed` rule).
            if self.held().is_some() {
                poked |= self.schedule.nap(SWEEP_EVERY);
                continue;
            }
            let due = next_due.is_some_and(|t| t <= now);
            // A failed claim or read is tried again in a second, not at once.
            let mut failed = false;
            if poked || due || last_read.is_none_or(|t| t.elapsed() >= QUIET_LOOK) {
                failed = guarded("claim", || {
                    self.claim_due(now)
                        .inspect_err(|e| log::warn!("scheduler: claiming due firings failed (will retry): {e}"))
                        .is_err()
                })
                .unwrap_or(true);
                // A claim may have made firings due: the sweep watches them.
                moving = true;
                match self.store.next_due_any() {
                    Ok(t) => (next_due, last_read) = (t, Some(Instant::now())),
                    Err(e) => {
                        log::warn!("scheduler: reading the next due time failed (will retry): {e}");
                        (failed, last_read) = (true, None);
                    }
                }
            }
            let sweep_every = if moving { SWEEP_EVERY } else { QUIET_LOOK };
            if poked || last_sweep.is_none_or(|t| t.elapsed() >= sweep_every) {
                last_sweep = Some(Instant::now());
                match self.store.sweep_firings() {
                    Ok(swept) => {
                        swept.interrupted.iter().for_each(|e| self.firing_ended(e));
                        for agent in swept.wake.iter().filter_map(|a| AgentId::parse(a).ok()) {
                            self.sessions.firing_due(&agent);
                        }
                        moving = swept.moving;
                    }
                    Err(e) => log::warn!("scheduler: tidying firings failed: {e}"),
                }
            }
            if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(Instant::now());
                let before = now.checked_sub(jiff::SignedDuration::from_hours(24 * KEEP_FIRINGS_DAYS)).unwrap_or(now);
                match self.store.prune_firings(before) {
                    Ok(n) if n > 0 => log::info!("scheduler: forgot {n} firing(s) older than {KEEP_FIRINGS_DAYS} days"),
                    Ok(_) => {}
                    Err(e) => log::warn!("scheduler: forgetting old firings failed: {e}"),
                }
            }
            let until = if failed {
                Duration::from_secs(1)
            } else {
                next_due.map_or(QUIET_LOOK, |t| When::until(self.schedule.clock.now(), t))
            };
            let until = until.min(if moving { SWEEP_EVERY } else { QUIET_LOOK });
            poked = self.schedule.nap(self.schedule.clock.nap(until));
        }
    }

    fn claim_due(&self, now: Timestamp) -> Result<(), Error> {
        loop {
            let claimed = self.store.claim_due(now, CLAIM_BATCH, &mut |job| self.plan(job, now))?;
            let n = claimed.len();
            for c in claimed.iter().filter(|c| !c.check_first) {
                if let Ok(agent) = AgentId::parse(&c.agent) {
                    self.sessions.firing_due(&agent);
                }
            }
            if claimed.iter().any(|c| c.check_first) {
                self.schedule.poke_looks();
            }
            if (n as i64) < CLAIM_BATCH {
                return Ok(());
            }
        }
    }

    /// What happens to one due job at `now` (see [`Plan`]).
    fn plan(&self, job: &DueJob, now: Timestamp) -> Plan {
        let checked = serde_json::from_value::<JobSpec>(job.spec.clone())
            .map_err(|e| format!("its stored spec no longer reads: {e}"))
            .and_then(|s| When::of(&s).map(|w| (s, w)));
        let (spec, when) = match checked {
            Ok(x) => x,
            Err(why) => {
                log::warn!("agent {}: scheduled job {} paused: {why}", job.agent, job.name);
                return Plan { pause_reason: Some(why), ..Plan::default() };
            }
        };
        let (dues, more) = when.due(job.next_due, now, MAX_MISSED_ROWS + 1);
        let newest = when.latest(now, job.next_due).unwrap_or(job.next_due);
        let late = now.as_second() - newest.as_second() > GRACE_S;
        let mut missed: Vec<Timestamp> = dues.into_iter().filter(|t| *t != newest).collect();
        let run = if !late {
            Some((newest, String::new()))
        } else if spec.missed == Missed::RunOnce {
            let n = missed.len() as u64 + more + 1;
            Some((newest, format!("catch-up: runs once for {n} firing(s) missed while choird was not running")))
        } else {
            missed.push(newest);
            None
        };
        missed.sort();
        missed.dedup();
        let missed_detail = if more > 0 {
            format!("choird was not running at this time (and {more} more firings not listed)")
        } else {
            "choird was not running at this time".to_owned()
        };
        let next_due = when.next_after(now, Some(newest));
        Plan {
            missed,
            missed_detail,
            run,
            check_first: spec.precondition.is_some(),
            pause_reason: next_due.is_none().then(|| "its schedule has no later firing".to_owned()),
            next_due,
        }
    }

    /// Looks at the preconditions of firings claimed with one; whether
    /// there were any (or they could not be listed): then it looks again
    /// soon.
    fn look_at_preconditions(&self, now: Timestamp) -> bool {
        let pending = match self.store.checking() {
            Ok(p) => p,
            Err(e) => {
                log::warn!("scheduler: cannot list firings to check: {e}");
                return true;
            }
        };
        let found = !pending.is_empty();
        for crate::store::schedule::Checking { id, agent, spec, last } in pending {
            let (Ok(agent), Ok(spec)) = (AgentId::parse(&agent), serde_json::from_value::<JobSpec>(spec)) else {
                let _ = self.store.checked(id, false, None, "the job's agent or spec no longer reads");
                continue;
            };
            let Some(pre) = &spec.precondition else {
                let _ = self.store.checked(id, true, None, "");
                self.sessions.firing_due(&agent);
                self.schedule.poke();
                continue;
            };
            let result = precondition::look(self.shared(), &agent, pre, last.as_deref(), now);
            // A failed look ends the firing failed: the breaker counts it.
            let recorded = match &result {
                Ok(look) => self.store.checked(id, look.run, Some(&look.state), &look.detail),
                Err(why) => self.store.checked(id, false, None, &format!("precondition failed: {why}")),
            };
            match (recorded, result) {
                (Err(e), _) => log::warn!("scheduler: firing {id}: cannot record its precondition: {e}"),
                (Ok(_), Ok(look)) if look.run => {
                    self.sessions.firing_due(&agent);
                    // Due now: the scheduler's sweep watches it on.
                    self.schedule.poke();
                }
                (Ok(_), Ok(look)) => log::debug!("agent {agent}: job {}: {}", spec.name, look.detail),
                (Ok(ended), Err(why)) => {
                    log::warn!("agent {agent}: job {}: precondition failed: {why}", spec.name);
                    if let Some(ended) = ended {
                        self.firing_ended(&ended);
                    }
                }
            }
        }
        found
    }

    /// The HEARTBEAT's firing reports: `starting` asks to start (the ids
    /// accepted are returned), the rest record outcomes.
    pub fn firing_reports(&self, who: &Authed, reports: &[FiringReport]) -> Result<Vec<i64>, Error> {
        let starting: Vec<i64> = reports.iter().filter(|r| r.state == "starting").map(|r| r.id).collect();
        let accepted = if starting.is_empty() {
            Vec::new()
        } else {
            self.store.accept_firings(&who.agent, who.session, &starting)?
        };
        for r in reports.iter().filter(|r| r.state != "starting") {
            if !matches!(r.state.as_str(), "done" | "failed" | "refused") {
                return Err(Error::Malformed(format!(
                    "firing state {:?} is not one of starting, done, failed, refused",
                    choir_common::text::clipped(&r.state, 40)
                )));
            }
            // Kept with its lines (it is the job's report, delivered as a
            // message); escaped wherever it is shown inside a line.
            let (detail, _) = choir_common::text::cap_with_note(&choir_common::text::nul_escaped(&r.detail), 4000);
            match self.store.end_firing(&who.agent, r.id, &r.state, &detail)? {
                Some(ended) => self.firing_ended(&ended),
                None => log::warn!("agent {}: report on firing {} that is not running; ignored", who.agent, r.id),
            }
        }
        Ok(accepted)
    }

    /// The firings to hand to `who` now.
    pub fn offer_firings(&self, who: &Authed) -> Result<Vec<FiringOffer>, Error> {
        let config = self.config();
        let core = config.agents.get(&who.agent).map(|a| a.core_budget).unwrap_or_default();
        let offered = self.store.offer_firings(&who.agent, who.session, core.wall_s)?;
        if !offered.is_empty() {
            // Offered firings move: the scheduler's sweep watches them
            // (a session that ends before their outcome, an offer not taken).
            self.schedule.poke();
        }
        if offered.len() >= crate::store::schedule::MAX_OFFERED {
            // More wait: the next poll takes them.
            self.sessions.firings_still_due(&who.agent);
        }
        Ok(offered
            .into_iter()
            .filter_map(|o| {
                let spec: JobSpec = match serde_json::from_value(o.spec) {
                    Ok(spec) => spec,
                    Err(e) => {
                        self.unreadable_at_offer(&who.agent, o.job_id, &o.name, &e);
                        return None;
                    }
                };
                Some(FiringOffer {
                    id: o.id,
                    job: o.name,
                    prompt: spec.prompt,
                    skill: spec.skill,
                    input: spec.input,
                    allowed_tools: spec.allowed_tools,
                    budget: crate::schedule::spec::firing_budget(&spec.budget, &core),
                })
            })
            .collect())
    }

    /// A job whose stored spec stopped reading between its claim and its
    /// offer (an upgrade that reads specs more strictly, an edit in the
    /// database): paused with the reason, as the claim pauses one, so its
    /// firing ends `skipped` instead of being offered again every
    /// [`REOFFER_S`](crate::store::schedule::REOFFER_S) seconds to an agent
    /// that is never handed it.
    fn unreadable_at_offer(&self, agent: &AgentId, job_id: i64, name: &str, e: &serde_json::Error) {
        // serde quotes the offending value, which may be long.
        let why = format!("its stored spec no longer reads: {}", choir_common::text::clipped(&e.to_string(), 300));
        log::warn!("agent {agent}: scheduled job {name} paused: {why}");
        match self.store.pause_job_by_id(agent, job_id, &why) {
            Ok(true) => {
                self.audit("scheduler", Some(agent), "schedule.pause", "paused", json!({"job": name, "why": why}))
            }
            Ok(false) => {}
            Err(e) => log::warn!("agent {agent}: scheduled job {name}: pausing it failed: {e}"),
        }
    }

    /// After a firing ended: audit, deliver its result to the job's chat,
    /// and tell the admins if the breaker tripped.
    fn firing_ended(&self, e: &Ended) {
        let Ok(agent) = AgentId::parse(&e.agent) else { return };
        self.audit(
            "scheduler",
            Some(&agent),
            "schedule.firing",
            &e.state,
            json!({"job": e.name, "firing": e.id, "failures": e.failures}),
        );
        log::info!("agent {agent}: scheduled job {} firing {} ended {}", e.name, e.id, e.state);
        let to = e.spec["deliver_to"].as_str().map(str::to_owned);
        if let (Some(conversation), "done" | "failed" | "interrupted") = (to, e.state.as_str()) {
            let text = match e.state.as_str() {
                "done" => format!("[{}] {}", e.name, e.detail),
                other => format!("[{}] {other}: {}", e.name, e.detail),
            };
            let reply = OutboundReply {
                in_reply_to: 0,
                covers: Vec::new(),
                key: format!("firing-{}", e.id),
                conversation: conversation.clone(),
                // The report's lines stay lines; control and bidi characters
                // are escaped; a long report is cut, with a note saying so.
                text: choir_common::text::cap_with_note(&choir_common::text::clean(&text), MAX_DELIVERED).0,
                failed: false,
            };
            match self.store.record_replies(&agent, &[reply], 0, self.delivery.as_ref()) {
                Ok(r) => {
                    for conversation in r.delivered {
                        self.events.send(crate::events::Event::Answered { agent: agent.clone(), conversation });
                    }
                    if !r.refused.is_empty() {
                        log::warn!(
                            "agent {agent}: job {}: {conversation} never wrote to the agent; the result stays in the log",
                            e.name
                        );
                    }
                }
                Err(err) => log::warn!("agent {agent}: job {}: result not delivered: {err}", e.name),
            }
        }
        if e.tripped {
            let text = format!(
                "Scheduled job {} of agent {agent} is paused: {} failures in a row (last: {}). Resume it with \
                 choirctl schedule resume {agent}/{} once it is fixed.",
                e.name,
                e.failures,
                choir_common::text::clipped(&e.detail, 300),
                e.name
            );
            log::warn!("{text}");
            self.audit(
                "scheduler",
                Some(&agent),
                "schedule.breaker",
                "paused",
                json!({"job": e.name, "failures": e.failures}),
            );
            self.events.send(crate::events::Event::ScheduleNotice { agent, text });
        }
    }
}

/// Runs one pass of the scheduler; a panic in it is logged and the thread
/// goes on (scheduling must not stop silently while choird serves).
fn guarded<T>(what: &str, pass: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(pass)) {
        Ok(out) => Some(out),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log::error!("scheduler: the {what} pass panicked ({why}); going on");
            None
        }
    }
}

/// Firing reports one HEARTBEAT may carry.
pub const MAX_FIRING_REPORTS: usize = 64;

/// Refuses a HEARTBEAT's firing reports before anything of it is stored:
/// more than [`MAX_FIRING_REPORTS`], or a state that does not exist.
pub fn check_firing_reports(reports: &[FiringReport]) -> Result<(), Error> {
    if reports.len() > MAX_FIRING_REPORTS {
        return Err(Error::Malformed(format!(
            "{} firing reports in one HEARTBEAT; at most {MAX_FIRING_REPORTS}",
            reports.len()
        )));
    }
    if let Some(r) = reports.iter().find(|r| !matches!(r.state.as_str(), "starting" | "done" | "failed" | "refused")) {
        return Err(Error::Malformed(format!(
            "firing state {:?} is not one of starting, done, failed, refused",
            choir_common::text::clipped(&r.state, 40)
        )));
    }
    Ok(())
}

/// The `{"job": spec}` of a schedule proposal, parsed.
pub fn proposed_spec(content: &Value) -> Result<JobSpec, String> {
    serde_json::from_value(content["job"].clone()).map_err(|e| format!("the proposed job does not read: {e}"))
}
