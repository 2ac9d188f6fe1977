//! Scheduled jobs and their firings in PostgreSQL (R-SCHED-1).
//!
//! **Invariant (exactly once):** a firing is a row keyed by (job, scheduled
//! time), inserted in the same transaction that moves the job's `next_due`
//! past it, under `FOR UPDATE SKIP LOCKED`: a due time is claimed once, and
//! a crash before the commit leaves it unclaimed and still due. A firing is
//! offered to one session at a time and runs only when the agent's start is
//! accepted here (`offered` → `running` for that very session), so it starts
//! at most once; one that never started is offered again (a new session, or
//! after [`REOFFER_S`]); one that started and whose session ended without an
//! outcome is recorded `interrupted`, never silently lost or rerun.

use std::time::SystemTime;

use choir_common::ids::AgentId;
use choir_common::schedule::{FiringRow, JobRow, JobSpec};
use jiff::Timestamp;
use postgres::Row;
use serde_json::Value;

use super::Store;
use crate::db::DbError;

/// A firing's job's own wall time (seconds) from its spec (`j`), when it is
/// a number within what a spec may say (1 to `spec::MAX_WALL_S`, as
/// `spec::firing_budget` reads it for the agent): a spec edited into
/// anything else reads as none instead of failing the statement — and with
/// it every poll of the agent. Nested `CASE`s: PostgreSQL does not promise
/// to test an `AND`'s sides in order, so the cast is reached only through
/// the type test.
const JOB_WALL_S: &str = "CASE WHEN jsonb_typeof(j.spec->'budget'->'wall_s') = 'number' THEN
       CASE WHEN (j.spec->'budget'->>'wall_s')::numeric BETWEEN 1 AND 86400
            THEN (j.spec->'budget'->>'wall_s')::float8 END END";

/// Seconds an offered firing waits for the agent's start before it is
/// offered again.
pub const REOFFER_S: i64 = 30;
/// Seconds past its wall-time budget after which a running firing with no
/// outcome is recorded interrupted.
pub const OVERRUN_GRACE_S: i64 = 120;
/// Firings offered to a session at once (a HEARTBEAT carries at most 64
/// reports, and the agent asks to start each offer in one).
pub const MAX_OFFERED: usize = 64;
/// Missed firings recorded one row each, per look; more are summed up in
/// the last row's detail.
pub const MAX_MISSED_ROWS: usize = 100;

/// A due job, as the claim sees it.
#[derive(Debug, Clone)]
pub struct DueJob {
    /// The job's id.
    pub id: i64,
    /// Its agent.
    pub agent: String,
    /// Its name.
    pub name: String,
    /// Its spec (as stored; the claim re-checks it).
    pub spec: Value,
    /// The due time reached.
    pub next_due: Timestamp,
}

/// What the claim does with one due job (decided by the daemon).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Due times recorded as missed, and why.
    pub missed: Vec<Timestamp>,
    /// Said of the missed rows (the last one also says how many more).
    pub missed_detail: String,
    /// The due time that runs (or is checked first), with its detail.
    pub run: Option<(Timestamp, String)>,
    /// Whether the run waits for a precondition look (`checking`).
    pub check_first: bool,
    /// The job's next due time; `None` pauses it (its schedule has ended or
    /// its spec no longer passes the checks), with `pause_reason`.
    pub next_due: Option<Timestamp>,
    /// Why the job was paused, if it was.
    pub pause_reason: Option<String>,
}

/// A firing claimed by a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The firing.
    pub id: i64,
    /// Its agent.
    pub agent: String,
    /// Whether it waits for its precondition.
    pub check_first: bool,
}

/// A firing waiting for its precondition's look.
#[derive(Debug, Clone)]
pub struct Checking {
    /// The firing.
    pub id: i64,
    /// Its agent.
    pub agent: String,
    /// The job's spec.
    pub spec: Value,
    /// The previous look's fingerprint.
    pub last: Option<String>,
}

/// A firing that ended, for the breaker and the delivery.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The firing.
    pub id: i64,
    /// Its job.
    pub job_id: i64,
    /// The agent.
    pub agent: String,
    /// The job's name.
    pub name: String,
    /// The job's spec.
    pub spec: Value,
    /// `done`, `failed`, `interrupted` or `refused`.
    pub state: String,
    /// The report or why.
    pub detail: String,
    /// Whether this ending tripped the breaker (the job is now paused).
    pub tripped: bool,
    /// Failures in a row now.
    pub failures: i32,
}

fn ts(t: Timestamp) -> SystemTime {
    SystemTime::from(t)
}

fn from_sys(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn job_row(r: &Row) -> JobRow {
    let spec: Value = r.get("spec");
    let next: Option<SystemTime> = r.get("next_due");
    JobRow {
        id: r.get("id"),
        agent: r.get("agent_id"),
        spec: serde_json::from_value::<JobSpec>(spec).unwrap_or_else(|e| broken_spec(r.get("name"), &e.to_string())),
        paused: r.get("paused"),
        paused_reason: r.get("paused_reason"),
        failures: r.get::<_, i32>("failures").max(0) as u32,
        next_due: next.map(|t| from_sys(t).to_string()),
        created_by: r.get("created_by"),
    }
}

/// A stored spec that no longer parses (written by an older choird): shown
/// with why, and never fired (the claim pauses it).
fn broken_spec(name: String, why: &str) -> JobSpec {
    JobSpec {
        name,
        cron: None,
        tz: None,
        every_s: None,
        prompt: format!("(unreadable spec: {why})"),
        skill: None,
        input: Value::Null,
        allowed_tools: None,
        budget: Default::default(),
        deliver_to: None,
        missed: Default::default(),
        precondition: None,
        breaker: 1,
    }
}

/// A firing offered to a session, with its job.
#[derive(Debug, Clone)]
pub struct Offered {
    /// The firing.
    pub id: i64,
    /// Its job.
    pub job_id: i64,
    /// The job's name.
    pub name: String,
    /// The job's spec as stored (the caller reads it).
    pub spec: Value,
}

/// A firing as `schedule show` lists it, read by [`firing_row`].
const FIRING_COLUMNS: &str = "id, scheduled_for, state, tokens, detail,
     (extract(epoch FROM finished_at - started_at) * 1000)::bigint";

fn firing_row(r: &Row) -> FiringRow {
    firing_row_from(r, 0)
}

/// [`FIRING_COLUMNS`] starting at column `at`.
fn firing_row_from(r: &Row, at: usize) -> FiringRow {
    FiringRow {
        id: r.get(at),
        scheduled_for: from_sys(r.get(at + 1)).to_string(),
        state: r.get(at + 2),
        tokens: r.get(at + 3),
        detail: r.get(at + 4),
        duration_ms: r.get(at + 5),
    }
}

const JOB_COLUMNS: &str = "id, agent_id, name, spec, paused, paused_reason, failures, next_due, created_by";

impl Store {
    /// Adds a job; `None` if the agent already has one of that name.
    pub fn add_job(
        &self,
        agent: &AgentId,
        spec: &JobSpec,
        next_due: Timestamp,
        created_by: &str,
    ) -> Result<Option<JobRow>, DbError> {
        // A struct of plain fields: serialising it cannot fail.
        let spec = serde_json::to_value(spec).unwrap_or_default();
        self.db.with(|c| {
            let row = c.query_opt(
                &format!(
                    "INSERT INTO schedule_jobs (agent_id, name, spec, next_due, created_by)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (agent_id, name) DO NOTHING RETURNING {JOB_COLUMNS}"
                ),
                &[&agent.as_str(), &spec["name"].as_str().unwrap_or_default(), &spec, &ts(next_due), &created_by],
            )?;
            Ok(row.as_ref().map(job_row))
        })
    }

    /// Jobs of one agent or all, by agent and name.
    pub fn jobs(&self, agent: Option<&AgentId>) -> Result<Vec<JobRow>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT {JOB_COLUMNS} FROM schedule_jobs WHERE $1::text IS NULL OR agent_id = $1
                     ORDER BY agent_id, name"
                ),
                &[&agent.map(AgentId::as_str)],
            )?;
            Ok(rows.iter().map(job_row).collect())
        })
    }

    /// One job.
    pub fn job(&self, agent: &AgentId, name: &str) -> Result<Option<JobRow>, DbError> {
        self.db.with(|c| {
            let row = c.query_opt(
                &format!("SELECT {JOB_COLUMNS} FROM schedule_jobs WHERE agent_id = $1 AND name = $2"),
                &[&agent.as_str(), &name],
            )?;
            Ok(row.as_ref().map(job_row))
        })
    }

    /// Removes a job and its firings' record; `false` if there was none.
    pub fn remove_job(&self, agent: &AgentId, name: &str) -> Result<bool, DbError> {
        self.db.with(|c| {
            Ok(c.execute("DELETE FROM schedule_jobs WHERE agent_id = $1 AND name = $2", &[&agent.as_str(), &name])?
                == 1)
        })
    }

    /// Pauses (`next_due` None) or resumes (with its next due time) a job;
    /// resuming clears its failures. `false` if there is no such job.
    pub fn set_job_paused(
        &self,
        agent: &AgentId,
        name: &str,
        reason: Option<&str>,
        next_due: Option<Timestamp>,
    ) -> Result<bool, DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let row = tx.query_opt(
                "UPDATE schedule_jobs SET paused = $3, paused_reason = $4, next_due = $5,
                        failures = CASE WHEN $3 THEN failures ELSE 0 END
                 WHERE agent_id = $1 AND name = $2 RETURNING id",
                &[&agent.as_str(), &name, &next_due.is_none(), &reason, &next_due.map(ts)],
            )?;
            if let (Some(row), true) = (&row, next_due.is_none()) {
                close_pending(&mut tx, row.get(0))?;
            }
            tx.commit()?;
            Ok(row.is_some())
        })
    }

    /// A firing of job `id` due `at` right now (`choirctl schedule run-now`);
    /// `false` if one for that time exists already.
    pub fn fire_now(&self, id: i64, at: Timestamp) -> Result<bool, DbError> {
        self.db.with(|c| {
            Ok(c.execute(
                "INSERT INTO schedule_firings (job_id, scheduled_for, state, detail)
                 VALUES ($1, $2, 'due', 'run now by the operator') ON CONFLICT DO NOTHING",
                &[&id, &ts(at)],
            )? == 1)
        })
    }

    /// The last `limit` firings of job `id`, newest first.
    pub fn firings(&self, id: i64, limit: i64) -> Result<Vec<FiringRow>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT {FIRING_COLUMNS} FROM schedule_firings WHERE job_id = $1
                     ORDER BY scheduled_for DESC, id DESC LIMIT $2"
                ),
                &[&id, &limit],
            )?;
            Ok(rows.iter().map(firing_row).collect())
        })
    }

    /// The last firing of each of `jobs` that has fired, in one query (the
    /// console's schedule page), by job id.
    pub fn last_firings(&self, jobs: &[i64]) -> Result<std::collections::HashMap<i64, FiringRow>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT DISTINCT ON (job_id) job_id, {FIRING_COLUMNS} FROM schedule_firings
                     WHERE job_id = ANY($1) ORDER BY job_id, scheduled_for DESC, id DESC"
                ),
                &[&jobs],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), firing_row_from(r, 1))).collect())
        })
    }

    /// The earliest due time of any running job.
    pub fn next_due_any(&self) -> Result<Option<Timestamp>, DbError> {
        self.db.with(|c| {
            let row = c.query_one("SELECT min(next_due) FROM schedule_jobs WHERE NOT paused", &[])?;
            Ok(row.get::<_, Option<SystemTime>>(0).map(from_sys))
        })
    }

    /// Claims what is due at `now`: up to `limit` jobs, each planned by
    /// `plan`, in one transaction (see the module's invariant).
    pub fn claim_due(
        &self,
        now: Timestamp,
        limit: i64,
        plan: &mut dyn FnMut(&DueJob) -> Plan,
    ) -> Result<Vec<Claimed>, DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let rows = tx.query(
                "SELECT id, agent_id, name, spec, next_due FROM schedule_jobs
                 WHERE NOT paused AND next_due <= $1 ORDER BY next_due LIMIT $2 FOR UPDATE SKIP LOCKED",
                &[&ts(now), &limit],
            )?;
            let mut claimed = Vec::new();
            for r in rows {
                let job = DueJob {
                    id: r.get(0),
                    agent: r.get(1),
                    name: r.get(2),
                    spec: r.get(3),
                    next_due: from_sys(r.get(4)),
                };
                let p = plan(&job);
                let n = p.missed.len();
                for (i, at) in p.missed.iter().enumerate() {
                    tx.execute(
                        "INSERT INTO schedule_firings (job_id, scheduled_for, state, detail)
                         VALUES ($1, $2, 'missed', $3) ON CONFLICT DO NOTHING",
                        &[&job.id, &ts(*at), &if i + 1 == n { p.missed_detail.clone() } else { String::new() }],
                    )?;
                }
                if let Some((at, detail)) = &p.run {
                    // One pending firing per job: an earlier one no agent took is missed.
                    tx.execute(
                        "UPDATE schedule_firings SET state = 'missed', detail = 'the agent was not running to take it'
                         WHERE job_id = $1 AND state IN ('due', 'checking') AND scheduled_for <> $2",
                        &[&job.id, &ts(*at)],
                    )?;
                    let state = if p.check_first { "checking" } else { "due" };
                    if let Some(row) = tx.query_opt(
                        "INSERT INTO schedule_firings (job_id, scheduled_for, state, detail)
                         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING id",
                        &[&job.id, &ts(*at), &state, detail],
                    )? {
                        claimed.push(Claimed { id: row.get(0), agent: job.agent.clone(), check_first: p.check_first });
                    }
                }
                tx.execute(
                    "UPDATE schedule_jobs SET next_due = $2, paused = $3, paused_reason = $4 WHERE id = $1",
                    &[&job.id, &p.next_due.map(ts), &p.next_due.is_none(), &p.pause_reason],
                )?;
            }
            tx.commit()?;
            Ok(claimed)
        })
    }

    /// Firings waiting for their precondition look (claimed before a crash
    /// too), with the job's spec and last fingerprint.
    pub fn checking(&self) -> Result<Vec<Checking>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "SELECT f.id, j.agent_id, j.spec, j.precondition_state FROM schedule_firings f
                 JOIN schedule_jobs j ON j.id = f.job_id WHERE f.state = 'checking' ORDER BY f.id LIMIT 1000",
                &[],
            )?;
            Ok(rows
                .iter()
                .map(|r| Checking { id: r.get(0), agent: r.get(1), spec: r.get(2), last: r.get(3) })
                .collect())
        })
    }

    /// Records a precondition's look: the firing goes on (`due`) or is
    /// `skipped`, and the job keeps the fingerprint; `state` `None` means
    /// the look failed, which ends the firing `failed` (the breaker counts
    /// it; returned).
    pub fn checked(&self, id: i64, run: bool, state: Option<&str>, detail: &str) -> Result<Option<Ended>, DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let next = match (run, state) {
                (true, _) => "due",
                (false, Some(_)) => "skipped",
                (false, None) => "failed",
            };
            // The fingerprint stays with the firing until it ends done (a
            // change is not used up by a firing that never did its work).
            let row = tx.query_opt(
                "UPDATE schedule_firings SET state = $2, detail = $3, precondition_state = $4,
                        finished_at = CASE WHEN $2 = 'due' THEN NULL ELSE now() END
                 WHERE id = $1 AND state = 'checking' RETURNING job_id",
                &[&id, &next, &detail, &state],
            )?;
            let mut ended = None;
            if let (Some(row), "failed") = (row, next) {
                ended = Some(settle(&mut tx, row.get(0), id, "failed", detail)?);
            }
            tx.commit()?;
            Ok(ended)
        })
    }

    /// Whether `agent` has firings to offer.
    pub fn has_due_firings(&self, agent: &AgentId) -> Result<bool, DbError> {
        self.db.with(|c| {
            Ok(c.query_opt(
                "SELECT 1 FROM schedule_firings f JOIN schedule_jobs j ON j.id = f.job_id
                 WHERE j.agent_id = $1 AND f.state = 'due' LIMIT 1",
                &[&agent.as_str()],
            )?
            .is_some())
        })
    }

    /// Offers up to [`MAX_OFFERED`] of `agent`'s due firings (of jobs not
    /// paused) to `session`. Each records the wall time it is offered with:
    /// its job's own, else `wall_s` (the agent's core budget now), which the
    /// overrun sweep then holds it to.
    pub fn offer_firings(&self, agent: &AgentId, session: i64, wall_s: u64) -> Result<Vec<Offered>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                &format!(
                    "UPDATE schedule_firings f SET state = 'offered', session_id = $2, offered_at = now(),
                            wall_s = coalesce({JOB_WALL_S}, $4)
                     FROM schedule_jobs j
                     WHERE f.job_id = j.id AND f.id IN (
                         SELECT f2.id FROM schedule_firings f2 JOIN schedule_jobs j2 ON j2.id = f2.job_id
                         WHERE j2.agent_id = $1 AND NOT j2.paused AND f2.state = 'due' ORDER BY f2.id LIMIT $3)
                     RETURNING f.id, j.id, j.name, j.spec"
                ),
                &[&agent.as_str(), &session, &(MAX_OFFERED as i64), &(wall_s as f64)],
            )?;
            Ok(rows
                .iter()
                .map(|r| Offered { id: r.get(0), job_id: r.get(1), name: r.get(2), spec: r.get(3) })
                .collect())
        })
    }

    /// Pauses job `job_id` of `agent` with `reason` (its spec no longer
    /// reads), by id — not by name, which a job removed and added again
    /// meanwhile would share; its firings not started end `skipped`.
    /// `false` if there is no such job of `agent`.
    pub fn pause_job_by_id(&self, agent: &AgentId, job_id: i64, reason: &str) -> Result<bool, DbError> {
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let ours = tx.query_opt(
                "SELECT 1 FROM schedule_jobs WHERE id = $2 AND agent_id = $1",
                &[&agent.as_str(), &job_id],
            )?;
            if ours.is_some() {
                pause(&mut tx, job_id, reason)?;
            }
            tx.commit()?;
            Ok(ours.is_some())
        })
    }

    /// Accepts the starts `ids` asks for: those offered to this very
    /// session move to `running`; returns them. Asked again by the same
    /// session (its first answer was lost), a start it already has is
    /// answered the same — never for another session.
    pub fn accept_firings(&self, agent: &AgentId, session: i64, ids: &[i64]) -> Result<Vec<i64>, DbError> {
        self.db.with(|c| {
            let rows = c.query(
                "UPDATE schedule_firings f SET state = 'running', started_at = coalesce(f.started_at, now())
                 FROM schedule_jobs j
                 WHERE f.job_id = j.id AND j.agent_id = $1 AND f.session_id = $2
                   AND (f.state = 'offered' OR (f.state = 'running' AND f.finished_at IS NULL))
                   AND f.id = ANY($3)
                 RETURNING f.id",
                &[&agent.as_str(), &session, &ids],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// Records the outcome of a running firing of `agent` (`done`,
    /// `failed`, `refused`); the tokens come from the cost ledger (the
    /// relay's count under the job's name while it ran). `None` if the
    /// firing is not a running one of this agent (a repeat, or forged).
    pub fn end_firing(&self, agent: &AgentId, id: i64, state: &str, detail: &str) -> Result<Option<Ended>, DbError> {
        // The tokens come from the ledger: its waiting rows first.
        self.flush_ledger_for_read();
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            let row = tx.query_opt(
                "UPDATE schedule_firings f SET state = $3, detail = $4, finished_at = now(),
                        tokens = (SELECT coalesce(sum(l.prompt_tokens + l.completion_tokens), 0)::bigint
                                  FROM llm_calls l
                                  WHERE l.agent_id = j.agent_id AND l.job = j.name
                                    AND l.at >= f.started_at AND l.at <= now())
                 FROM schedule_jobs j
                 WHERE f.job_id = j.id AND j.agent_id = $1 AND f.id = $2 AND f.state = 'running'
                 RETURNING f.job_id",
                &[&agent.as_str(), &id, &state, &detail],
            )?;
            let Some(row) = row else { return Ok(None) };
            let ended = settle(&mut tx, row.get(0), id, state, detail)?;
            tx.commit()?;
            Ok(Some(ended))
        })
    }

    /// Forgets ended firings scheduled before `before` (the record is kept
    /// [`crate::daemon::schedule::KEEP_FIRINGS_DAYS`] days); returns how many.
    pub fn prune_firings(&self, before: Timestamp) -> Result<u64, DbError> {
        self.db.with(|c| {
            c.execute(
                "DELETE FROM schedule_firings
                 WHERE scheduled_for < $1 AND state NOT IN ('checking', 'due', 'offered', 'running')",
                &[&ts(before)],
            )
        })
    }

    /// Tidies firings whose session is gone: offered ones are offered
    /// again, running ones (and those past their wall time by
    /// [`OVERRUN_GRACE_S`]) are `interrupted`: the wall time a firing was
    /// offered with (see [`Store::offer_firings`]; for one offered before
    /// that was recorded, its job's own, else a day). Returns those
    /// interrupted, the agents with firings to offer again, and whether a
    /// firing is still moving (see [`Swept::moving`]).
    pub fn sweep_firings(&self) -> Result<Swept, DbError> {
        // The tokens come from the ledger: its waiting rows first.
        self.flush_ledger_for_read();
        self.db.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute(
                "UPDATE schedule_firings f SET state = 'due', session_id = NULL
                 WHERE f.state = 'offered' AND (f.offered_at < now() - make_interval(secs => $1)
                    OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = f.session_id AND s.ended_at IS NULL))",
                &[&(REOFFER_S as f64)],
            )?;
            // Every agent with something to take is woken (also a backstop
            // for a wake-up lost on an error path).
            let agents: Vec<String> = tx
                .query(
                    "SELECT DISTINCT j.agent_id FROM schedule_firings f JOIN schedule_jobs j ON j.id = f.job_id
                     WHERE f.state = 'due' AND NOT j.paused",
                    &[],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let rows = tx.query(
                &format!("UPDATE schedule_firings f SET state = 'interrupted', finished_at = now(),
                        detail = CASE WHEN EXISTS (SELECT 1 FROM sessions s WHERE s.id = f.session_id AND s.ended_at IS NULL)
                                      THEN 'no outcome within the job''s wall time'
                                      ELSE 'the agent stopped while the job ran; not run again (it may have acted)' END,
                        tokens = (SELECT coalesce(sum(l.prompt_tokens + l.completion_tokens), 0)::bigint
                                  FROM llm_calls l WHERE l.agent_id = j.agent_id AND l.job = j.name
                                    AND l.at >= f.started_at)
                 FROM schedule_jobs j
                 WHERE f.job_id = j.id AND f.state = 'running'
                   AND (NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = f.session_id AND s.ended_at IS NULL)
                        OR f.started_at < now() - make_interval(secs =>
                              coalesce(f.wall_s, {JOB_WALL_S}, 86400) + $1))
                 RETURNING f.id, f.job_id, f.detail"),
                &[&(OVERRUN_GRACE_S as f64)],
            )?;
            let mut out = Vec::new();
            for r in rows {
                let detail: String = r.get(2);
                out.push(settle(&mut tx, r.get(1), r.get(0), "interrupted", &detail)?);
            }
            let moving: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM schedule_firings WHERE state IN ('offered', 'running'))
                         OR EXISTS (SELECT 1 FROM schedule_firings f JOIN schedule_jobs j ON j.id = f.job_id
                                    JOIN sessions s ON s.agent_id = j.agent_id AND s.ended_at IS NULL
                                    WHERE f.state = 'due' AND NOT j.paused)",
                    &[],
                )?
                .get(0);
            tx.commit()?;
            Ok(Swept { interrupted: out, wake: agents, moving })
        })
    }
}

/// What a sweep of the firings did and found.
#[derive(Debug)]
pub struct Swept {
    /// Firings it ended `interrupted`.
    pub interrupted: Vec<Ended>,
    /// Agents with firings due to offer them.
    pub wake: Vec<String>,
    /// Whether a firing is offered or running, or due for an agent that
    /// runs: the next sweep has something to watch. When none is, nothing
    /// changes until something new is claimed or offered.
    pub moving: bool,
}

/// Pauses job `job_id` with `reason`, by the scheduler (its breaker, or a
/// spec that no longer reads): no next due time, and its firings not
/// started end `skipped` ([`close_pending`]).
fn pause(tx: &mut postgres::Transaction<'_>, job_id: i64, reason: &str) -> Result<(), postgres::Error> {
    tx.execute(
        "UPDATE schedule_jobs SET paused = true, next_due = NULL, paused_reason = $2 WHERE id = $1",
        &[&job_id, &reason],
    )?;
    close_pending(tx, job_id).map(drop)
}

/// A paused job's firings not started yet end `skipped`: they never run
/// later, when the agent next starts.
fn close_pending(tx: &mut postgres::Transaction<'_>, job_id: i64) -> Result<u64, postgres::Error> {
    tx.execute(
        "UPDATE schedule_firings SET state = 'skipped', detail = 'the job was paused', finished_at = now()
         WHERE job_id = $1 AND state IN ('checking', 'due', 'offered')",
        &[&job_id],
    )
}

/// Counts an ending against the job's breaker (a success resets it; a
/// refusal — the agent was busy — counts neither way) and pauses the job
/// when it trips.
fn settle(
    tx: &mut postgres::Transaction<'_>,
    job_id: i64,
    id: i64,
    state: &str,
    detail: &str,
) -> Result<Ended, postgres::Error> {
    let row = tx.query_one(
        "UPDATE schedule_jobs SET failures = CASE WHEN $2 = 'done' THEN 0
                                                  WHEN $2 = 'refused' THEN failures ELSE failures + 1 END
         WHERE id = $1 RETURNING agent_id, name, spec, failures, paused",
        &[&job_id, &state],
    )?;
    let (agent, name, spec, failures, paused): (String, String, Value, i32, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let breaker = spec["breaker"].as_i64().unwrap_or(choir_common::schedule::DEFAULT_BREAKER as i64);
    let tripped = !paused && state != "done" && state != "refused" && i64::from(failures) >= breaker;
    if tripped {
        pause(tx, job_id, &format!("circuit breaker: {failures} failures in a row"))?;
    }
    if state == "done" {
        // The change this firing was started on is now acted on.
        tx.execute(
            "UPDATE schedule_jobs j SET precondition_state = f.precondition_state
             FROM schedule_firings f WHERE f.id = $2 AND j.id = $1 AND f.precondition_state IS NOT NULL",
            &[&job_id, &id],
        )?;
    }
    Ok(Ended { id, job_id, agent, name, spec, state: state.to_owned(), detail: detail.to_owned(), tripped, failures })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sweeps_wall_time_bound_is_the_specs() {
        let bound = format!("BETWEEN 1 AND {}", crate::schedule::spec::MAX_WALL_S);
        assert!(super::JOB_WALL_S.contains(&bound), "{}", super::JOB_WALL_S);
    }
}
