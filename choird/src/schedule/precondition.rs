//! Preconditions: a cheap look choird takes before a firing may cost a
//! model call (R-SCHED-1). Each returns a fingerprint of what it looked at;
//! the firing runs only when it differs from the one stored at the previous
//! look (the first look always runs, so a new job proves it works).
//!
//! **Invariant:** a precondition makes no model call and changes nothing it
//! looks at: the workspace is read through descriptors without following a
//! link (`workspace_files::fingerprint`), the mailbox is EXAMINEd (read
//! only), a URL is fetched under the agent's own egress policy (pinned
//! address, no redirects, at most [`MAX_URL_BYTES`]), and memory is read.
//! Each look is bounded in time (the HTTP and IMAP timeouts) and size.

use std::io::Read;
use std::time::Duration;

use choir_common::ids::AgentId;
use choir_common::schedule::Precondition;
use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::shared::Shared;

/// Bytes of a URL's body looked at.
pub const MAX_URL_BYTES: u64 = 1024 * 1024;
/// How long a URL may take.
const URL_TIMEOUT: Duration = Duration::from_secs(10);
/// Memory items with a due date looked at, newest first.
const MAX_DUE_ITEMS: i64 = 1000;

/// What a look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Look {
    /// Whether the firing should run.
    pub run: bool,
    /// The fingerprint to store for the next look.
    pub state: String,
    /// What was seen, for the firing's record.
    pub detail: String,
}

/// Looks at `pre` for `agent`; `last` is the previous look's fingerprint.
pub fn look(
    shared: &Shared,
    agent: &AgentId,
    pre: &Precondition,
    last: Option<&str>,
    now: Timestamp,
) -> Result<Look, String> {
    let changed = |state: String, what: &str| {
        let run = last != Some(state.as_str());
        let detail = if run { format!("{what} changed") } else { format!("nothing new: {what} unchanged") };
        Look { run, state, detail }
    };
    match pre {
        Precondition::FileChanged { path } => {
            let config = shared.config();
            let ws = config.workspace(&shared.home, agent);
            let fp = crate::workspace_files::fingerprint(&ws, path)
                .map_err(|e| format!("cannot look at {path} in the workspace: {e}"))?;
            Ok(changed(fp, &format!("workspace {path}")))
        }
        Precondition::UrlChanged { url } => Ok(changed(url_digest(shared, agent, url)?, "the URL's content")),
        Precondition::NewMail => {
            let (validity, uids) = crate::host_tools::mail::read::unseen(shared, agent).map_err(|e| e.to_string())?;
            let newest = uids.iter().copied().max().unwrap_or(0);
            let state = format!("{validity}:{newest}");
            // New unseen mail: a higher unseen UID than last time (or a
            // mailbox whose UIDs were reset, holding unseen mail).
            let before = last
                .and_then(|l| l.split_once(':'))
                .and_then(|(v, u)| Some((v.parse::<u32>().ok()?, u.parse::<u32>().ok()?)));
            let run = match before {
                _ if uids.is_empty() => false,
                Some((v, u)) if v == validity => newest > u,
                _ => true,
            };
            let detail = if run {
                format!("{} unseen message(s), newest uid {newest}", uids.len())
            } else {
                format!("nothing new: {} unseen, none newer than at the last look", uids.len())
            };
            // An unchanged state keeps the newest UID seen (mail read since is not "new" again).
            let state = if !run && before.is_some_and(|(v, _)| v == validity) {
                last.unwrap_or_default().to_owned()
            } else {
                state
            };
            Ok(Look { run, state, detail })
        }
        Precondition::MemoryDue => {
            // The window is (last look, now]: each due time passes once.
            let since: Option<Timestamp> = last.and_then(|l| l.parse().ok());
            let dues = due_items(shared, agent)?;
            let fresh = dues.iter().filter(|t| **t <= now && since.is_none_or(|s| **t > s)).count();
            Ok(Look {
                run: fresh > 0,
                state: now.to_string(),
                detail: if fresh > 0 {
                    format!("{fresh} memory item(s) came due")
                } else {
                    "nothing new: no memory item came due".into()
                },
            })
        }
    }
}

/// sha256 of a URL's status and body (at most [`MAX_URL_BYTES`]).
fn url_digest(shared: &Shared, agent: &AgentId, raw: &str) -> Result<String, String> {
    let config = shared.config();
    let web = crate::host_tools::web::common::agent_web(&config, agent).map_err(|_| {
        format!("agents.{agent}.web is not configured; a url_changed precondition fetches under its egress policy")
    })?;
    let policy = crate::egress::Policy::new(web);
    let url = policy.check_url(raw).map_err(|e| e.0)?;
    let origin = crate::egress::origin_of(&url);
    let port = url.port_or_known_default().unwrap_or(443);
    let addr = policy.resolve(url.host_str().unwrap_or_default(), port).map_err(|e| e.0)?;
    let client = crate::host_tools::web::common::pinned_agent(addr, URL_TIMEOUT);
    let resp = client.get(url.as_str()).call().map_err(|_| format!("{origin} could not be reached"))?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    resp.into_body()
        .into_reader()
        .take(MAX_URL_BYTES)
        .read_to_end(&mut body)
        .map_err(|_| format!("{origin}: the body could not be read"))?;
    let mut h = Sha256::new();
    h.update(status.to_be_bytes());
    h.update(&body);
    Ok(hex::encode(h.finalize()))
}

/// Due times (`metadata.due`, RFC 3339) of the agent's memory items; items
/// whose due is not a time are ignored.
fn due_items(shared: &Shared, agent: &AgentId) -> Result<Vec<Timestamp>, String> {
    let schema = crate::db::agent_schema(agent);
    // An agent that never stored a memory has no schema yet: nothing is due.
    let exists = shared
        .store
        .db
        .with(|c| c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&format!("{schema}.items")]))
        .map_err(|_| format!("agent {agent}'s memory cannot be read"))?
        .get::<_, bool>(0);
    if !exists {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT metadata->>'due' FROM {schema}.items WHERE metadata ? 'due' ORDER BY id DESC LIMIT {MAX_DUE_ITEMS}"
    );
    let rows = shared
        .store
        .db
        .with(|c| c.query(&sql, &[]))
        .map_err(|_| format!("agent {agent}'s memory cannot be read (is memory configured?)"))?;
    Ok(rows.iter().filter_map(|r| r.get::<_, Option<String>>(0)).filter_map(|s| s.parse::<Timestamp>().ok()).collect())
}
