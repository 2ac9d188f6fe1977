//! `choirctl usage [ID] [--since T] [--by day|model|lane|agent|job]`: the cost
//! ledger of relayed model calls.

use choir_common::admin::UsageReport;

use crate::ctx::{print_json, Ctx};

/// Prints calls, tokens and estimated cost per group, and the total.
pub fn run(ctx: &Ctx, agent: Option<&str>, since: Option<&str>, by: Option<&str>) -> anyhow::Result<()> {
    let mut query = vec![format!("by={}", by.unwrap_or("day"))];
    if let Some(a) = agent {
        choir_common::ids::AgentId::parse(a)?;
        query.push(format!("agent={a}"));
    }
    if let Some(s) = since {
        query.push(format!("since={}", choir_common::unix_http::query_value(&crate::logs::since(s)?)));
    }
    let report: UsageReport = ctx.client.get(&format!("usage?{}", query.join("&")))?;
    if ctx.json {
        return print_json(&report);
    }
    let cost = |c: Option<f64>| c.map_or("-".to_owned(), |c| format!("${c:.4}"));
    say!(
        "{:<24} {:>8} {:>14} {:>12} {:>14} {:>12}",
        by.unwrap_or("day").to_uppercase(),
        "CALLS",
        "PROMPT",
        "OF IT CACHED",
        "COMPLETION",
        "COST"
    );
    let (mut calls, mut prompt, mut cached, mut completion, mut total) = (0, 0, 0, 0, Some(0.0));
    for r in &report.rows {
        say!(
            "{:<24} {:>8} {:>14} {:>12} {:>14} {:>12}",
            crate::term::one_line(&r.key),
            r.calls,
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            cost(r.cost_usd)
        );
        calls += r.calls;
        prompt += r.prompt_tokens;
        cached += r.cached_tokens;
        completion += r.completion_tokens;
        total = total.zip(r.cost_usd).map(|(a, b)| a + b);
    }
    say!("{:<24} {:>8} {:>14} {:>12} {:>14} {:>12}", "total", calls, prompt, cached, completion, cost(total));
    if total.is_none() {
        say!("(a cost of - means a model without a price in config.json llm.prices)");
    }
    Ok(())
}
