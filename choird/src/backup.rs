//! `choirctl backup FILE` and `choirctl restore FILE`: one gzipped tar with
//! everything a home needs to come back on another machine — `config.json`,
//! `secrets.json`, `repos/` (the approved tools, skills and policies with
//! their git history), `remembered/` (destinations operators approved and
//! asked to remember), the database (`pg_dump -Fc` of the managed cluster or
//! of `database_url`: commit logs, sessions, conversations, memory, approvals,
//! audit) and, when asked, each agent's workspace.
//!
//! Layout: `choir-backup.json` (the manifest, always first), `config.json`,
//! `secrets.json`, `repos/…`, `remembered/…`, `database.dump`,
//! `workspaces/<agent>/…`.
//!
//! **Invariants:**
//! - The archive holds secrets: it is created mode 0600, and `secrets.json`
//!   is restored mode 0600.
//! - Trees are read through descriptors: a symlink is stored as a symlink and
//!   never followed, and anything that is not a directory, regular file or
//!   symlink (a FIFO an agent made in its workspace) is skipped and counted,
//!   so a hostile workspace can neither make choird read a host file into the
//!   archive nor block it on a pipe.
//! - Restore writes only into an empty home (and workspaces that are empty or
//!   missing), never follows a link out of it (`unpack_in`), and refuses a
//!   database that already holds choird's tables: it never merges.
//! - No database URL or password reaches a process's command line: the
//!   connection is handed to `pg_dump`/`pg_restore` in `PG*` variables.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use choir_common::ids::AgentId;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::db::cluster::ManagedCluster;
use crate::home::Home;
use crate::spawn::Cmd;

/// The manifest's name in the archive (its first entry).
pub const MANIFEST: &str = "choir-backup.json";
/// The dump's name in the archive.
pub const DUMP: &str = "database.dump";
/// The archive format this choird writes and reads.
pub const FORMAT: u32 = 1;
/// Deepest directory nesting archived (deeper trees are cut and counted).
const MAX_DEPTH: usize = 64;

/// What an archive says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The choird version that wrote it.
    pub choird_version: String,
    /// When (RFC 3339, UTC).
    pub created: String,
    /// `managed` or `external` (from `database_url`).
    pub database: String,
    /// Agents whose workspaces are in it.
    pub workspaces: Vec<String>,
}

/// What a backup wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Files archived (dump included).
    pub files: u64,
    /// Bytes of file content archived (before compression).
    pub bytes: u64,
    /// Size of the database dump.
    pub database_bytes: u64,
    /// Entries skipped: special files, trees nested too deep.
    pub skipped: u64,
}

/// A backup or restore that could not be done, worded for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackupError(pub String);

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> BackupError {
    move |e| BackupError(format!("{what}: {e}"))
}

/// Where the database is and how to reach its tools.
pub struct Database {
    /// The connection string (URL or key=value).
    pub url: String,
    /// Directory with `pg_dump` and `pg_restore` (else they are looked up in `PATH`).
    pub bin: Option<PathBuf>,
    /// `managed` or `external`.
    pub kind: &'static str,
}

impl Database {
    /// The database `config` uses in `home` (the managed cluster's socket when
    /// `database_url` is unset).
    pub fn of(home: &Home, config: &Config) -> Database {
        let bin = ManagedCluster::find_bin_dir(config.postgres_bin_dir.as_deref()).ok();
        match &config.database_url {
            Some(url) => Database { url: url.clone(), bin, kind: "external" },
            None => Database { url: ManagedCluster::probe(&home.pg()).0, bin, kind: "managed" },
        }
    }

    fn parsed(&self) -> Result<postgres::Config, BackupError> {
        self.url.parse().map_err(|e| BackupError(format!("the database connection string is invalid: {e}")))
    }

    fn tool(&self, name: &str) -> Result<Cmd, BackupError> {
        let program = self.bin.as_ref().map(|b| b.join(name)).unwrap_or_else(|| PathBuf::from(name));
        let config = self.parsed()?;
        let mut cmd = Cmd::new(program);
        cmd.arg("--no-password");
        if let Some(host) = config.get_hosts().first() {
            match host {
                postgres::config::Host::Tcp(h) => cmd.env("PGHOST", h),
                postgres::config::Host::Unix(p) => cmd.env("PGHOST", p),
            };
        }
        if let Some(port) = config.get_ports().first() {
            cmd.env("PGPORT", port.to_string());
        }
        if let Some(user) = config.get_user() {
            cmd.env("PGUSER", user);
        }
        if let Some(password) = config.get_password() {
            cmd.env("PGPASSWORD", String::from_utf8_lossy(password).into_owned());
        }
        cmd.env("PGDATABASE", dbname(&config));
        Ok(cmd)
    }
}

/// The database a connection string names; without one, the user's, as the
/// server picks it (choird connects the same way).
fn dbname(config: &postgres::Config) -> String {
    config.get_dbname().or(config.get_user()).unwrap_or(crate::db::cluster::DATABASE).to_owned()
}

/// Writes the archive of `home` to `out` (gzip level 6). `workspaces`: the
/// agents whose workspaces go in too. The caller holds whatever keeps the
/// home's files and the database from changing underneath (choird: no
/// approval or config rewrite runs meanwhile).
pub fn write(
    home: &Home,
    config: &Config,
    db: &Database,
    workspaces: &[AgentId],
    out: &mut File,
    abandoned: &dyn Fn() -> bool,
) -> Result<Summary, BackupError> {
    let mut summary = Summary::default();
    let mut guarded = Abandonable { inner: &mut *out, abandoned, unchecked: 0 };
    let gz = flate2::write::GzEncoder::new(&mut guarded, flate2::Compression::new(6));
    let mut tar = tar::Builder::new(gz);
    let manifest = Manifest {
        format: FORMAT,
        choird_version: env!("CARGO_PKG_VERSION").to_owned(),
        created: jiff::Timestamp::now().to_string(),
        database: db.kind.to_owned(),
        workspaces: workspaces.iter().map(|a| a.as_str().to_owned()).collect(),
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| BackupError(e.to_string()))?;
    append_bytes(&mut tar, MANIFEST, &text, 0o600)?;
    for (name, mode) in [("config.json", 0o644), ("secrets.json", 0o600)] {
        let path = home.root().join(name);
        let bytes = std::fs::read(&path).map_err(io(path.display()))?;
        append_bytes(&mut tar, name, &bytes, mode)?;
        summary.files += 1;
        summary.bytes += bytes.len() as u64;
    }
    append_tree(&mut tar, &home.repos(), Path::new("repos"), &mut summary)?;
    // The destinations operators approved and asked to remember.
    let remembered = crate::arg_policies::remembered_dir(home);
    if remembered.is_dir() {
        append_tree(&mut tar, &remembered, Path::new("remembered"), &mut summary)?;
    }
    // The dump, through a private directory of the home (same file system).
    let tmp = tempfile::Builder::new()
        .prefix(".backup-")
        .tempdir_in(home.root())
        .map_err(io(format!("a temporary directory in {}", home.root().display())))?;
    let dump = tmp.path().join(DUMP);
    db.tool("pg_dump")?
        .args(["--format=custom", "--compress=0", "--file"])
        .arg(dump.clone())
        .run()
        .map_err(|e| BackupError(format!("pg_dump of the {} database failed: {e}", db.kind)))?;
    let size = std::fs::metadata(&dump).map_err(io(dump.display()))?.len();
    let mut file = File::open(&dump).map_err(io(dump.display()))?;
    let mut header = file_header(size, 0o600);
    tar.append_data(&mut header, DUMP, &mut file).map_err(io("writing the archive"))?;
    summary.files += 1;
    summary.database_bytes = size;
    for id in workspaces {
        let dir = config.workspace(home, id);
        if dir.is_dir() {
            append_tree(&mut tar, &dir, &Path::new("workspaces").join(id.as_str()), &mut summary)?;
        }
    }
    let gz = tar.into_inner().map_err(io("writing the archive"))?;
    gz.finish().map_err(io("writing the archive"))?;
    out.sync_all().map_err(io("syncing the archive"))?;
    Ok(summary)
}

/// The archive's writer, which stops the backup (an error) once `abandoned`
/// says nobody waits for it any more (asked every MiB written): a client
/// gone does not keep the gate on changes held while the rest is written.
struct Abandonable<'a, W: Write> {
    inner: W,
    abandoned: &'a dyn Fn() -> bool,
    unchecked: usize,
}

impl<W: Write> Write for Abandonable<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.unchecked += buf.len();
        if self.unchecked >= 1 << 20 {
            self.unchecked = 0;
            if (self.abandoned)() {
                return Err(std::io::Error::other("nobody waits for this backup any more (its client went away)"));
            }
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn file_header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(jiff::Timestamp::now().as_second().max(0) as u64);
    h
}

fn append_bytes<W: Write>(tar: &mut tar::Builder<W>, name: &str, bytes: &[u8], mode: u32) -> Result<(), BackupError> {
    let mut header = file_header(bytes.len() as u64, mode);
    tar.append_data(&mut header, name, bytes).map_err(io("writing the archive"))
}

/// Archives the tree at `root` under `prefix`, through descriptors (see the
/// module's invariants).
fn append_tree<W: Write>(
    tar: &mut tar::Builder<W>,
    root: &Path,
    prefix: &Path,
    summary: &mut Summary,
) -> Result<(), BackupError> {
    let dir = match rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(BackupError(format!("{}: {e}", root.display()))),
    };
    append_dir(tar, &dir, prefix, 0, summary)
}

fn append_dir<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &OwnedFd,
    path: &Path,
    depth: usize,
    summary: &mut Summary,
) -> Result<(), BackupError> {
    let err = |what: &str, e: rustix::io::Errno| BackupError(format!("{}: {what}: {e}", path.display()));
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    tar.append_data(&mut header, path, std::io::empty()).map_err(io("writing the archive"))?;
    if depth >= MAX_DEPTH {
        summary.skipped += 1;
        return Ok(());
    }
    let mut names: Vec<std::ffi::CString> = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(|e| err("reading", e))? {
        let entry = entry.map_err(|e| err("reading", e))?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    names.sort();
    for name in names {
        let rel = path.join(os_str(name.as_bytes()));
        let st = match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue, // removed meanwhile
            Err(e) => return Err(err("stat", e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                match rustix::fs::openat(dir, &name, flags, Mode::empty()) {
                    Ok(sub) => append_dir(tar, &sub, &rel, depth + 1, summary)?,
                    Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                        summary.skipped += 1
                    }
                    Err(e) => return Err(err("open", e)),
                }
            }
            FileType::RegularFile => {
                let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
                let fd = match rustix::fs::openat(dir, &name, flags, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP) => continue,
                    Err(e) => return Err(err("open", e)),
                };
                let st = rustix::fs::fstat(&fd).map_err(|e| err("stat", e))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                    summary.skipped += 1;
                    continue;
                }
                // The size as opened; a file growing meanwhile is cut there.
                let size = st.st_size.max(0) as u64;
                let mut header = file_header(size, (st.st_mode & 0o777) as u32);
                let file = File::from(fd).take(size);
                let mut padded = Padded { inner: file, left: size };
                tar.append_data(&mut header, &rel, &mut padded).map_err(io("writing the archive"))?;
                summary.files += 1;
                summary.bytes += size;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, &name, Vec::new()).map_err(|e| err("readlink", e))?;
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                header.set_mode(0o777);
                let target = os_str(target.as_bytes());
                tar.append_link(&mut header, &rel, target).map_err(io("writing the archive"))?;
            }
            _ => summary.skipped += 1,
        }
    }
    Ok(())
}

fn os_str(bytes: &[u8]) -> &std::ffi::OsStr {
    std::os::unix::ffi::OsStrExt::from_bytes(bytes)
}

/// A file's content padded with zeros to the size its header promised (a
/// file truncated while it is archived must not corrupt the archive).
struct Padded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Padded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left as usize);
        let n = self.inner.read(&mut buf[..want])?;
        let n = if n == 0 {
            buf[..want].fill(0);
            want
        } else {
            n
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// Where a restore loads the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RestoreInto {
    /// As the backup's config.json says: the managed cluster, or its
    /// `database_url`.
    #[default]
    AsBackedUp,
    /// This external database (the restored config.json's `database_url`
    /// is set to it): moving to a host whose PostgreSQL is elsewhere.
    Url(String),
    /// A new managed cluster in the home (`database_url` is removed).
    Managed,
}

impl RestoreInto {
    /// Checked before anything is unpacked: a connection string that does
    /// not parse changes nothing. The error never repeats the string (it
    /// may hold a password). Returns whether the string holds a password
    /// (what [`RestoreInto::apply`] needs to know of it).
    fn check(&self) -> Result<bool, BackupError> {
        match self {
            RestoreInto::Url(url) if url.trim().is_empty() => {
                Err(BackupError("--database-url is empty (use --managed for the managed cluster)".into()))
            }
            RestoreInto::Url(url) if url.chars().any(char::is_control) => Err(BackupError(
                "--database-url holds a control character (a NUL, a line break): give the connection string on one line"
                    .into(),
            )),
            RestoreInto::Url(url) => {
                let config = url
                    .parse::<postgres::Config>()
                    .map_err(|e| BackupError(format!("--database-url is not a PostgreSQL connection string: {e}")))?;
                if config.get_dbname().is_none() {
                    return Err(BackupError(
                        "--database-url names no database (postgresql://HOST/NAME, or dbname=NAME): restore loads \
                         only into a database named for it"
                            .into(),
                    ));
                }
                Ok(config.get_password().is_some())
            }
            _ => Ok(false),
        }
    }

    /// Points the restored config.json at the chosen database; everything
    /// else in it keeps its value (written back pretty-printed, keys in
    /// sorted order). `holds_password` is what [`RestoreInto::check`]
    /// returned: the file is made its owner's alone before the password is
    /// written into it.
    fn apply(&self, config_json: &Path, holds_password: bool) -> Result<(), BackupError> {
        let set = match self {
            RestoreInto::AsBackedUp => return Ok(()),
            RestoreInto::Url(url) => Some(url.as_str()),
            RestoreInto::Managed => None,
        };
        let text = std::fs::read_to_string(config_json).map_err(io(config_json.display()))?;
        let mut value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| BackupError(format!("the backup's config.json: {e}")))?;
        let object =
            value.as_object_mut().ok_or_else(|| BackupError("the backup's config.json is not an object".into()))?;
        match set {
            Some(url) => object.insert("database_url".into(), url.into()),
            None => object.remove("database_url"),
        };
        let mut out = serde_json::to_string_pretty(&value).map_err(|e| BackupError(e.to_string()))?;
        out.push('\n');
        if holds_password {
            // Readable by its owner only before the password is in it.
            std::fs::set_permissions(config_json, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(io(config_json.display()))?;
        }
        std::fs::write(config_json, out).map_err(io(config_json.display()))?;
        Ok(())
    }
}

/// Restores the archive at `archive` into `root`, which must not exist or be
/// empty; `report` hears each step. The database goes where `into` says:
/// the managed cluster (created in the new home) or an external database,
/// which must not hold choird's tables yet.
pub fn restore(
    archive: &Path,
    root: &Path,
    into: &RestoreInto,
    report: &mut dyn FnMut(&str),
) -> Result<Summary, BackupError> {
    let holds_password = into.check()?;
    if let Ok(mut entries) = std::fs::read_dir(root) {
        if let Some(first) = entries.next() {
            let name = first.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default();
            return Err(BackupError(format!(
                "{} is not empty (it holds {name}, …): restore only into an empty or new directory",
                root.display()
            )));
        }
    }
    std::fs::create_dir_all(root).map_err(io(root.display()))?;
    let result = restore_into(archive, root, (into, holds_password), report);
    if result.is_err() {
        // The home was empty: a failed restore leaves it so (the managed
        // cluster, if one was made, is stopped by then).
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                let path = entry.path();
                let _ = if path.is_dir() && !path.is_symlink() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
    }
    result
}

/// `(into, holds_password)`: where the database goes, as checked by
/// [`RestoreInto::check`].
fn restore_into(
    archive: &Path,
    root: &Path,
    (into, holds_password): (&RestoreInto, bool),
    report: &mut dyn FnMut(&str),
) -> Result<Summary, BackupError> {
    let home = Home::new(root.to_owned());
    let file = File::open(archive).map_err(io(archive.display()))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    tar.set_preserve_permissions(true);
    tar.set_overwrite(false);
    let mut entries = tar.entries().map_err(io(archive.display()))?;
    let not_ours = || BackupError(format!("{} is not a choirctl backup (no {MANIFEST} first)", archive.display()));
    let mut first = entries.next().ok_or_else(not_ours)?.map_err(|_| not_ours())?;
    if first.path().map_err(|_| not_ours())?.as_ref() != Path::new(MANIFEST) {
        return Err(not_ours());
    }
    let mut text = String::new();
    first.read_to_string(&mut text).map_err(|_| not_ours())?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|_| not_ours())?;
    if manifest.format != FORMAT {
        return Err(BackupError(format!(
            "the backup has format {}, this choirctl reads format {FORMAT}: use choirctl {}",
            manifest.format, manifest.choird_version
        )));
    }
    report(&format!(
        "backup of {} (choird {}, {} database)",
        manifest.created, manifest.choird_version, manifest.database
    ));
    let scratch = tempfile::Builder::new().prefix(".restore-").tempdir_in(root).map_err(io(root.display()))?;
    let mut summary = Summary::default();
    let mut config: Option<Config> = None;
    for entry in entries {
        let mut entry = entry.map_err(io(archive.display()))?;
        let path = entry.path().map_err(io(archive.display()))?.into_owned();
        let size = entry.header().size().unwrap_or(0);
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir() || kind.is_symlink()) {
            return Err(BackupError(format!("{}: a {kind:?} entry (choirctl writes none)", path.display())));
        }
        if path == Path::new(DUMP) {
            entry.unpack(scratch.path().join(DUMP)).map_err(io("unpacking the database dump"))?;
            summary.database_bytes = size;
            continue;
        }
        let mut parts = path.components();
        let target = match parts.next().and_then(|c| c.as_os_str().to_str()) {
            Some("workspaces") => {
                let id = parts.next().and_then(|c| c.as_os_str().to_str()).and_then(|s| AgentId::parse(s).ok());
                let (Some(id), Some(config)) = (id, config.as_ref()) else {
                    return Err(BackupError(format!("{}: a workspace entry before config.json", path.display())));
                };
                let dir = config.workspace(&home, &id);
                std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
                let rest = parts.as_path();
                if rest.as_os_str().is_empty() {
                    if std::fs::read_dir(&dir).map(|mut d| d.next().is_some()).unwrap_or(false) {
                        return Err(BackupError(format!(
                            "{id}'s workspace {} is not empty: move it away, or restore without workspaces",
                            dir.display()
                        )));
                    }
                    continue;
                }
                unpack_under(&mut entry, &dir, rest)?
            }
            _ => unpack_under(&mut entry, root, &path)?,
        };
        if target == root.join("config.json") {
            into.apply(&target, holds_password)?;
            config = Some(Config::load(&target).map_err(|e| BackupError(format!("the backup's {e}")))?);
        }
        if entry.header().entry_type().is_file() {
            summary.files += 1;
            summary.bytes += size;
        }
    }
    let config = config.ok_or_else(|| BackupError("the backup holds no config.json".into()))?;
    std::fs::set_permissions(home.secrets(), std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io(home.secrets().display()))?;
    report(&format!("unpacked {} files ({} bytes)", summary.files, summary.bytes));
    let dump = scratch.path().join(DUMP);
    if !dump.is_file() {
        return Err(BackupError("the backup holds no database dump".into()));
    }
    home.ensure_layout().map_err(|e| BackupError(e.to_string()))?;
    restore_database(&home, &config, &dump, report)?;
    // The host the backup came from may still run: until the operator says
    // so, this home polls no bot and fires no job (two pollers would fight
    // over each bot, and every job would run twice).
    let hold = format!(
        "restored from a backup of {} at {}: Telegram polling and the scheduler wait for `choirctl resume` (stop \
         choird on the host the backup came from first)\n",
        manifest.created,
        jiff::Timestamp::now()
    );
    std::fs::write(home.restore_hold(), hold).map_err(io(home.restore_hold().display()))?;
    report("Telegram polling and the scheduler are held until `choirctl resume`");
    Ok(summary)
}

/// Unpacks `entry` as `rel` beneath `dir` (never through a link out of it).
fn unpack_under<R: Read>(entry: &mut tar::Entry<'_, R>, dir: &Path, rel: &Path) -> Result<PathBuf, BackupError> {
    let target = dir.join(rel);
    if rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
        return Err(BackupError(format!("{}: a path that leaves its directory", rel.display())));
    }
    entry.set_preserve_mtime(true);
    // `unpack_in` checks the entry's own path and every parent it creates
    // against `dir`; the entry's path is re-rooted here first.
    let scratch = target.parent().unwrap_or(dir);
    std::fs::create_dir_all(scratch).map_err(io(scratch.display()))?;
    let canonical_parent = scratch.canonicalize().map_err(io(scratch.display()))?;
    if !canonical_parent.starts_with(dir.canonicalize().map_err(io(dir.display()))?) {
        return Err(BackupError(format!("{}: its directory leads out of {}", rel.display(), dir.display())));
    }
    if target.symlink_metadata().is_ok() && !entry.header().entry_type().is_dir() {
        return Err(BackupError(format!("{} appears twice in the backup", rel.display())));
    }
    entry.unpack(&target).map_err(io(target.display()))?;
    Ok(target)
}

fn restore_database(
    home: &Home,
    config: &Config,
    dump: &Path,
    report: &mut dyn FnMut(&str),
) -> Result<(), BackupError> {
    let cluster = match &config.database_url {
        Some(_) => None,
        None => {
            report("creating the managed PostgreSQL cluster");
            let bin = ManagedCluster::find_bin_dir(config.postgres_bin_dir.as_deref())
                .map_err(|e| BackupError(e.to_string()))?;
            Some(ManagedCluster::start(&home.pg(), &bin).map_err(|e| BackupError(e.to_string()))?)
        }
    };
    let result = (|| {
        let db = Database::of(home, config);
        let conn = crate::db::Db::connect(&db.url)
            .map_err(|e| BackupError(format!("cannot reach the {} database: {e}", db.kind)))?;
        let ours: bool = conn
            .with(|c| c.query_one("SELECT to_regclass('public.schema_migrations') IS NOT NULL", &[]).map(|r| r.get(0)))
            .map_err(|e| BackupError(e.to_string()))?;
        if ours {
            return Err(BackupError(format!(
                "the {} database already holds choird's tables: restore into an empty database",
                db.kind
            )));
        }
        report(&format!("restoring the database into the {} cluster", db.kind));
        db.tool("pg_restore")?
            .args(["--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", "--dbname"])
            .arg(dbname(&db.parsed()?))
            .arg(dump)
            .run()
            .map_err(|e| BackupError(format!("pg_restore failed: {e}")))?;
        Ok(())
    })();
    if let Some(cluster) = cluster {
        report("stopping the managed PostgreSQL (choird starts it)");
        if let Err(e) = cluster.stop() {
            report(&format!("stopping the managed PostgreSQL: {e}"));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: impl FnOnce(&mut tar::Builder<flate2::write::GzEncoder<File>>)) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let gz = flate2::write::GzEncoder::new(file.reopen().unwrap(), flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        let manifest = Manifest {
            format: FORMAT,
            choird_version: "test".into(),
            created: "now".into(),
            database: "managed".into(),
            workspaces: vec![],
        };
        append_bytes(&mut tar, MANIFEST, &serde_json::to_vec(&manifest).unwrap(), 0o600).unwrap();
        entries(&mut tar);
        tar.into_inner().unwrap().finish().unwrap();
        file
    }

    #[test]
    fn a_restore_target_is_checked_first_and_written_into_the_config() {
        use std::os::unix::fs::PermissionsExt;
        let url = |u: &str| RestoreInto::Url(u.to_owned());
        for (bad, why) in [
            (url(""), "is empty"),
            (url("postgresql://u:s3cret@h:notaport/x"), "not a PostgreSQL connection string"),
            (url("postgresql://u:s3cret@h"), "names no database"),
            (url("host=/tmp user=u password=s3cret"), "names no database"),
            (url("postgresql://u:s3cret@h/db\0x"), "control character"),
            (url("postgresql://u:s3cret@h/db\nx"), "control character"),
        ] {
            let err = bad.check().unwrap_err().to_string();
            assert!(err.contains(why) && !err.contains("s3cret"), "{bad:?}: {err}");
        }
        assert!(!url("postgresql://u@h/choir2").check().unwrap(), "no password");
        assert!(url("postgresql://u:pw@h/choir2").check().unwrap(), "a password");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        let original = serde_json::json!({"agents": {"demo": {"image": "x"}}, "database_url": "postgresql://old/db"});
        let write = || {
            std::fs::write(&file, original.to_string()).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        };
        let read = || serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let mode = || std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        write();
        RestoreInto::AsBackedUp.apply(&file, false).unwrap();
        assert_eq!(read(), original);
        RestoreInto::Managed.apply(&file, false).unwrap();
        assert_eq!(read(), serde_json::json!({"agents": {"demo": {"image": "x"}}}));
        assert_eq!(mode(), 0o644);
        write();
        let plain = url("postgresql://u@new/db");
        plain.apply(&file, plain.check().unwrap()).unwrap();
        assert_eq!(read()["database_url"], "postgresql://u@new/db");
        assert_eq!(read()["agents"], original["agents"]);
        assert_eq!(mode(), 0o644, "no password in it");
        let secret = url("postgresql://u:pw@new/db");
        secret.apply(&file, secret.check().unwrap()).unwrap();
        assert_eq!(mode(), 0o600, "it holds a password now");
    }

    #[test]
    fn a_link_in_the_archive_cannot_lead_a_later_entry_out_of_the_home() {
        let outside = tempfile::tempdir().unwrap();
        let file = archive(|tar| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            tar.append_link(&mut h, "repos", outside.path()).unwrap();
            append_bytes(tar, "repos/evil.json", b"{}", 0o644).unwrap();
        });
        let home = tempfile::tempdir().unwrap();
        let err = restore(file.path(), home.path(), &RestoreInto::AsBackedUp, &mut |_| {}).unwrap_err();
        assert!(err.0.contains("leads out of"), "{err}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing written outside");
        assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0, "the home is empty again");
    }

    /// Appends a file entry named `name` as given, past the tar crate's own
    /// refusal of `..` (a hostile archive is not written by our builder).
    fn append_raw_name<W: Write>(tar: &mut tar::Builder<W>, name: &[u8], bytes: &[u8]) {
        let mut h = file_header(bytes.len() as u64, 0o644);
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        tar.append(&h, bytes).unwrap();
    }

    #[test]
    fn entries_whose_path_climbs_out_are_refused_and_nothing_lands_outside() {
        for name in [&b"../escape.json"[..], b"repos/../../escape.json", b"workspaces/demo/../../../escape.json"] {
            let file = archive(|tar| {
                append_bytes(tar, "config.json", crate::home::STARTER_CONFIG.as_bytes(), 0o600).unwrap();
                append_raw_name(tar, name, b"{}");
            });
            let outer = tempfile::tempdir().unwrap();
            let home = outer.path().join("home");
            std::fs::create_dir(&home).unwrap();
            let err = restore(file.path(), &home, &RestoreInto::AsBackedUp, &mut |_| {}).unwrap_err();
            assert!(err.0.contains("leaves its directory"), "{}: {err}", String::from_utf8_lossy(name));
            let beside: Vec<_> = std::fs::read_dir(outer.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(beside, ["home"], "{}: something was written outside the home", String::from_utf8_lossy(name));
            assert!(!home.join("escape.json").exists() && !outer.path().join("escape.json").exists());
        }
    }

    #[test]
    fn hard_links_and_devices_are_refused() {
        let file = archive(|tar| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Link);
            h.set_size(0);
            tar.append_link(&mut h, "config.json", "/etc/shadow").unwrap();
        });
        let home = tempfile::tempdir().unwrap();
        let err = restore(file.path(), home.path(), &RestoreInto::AsBackedUp, &mut |_| {}).unwrap_err();
        assert!(err.0.contains("choirctl writes none"), "{err}");
    }

    #[test]
    fn a_tree_is_archived_without_following_links_or_opening_fifos() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "alpha").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link")).unwrap();
        rustix::fs::mknodat(rustix::fs::CWD, dir.path().join("pipe"), FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .unwrap();
        let mut out = Vec::new();
        let mut summary = Summary::default();
        {
            let mut tar = tar::Builder::new(&mut out);
            append_tree(&mut tar, dir.path(), Path::new("w"), &mut summary).unwrap();
            tar.finish().unwrap();
        }
        assert_eq!((summary.files, summary.bytes, summary.skipped), (1, 5, 1));
        let mut archive = tar::Archive::new(&out[..]);
        let mut seen = Vec::new();
        for e in archive.entries().unwrap() {
            let e = e.unwrap();
            let link = e.link_name().unwrap().map(|l| l.display().to_string());
            seen.push((e.path().unwrap().display().to_string(), e.header().entry_type(), link));
        }
        assert!(seen.contains(&("w/link".into(), tar::EntryType::Symlink, Some("/etc/hostname".into()))), "{seen:?}");
        assert!(seen.iter().any(|(p, t, _)| p == "w/sub/a.txt" && *t == tar::EntryType::Regular), "{seen:?}");
        assert!(!seen.iter().any(|(p, _, _)| p.contains("pipe")), "{seen:?}");
    }
}
