//! `choirctl schedule …`: scheduled jobs (R-SCHED-1). A job is
//! named `AGENT/NAME`; `add` builds its spec from flags (or `--file` with a
//! whole JSON spec) and choird checks it completely before storing it.

use choir_common::schedule::{JobBudget, JobDetail, JobList, JobRow, JobSpec, Missed, Precondition};
use serde_json::Value;

use crate::ctx::{print_json, Ctx};
use crate::term::one_line;

/// The flags of `schedule add`, as the command line defines them.
pub use crate::cli::JobArgs as AddArgs;

impl AddArgs {
    /// The spec of job `name`.
    fn spec(&self, name: &str) -> anyhow::Result<JobSpec> {
        if let Some(file) = &self.file {
            let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("cannot read {file}: {e}"))?;
            let mut v: Value = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
            v["name"] = Value::String(name.to_owned());
            return serde_json::from_value(v).map_err(|e| anyhow::anyhow!("{file}: {e}"));
        }
        let num = |v: &Option<String>, what: &str| -> anyhow::Result<Option<u64>> {
            v.as_deref()
                .map(|s| s.parse::<u64>().map_err(|_| anyhow::anyhow!("--{what} wants a number, not {s:?}")))
                .transpose()
        };
        let precondition = match self.precondition.as_deref() {
            None => None,
            Some("mail" | "new_mail") => Some(Precondition::NewMail),
            Some("memory" | "memory_due") => Some(Precondition::MemoryDue),
            Some(p) => match p.split_once(':') {
                Some(("file", path)) => Some(Precondition::FileChanged { path: path.to_owned() }),
                Some(("url", _)) => Some(Precondition::UrlChanged { url: p["url:".len()..].to_owned() }),
                _ => anyhow::bail!("--precondition is mail, memory, file:PATH or url:URL, not {p:?}"),
            },
        };
        Ok(JobSpec {
            name: name.to_owned(),
            cron: self.cron.clone(),
            tz: self.tz.clone(),
            every_s: self.every.as_deref().map(seconds).transpose()?,
            prompt: self.prompt.clone().unwrap_or_default(),
            skill: self.skill.clone(),
            input: match &self.input {
                Some(s) => serde_json::from_str(s).map_err(|e| anyhow::anyhow!("--input is not JSON: {e}"))?,
                None => Value::Null,
            },
            allowed_tools: self
                .tools
                .as_deref()
                .map(|t| t.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect()),
            budget: JobBudget {
                steps: num(&self.steps, "steps")?,
                tokens: num(&self.tokens, "tokens")?,
                wall_s: self.wall.as_deref().map(seconds).transpose()?,
            },
            deliver_to: self.deliver.clone(),
            missed: match self.missed.as_deref() {
                None | Some("skip") => Missed::Skip,
                Some("run_once" | "run-once") => Missed::RunOnce,
                Some(m) => anyhow::bail!("--missed is skip or run_once, not {m:?}"),
            },
            precondition,
            breaker: num(&self.breaker, "breaker")?
                .map(|b| u32::try_from(b).unwrap_or(u32::MAX))
                .unwrap_or(choir_common::schedule::DEFAULT_BREAKER),
        })
    }
}

/// `90`, `90s`, `30m`, `2h`, `1d` → seconds.
fn seconds(s: &str) -> anyhow::Result<u64> {
    let (n, unit) = s.trim().split_at(s.trim().find(|c: char| !c.is_ascii_digit()).unwrap_or(s.trim().len()));
    let n: u64 = n.parse().map_err(|_| anyhow::anyhow!("{s:?} is not a duration (90s, 30m, 2h, 1d)"))?;
    let mul = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => anyhow::bail!("{s:?} is not a duration (90s, 30m, 2h, 1d)"),
    };
    n.checked_mul(mul).ok_or_else(|| anyhow::anyhow!("{s:?} is too long"))
}

/// `AGENT/NAME` (or `AGENT NAME` given as two words).
pub fn job_ref<'a>(words: &[&'a str]) -> anyhow::Result<(&'a str, &'a str)> {
    match words {
        [one] => one.split_once('/').ok_or_else(|| anyhow::anyhow!("name the job as AGENT/NAME, not {one:?}")),
        [agent, name] => Ok((agent, name)),
        _ => anyhow::bail!("name one job, as AGENT/NAME"),
    }
}

fn when(spec: &JobSpec) -> String {
    match (&spec.cron, spec.every_s) {
        (Some(c), _) => format!("{c} ({})", spec.tz.as_deref().unwrap_or("UTC")),
        (_, Some(s)) => format!("every {s}s"),
        _ => "-".into(),
    }
}

fn state(job: &JobRow) -> String {
    if job.paused {
        format!("paused: {}", job.paused_reason.as_deref().unwrap_or("-"))
    } else if job.failures > 0 {
        format!("active ({} failures in a row)", job.failures)
    } else {
        "active".into()
    }
}

/// `schedule add AGENT NAME …`.
pub fn add(ctx: &Ctx, agent: &str, name: &str, args: &AddArgs) -> anyhow::Result<()> {
    let spec = args.spec(name)?;
    let row: JobRow = ctx.client.post(&format!("agents/{agent}/schedule"), &spec)?;
    if ctx.json {
        return print_json(&row);
    }
    say!(
        "scheduled {}/{}: {}, next firing {}",
        row.agent,
        row.spec.name,
        when(&row.spec),
        row.next_due.as_deref().unwrap_or("-")
    );
    Ok(())
}

/// `schedule list [AGENT]`.
pub fn list(ctx: &Ctx, agent: Option<&str>) -> anyhow::Result<()> {
    let path = match agent {
        Some(a) => format!("schedule?agent={}", choir_common::ids::AgentId::parse(a)?),
        None => "schedule".into(),
    };
    let list: JobList = ctx.client.get(&path)?;
    if ctx.json {
        return print_json(&list);
    }
    if list.jobs.is_empty() {
        say!("no scheduled jobs");
        return Ok(());
    }
    say!("{:<28} {:<26} {:<26} {:<12} STATE", "JOB", "WHEN", "NEXT", "PRECONDITION");
    for j in &list.jobs {
        say!(
            "{:<28} {:<26} {:<26} {:<12} {}",
            one_line(&format!("{}/{}", j.agent, j.spec.name)),
            one_line(&when(&j.spec)),
            j.next_due.as_deref().unwrap_or("-"),
            one_line(&j.spec.precondition.as_ref().map_or("-".into(), Precondition::describe)),
            one_line(&state(j))
        );
    }
    Ok(())
}

/// `schedule show AGENT/NAME`.
pub fn show(ctx: &Ctx, agent: &str, name: &str) -> anyhow::Result<()> {
    let d: JobDetail = ctx.client.get(&format!("agents/{agent}/schedule/{name}"))?;
    if ctx.json {
        return print_json(&d);
    }
    let j = &d.job;
    say!("job        {}/{}", j.agent, j.spec.name);
    say!("when       {}", one_line(&when(&j.spec)));
    say!("state      {}", one_line(&state(j)));
    say!("made by    {}", one_line(&j.created_by));
    say!("prompt     {}", one_line(&j.spec.prompt));
    if let Some(s) = &j.spec.skill {
        say!("skill      {} {}", one_line(s), one_line(&j.spec.input.to_string()));
    }
    if let Some(t) = &j.spec.allowed_tools {
        say!("tools      {}", one_line(&t.join(", ")));
    }
    say!("missed     {}", j.spec.missed.as_str());
    say!("breaker    {} failures in a row", j.spec.breaker);
    say!("deliver to {}", one_line(j.spec.deliver_to.as_deref().unwrap_or("the log only")));
    if let Some(p) = &j.spec.precondition {
        say!("precondition {}", one_line(&p.describe()));
    }
    say!("next       {}", if d.next.is_empty() { "-".into() } else { d.next.join(", ") });
    say!("");
    say!("{:<22} {:<12} {:>10} {:>8}  DETAIL", "SCHEDULED FOR", "OUTCOME", "DURATION", "TOKENS");
    for f in &d.last {
        say!(
            "{:<22} {:<12} {:>10} {:>8}  {}",
            f.scheduled_for,
            f.state,
            f.duration_ms.map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0)),
            f.tokens.map_or("-".into(), |t| t.to_string()),
            one_line(&choir_common::text::clipped(&f.detail, 100))
        );
    }
    Ok(())
}

/// `schedule rm|pause|resume|run-now AGENT/NAME`.
pub fn act(ctx: &Ctx, verb: &str, agent: &str, name: &str) -> anyhow::Result<()> {
    let path = format!("agents/{agent}/schedule/{name}");
    let v: Value = match verb {
        "rm" => ctx.client.delete(&path)?,
        _ => ctx.client.post(&format!("{path}/{verb}"), &serde_json::json!({}))?,
    };
    if ctx.json {
        return print_json(&v);
    }
    match verb {
        "rm" => say!("removed {agent}/{name}"),
        "pause" => say!("paused {agent}/{name}"),
        "resume" => say!("resumed {agent}/{name}: next firing {}", v["next_due"].as_str().unwrap_or("-")),
        _ => say!("{agent}/{name} is due now; it starts when the agent takes it"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_the_spec_choird_checks() {
        let a = AddArgs {
            every: Some("30m".into()),
            prompt: Some("check the build".into()),
            precondition: Some("file:build/status".into()),
            tools: Some("choir.fs.read, choir.exec".into()),
            missed: Some("run_once".into()),
            ..AddArgs::default()
        };
        let s = a.spec("build").unwrap();
        assert_eq!(s.every_s, Some(1800));
        assert_eq!(s.precondition, Some(Precondition::FileChanged { path: "build/status".into() }));
        assert_eq!(s.allowed_tools.unwrap(), ["choir.fs.read", "choir.exec"]);
        assert_eq!(s.missed, Missed::RunOnce);
        let bad = AddArgs { every: Some("soon".into()), ..AddArgs::default() };
        assert!(bad.spec("x").unwrap_err().to_string().contains("not a duration"));
        assert!(job_ref(&["a/b"]).is_ok() && job_ref(&["ab"]).is_err());
    }
}
