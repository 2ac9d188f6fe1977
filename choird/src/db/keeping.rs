//! Who keeps the managed cluster running: choird itself, or `choird
//! cluster` — a process of its own (the `choir-db` systemd unit), so that
//! restarting choird does not stop and start PostgreSQL (most of a
//! restart's time) and every agent finds the database where it was.
//!
//! The keeper is whichever process holds the home's `pg-keeper.lock` (an
//! exclusive `flock`, released by the kernel when the process ends, however
//! it ends). choird claims it at start: when it gets it, it starts, watches
//! (`pg-keeper`) and at exit stops the cluster, as it always has; when a
//! live `choird cluster` holds it, choird only adopts the cluster (waits
//! for it to accept connections) and leaves it running at exit.
//!
//! **Invariant:** at most one process starts, restarts or stops a home's
//! cluster: the one holding the lock. Two keepers would race `pg_ctl`
//! (one's start fails on the other's pid file, one's keeper restarts what
//! the other just stopped).

use std::fs::File;
use std::path::Path;

use crate::home::pid_lock;

/// The keeping of a home's cluster, held until dropped.
#[derive(Debug)]
pub struct KeeperLock {
    _file: File,
}

/// Claims the keeping of the cluster whose lock file is `path`: `Ok(Some)`
/// when this process now keeps it, `Ok(None)` when another live process
/// does (its pid is in the file, for the log).
pub fn claim(path: &Path) -> std::io::Result<Option<KeeperLock>> {
    Ok(pid_lock(path)?.map(|file| KeeperLock { _file: file }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_claim_on_a_held_lock_is_refused_and_succeeds_once_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pg-keeper.lock");
        let first = claim(&path).unwrap();
        assert!(first.is_some(), "a free lock is claimed");
        assert_eq!(crate::home::lock_holder(&path), Some(std::process::id()));
        // flock locks belong to the open file description: a second open,
        // even in this process, is refused while the first is held.
        assert!(claim(&path).unwrap().is_none(), "a held lock is not claimed twice");
        drop(first);
        assert!(claim(&path).unwrap().is_some(), "a released lock is claimed again");
    }

    #[test]
    fn a_lock_path_that_is_a_link_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep me").unwrap();
        let path = dir.path().join("pg-keeper.lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(claim(&path).is_err(), "a link is not followed");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert_eq!(crate::home::lock_holder(&path), None);
        // The control: the same claim on a plain file takes it.
        std::fs::remove_file(&path).unwrap();
        assert!(claim(&path).unwrap().is_some());
    }
}
