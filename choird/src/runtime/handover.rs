//! Handing an agent its workspace: the directory private to the agent's user
//! (mode 0700) and, when choird is root, everything in it owned by that user.
//!
//! A workspace moves between users when its agent moves between runtimes (the
//! process runtime runs as choird's user, a container as
//! [`AGENT_UID`](super::docker::AGENT_UID) when choird is root): files the
//! earlier runtime made would otherwise stay the earlier user's, and the
//! agent would meet `Permission denied` on its own lock file.
//!
//! **Invariants.** The workspace is hostile (an agent wrote it): the tree is
//! walked through descriptors only (`openat` with `O_NOFOLLOW`, `fstatat` and
//! `fchownat` with `AT_SYMLINK_NOFOLLOW`), so a link is re-owned itself and
//! never followed; a file with more than one hard link is never re-owned (it
//! may be a host file's other name) and is named in the refusal instead; the
//! walk is bounded in depth and in entries, and a bound reached refuses with
//! the command that does the rest. Nothing is re-owned unless choird is root.

use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Deepest directory the walk descends into.
const MAX_DEPTH: u32 = 64;
/// Most entries the walk looks at.
const MAX_ENTRIES: u64 = 2_000_000;

/// What [`hand_over`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HandedOver {
    /// The workspace directory's mode was made 0700.
    pub made_private: bool,
    /// Entries (the workspace itself included) given to the agent's user.
    pub reowned: u64,
}

/// Makes `workspace` (a real directory, not a link) private to `uid:gid`:
/// mode 0700 and, when choird is root, every entry in it owned by them.
/// A non-root choird can only set the mode of a workspace it owns, and says
/// what to run when the workspace is someone else's.
pub fn hand_over(workspace: &Path, uid: u32, gid: u32) -> Result<HandedOver, String> {
    let shown = workspace.display();
    let fd = rustix::fs::open(
        workspace,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the workspace {shown} (it must be a real directory, not a link): {e}"))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat {shown}: {e}"))?;
    let root = rustix::process::geteuid().is_root();
    let mut done = HandedOver::default();
    if root {
        // A first walk only looks, so that a refusal changes nothing.
        let mut walk = Walk { uid, gid, apply: false, seen: 0, changed: 0, too_deep: false, shared: Vec::new() };
        walk.dir(&fd, 0).map_err(|e| format!("cannot look through {shown}: {e}"))?;
        if walk.seen >= MAX_ENTRIES || walk.too_deep {
            return Err(format!(
                "{shown} holds more than {MAX_ENTRIES} entries or directories deeper than {MAX_DEPTH}; hand it over yourself: chown -R --no-dereference \
                 {uid}:{gid} {shown}"
            ));
        }
        if let Some(first) = walk.shared.first() {
            return Err(format!(
                "{shown} holds {} file(s) with other hard links (first: {first}), which are not handed over (another \
                 name may be a host file's); remove them or copy them into the workspace, then start the agent again",
                walk.shared.len()
            ));
        }
        walk = Walk { apply: true, seen: 0, changed: 0, ..walk };
        walk.dir(&fd, 0).map_err(|e| format!("cannot hand {shown} to uid {uid}: {e}"))?;
        if st.st_uid != uid || st.st_gid != gid {
            rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
                .map_err(|e| format!("cannot hand {shown} to uid {uid}: {e}"))?;
        }
        done.reowned = walk.reowned(st.st_uid != uid || st.st_gid != gid);
    } else if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(format!(
            "the workspace {shown} belongs to uid {} while the agent runs as uid {uid}: as root, run chown -R \
             --no-dereference {uid}:{gid} {shown} (or start the agent from a choird running as root, which does it)",
            st.st_uid
        ));
    }
    if st.st_mode & 0o777 != 0o700 {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| format!("cannot make {shown} private: {e}"))?;
        done.made_private = true;
    }
    Ok(done)
}

struct Walk {
    uid: u32,
    gid: u32,
    apply: bool,
    seen: u64,
    changed: u64,
    too_deep: bool,
    shared: Vec<String>,
}

impl Walk {
    fn reowned(&self, top: bool) -> u64 {
        self.changed + u64::from(top)
    }

    fn dir(&mut self, dir: &OwnedFd, depth: u32) -> rustix::io::Result<()> {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(entry.file_name().to_owned());
            }
            self.seen += 1;
            if self.seen >= MAX_ENTRIES {
                return Ok(());
            }
        }
        for name in names {
            let st = match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e),
            };
            let kind = FileType::from_raw_mode(st.st_mode);
            if kind != FileType::Directory && st.st_nlink > 1 {
                self.shared.push(String::from_utf8_lossy(name.to_bytes()).into_owned());
                continue;
            }
            if self.apply && (st.st_uid != self.uid || st.st_gid != self.gid) {
                rustix::fs::chownat(
                    dir,
                    &name,
                    Some(rustix::fs::Uid::from_raw(self.uid)),
                    Some(rustix::fs::Gid::from_raw(self.gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
                self.changed += 1;
            }
            if kind == FileType::Directory && depth >= MAX_DEPTH {
                self.too_deep = true;
            } else if kind == FileType::Directory && self.seen < MAX_ENTRIES {
                let sub = rustix::fs::openat(
                    dir,
                    &name,
                    OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                self.dir(&sub, depth + 1)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn root_only() -> bool {
        let root = rustix::process::geteuid().is_root();
        if !root {
            eprintln!("skipped: handing a workspace to another user takes root");
        }
        root
    }

    /// A workspace the process runtime (root) wrote, moved to a container's
    /// user: every entry becomes the agent's, the directory private.
    #[test]
    fn regression_a_workspace_moved_from_the_process_runtime_to_docker_kept_the_earlier_owner() {
        if !root_only() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir_all(ws.join(".choir/deep")).unwrap();
        std::fs::write(ws.join(".choir/agent.lock"), "").unwrap();
        std::fs::write(ws.join(".choir/deep/f"), "x").unwrap();
        std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
        let done = hand_over(&ws, 10001, 10001).unwrap();
        assert!(done.made_private);
        assert_eq!(done.reowned, 5, "the workspace, .choir, deep, agent.lock and f");
        for p in [&ws, &ws.join(".choir"), &ws.join(".choir/agent.lock"), &ws.join(".choir/deep/f")] {
            let m = std::fs::symlink_metadata(p).unwrap();
            assert_eq!((m.uid(), m.gid()), (10001, 10001), "{}", p.display());
        }
        assert_eq!(std::fs::metadata(&ws).unwrap().mode() & 0o777, 0o700);
        // Again: nothing left to change.
        assert_eq!(hand_over(&ws, 10001, 10001).unwrap(), HandedOver::default());
    }

    /// A link in the workspace to a host file: the link is re-owned, the host
    /// file is not; the same walk without NOFOLLOW would have given it away.
    #[test]
    fn a_link_in_the_workspace_is_reowned_itself_never_its_target() {
        if !root_only() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("host-secret");
        std::fs::write(&host, "root's").unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::os::unix::fs::symlink(&host, ws.join("link")).unwrap();
        std::os::unix::fs::symlink(d.path(), ws.join("sub/up")).unwrap();
        hand_over(&ws, 10001, 10001).unwrap();
        assert_eq!(std::fs::symlink_metadata(ws.join("link")).unwrap().uid(), 10001);
        assert_eq!(std::fs::metadata(&host).unwrap().uid(), 0, "the host file stays root's");
        assert_eq!(std::fs::metadata(d.path()).unwrap().uid(), 0, "a linked directory is not walked");
        // Negative control: following the link is what would have given it away.
        std::os::unix::fs::chown(ws.join("link"), Some(10001), Some(10001)).unwrap();
        assert_eq!(std::fs::metadata(&host).unwrap().uid(), 10001);
    }

    #[test]
    fn a_file_with_another_hard_link_is_refused_and_left_as_it_was() {
        if !root_only() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("host-file");
        std::fs::write(&host, "root's").unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(ws.join("a-first"), "").unwrap();
        std::fs::hard_link(&host, ws.join("other-name")).unwrap();
        let e = hand_over(&ws, 10001, 10001).unwrap_err();
        assert!(e.contains("other hard links") && e.contains("other-name"), "{e}");
        assert_eq!(std::fs::metadata(&host).unwrap().uid(), 0);
        assert_eq!(std::fs::metadata(&ws).unwrap().uid(), 0, "a refusal changes nothing");
        assert_eq!(std::fs::metadata(ws.join("a-first")).unwrap().uid(), 0, "not even what the walk met first");
        std::fs::remove_file(ws.join("other-name")).unwrap();
        hand_over(&ws, 10001, 10001).unwrap();
    }

    #[test]
    fn a_workspace_that_is_a_link_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("ws")).unwrap();
        let e = hand_over(&d.path().join("ws"), 10001, 10001).unwrap_err();
        assert!(e.contains("not a link"), "{e}");
    }
}
