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

use std::path::Path;

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

/// Why new work for an agent whose workspace is `workspace` is refused
/// (choird's home at `home`), if it is: the first nearly full file system
/// of the two, named. A path that cannot be looked at refuses nothing (the
/// work then fails where it needs the path, with its own error).
pub fn refuse_new_work(home: &Path, workspace: &Path) -> Option<String> {
    for (what, path) in [("choird's home", home), ("the agent's workspace", workspace)] {
        let Ok(space) = Space::of(path) else { continue };
        if let Some(why) = space.nearly_full() {
            return Some(format!(
                "the disk of {what} ({}) is nearly full ({why}); new messages are refused until space is freed there",
                path.display()
            ));
        }
    }
    None
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

    #[test]
    fn a_path_that_cannot_be_looked_at_refuses_nothing() {
        let missing = Path::new("/nonexistent/choir-disk-test");
        assert_eq!(refuse_new_work(missing, missing), None);
    }
}
