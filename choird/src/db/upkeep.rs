//! Upkeep of the managed cluster's tables, in place of PostgreSQL's
//! autovacuum launcher: that process, always running and waking every
//! naptime, was 3.3 MB of an idle system's memory (docs/operations.md).
//! The cluster's keeper runs [`tend`] every [`UPKEEP_EVERY`] (the naptime
//! the launcher had) on a thread of its own: it asks the statistics which
//! tables changed enough, by autovacuum's own default rules, and vacuums or
//! analyzes those, so dead rows are reclaimed and plans — and the memory
//! indexer's row estimates, read from the last ANALYZE — keep up as the
//! tables grow. A pass on a quiet database is one short connection and one
//! query; its server process ends with it.
//!
//! Turning the launcher off (`autovacuum = off`) leaves PostgreSQL's own
//! protection against transaction-id wraparound in place: the postmaster
//! still starts a worker for a database that needs freezing, whatever the
//! setting. A database choird does not manage (`database_url`) keeps its
//! own server's autovacuum; nothing here touches it.
//!
//! **Invariant:** a pass opens one connection and closes it; it only runs
//! `VACUUM (ANALYZE)` and `ANALYZE` on the `choir` database's own tables,
//! named by the server's catalog (quoted with `format('%I.%I')`), never on
//! a name from anywhere else.

use std::time::Duration;

/// How often the keeper tends the tables.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(300);

/// What a pass found due and did: tables vacuumed (and analyzed), tables
/// only analyzed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tended {
    /// Vacuumed and analyzed.
    pub vacuumed: Vec<String>,
    /// Analyzed only.
    pub analyzed: Vec<String>,
}

/// The tables due, by autovacuum's default thresholds: a vacuum when dead
/// rows pass 50 + 20 % of the live ones, or rows inserted since the last
/// vacuum pass 1,000 + 20 % (so the visibility map, and index-only scans,
/// keep up with append-only tables); an analyze when rows changed since the
/// last one pass 50 + 10 %.
const DUE: &str = "SELECT format('%I.%I', schemaname, relname),
        n_dead_tup > 50 + 0.2 * n_live_tup OR n_ins_since_vacuum > 1000 + 0.2 * n_live_tup,
        n_mod_since_analyze > 50 + 0.1 * n_live_tup
   FROM pg_stat_user_tables ORDER BY 1";

/// One pass over the database at `url`: vacuums and analyzes what is due.
pub fn tend(url: &str) -> Result<Tended, postgres::Error> {
    let mut config: postgres::Config = url.parse()?;
    config.connect_timeout(Duration::from_secs(10)).application_name("choird upkeep");
    let mut client = config.connect(postgres::NoTls)?;
    let mut out = Tended::default();
    for row in client.query(DUE, &[])? {
        let (table, vacuum, analyze): (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
        if vacuum {
            // Outside a transaction block: VACUUM cannot run inside one.
            client.batch_execute(&format!("VACUUM (ANALYZE) {table}"))?;
            out.vacuumed.push(table);
        } else if analyze {
            client.batch_execute(&format!("ANALYZE {table}"))?;
            out.analyzed.push(table);
        }
    }
    Ok(out)
}
