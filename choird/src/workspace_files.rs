//! Files between choird and an agent's workspace: what the agent put in
//! `.choirtmp/send/` goes out to Telegram (and is removed); what a user
//! sends lands in `.choirtmp/recv/`; what a host tool makes for the user
//! (a screenshot) is written into `.choirtmp/send/`.
//!
//! **Invariant:** the workspace belongs to a possibly hostile agent, so
//! choird touches it only through descriptors: every path is resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the workspace root,
//! files are opened with `O_NOFOLLOW` and checked to be regular files, and
//! outgoing files are copied into choird's own spool before anything reads
//! them by path. A symlink the agent plants can neither make choird send a
//! host file nor write outside the workspace.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// Telegram's upload limit for bots (50 MB).
pub const MAX_UPLOAD: u64 = 50 * 1024 * 1024;

const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);

/// A file taken from `.choirtmp/send/`, now in choird's spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Where choird keeps it until it is sent.
    pub spool: PathBuf,
    /// Its name in the workspace.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// How an outgoing file is sent: `sendVoice` for OGG/Opus audio,
/// `sendAudio` for other audio, else `sendDocument`.
pub fn method_for(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "ogg" | "oga" | "opus" => "sendVoice",
        "mp3" | "m4a" | "wav" | "flac" | "aac" => "sendAudio",
        _ => "sendDocument",
    }
}

/// A name safe to create: letters, digits, `.`, `_`, `-`; no leading dot.
pub fn safe_name(raw: &str) -> String {
    let cleaned: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(100)
        .collect();
    let cleaned = cleaned.trim_start_matches('.').to_owned();
    if cleaned.is_empty() {
        "file".to_owned()
    } else {
        cleaned
    }
}

fn io(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from(e)
}

fn open_root(workspace: &Path) -> std::io::Result<OwnedFd> {
    rustix::fs::open(workspace, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(io)
}

/// Opens (creating when asked) the directory `rel` beneath the workspace root.
fn dir_beneath(root: &OwnedFd, rel: &str, create: bool) -> std::io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut prefix = String::new();
    for part in rel.split('/') {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        match rustix::fs::openat2(root, prefix.as_str(), flags, Mode::empty(), BENEATH) {
            Ok(fd) => drop(fd),
            Err(rustix::io::Errno::NOENT) if create => {
                match rustix::fs::mkdirat(root, prefix.as_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io(e)),
                }
            }
            Err(e) => return Err(io(e)),
        }
    }
    rustix::fs::openat2(root, rel, flags, Mode::empty(), BENEATH).map_err(io)
}

/// Moves every regular file of `<workspace>/.choirtmp/send/` into `spool`
/// (copied through descriptors, then unlinked). Anything else there — links,
/// directories, files over [`MAX_UPLOAD`] — is left alone and reported in the
/// log. A missing directory means nothing to send.
pub fn take_outgoing(workspace: &Path, spool: &Path, room: u64) -> std::io::Result<Vec<Outgoing>> {
    let mut room = room;
    let root = open_root(workspace)?;
    let send = match dir_beneath(&root, ".choirtmp/send", false) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    std::fs::create_dir_all(spool)?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&send).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." && name != ".gitignore" {
            names.push(name);
        }
    }
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let fd = match rustix::fs::openat2(
            &send,
            name.as_str(),
            // Non-blocking: a FIFO planted here opens at once (and is then
            // refused as not a plain file) instead of blocking this thread.
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        ) {
            Ok(fd) => fd,
            Err(e) => {
                log::warn!("not sending .choirtmp/send/{name}: {e} (only plain files are sent)");
                continue;
            }
        };
        let stat = rustix::fs::fstat(&fd).map_err(io)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            log::warn!("not sending .choirtmp/send/{name}: not a plain file");
            continue;
        }
        let size = stat.st_size as u64;
        if size > MAX_UPLOAD {
            log::warn!("not sending .choirtmp/send/{name}: {size} bytes is over Telegram's 50 MB limit");
            continue;
        }
        if size > room {
            log::warn!(
                "not sending .choirtmp/send/{name} now: the agent's spool is full (quotas.spool_mb); it stays in the \
                 workspace and goes with a later answer"
            );
            continue;
        }
        room -= size;
        let mut rnd = [0u8; 6];
        let _ = getrandom::fill(&mut rnd);
        let spooled = spool.join(format!("{}-{}", hex::encode(rnd), safe_name(&name)));
        // Back to blocking reads for a regular file (no effect on its reads, but explicit).
        let _ = rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY);
        let mut src = std::fs::File::from(fd);
        let mut dst = std::fs::OpenOptions::new().write(true).create_new(true).open(&spooled)?;
        let copied = std::io::copy(&mut (&mut src).take(MAX_UPLOAD), &mut dst)?;
        dst.flush()?;
        rustix::fs::unlinkat(&send, name.as_str(), AtFlags::empty()).map_err(io)?;
        out.push(Outgoing { spool: spooled, name, size: copied });
    }
    Ok(out)
}

/// Reads the workspace file `rel` (relative, no `..`, not under the
/// agent's `.choir/` state), at most `cap` bytes, through descriptors: no
/// link is followed anywhere on the path, and only a regular file is read
/// (a FIFO is opened non-blocking and refused).
pub fn read_beneath(workspace: &Path, rel: &str, cap: u64) -> std::io::Result<Vec<u8>> {
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{rel}: {why}"));
    let path = Path::new(rel);
    if rel.is_empty() || path.is_absolute() {
        return Err(bad("must be a path relative to the workspace"));
    }
    for c in path.components() {
        match c {
            std::path::Component::Normal(p) if p == ".choir" => {
                return Err(bad("the agent's state is not readable here"))
            }
            std::path::Component::Normal(_) | std::path::Component::CurDir => {}
            _ => return Err(bad("must stay inside the workspace")),
        }
    }
    let root = open_root(workspace)?;
    let fd = rustix::fs::openat2(
        &root,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(|e| std::io::Error::new(std::io::Error::from(e).kind(), format!("{rel}: {e}")))?;
    let stat = rustix::fs::fstat(&fd).map_err(io)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(bad("not a plain file"));
    }
    if stat.st_size as u64 > cap {
        return Err(bad(&format!("{} bytes is over the {cap}-byte limit", stat.st_size)));
    }
    let _ = rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY);
    let mut data = Vec::new();
    std::fs::File::from(fd).take(cap + 1).read_to_end(&mut data)?;
    if data.len() as u64 > cap {
        return Err(bad("grew over the limit while being read"));
    }
    Ok(data)
}

/// Entries a [`fingerprint`] looks at, at most.
pub const FINGERPRINT_ENTRIES: usize = 10_000;
/// Directory depth a [`fingerprint`] descends, at most.
pub const FINGERPRINT_DEPTH: usize = 16;

/// A digest of what the workspace path `rel` holds: for a file its type,
/// size and modification time; for a directory the same of every entry
/// beneath it (names included), at most [`FINGERPRINT_ENTRIES`] entries and
/// [`FINGERPRINT_DEPTH`] levels. Read through descriptors, `lstat` only: a
/// link is fingerprinted as a link, never followed; nothing is opened for
/// reading but directories, so a FIFO cannot block it. A missing path has
/// its own fingerprint (`absent`), so its appearing is a change.
pub fn fingerprint(workspace: &Path, rel: &str) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let root = open_root(workspace)?;
    let rel = rel.trim_start_matches("./");
    let target = if rel.is_empty() || rel == "." { "." } else { rel };
    // The parent is reached without a link anywhere on the way (a link in
    // the middle of the path is refused, never followed), then the last
    // component is looked at without following it.
    let path = Path::new(target);
    let parent = path.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| ".".into());
    let dir = if parent.is_empty() {
        root
    } else {
        match dir_beneath(&root, &parent, false) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok("absent".into()),
            Err(e) => return Err(e),
        }
    };
    let stat = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(rustix::io::Errno::NOENT) => return Ok("absent".into()),
        Err(e) => return Err(io(e)),
    };
    let mut h = Sha256::new();
    let mut count = 0usize;
    let line = |h: &mut Sha256, name: &[u8], st: &rustix::fs::Stat| {
        h.update(name);
        h.update(format!(" {:o} {} {}.{}\n", st.st_mode, st.st_size, st.st_mtime, st.st_mtime_nsec).as_bytes());
    };
    line(&mut h, target.as_bytes(), &stat);
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        let sub = rustix::fs::openat(
            &dir,
            name.as_str(),
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io)?;
        walk_fingerprint(sub, b"", 0, &mut count, &mut |name, st| line(&mut h, name, st))?;
    }
    Ok(hex::encode(h.finalize()))
}

fn walk_fingerprint(
    dir: OwnedFd,
    prefix: &[u8],
    depth: usize,
    count: &mut usize,
    see: &mut dyn FnMut(&[u8], &rustix::fs::Stat),
) -> std::io::Result<()> {
    let mut entries: Vec<(Vec<u8>, rustix::fs::Stat)> = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if *count >= FINGERPRINT_ENTRIES {
            break;
        }
        *count += 1;
        let st = rustix::fs::statat(&dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW).map_err(io)?;
        entries.push((name.to_vec(), st));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, st) in entries {
        let full = [prefix, b"/", &name].concat();
        see(&full, &st);
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory && depth + 1 < FINGERPRINT_DEPTH {
            let sub = rustix::fs::openat(
                &dir,
                name.as_slice(),
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(io)?;
            walk_fingerprint(sub, &full, depth + 1, count, see)?;
        }
    }
    Ok(())
}

/// Writes a received file as `.choirtmp/recv/<name>` in the workspace (a
/// new file; an existing one is replaced), owned like the workspace root so
/// the agent can read it. Returns its workspace-relative path.
pub fn store_incoming(workspace: &Path, name: &str, data: &[u8]) -> std::io::Result<String> {
    store_beneath(workspace, ".choirtmp/recv", name, data)
}

/// Writes a file for the user as `.choirtmp/send/<name>` (it goes out with
/// the agent's next answer), like [`store_incoming`].
pub fn store_outgoing(workspace: &Path, name: &str, data: &[u8]) -> std::io::Result<String> {
    store_beneath(workspace, ".choirtmp/send", name, data)
}

/// Writes `data` as `<dir>/<name>` beneath the workspace, through
/// descriptors (no link followed), owned like the workspace root.
fn store_beneath(workspace: &Path, dir: &str, name: &str, data: &[u8]) -> std::io::Result<String> {
    let root = open_root(workspace)?;
    let recv = dir_beneath(&root, dir, true)?;
    let name = safe_name(name);
    match rustix::fs::unlinkat(&recv, name.as_str(), AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io(e)),
    }
    let fd = rustix::fs::openat2(
        &recv,
        name.as_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
        BENEATH,
    )
    .map_err(io)?;
    let owner = rustix::fs::fstat(&root).map_err(io)?;
    if rustix::process::geteuid().is_root() {
        let uid = Some(rustix::fs::Uid::from_raw(owner.st_uid));
        let gid = Some(rustix::fs::Gid::from_raw(owner.st_gid));
        rustix::fs::fchown(&fd, uid, gid).map_err(io)?;
        rustix::fs::fchown(&recv, uid, gid).map_err(io)?;
    }
    let mut file = std::fs::File::from(fd);
    file.write_all(data)?;
    file.flush()?;
    Ok(format!("{dir}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_a_fingerprint_never_follows_a_link_in_the_middle_of_its_path() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("exists"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("a")).unwrap();
        // Through the link: refused, not "absent" or a digest of what is out there.
        assert!(fingerprint(ws.path(), "a/exists").is_err());
        assert!(fingerprint(ws.path(), "a/missing").is_err());
        // The link itself is fingerprinted as a link; the tree beneath a real
        // directory changes its digest when an entry appears.
        let link = fingerprint(ws.path(), "a").unwrap();
        assert_ne!(link, "absent");
        std::fs::create_dir(ws.path().join("d")).unwrap();
        let before = fingerprint(ws.path(), "d").unwrap();
        std::fs::write(ws.path().join("d/new"), "n").unwrap();
        assert_ne!(fingerprint(ws.path(), "d").unwrap(), before);
        assert_eq!(fingerprint(ws.path(), "d/none/deeper").unwrap(), "absent");
    }

    #[test]
    fn a_fingerprint_looks_at_no_more_entries_or_levels_than_its_caps_and_opens_no_fifo() {
        // What a hostile agent can leave in its workspace for choird's look:
        // a flat directory past the entry cap, a tree past the depth cap, a
        // FIFO and a link to a big directory elsewhere.
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(outside.path().join(format!("o{i}")), "x").unwrap();
        }
        let flat = ws.path().join("t/flat");
        std::fs::create_dir_all(&flat).unwrap();
        for i in 0..FINGERPRINT_ENTRIES + 50 {
            std::fs::write(flat.join(i.to_string()), "").unwrap();
        }
        let mut deep = ws.path().join("t");
        for i in 0..FINGERPRINT_DEPTH + 10 {
            deep = deep.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        rustix::fs::mknodat(rustix::fs::CWD, ws.path().join("t/pipe"), FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("t/elsewhere")).unwrap();

        let root = open_root(ws.path()).unwrap();
        let t = dir_beneath(&root, "t", false).unwrap();
        let (mut count, mut seen, mut deepest) = (0, 0, 0);
        walk_fingerprint(t, b"", 0, &mut count, &mut |name, _| {
            seen += 1;
            deepest = deepest.max(name.iter().filter(|b| **b == b'/').count());
            assert!(!name.starts_with(b"/elsewhere/"), "followed a link: {}", String::from_utf8_lossy(name));
        })
        .unwrap();
        assert_eq!((count, seen), (FINGERPRINT_ENTRIES, FINGERPRINT_ENTRIES), "looked past the entry cap");
        assert!(deepest <= FINGERPRINT_DEPTH, "descended {deepest} levels");
        // The whole look returns (the FIFO was never opened) and is stable.
        let once = fingerprint(ws.path(), "t").unwrap();
        assert_eq!(fingerprint(ws.path(), "t").unwrap(), once);
    }

    #[test]
    fn outgoing_files_are_spooled_and_removed_and_links_never_followed() {
        let ws = tempfile::tempdir().unwrap();
        let spool = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host secret").unwrap();
        let send = ws.path().join(".choirtmp/send");
        std::fs::create_dir_all(&send).unwrap();
        std::fs::write(send.join("hello.ogg"), b"OggS voice").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), send.join("steal.txt")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            send.join("pipe.ogg"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let out = take_outgoing(ws.path(), spool.path(), u64::MAX).unwrap();
        assert_eq!(out.len(), 1, "neither the link nor the FIFO (which would block) is taken");
        assert_eq!((out[0].name.as_str(), out[0].size), ("hello.ogg", 10));
        assert_eq!(std::fs::read(&out[0].spool).unwrap(), b"OggS voice");
        assert!(!send.join("hello.ogg").exists());
        assert!(send.join("steal.txt").symlink_metadata().is_ok(), "the link is left, not followed");
        assert_eq!(std::fs::read_to_string(outside.path().join("secret")).unwrap(), "host secret");

        // The send directory itself swapped for a link out of the workspace.
        std::fs::remove_dir_all(&send).unwrap();
        std::os::unix::fs::symlink(outside.path(), &send).unwrap();
        assert!(take_outgoing(ws.path(), spool.path(), u64::MAX).is_err());
        assert!(outside.path().join("secret").exists());
    }

    #[test]
    fn the_spool_takes_no_more_than_its_room() {
        let ws = tempfile::tempdir().unwrap();
        let spool = tempfile::tempdir().unwrap();
        let send = ws.path().join(".choirtmp/send");
        std::fs::create_dir_all(&send).unwrap();
        std::fs::write(send.join("a.txt"), vec![b'a'; 600]).unwrap();
        std::fs::write(send.join("b.txt"), vec![b'b'; 600]).unwrap();
        let taken = take_outgoing(ws.path(), spool.path(), 1000).unwrap();
        assert_eq!(taken.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a.txt"]);
        assert!(send.join("b.txt").exists(), "what does not fit stays in the workspace for later");
        assert_eq!(crate::home::dir_bytes(spool.path()), 600);
    }

    #[test]
    fn incoming_files_stay_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        assert_eq!(store_incoming(ws.path(), "../../etc/passwd", b"x").unwrap(), ".choirtmp/recv/_.._etc_passwd");
        std::fs::create_dir_all(ws.path().join(".choirtmp")).unwrap();
        std::fs::remove_dir_all(ws.path().join(".choirtmp/recv")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join(".choirtmp/recv")).unwrap();
        assert!(store_incoming(ws.path(), "a.txt", b"x").is_err());
        assert!(!outside.path().join("a.txt").exists());
        assert_eq!(method_for("Hi.OGG"), "sendVoice");
        assert_eq!(method_for("song.mp3"), "sendAudio");
        assert_eq!(method_for("report.pdf"), "sendDocument");
    }
}
