//! `choirctl backup FILE [--workspaces]` (choird makes the archive, see
//! `choird::backup`; it is written here to `FILE` mode 0600, complete or not
//! at all) and `choirctl restore FILE` (offline, into an empty home, through
//! `choird restore`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::ctx::{print_json, Ctx};

/// `backup FILE` (or `-`: the archive to standard output, which must not be
/// a terminal). FILE appears complete or not at all: the archive is
/// written into an unnamed file in FILE's directory (`O_TMPFILE`) and named
/// only once whole, so an interrupted backup (Ctrl-C, a lost connection)
/// leaves nothing behind. Progress goes to a terminal's stderr.
pub(crate) fn backup(ctx: &Ctx, file: &str, workspaces: bool) -> anyhow::Result<()> {
    if file == "-" {
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            anyhow::bail!(
                "the archive is binary and holds the secrets: redirect standard output (`> FILE`), or give a FILE"
            );
        }
        say_err!("choird is writing the backup to standard output; it holds secrets.json: keep it where only you can read it");
        let mut out = Progress::new(std::io::stdout().lock());
        let (bytes, _) =
            ctx.client.post_to("backup", &serde_json::json!({"workspaces": workspaces}), "x-choir-backup", &mut out)?;
        out.done();
        say_err!("wrote {} to standard output", choir_common::text::human_bytes(bytes));
        return Ok(());
    }
    let dest = Path::new(file);
    if dest.exists() {
        anyhow::bail!("{file} exists: choose a new file (a backup never overwrites one)");
    }
    let target = Target::open(dest)?;
    if !ctx.json {
        say_err!("choird is writing the backup{} …", if workspaces { " (with workspaces)" } else { "" });
    }
    let mut out = Progress::new(target.file.try_clone()?);
    let result = ctx
        .client
        .post_to("backup", &serde_json::json!({"workspaces": workspaces}), "x-choir-backup", &mut out)
        .and_then(|r| {
            out.done();
            out.inner.flush()?;
            out.inner.sync_all()?;
            Ok(r)
        });
    let (bytes, summary) = match result {
        Ok(r) => r,
        Err(e) => {
            target.abandon();
            return Err(e);
        }
    };
    target.name(dest)?;
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

/// Where the archive is written before it has its name: an unnamed file in
/// the destination's directory, or (a file system without `O_TMPFILE`) a
/// `.NAME.partial` file removed on failure.
struct Target {
    file: std::fs::File,
    dir: std::os::fd::OwnedFd,
    partial: Option<std::path::PathBuf>,
}

impl Target {
    fn open(dest: &Path) -> anyhow::Result<Target> {
        use rustix::fs::{Mode, OFlags};
        let dir_path = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = rustix::fs::open(dir_path, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir_path.display()))?;
        match rustix::fs::openat(
            &dir,
            ".",
            OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => Ok(Target { file: std::fs::File::from(fd), dir, partial: None }),
            Err(_) => {
                let tmp = dest.with_file_name(format!(
                    ".{}.partial",
                    dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "backup".into())
                ));
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
                Ok(Target { file, dir, partial: Some(tmp) })
            }
        }
    }

    /// Gives the finished archive its name; never over an existing file.
    fn name(self, dest: &Path) -> anyhow::Result<()> {
        let shown = dest.display();
        match &self.partial {
            Some(tmp) => {
                std::fs::hard_link(tmp, dest).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
                let _ = std::fs::remove_file(tmp);
            }
            None => {
                use std::os::fd::AsRawFd;
                let name = dest.file_name().ok_or_else(|| anyhow::anyhow!("{shown} names no file"))?;
                let own = format!("/proc/self/fd/{}", self.file.as_raw_fd());
                rustix::fs::linkat(rustix::fs::CWD, own.as_str(), &self.dir, name, rustix::fs::AtFlags::SYMLINK_FOLLOW)
                    .map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
            }
        }
        Ok(())
    }

    fn abandon(self) {
        if let Some(tmp) = &self.partial {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// A writer that shows how much has arrived on a terminal's stderr, every
/// 16 MiB.
struct Progress<W: Write> {
    inner: W,
    bytes: u64,
    shown: u64,
    terminal: bool,
}

impl<W: Write> Progress<W> {
    fn new(inner: W) -> Progress<W> {
        Progress { inner, bytes: 0, shown: 0, terminal: std::io::IsTerminal::is_terminal(&std::io::stderr()) }
    }

    fn done(&mut self) {
        if self.terminal && self.shown > 0 {
            eprintln!();
        }
    }
}

impl<W: Write> Write for Progress<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        if self.terminal && self.bytes - self.shown >= 16 << 20 {
            self.shown = self.bytes;
            eprint!("\rreceived {}", choir_common::text::human_bytes(self.bytes));
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
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
