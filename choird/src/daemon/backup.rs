//! `choirctl backup`: the archive is made by choird (see [`crate::backup`])
//! so that nothing it holds changes while it is taken — no approval is
//! applied and no config or secret is rewritten until the dump and the files
//! are in it — and then streamed to choirctl from an unnamed file.

use std::io::Seek;

use serde_json::json;

use super::Daemon;
use crate::backup::{Database, Summary};
use crate::error::Error;

impl Daemon {
    /// Writes a backup of the home into an unnamed temporary file (mode
    /// 0600, gone when closed) and returns it from its start.
    /// `abandoned` says when the client stopped waiting: the archive is then
    /// given up (and the gate it holds opened) instead of finished for nobody.
    pub fn backup(&self, workspaces: bool, abandoned: &dyn Fn() -> bool) -> Result<(std::fs::File, Summary), Error> {
        let mut file = tempfile::tempfile_in(self.home.root())
            .map_err(|e| Error::Internal(format!("a temporary file in the home: {e}")))?;
        let config = self.config();
        let ids: Vec<_> = if workspaces { config.agents.keys().cloned().collect() } else { Vec::new() };
        let db = Database::of(&self.home, &config);
        // The dump reads the cost ledger: the rows waiting go in first.
        self.store.flush_ledger_for_read();
        let summary = {
            let _no_approvals = self.state_gate.write();
            let _no_rewrites = self.config_write.lock();
            *self.backup_since.lock() = Some(jiff::Timestamp::now());
            let written = crate::backup::write(&self.home, &config, &db, &ids, &mut file, abandoned);
            *self.backup_since.lock() = None;
            written
        };
        let summary = summary.map_err(|e| {
            self.audit("admin", None, "backup", "failed", json!({"error": e.to_string()}));
            Error::Unavailable(e.to_string())
        })?;
        file.rewind().map_err(|e| Error::Internal(e.to_string()))?;
        self.audit("admin", None, "backup", "ok", json!({"summary": summary, "workspaces": workspaces}));
        log::info!(
            "backup: {} files, {} bytes, database dump {} bytes, {} skipped",
            summary.files,
            summary.bytes,
            summary.database_bytes,
            summary.skipped
        );
        Ok((file, summary))
    }
}
