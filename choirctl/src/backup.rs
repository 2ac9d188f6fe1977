//! `choirctl backup FILE [--workspaces]` (choird makes the archive, see
//! `choird::backup`; it is written here to `FILE` mode 0600, complete or not
//! at all) and `choirctl restore FILE` (offline, into an empty home, through
//! `choird restore`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::ctx::{print_json, Ctx};

/// `backup FILE`.
pub(crate) fn backup(ctx: &Ctx, file: &str, workspaces: bool) -> anyhow::Result<()> {
    let dest = Path::new(file);
    if dest.exists() {
        anyhow::bail!("{file} exists: choose a new file (a backup never overwrites one)");
    }
    let tmp = dest.with_file_name(format!(
        ".{}.partial",
        dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "backup".into())
    ));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
    if !ctx.json {
        say_err!("choird is writing the backup{} …", if workspaces { " (with workspaces)" } else { "" });
    }
    let result = ctx
        .client
        .post_to("backup", &serde_json::json!({"workspaces": workspaces}), "x-choir-backup", &mut out)
        .and_then(|r| {
            out.flush()?;
            out.sync_all()?;
            Ok(r)
        });
    let (bytes, summary) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, dest)?;
    let summary: serde_json::Value =
        summary.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(serde_json::Value::Null);
    if ctx.json {
        return print_json(&serde_json::json!({"file": file, "bytes": bytes, "summary": summary}));
    }
    say!(
        "wrote {file} ({}): {} files, database dump {}{}",
        choir_common::text::human_bytes(bytes),
        summary["files"],
        choir_common::text::human_bytes(summary["database_bytes"].as_u64().unwrap_or(0)),
        match summary["skipped"].as_u64() {
            Some(n) if n > 0 => format!(", {n} special files or too-deep trees skipped"),
            _ => String::new(),
        }
    );
    say!("it holds secrets.json: keep it where only you can read it");
    Ok(())
}

/// Where `restore` puts the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RestoreInto {
    /// As the backup's config.json says.
    AsBackedUp,
    /// This external database (its connection string may hold a password).
    Url(String),
    /// A new managed cluster in the home.
    Managed,
}

/// `restore FILE [--database-url URL | --managed]` into `home`, by
/// `choird restore` (the connection string goes on its stdin).
pub(crate) fn restore(json: bool, home: &Path, file: &str, into: &RestoreInto) -> anyhow::Result<()> {
    let mut steps = Vec::new();
    let mut summary = serde_json::Value::Null;
    let (how, secret): (Option<&str>, Option<&str>) = match into {
        RestoreInto::AsBackedUp => (None, None),
        RestoreInto::Managed => (Some("--managed"), None),
        RestoreInto::Url(url) => (Some("--database-url-stdin"), Some(url.as_str())),
    };
    let mut words = vec!["restore", file];
    words.extend(how);
    crate::offline::run_lines(&words, home, secret, &mut |line| {
        if let Some(step) = line["step"].as_str() {
            if !json {
                say!("{step}");
            }
            steps.push(step.to_owned());
        } else if let Some(s) = line.get("summary") {
            summary = s.clone();
        }
    })?;
    if json {
        return print_json(&serde_json::json!({"home": home, "summary": summary, "steps": steps}));
    }
    say!("restored into {}: start choird on it (choird --home {0}, or systemctl start choird)", home.display());
    Ok(())
}
