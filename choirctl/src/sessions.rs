//! `choirctl sessions [AGENT]` and `choirctl agent events ID --follow`.

use std::time::Duration;

use choir_common::admin::{EventsResponse, SessionList};

use crate::ctx::{print_json, Ctx};
use crate::term;

/// Every session (of one agent), newest first.
pub fn list(ctx: &Ctx, agent: Option<&str>, limit: u64) -> anyhow::Result<()> {
    let mut path = format!("sessions?limit={limit}");
    if let Some(a) = agent {
        choir_common::ids::AgentId::parse(a)?;
        path.push_str(&format!("&agent={a}"));
    }
    let l: SessionList = ctx.client.get(&path)?;
    if ctx.json {
        return print_json(&l);
    }
    if l.sessions.is_empty() {
        say!("no sessions{}", agent.map(|a| format!(" of agent {a}")).unwrap_or_default());
        return Ok(());
    }
    say!(
        "{:<8} {:<14} {:<8} {:<23} {:>8} {:<22} {:>7} {:>9}  ENDED",
        "SESSION",
        "AGENT",
        "RUNTIME",
        "STARTED",
        "RAN",
        "INSTANCE",
        "COMMITS",
        "TOKENS"
    );
    for s in &l.sessions {
        let ended = match (&s.ended_at, &s.end_reason) {
            (None, _) => "running".to_owned(),
            (Some(at), reason) => {
                format!("{}: {}", term::moment(at), term::one_line(reason.as_deref().unwrap_or("?")))
            }
        };
        say!(
            "{:<8} {:<14} {:<8} {:<23} {:>8} {:<22} {:>7} {:>9}  {ended}",
            s.id,
            term::one_line(&s.agent),
            s.runtime,
            term::moment(&s.started_at),
            choir_common::text::human_duration(std::time::Duration::from_secs(s.seconds)),
            term::one_line(s.instance.as_deref().unwrap_or("-")),
            s.commits,
            s.tokens
        );
    }
    Ok(())
}

/// Prints the agent's committed events after `after`, and with `follow`
/// keeps printing new ones as they are replicated (until interrupted).
pub fn events(ctx: &Ctx, id: &str, after: u64, follow: bool) -> anyhow::Result<()> {
    let mut after = after;
    loop {
        let r: EventsResponse = ctx.client.get(&format!("agents/{id}/events?after={after}"))?;
        if ctx.json && !follow {
            return print_json(&r);
        }
        for e in &r.events {
            if ctx.json {
                crate::ctx::print_json_line(e)?;
                continue;
            }
            let input = serde_json::to_string(&e.input)?;
            let input: String =
                if input.chars().count() > 100 { input.chars().take(97).collect::<String>() + "..." } else { input };
            let kind = if e.kind == choir_common::commit::EventKind::Quarantined { " (quarantined)" } else { "" };
            say!(
                "#{:<4} {:<6} {:<16} {:<9} {:>7} µs  {}{kind}",
                e.seq,
                term::one_line(&e.lane),
                term::one_line(&e.tool),
                format!("{:?}", e.outcome).to_lowercase(),
                e.duration_us,
                term::one_line(&input)
            );
        }
        if !r.chain_ok {
            say_err!("the chain of these events is BROKEN (choird's copy does not verify)");
        }
        if !follow {
            if r.events.is_empty() {
                say!("no committed events after {after}");
            } else if !ctx.json {
                say!(
                    "chain: {} ({} events, head {})",
                    if r.chain_ok { "intact" } else { "BROKEN" },
                    r.events.len(),
                    r.events.last().map(|e| &e.hash[..16]).unwrap_or("-")
                );
            }
            return Ok(());
        }
        after = r.events.last().map_or(after, |e| e.seq);
        std::io::Write::flush(&mut std::io::stdout())?;
        std::thread::sleep(Duration::from_millis(500));
    }
}
