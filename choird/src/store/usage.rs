//! The cost ledger read back (`choirctl usage`): relayed model calls summed
//! by day, model or lane.

use choir_common::admin::{UsageReport, UsageRow};

use super::Store;
use crate::db::DbError;

/// How usage is grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    /// UTC day.
    Day,
    /// Model name.
    Model,
    /// `edge` or `core`.
    Lane,
    /// Agent.
    Agent,
    /// The core job (`-` for the edge and choird's own calls).
    Job,
}

impl UsageBy {
    /// Parses `day`, `model`, `lane`, `agent` or `job`.
    pub fn parse(s: &str) -> Option<UsageBy> {
        match s {
            "day" => Some(UsageBy::Day),
            "model" => Some(UsageBy::Model),
            "lane" => Some(UsageBy::Lane),
            "agent" => Some(UsageBy::Agent),
            "job" => Some(UsageBy::Job),
            _ => None,
        }
    }

    fn column(self) -> &'static str {
        match self {
            UsageBy::Day => "((at AT TIME ZONE 'UTC')::date)::text",
            UsageBy::Model => "model",
            UsageBy::Lane => "lane",
            UsageBy::Agent => "agent_id",
            UsageBy::Job => "coalesce(job, '-')",
        }
    }
}

impl Store {
    /// Calls, tokens and estimated cost of `agent` (or all) since `since`
    /// (RFC 3339; none: all time), grouped `by`. A group's cost is `None`
    /// when one of its calls had no price.
    pub fn usage(&self, agent: Option<&str>, since: Option<&str>, by: UsageBy) -> Result<UsageReport, DbError> {
        self.flush_ledger_for_read();
        let sql = format!(
            "SELECT {key}, count(*), coalesce(sum(prompt_tokens), 0)::bigint, coalesce(sum(completion_tokens), 0)::bigint,
                    sum(cost_usd), count(*) FILTER (WHERE cost_usd IS NULL),
                    coalesce(sum(cache_read_tokens), 0)::bigint
             FROM llm_calls
             WHERE ($1::text IS NULL OR agent_id = $1) AND ($2::text IS NULL OR at >= $2::timestamptz)
             GROUP BY 1 ORDER BY 1",
            key = by.column()
        );
        self.db.with(|c| {
            let rows = c.query(sql.as_str(), &[&agent, &since])?;
            let rows: Vec<UsageRow> = rows
                .iter()
                .map(|r| {
                    let unpriced: i64 = r.get(5);
                    UsageRow {
                        key: r.get(0),
                        calls: r.get::<_, i64>(1) as u64,
                        prompt_tokens: r.get::<_, i64>(2) as u64,
                        cached_tokens: r.get::<_, i64>(6) as u64,
                        completion_tokens: r.get::<_, i64>(3) as u64,
                        cost_usd: if unpriced > 0 { None } else { r.get::<_, Option<f64>>(4) },
                    }
                })
                .collect();
            Ok(UsageReport { rows })
        })
    }
}
