//! Free space where agents work: choird refuses new work (a message, a
//! start) while the file system of choird's home or of the agent's
//! workspace is nearly full, saying so, instead of letting an agent crash
//! into a full disk mid-turn (its commit log cannot be written, it is
//! restarted, and it crashes again).
//!
//! "Nearly full" is relative, so a small file system (a test's, or a
//! per-agent quota) is judged as fairly as a large disk: less than
//! [`RESERVE_BYTES`] or 5 % of its size free, whichever is less; or less
//! than [`RESERVE_INODES`] or 5 % of its inodes free, whichever is less.
//!
//! **Invariant:** a refusal is always read fresh (space freed is seen by
//! the next message); only "not nearly full" is reused, by [`Guard`], for
//! at most [`OK_FOR`] per file system path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Free bytes below which a file system counts as nearly full (or 5 % of
/// its size, when that is less).
pub const RESERVE_BYTES: u64 = 256 * 1024 * 1024;
/// Free inodes below which a file system counts as nearly full (or 5 % of
/// its inodes, when that is less).
pub const RESERVE_INODES: u64 = 10_000;

/// A file system's free space, as statvfs(3) tells it (for unprivileged
/// users).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes free.
    pub free: u64,
    /// Bytes in all.
    pub total: u64,
    /// Inodes free.
    pub free_inodes: u64,
    /// Inodes in all (0 where the file system does not count them).
    pub total_inodes: u64,
}

impl Space {
    /// The file system holding `path`.
    pub fn of(path: &Path) -> std::io::Result<Space> {
        let v = rustix::fs::statvfs(path)?;
        Ok(Space {
            free: v.f_bavail.saturating_mul(v.f_frsize),
            total: v.f_blocks.saturating_mul(v.f_frsize),
            free_inodes: v.f_favail,
            total_inodes: v.f_files,
        })
    }

    /// Why this file system counts as nearly full, if it does.
    pub fn nearly_full(&self) -> Option<String> {
        let reserve = RESERVE_BYTES.min(self.total / 20);
        if self.free < reserve {
            return Some(format!(
                "{} free of {}",
                choir_common::text::human_bytes(self.free),
                choir_common::text::human_bytes(self.total)
            ));
        }
        let inodes = RESERVE_INODES.min(self.total_inodes / 20);
        if self.total_inodes > 0 && self.free_inodes < inodes {
            return Some(format!("{} of {} inodes free", self.free_inodes, self.total_inodes));
        }
        None
    }
}

/// How long a file system seen not nearly full is taken to be so without
/// asking again. Without it every message asked (two `statvfs` calls, one
/// per path). What a second's staleness allows is what the check always
/// allowed: it races every writer of the disk anyway, and a message
/// admitted just before the disk filled is the same message either way.
pub const OK_FOR: Duration = Duration::from_secs(1);

/// How a caller of [`Guard::refuse_new_work`] wants the disks looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// A reading that said "not nearly full" at most [`OK_FOR`] ago will
    /// do (a message, a start).
    Recent,
    /// Every path asked now: an agent's start, and `choirctl status`,
    /// which shows the disks (both rare, and an operator's).
    Now,
}

/// What the guard remembers.
#[derive(Default)]
struct Readings {
    /// When each path was last seen not nearly full.
    ok_at: HashMap<PathBuf, Instant>,
    /// Refusals so far: a reading taken before one is not kept after it.
    refusals: u64,
}

/// Whether a disk refuses new work, asked for every message: a path seen
/// not nearly full within [`OK_FOR`] is not asked again. A nearly full one
/// is asked every time, so space freed admits the next message at once.
///
/// **Invariants:** a refusal forgets every reading, of every path (another
/// agent's workspace may be on the file system just found full), and a
/// reading taken before a refusal is not kept after it; so no reading
/// older than the last refusal is ever used. It holds only the paths it was
/// asked about within [`OK_FOR`] of its last new reading: choird's home
/// and the configured agents' workspaces.
#[derive(Default)]
pub struct Guard {
    readings: Mutex<Readings>,
}

impl Guard {
    /// Why new work for an agent whose workspace is `workspace` is refused
    /// (choird's home at `home`), if it is: the first nearly full file
    /// system of the two, named. A path that cannot be looked at refuses
    /// nothing.
    pub fn refuse_new_work(&self, home: &Path, workspace: &Path, look: Look) -> Option<String> {
        self.refuse_reading(home, workspace, look, Instant::now(), Space::of)
    }

    /// [`Guard::refuse_new_work`] at `now`, with each path's space as `read`
    /// says. The guard's lock is not held while a disk is read.
    fn refuse_reading(
        &self,
        home: &Path,
        workspace: &Path,
        look: Look,
        now: Instant,
        read: impl Fn(&Path) -> std::io::Result<Space>,
    ) -> Option<String> {
        let paths = [("choird's home", home), ("the agent's workspace", workspace)];
        let (refusals_before, fresh) = {
            let readings = self.readings.lock();
            let fresh = paths.map(|(_, p)| {
                look == Look::Recent
                    && readings.ok_at.get(p).is_some_and(|at| now.saturating_duration_since(*at) < OK_FOR)
            });
            (readings.refusals, fresh)
        };
        let mut seen = Vec::new();
        let mut why = None;
        for ((what, path), fresh) in paths.into_iter().zip(fresh) {
            // A path that cannot be looked at refuses nothing (the work then
            // fails where it needs the path, with its own error).
            let Some(space) = (!fresh).then(|| read(path).ok()).flatten() else { continue };
            match space.nearly_full() {
                None => seen.push(path.to_path_buf()),
                Some(full) => {
                    why = Some(format!(
                        "the disk of {what} ({}) is nearly full ({full}); new messages are refused until space is freed \
                         there",
                        path.display()
                    ));
                    break;
                }
            }
        }
        let mut readings = self.readings.lock();
        if why.is_some() {
            readings.ok_at.clear();
            readings.refusals += 1;
        } else if readings.refusals == refusals_before && !seen.is_empty() {
            readings.ok_at.retain(|_, at| now.saturating_duration_since(*at) < OK_FOR);
            readings.ok_at.extend(seen.into_iter().map(|p| (p, now)));
        }
        why
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn space(free: u64, total: u64, free_inodes: u64, total_inodes: u64) -> Space {
        Space { free, total, free_inodes, total_inodes }
    }

    #[test]
    fn nearly_full_is_relative_to_the_file_systems_size() {
        // A large disk: 256 MiB is the line.
        assert!(space(255 * MIB, 100_000 * MIB, 1_000_000, 1_000_000).nearly_full().is_some());
        assert!(space(257 * MIB, 100_000 * MIB, 1_000_000, 1_000_000).nearly_full().is_none());
        // A small file system: 5 % is.
        assert!(space(MIB, 16 * MIB, 4_000, 4_000).nearly_full().is_none());
        let why = space(MIB / 2, 16 * MIB, 4_000, 4_000).nearly_full().unwrap();
        assert!(why.contains("free of"), "{why}");
        // Out of inodes with bytes to spare.
        let why = space(50_000 * MIB, 100_000 * MIB, 9_000, 10_000_000).nearly_full().unwrap();
        assert!(why.contains("inodes"), "{why}");
        // A file system that counts no inodes is judged by bytes alone.
        assert!(space(50_000 * MIB, 100_000 * MIB, 0, 0).nearly_full().is_none());
    }

    /// A file system whose free bytes a test sets, counting its readings.
    #[derive(Default)]
    struct Disk {
        free: std::cell::Cell<u64>,
        reads: std::cell::Cell<u32>,
    }

    impl Disk {
        fn read(&self) -> std::io::Result<Space> {
            self.reads.set(self.reads.get() + 1);
            Ok(space(self.free.get(), 100_000 * MIB, 1_000_000, 1_000_000))
        }
    }

    #[test]
    fn a_disk_seen_ok_is_not_asked_again_for_a_second_and_a_full_one_every_time() {
        let guard = Guard::default();
        let (home, ws) = (Path::new("/home"), Path::new("/ws"));
        let disk = Disk::default();
        disk.free.set(50_000 * MIB);
        let read = |_: &Path| disk.read();
        let t0 = Instant::now();
        assert_eq!(guard.refuse_reading(home, ws, Look::Recent, t0, read), None);
        assert_eq!(disk.reads.get(), 2, "both paths read");
        // Within the second: not asked again.
        assert_eq!(guard.refuse_reading(home, ws, Look::Recent, t0 + OK_FOR / 2, read), None);
        assert_eq!(disk.reads.get(), 2, "the readings reused");
        // Past it, asked again, and now the disk is nearly full.
        disk.free.set(MIB);
        let why = guard.refuse_reading(home, ws, Look::Recent, t0 + OK_FOR, read).expect("refused");
        assert!(why.contains("choird's home (/home) is nearly full"), "{why}");
        assert_eq!(disk.reads.get(), 3, "the home read fresh, the refusal said at once");
        // A refusal is read fresh every time: freed space admits the next message.
        assert!(guard.refuse_reading(home, ws, Look::Recent, t0 + OK_FOR, read).is_some());
        assert_eq!(disk.reads.get(), 4);
        disk.free.set(50_000 * MIB);
        assert_eq!(guard.refuse_reading(home, ws, Look::Recent, t0 + OK_FOR, read), None);
        assert_eq!(disk.reads.get(), 6);
        // The guard forgets what is older than a second when it learns more.
        let later = t0 + OK_FOR * 3;
        assert_eq!(guard.refuse_reading(Path::new("/other"), ws, Look::Recent, later, read), None);
        assert_eq!(guard.readings.lock().ok_at.len(), 2, "only /other and /ws, read just now");
    }

    #[test]
    fn a_refusal_forgets_every_reading_and_one_taken_before_it_is_not_kept() {
        let guard = Guard::default();
        let (home, a, b) = (Path::new("/home"), Path::new("/srv/a"), Path::new("/srv/b"));
        let t0 = Instant::now();
        let ok = |_: &Path| Ok(space(50_000 * MIB, 100_000 * MIB, 1_000_000, 1_000_000));
        let full = |_: &Path| Ok(space(MIB, 100_000 * MIB, 1_000_000, 1_000_000));
        // Agent a's workspace seen fine; then agent b's, on the same file
        // system, found full: a's reading goes too.
        assert_eq!(guard.refuse_reading(home, a, Look::Recent, t0, ok), None);
        assert_eq!(guard.readings.lock().ok_at.len(), 2);
        assert!(guard.refuse_reading(home, b, Look::Recent, t0, full).is_some());
        assert!(guard.readings.lock().ok_at.is_empty(), "every reading forgotten");
        // A reading that said fine while a refusal came meanwhile is not kept.
        let racing = |p: &Path| {
            if p == a {
                assert!(guard.refuse_reading(home, b, Look::Now, t0, full).is_some());
            }
            ok(p)
        };
        assert_eq!(guard.refuse_reading(home, a, Look::Recent, t0, racing), None);
        assert!(guard.readings.lock().ok_at.is_empty(), "a reading from before the refusal was kept");
        // Now asks even a path seen fine a moment ago.
        let reads = std::cell::Cell::new(0);
        let counting = |p: &Path| {
            reads.set(reads.get() + 1);
            ok(p)
        };
        assert_eq!(guard.refuse_reading(home, a, Look::Recent, t0, counting), None);
        assert_eq!(guard.refuse_reading(home, a, Look::Recent, t0, counting), None);
        assert_eq!(reads.get(), 2, "the second message used the readings");
        assert_eq!(guard.refuse_reading(home, a, Look::Now, t0, counting), None);
        assert_eq!(reads.get(), 4, "status asked both again");
    }

    #[test]
    fn a_path_that_cannot_be_looked_at_refuses_nothing() {
        let missing = Path::new("/nonexistent/choir-disk-test");
        assert_eq!(Guard::default().refuse_new_work(missing, missing, Look::Now), None);
    }
}
