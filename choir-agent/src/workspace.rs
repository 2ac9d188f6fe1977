//! Path rules (R-ARB-1): every path a tool touches resolves inside the agent's
//! workspace root. Checked twice, on purpose:
//!
//! 1. *Lexically*, before any lock is taken ([`Workspace::normalize`]): no `..`
//!    component, absolute paths only under the root, the reserved `.choir/`
//!    state directory off limits. The result is the canonical relative path
//!    that names the `file:<path>` lock, so two spellings are one resource.
//! 2. *At use*, by the kernel: every open goes through `openat2` with
//!    `RESOLVE_BENEATH` relative to a descriptor of the root, so a symlink that
//!    leaves the root at any component — including one swapped in between the
//!    check and the use — fails with `EXDEV` instead of escaping. Writes replace
//!    files by `renameat` inside the resolved parent directory, which never
//!    follows a symlink in the final component.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The name of the workspace root as models see it.
pub const LOGICAL_ROOT: &str = "/workspace";
/// Agent-private state inside the workspace; tools may not touch it.
pub const STATE_DIR: &str = ".choir";

/// A path was refused or an operation on it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path is not acceptable at all (empty, NUL, `..`, outside the root).
    #[error("path {path:?} is not allowed: {reason}")]
    Refused {
        /// The path as given.
        path: String,
        /// Why.
        reason: String,
    },
    /// Resolution left the workspace through a symlink.
    #[error("path {0:?} leaves the workspace through a symbolic link")]
    Escapes(String),
    /// The file does not exist.
    #[error("{0:?} does not exist")]
    NotFound(String),
    /// Another filesystem error.
    #[error("{path:?}: {reason}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        reason: String,
    },
}

/// A file type in words, for error messages.
pub fn kind_name(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match kind {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of unknown type",
    }
}

/// A canonical path relative to the workspace root (no `.`/`..`, no leading `/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

impl RelPath {
    /// As a string, e.g. `notes/a.txt` (`.` for the root itself).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The workspace root, held open.
pub struct Workspace {
    root: PathBuf,
    dir: OwnedFd,
}

fn errno_to(path: &str, e: Errno) -> PathError {
    match e {
        Errno::XDEV | Errno::LOOP => PathError::Escapes(path.to_owned()),
        Errno::NOENT => PathError::NotFound(path.to_owned()),
        other => PathError::Io { path: path.to_owned(), reason: std::io::Error::from(other).to_string() },
    }
}

impl Workspace {
    /// Opens the root directory (which must exist).
    pub fn open(root: &Path) -> std::io::Result<Workspace> {
        let dir = rustix::fs::open(root, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Workspace { root: root.to_owned(), dir })
    }

    /// The real directory behind [`LOGICAL_ROOT`].
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Lexical check and canonicalisation (step 1 above).
    pub fn normalize(&self, raw: &str) -> Result<RelPath, PathError> {
        let refuse = |reason: &str| PathError::Refused { path: raw.to_owned(), reason: reason.to_owned() };
        if raw.is_empty() {
            return Err(refuse("empty path"));
        }
        if raw.contains('\0') {
            return Err(refuse("contains a NUL byte"));
        }
        let path = Path::new(raw);
        let rel: &Path = if path.is_absolute() {
            let real = self.root.as_path();
            if let Ok(r) = path.strip_prefix(LOGICAL_ROOT) {
                r
            } else if let Ok(r) = path.strip_prefix(real) {
                r
            } else {
                return Err(refuse(&format!("absolute paths must be under {LOGICAL_ROOT}")));
            }
        } else {
            path
        };
        let mut parts: Vec<&str> = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(s) => parts.push(s.to_str().ok_or_else(|| refuse("not valid UTF-8"))?),
                Component::CurDir => {}
                Component::ParentDir => return Err(refuse("'..' is not allowed")),
                Component::RootDir | Component::Prefix(_) => return Err(refuse("unexpected root component")),
            }
        }
        if parts.first() == Some(&STATE_DIR) {
            return Err(refuse("the .choir directory holds the agent's own state"));
        }
        Ok(RelPath(if parts.is_empty() { ".".to_owned() } else { parts.join("/") }))
    }

    fn open_beneath(&self, rel: &RelPath, flags: OFlags) -> Result<OwnedFd, PathError> {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        rustix::fs::openat2(&self.dir, rel.as_str(), flags | OFlags::CLOEXEC, Mode::empty(), how)
            .map_err(|e| errno_to(rel.as_str(), e))
    }

    /// Reads a whole file, up to `cap` bytes (more is an error). Opened
    /// non-blocking and checked to be a regular file before any read: a FIFO
    /// or device planted in the workspace is refused, never waited on.
    pub fn read(&self, rel: &RelPath, cap: u64) -> Result<Vec<u8>, PathError> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| errno_to(rel.as_str(), e))?;
        let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
        if kind != rustix::fs::FileType::RegularFile {
            return Err(PathError::Io {
                path: rel.0.clone(),
                reason: format!("not a regular file ({})", kind_name(kind)),
            });
        }
        let mut out = Vec::new();
        File::from(fd)
            .take(cap + 1)
            .read_to_end(&mut out)
            .map_err(|e| PathError::Io { path: rel.0.clone(), reason: e.to_string() })?;
        if out.len() as u64 > cap {
            return Err(PathError::Io { path: rel.0.clone(), reason: format!("file is larger than {cap} bytes") });
        }
        Ok(out)
    }

    /// What kind of file `rel` is (looked at through `O_PATH`, never opened
    /// for reading), or `None` when it does not exist.
    pub fn kind(&self, rel: &RelPath) -> Result<Option<rustix::fs::FileType>, PathError> {
        match self.open_beneath(rel, OFlags::PATH) {
            Ok(fd) => {
                let stat = rustix::fs::fstat(&fd).map_err(|e| errno_to(rel.as_str(), e))?;
                Ok(Some(rustix::fs::FileType::from_raw_mode(stat.st_mode)))
            }
            Err(PathError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether a file exists (following only in-root symlinks).
    pub fn exists(&self, rel: &RelPath) -> Result<bool, PathError> {
        match self.open_beneath(rel, OFlags::PATH) {
            Ok(_) => Ok(true),
            Err(PathError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Replaces the file's content atomically (temp file, fsync, rename, fsync
    /// of the directory), creating parent directories as needed.
    pub fn write_atomic(&self, rel: &RelPath, content: &[u8]) -> Result<(), PathError> {
        let io = |reason: String| PathError::Io { path: rel.0.clone(), reason };
        let (parent, name) = match rel.0.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, rel.0.as_str()),
        };
        if rel.0 == "." {
            return Err(PathError::Refused { path: rel.0.clone(), reason: "is the workspace root".into() });
        }
        let dir = match parent {
            None => rustix::io::dup(&self.dir).map_err(|e| io(e.to_string()))?,
            Some(p) => self.mkdirs(p)?,
        };
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| io(e.to_string()))?;
        let tmp = format!(".{name}.choir-tmp-{}", hex::encode(rnd));
        let fd = rustix::fs::openat(
            &dir,
            tmp.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| errno_to(rel.as_str(), e))?;
        let mut file = File::from(fd);
        let written = file.write_all(content).and_then(|()| file.sync_data());
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), rustix::fs::AtFlags::empty());
            return Err(io(e.to_string()));
        }
        if let Err(e) = rustix::fs::renameat(&dir, tmp.as_str(), &dir, name) {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), rustix::fs::AtFlags::empty());
            return Err(errno_to(rel.as_str(), e));
        }
        rustix::fs::fsync(&dir).map_err(|e| io(e.to_string()))?;
        Ok(())
    }

    /// Opens (creating as needed) the directory `rel_dir`. Each prefix is
    /// resolved from the root with `RESOLVE_BENEATH`; a missing component is
    /// created with `mkdirat` inside its already-resolved parent.
    fn mkdirs(&self, rel_dir: &str) -> Result<OwnedFd, PathError> {
        let parts: Vec<&str> = rel_dir.split('/').collect();
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        let mut parent = rustix::io::dup(self.dir.as_fd()).map_err(|e| errno_to(rel_dir, e))?;
        for i in 0..parts.len() {
            let prefix = parts[..=i].join("/");
            let open = || rustix::fs::openat2(&self.dir, prefix.as_str(), flags, Mode::empty(), how);
            parent = match open() {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&parent, parts[i], Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(errno_to(rel_dir, e)),
                    }
                    open().map_err(|e| errno_to(rel_dir, e))?
                }
                Err(e) => return Err(errno_to(rel_dir, e)),
            };
        }
        Ok(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> (tempfile::TempDir, tempfile::TempDir, Workspace) {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("sub/deeper")).unwrap();
        std::fs::write(root.path().join("sub/file.txt"), "inside").unwrap();
        std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("out_dir")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.path().join("out_file")).unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("../..", root.path().join("sub/up2")).unwrap();
        std::os::unix::fs::symlink("sub/file.txt", root.path().join("in_link")).unwrap();
        let w = Workspace::open(root.path()).unwrap();
        (root, outside, w)
    }

    #[test]
    fn regression_a_fifo_in_the_workspace_is_refused_not_waited_on() {
        let (root, _o, w) = ws();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.path().join("pipe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let rel = w.normalize("pipe").unwrap();
        let started = std::time::Instant::now();
        let err = w.read(&rel, 1024).unwrap_err();
        assert!(err.to_string().contains("not a regular file (a FIFO)"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "the read blocked on the FIFO");
        assert_eq!(w.kind(&rel).unwrap(), Some(rustix::fs::FileType::Fifo));
    }

    #[test]
    fn spellings_of_one_file_normalise_to_one_resource() {
        let (root, _o, w) = ws();
        let canonical = w.normalize("sub/file.txt").unwrap();
        let real_abs = format!("{}/sub/file.txt", root.path().display());
        for spelling in
            ["./sub/file.txt", "sub//file.txt", "sub/./file.txt", "/workspace/sub/file.txt", real_abs.as_str()]
        {
            assert_eq!(w.normalize(spelling).unwrap(), canonical, "{spelling}");
        }
        assert_eq!(w.normalize("/workspace").unwrap().as_str(), ".");
    }

    #[test]
    fn hostile_paths_never_escape() {
        let (_r, outside, w) = ws();
        let lexical = [
            "",
            "..",
            "../x",
            "../../etc/passwd",
            "sub/../../x",
            "sub/deeper/../../../x",
            "./../x",
            "/etc/passwd",
            "/workspace/../etc/passwd",
            "/workspacex/file",
            "/tmp",
            "a\0b",
            ".choir/commit.log",
            "./.choir/x",
            "/workspace/.choir",
        ];
        for p in lexical {
            assert!(matches!(w.normalize(p), Err(PathError::Refused { .. })), "{p:?} was not refused");
        }
        let through_links = ["out_dir/secret.txt", "out_file", "etc/passwd", "sub/up2/x", "out_dir", "etc/hostname"];
        for p in through_links {
            let rel = w.normalize(p).unwrap();
            assert!(matches!(w.read(&rel, 1024), Err(PathError::Escapes(_))), "read {p:?} escaped");
            let write = w.write_atomic(&RelPath(format!("{p}/new")), b"x");
            assert!(write.is_err(), "write under {p:?} succeeded");
        }
        // A symlinked parent directory that leaves the root.
        assert!(matches!(w.write_atomic(&w.normalize("out_dir/new.txt").unwrap(), b"x"), Err(PathError::Escapes(_))));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1, "nothing was created outside");
        assert_eq!(std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "outside");
    }

    #[test]
    fn in_root_symlinks_work_and_writes_replace_links_not_targets() {
        let (root, outside, w) = ws();
        assert_eq!(w.read(&w.normalize("in_link").unwrap(), 1024).unwrap(), b"inside");
        // Writing to a name that is a symlink to the outside replaces the link itself.
        w.write_atomic(&w.normalize("out_file").unwrap(), b"replaced").unwrap();
        assert_eq!(std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "outside");
        assert_eq!(std::fs::read_to_string(root.path().join("out_file")).unwrap(), "replaced");
        assert!(!std::fs::symlink_metadata(root.path().join("out_file")).unwrap().file_type().is_symlink());
        // Parents are created as needed; no temp files are left behind.
        w.write_atomic(&w.normalize("new/dir/f.txt").unwrap(), b"hi").unwrap();
        assert_eq!(std::fs::read_to_string(root.path().join("new/dir/f.txt")).unwrap(), "hi");
        assert_eq!(std::fs::read_dir(root.path().join("new/dir")).unwrap().count(), 1);
    }

    #[test]
    fn a_symlink_swapped_in_after_the_check_does_not_escape() {
        let (root, outside, w) = ws();
        // The lexical check passes while "swap" is a real directory...
        std::fs::create_dir(root.path().join("swap")).unwrap();
        let rel = w.normalize("swap/f.txt").unwrap();
        // ...then it becomes a link to the outside before the use.
        std::fs::remove_dir(root.path().join("swap")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("swap")).unwrap();
        assert!(matches!(w.write_atomic(&rel, b"x"), Err(PathError::Escapes(_))));
        assert!(!outside.path().join("f.txt").exists());
    }
}
