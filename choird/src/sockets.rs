//! The Unix sockets choird listens on, and the directories that hold them,
//! made and repaired through descriptors.
//!
//! An agent's socket directory (`socks/agents/<id>/`) is mounted into its
//! container, read-only. Older versions mounted it read-write and handed it
//! to the agent's user, so whatever is found there may have been planted by a
//! hostile agent: links, directories, FIFOs named like the socket.
//!
//! **Invariant:** no path under `socks/` is ever resolved through a link.
//! Directories are opened with `O_NOFOLLOW | O_DIRECTORY` and checked to be
//! choird's own; a directory holding anything but choird's socket is renamed
//! aside (`renameat` never follows its last component) and made afresh; the
//! stale socket is removed with `unlinkat`; ownership and mode of the new
//! socket are set on an `O_PATH | O_NOFOLLOW` descriptor of it. So nothing an
//! agent left there can redirect a `chown`/`chmod` to a host file or stop
//! choird from starting.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// The socket's file name inside its directory.
pub const SOCKET_NAME: &str = "choird.sock";

/// What went wrong preparing a socket.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {what}: {source}")]
pub struct SocketError {
    path: PathBuf,
    what: &'static str,
    source: std::io::Error,
}

fn err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(rustix::io::Errno) -> SocketError + 'a {
    move |e| SocketError { path: path.to_owned(), what, source: e.into() }
}

fn open_dir_at(dir: &impl AsFd, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens `path` (a directory choird made) without following a link at its
/// last component, and checks it is owned by choird's user.
fn open_own_dir(path: &Path) -> Result<OwnedFd, SocketError> {
    let fd =
        rustix::fs::open(path, OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(err(path, "cannot open the directory (it must be a real directory, not a link)"))?;
    let st = rustix::fs::fstat(&fd).map_err(err(path, "cannot stat"))?;
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(SocketError {
            path: path.to_owned(),
            what: "is not owned by choird's user",
            source: std::io::Error::other(format!("owner uid {}", st.st_uid)),
        });
    }
    Ok(fd)
}

/// Whether a directory holds nothing but (at most) a socket named [`SOCKET_NAME`].
fn holds_only_a_socket(dir: &OwnedFd) -> rustix::io::Result<bool> {
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if name != SOCKET_NAME.as_bytes() {
            return Ok(false);
        }
        let st = rustix::fs::statat(dir, SOCKET_NAME, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Removes `name` in `dir` and everything beneath it without following a
/// link (best effort; depth-bounded).
fn remove_tree_at(dir: &OwnedFd, name: &str, depth: u32) -> rustix::io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) if depth < 32 => {}
        Err(e) => return Err(e),
    }
    let sub = open_dir_at(dir, name)?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&sub)? {
        let entry = entry?;
        let n = entry.file_name().to_string_lossy().into_owned();
        if n != "." && n != ".." {
            names.push(n);
        }
        if names.len() > 100_000 {
            break;
        }
    }
    for n in names {
        remove_tree_at(&sub, &n, depth + 1)?;
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

/// Makes `parent/name` a fresh directory of choird's, with `mode`, whatever
/// was there; returns a descriptor of it.
fn fresh_dir(parent: &OwnedFd, parent_path: &Path, name: &str, mode: u32) -> Result<OwnedFd, SocketError> {
    let path = parent_path.join(name);
    let me = rustix::process::geteuid().as_raw();
    let reusable = match open_dir_at(parent, name) {
        Ok(fd) => {
            let st = rustix::fs::fstat(&fd).map_err(err(&path, "cannot stat"))?;
            let clean = holds_only_a_socket(&fd).unwrap_or(false);
            if clean && st.st_uid != me {
                // Handed to an agent's user by an older choird: take it back.
                rustix::fs::fchown(&fd, Some(rustix::process::geteuid()), Some(rustix::process::getegid()))
                    .map_err(err(&path, "cannot take the directory back"))?;
            }
            clean.then_some(fd)
        }
        Err(rustix::io::Errno::NOENT) => None,
        // A link, a file, a FIFO … named like the directory: set aside below.
        Err(_) => None,
    };
    let fd = match reusable {
        Some(fd) => fd,
        None => {
            if rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                let mut rnd = [0u8; 6];
                let _ = getrandom::fill(&mut rnd);
                let aside = format!(".stale-{name}-{}", hex::encode(rnd));
                rustix::fs::renameat(parent, name, parent, aside.as_str())
                    .map_err(err(&path, "cannot set aside what is there"))?;
                log::warn!(
                    "{}: held something besides choird's socket (left by an agent?); set aside as {aside} and removed",
                    path.display()
                );
                if let Err(e) = remove_tree_at(parent, &aside, 0) {
                    log::warn!("{}: could not remove all of {aside}: {e}", parent_path.display());
                }
            }
            rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode)).map_err(err(&path, "cannot create"))?;
            open_dir_at(parent, name).map_err(err(&path, "cannot open"))?
        }
    };
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(err(&path, "cannot set the mode"))?;
    Ok(fd)
}

/// Binds `dir/choird.sock` after removing whatever stale entry has that name
/// (without following it), and gives the new socket `owner` (when given) and
/// mode 0600 through an `O_PATH | O_NOFOLLOW` descriptor.
fn bind_in(
    dir: &OwnedFd,
    dir_path: &Path,
    owner: Option<(u32, u32)>,
    mode: u32,
) -> Result<(UnixListener, PathBuf), SocketError> {
    bind_named(dir, dir_path, SOCKET_NAME, owner, mode)
}

fn bind_named(
    dir: &OwnedFd,
    dir_path: &Path,
    name: &str,
    owner: Option<(u32, u32)>,
    mode: u32,
) -> Result<(UnixListener, PathBuf), SocketError> {
    let path = dir_path.join(name);
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {
            remove_tree_at(dir, name, 0).map_err(err(&path, "cannot remove a directory named like the socket"))?
        }
        Err(e) => return Err(err(&path, "cannot remove the stale socket")(e)),
    }
    // The directory is choird's and verified: nobody else can put an entry
    // here between the unlink and the bind.
    let listener =
        UnixListener::bind(&path).map_err(|e| SocketError { path: path.clone(), what: "cannot listen", source: e })?;
    let sock = rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(err(&path, "cannot open the new socket"))?;
    let st = rustix::fs::fstat(&sock).map_err(err(&path, "cannot stat the new socket"))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
        return Err(SocketError {
            path,
            what: "is not the socket just bound",
            source: std::io::Error::other("replaced under us"),
        });
    }
    if let Some((uid, gid)) = owner {
        rustix::fs::chownat(
            &sock,
            "",
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::EMPTY_PATH,
        )
        .map_err(err(&path, "cannot hand the socket to the agent's user"))?;
    }
    // chmod has no descriptor form for O_PATH before Linux 6.6; the magic
    // link of our own descriptor names exactly this inode.
    let magic = format!("/proc/self/fd/{}", sock.as_raw_fd());
    std::fs::set_permissions(&magic, std::fs::Permissions::from_mode(mode)).map_err(|e| SocketError {
        path: path.clone(),
        what: "cannot set the socket's mode",
        source: e,
    })?;
    Ok((listener, path))
}

/// Binds the admin socket `socks/choird.sock`: choird's, mode 0600 in a
/// 0700 directory; with an admin group (config `admin_group`), that group's
/// too: mode 0660 in a 0710 directory of the group (its members can reach
/// the socket and list nothing).
pub fn bind_admin(socks: &Path, group: Option<u32>) -> Result<(UnixListener, PathBuf), SocketError> {
    let dir = open_own_dir(socks)?;
    let me = rustix::process::geteuid().as_raw();
    let (dir_mode, sock_mode, gid) = match group {
        Some(g) => (0o710, 0o660, g),
        None => (0o700, 0o600, rustix::process::getegid().as_raw()),
    };
    rustix::fs::fchown(&dir, None, Some(rustix::fs::Gid::from_raw(gid)))
        .map_err(err(socks, "cannot give the directory to the admin group"))?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(dir_mode)).map_err(err(socks, "cannot set the mode"))?;
    bind_in(&dir, socks, Some((me, gid)), sock_mode)
}

/// Binds the console's socket `socks/console.sock` beside the admin socket,
/// with the admin socket's owner and mode (0600, or 0660 for the admin
/// group): whoever may run choirctl may open the console, nobody else.
pub fn bind_console(socks: &Path, group: Option<u32>) -> Result<(UnixListener, PathBuf), SocketError> {
    let dir = open_own_dir(socks)?;
    let me = rustix::process::geteuid().as_raw();
    let (mode, gid) = match group {
        Some(g) => (0o660, g),
        None => (0o600, rustix::process::getegid().as_raw()),
    };
    bind_named(&dir, socks, "console.sock", Some((me, gid)), mode)
}

/// The id of system group `name` (from /etc/group).
pub fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// Binds an agent's socket `socks/agents/<id>/choird.sock`: the directory is
/// choird's (0755 when root, so the agent's user can reach the socket; 0700
/// otherwise) and the socket alone belongs to `agent_owner` (when choird is
/// root), mode 0600.
pub fn bind_agent(
    agents_dir: &Path,
    id: &str,
    agent_owner: Option<(u32, u32)>,
) -> Result<(UnixListener, PathBuf), SocketError> {
    let parent = open_own_dir(agents_dir)?;
    let mode = if agent_owner.is_some() { 0o755 } else { 0o700 };
    let dir = fresh_dir(&parent, agents_dir, id, mode)?;
    bind_in(&dir, &agents_dir.join(id), agent_owner, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn agents_dir() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let agents = d.path().join("agents");
        std::fs::create_dir(&agents).unwrap();
        (d, agents)
    }

    #[test]
    fn a_planted_link_named_like_the_socket_is_removed_not_followed() {
        let (d, agents) = agents_dir();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "host file").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir(agents.join("a")).unwrap();
        std::os::unix::fs::symlink(&victim, agents.join("a").join(SOCKET_NAME)).unwrap();
        let (_l, path) = bind_agent(&agents, "a", None).unwrap();
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket_like());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file");
        assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o777, 0o644, "the link's target kept its mode");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_directory_or_dangling_link_named_like_the_socket_does_not_stop_the_bind() {
        let (_d, agents) = agents_dir();
        std::fs::create_dir_all(agents.join("a").join(SOCKET_NAME).join("deep")).unwrap();
        bind_agent(&agents, "a", None).unwrap();
        let (_d2, agents2) = agents_dir();
        std::fs::create_dir(agents2.join("b")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/x", agents2.join("b").join(SOCKET_NAME)).unwrap();
        bind_agent(&agents2, "b", None).unwrap();
    }

    #[test]
    fn the_socket_directory_itself_replaced_by_a_link_is_set_aside() {
        let (d, agents) = agents_dir();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, agents.join("a")).unwrap();
        let (_l, path) = bind_agent(&agents, "a", None).unwrap();
        assert!(!std::fs::symlink_metadata(agents.join("a")).unwrap().file_type().is_symlink());
        assert!(path.starts_with(&agents));
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was made through the link");
        // Planted extra entries are gone with the old directory.
        std::fs::write(agents.join("a").join("planted"), "x").unwrap();
        drop(_l);
        bind_agent(&agents, "a", None).unwrap();
        assert!(!agents.join("a").join("planted").exists());
        let stale: Vec<_> = std::fs::read_dir(&agents).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(stale, vec![std::ffi::OsString::from("a")], "stale directories removed");
    }

    #[test]
    fn as_root_only_the_socket_is_the_agents() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: the hand-over to the agent's user needs root (CI runs as root)");
            return;
        }
        let (_d, agents) = agents_dir();
        // An older choird had handed the directory to the agent's user.
        std::fs::create_dir(agents.join("a")).unwrap();
        rustix::fs::chown(
            agents.join("a"),
            Some(rustix::fs::Uid::from_raw(10001)),
            Some(rustix::fs::Gid::from_raw(10001)),
        )
        .unwrap();
        let (_l, path) = bind_agent(&agents, "a", Some((10001, 10001))).unwrap();
        let dir = std::fs::metadata(agents.join("a")).unwrap();
        assert_eq!((dir.uid(), dir.mode() & 0o777), (0, 0o755), "the directory is choird's, traversable");
        let sock = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!((sock.uid(), sock.gid(), sock.mode() & 0o777), (10001, 10001, 0o600));
    }

    trait SocketLike {
        fn is_socket_like(&self) -> bool;
    }
    impl SocketLike for std::fs::FileType {
        fn is_socket_like(&self) -> bool {
            use std::os::unix::fs::FileTypeExt;
            self.is_socket()
        }
    }
}
