//! Metrics for Prometheus: `GET /metrics` on the optional
//! `metrics_listen` address (loopback unless `metrics_allow_non_loopback`),
//! in the text exposition format 0.0.4. Only this one path is served there;
//! nothing is changed by a scrape, and no label carries more than an agent
//! id, a bot name, a state or an outcome (no message text, no secret).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::daemon::Daemon;

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head<'o>(out: &'o mut String, name: &str, kind: &str, help: &str) -> Family<'o> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        let _ = writeln!(self.out, "{name}{labels} {value}");
        self
    }
}

/// A label value as the format wants it (backslash, quote and newline escaped).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A number of a bot's status.
type BotValue = fn(&choir_common::admin::BotStatus) -> f64;

/// The page.
pub fn render(d: &Daemon, tg: &crate::telegram::Handle) -> String {
    let mut out = String::new();
    Family::head(&mut out, "choir_up", "gauge", "1 while choird serves.").sample("choir_up", &[], 1.0);
    Family::head(&mut out, "choir_uptime_seconds", "gauge", "Seconds since choird started.").sample(
        "choir_uptime_seconds",
        &[],
        d.uptime_s() as f64,
    );
    let summaries = d.summaries();
    let mut by_state: BTreeMap<String, u64> =
        ["stopped", "starting", "running", "stopping"].iter().map(|s| ((*s).to_owned(), 0)).collect();
    for s in &summaries {
        *by_state.entry(s.state.clone()).or_default() += 1;
    }
    let mut f = Family::head(&mut out, "choir_agents", "gauge", "Configured agents by state.");
    for (state, n) in &by_state {
        f.sample("choir_agents", &[("state", state)], *n as f64);
    }
    let mut f = Family::head(&mut out, "choir_agent_replicated_seq", "gauge", "Highest commit replicated to choird.");
    for s in &summaries {
        f.sample("choir_agent_replicated_seq", &[("agent", &s.id)], s.replicated_seq as f64);
    }
    let mut f = Family::head(
        &mut out,
        "choir_agent_heartbeat_age_seconds",
        "gauge",
        "Seconds since a running agent's last heartbeat (its replication and liveness lag).",
    );
    for s in summaries.iter().filter(|s| s.last_heartbeat_ms.is_some()) {
        let age = s.last_heartbeat_ms.unwrap_or(0) as f64 / 1000.0;
        f.sample("choir_agent_heartbeat_age_seconds", &[("agent", &s.id)], age);
    }
    let counts = d.store.metric_counts().unwrap_or_default();
    let mut f = Family::head(&mut out, "choir_turns_total", "counter", "User messages an agent has processed.");
    for (agent, n) in &counts.processed {
        f.sample("choir_turns_total", &[("agent", agent)], *n as f64);
    }
    let mut f = Family::head(&mut out, "choir_tool_calls_total", "counter", "Committed tool calls by outcome.");
    for ((agent, outcome), n) in &counts.tool_calls {
        f.sample("choir_tool_calls_total", &[("agent", agent), ("outcome", outcome)], *n as f64);
    }
    let mut f = Family::head(&mut out, "choir_model_tokens_total", "counter", "Model tokens relayed, by kind.");
    for ((agent, kind), n) in &counts.tokens {
        f.sample("choir_model_tokens_total", &[("agent", agent), ("kind", kind)], *n as f64);
    }
    let usage = d.usage();
    let mut f = Family::head(&mut out, "choir_pending_approvals", "gauge", "Proposals waiting for a human.");
    for u in &usage {
        f.sample("choir_pending_approvals", &[("agent", &u.id)], u.pending_proposals.used.unwrap_or(0) as f64);
    }
    if let Ok(status) = crate::telegram::status(tg) {
        let families: [(&str, &str, &str, BotValue); 6] = [
            ("choir_telegram_updates_total", "counter", "Updates received.", |b| b.updates as f64),
            ("choir_telegram_sent_total", "counter", "Messages sent.", |b| b.sent as f64),
            ("choir_telegram_errors_total", "counter", "Bot API errors.", |b| b.errors as f64),
            ("choir_telegram_queued_updates", "gauge", "Updates waiting for their agent.", |b| b.queued_updates as f64),
            ("choir_telegram_queued_outbox", "gauge", "Messages waiting to be sent.", |b| b.queued_outbox as f64),
            ("choir_telegram_failed_outbox", "gauge", "Messages that could not be sent.", |b| b.failed_outbox as f64),
        ];
        for (name, kind, help, value) in families {
            let mut f = Family::head(&mut out, name, kind, help);
            for b in &status.bots {
                f.sample(name, &[("bot", &b.bot)], value(b));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
