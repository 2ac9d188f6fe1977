//! Process trees from `/proc`: the children of a process, and killing a
//! whole tree so that no member can fork its way out. Used by choir-agent (a
//! child subreaper: nothing a tool starts outlives its call) and by choird
//! (stopping a process-runtime agent ends every process it started).

use std::collections::BTreeSet;

use rustix::process::{Pid, Signal};

/// The direct children of `pid`, from `/proc/<pid>/task/*/children`
/// (falling back to a scan of `/proc/*/stat` where that file is missing).
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = BTreeSet::new();
    let mut found_file = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                found_file = true;
                out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    if !found_file {
        out.extend(scan_parents().into_iter().filter(|(_, ppid)| *ppid == pid).map(|(p, _)| p));
    }
    out.into_iter().collect()
}

/// Every (pid, parent pid) in `/proc`.
fn scan_parents() -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
            // "pid (comm) state ppid …": comm may hold spaces and parentheses.
            if let Some(ppid) = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)) {
                if let Ok(ppid) = ppid.parse() {
                    out.push((pid, ppid));
                }
            }
        }
    }
    out
}

/// Every descendant of `pid` (children first, then theirs), at most `cap`.
pub fn descendants_of(pid: i32, cap: usize) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    let mut seen = BTreeSet::new();
    while let Some(p) = queue.pop() {
        for c in children_of(p) {
            if seen.insert(c) && out.len() < cap {
                out.push(c);
                queue.push(c);
            }
        }
    }
    out
}

/// The parent of `pid`, from `/proc/<pid>/stat` (`None` when it is gone).
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …": comm may hold spaces and parentheses.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a descendant of `ancestor` (its parent, its parent's
/// parent, …); `None` when `pid` is gone, so it cannot be told.
pub fn is_descendant_of(pid: i32, ancestor: i32) -> Option<bool> {
    let mut at = parent_of(pid)?;
    for _ in 0..4096 {
        if at == ancestor {
            return Some(true);
        }
        if at <= 1 {
            return Some(false);
        }
        match parent_of(at) {
            Some(p) => at = p,
            None => return Some(false),
        }
    }
    Some(false)
}

/// Whether `pid` is stopped by a signal or a tracer (state `T` or `t` in
/// `/proc/<pid>/stat`). A process that is gone is not stopped.
pub fn is_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.split_whitespace().next()?.to_owned()))
        .is_some_and(|state| state == "T" || state == "t")
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal(pid: i32, sig: Signal) {
    if let Some(p) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Stops `pids` and every descendant of theirs (SIGSTOP, so none forks
/// again), then kills them all (SIGKILL). Returns how many were signalled.
/// Processes are not reaped here: their parent (or subreaper) reaps them.
pub fn kill_trees(pids: &[i32]) -> usize {
    let mut all: BTreeSet<i32> = BTreeSet::new();
    // Freeze, looking again until no new descendant appears (one may have
    // forked before its SIGSTOP arrived).
    for _ in 0..16 {
        let mut found = false;
        for &p in pids {
            for q in std::iter::once(p).chain(descendants_of(p, 4096)) {
                if all.insert(q) {
                    found = true;
                    signal(q, Signal::STOP);
                }
            }
        }
        if !found {
            break;
        }
    }
    for &p in &all {
        signal(p, Signal::KILL);
    }
    all.len()
}

/// The live processes of session `sid` (`/proc/*/stat`'s sixth field) that
/// run with this process's real user id, at most `cap`; this process
/// excluded.
pub fn session_members(sid: i32, cap: usize) -> Vec<i32> {
    let me = std::process::id() as i32;
    let uid = rustix::process::getuid().as_raw();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if pid == me || out.len() >= cap {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "pid (comm) state ppid pgrp session …"; a zombie is already dead.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().take(4).collect()).unwrap_or_default();
        if fields.len() < 4 || fields[0] == "Z" || fields[3].parse::<i32>().ok() != Some(sid) {
            continue;
        }
        let owner = std::fs::read_to_string(e.path().join("status")).ok().and_then(|status| {
            status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse::<u32>().ok())
        });
        if owner == Some(uid) {
            out.push(pid);
        }
    }
    out
}

/// Kills every process left in session `sid` (see [`session_members`]) and
/// their descendants, looking again while any is left (at most a few
/// rounds). For a session leader that died without ending what it started:
/// its members were reparented, and only their session still names it.
/// Returns how many were signalled.
pub fn kill_session(sid: i32) -> usize {
    let mut killed = 0;
    for _ in 0..8 {
        let members = session_members(sid, 4096);
        if members.is_empty() {
            break;
        }
        killed += kill_trees(&members);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_children_are_found() {
        #[allow(clippy::disallowed_methods)]
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id() as i32;
        assert!(children_of(me).contains(&(child.id() as i32)));
        assert!(descendants_of(me, 100).contains(&(child.id() as i32)));
        assert_eq!(kill_trees(&[child.id() as i32]), 1);
        let status = child.wait().unwrap();
        assert!(!status.success());
    }

    #[test]
    fn a_descendant_is_told_from_a_stranger() {
        #[allow(clippy::disallowed_methods)]
        let mut child = std::process::Command::new("sh").arg("-c").arg("sleep 5 & wait").spawn().unwrap();
        let me = std::process::id() as i32;
        let child_pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let grandchild = loop {
            if let Some(g) = children_of(child_pid).first() {
                break *g;
            }
            assert!(std::time::Instant::now() < deadline, "no grandchild");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(parent_of(child_pid), Some(me));
        assert_eq!(is_descendant_of(grandchild, me), Some(true));
        assert_eq!(is_descendant_of(me, child_pid), Some(false), "a parent is no descendant");
        kill_trees(&[child_pid]);
        child.wait().unwrap();
        assert_eq!(is_descendant_of(child_pid, me), None, "gone: cannot be told");
    }

    #[test]
    fn a_stopped_process_is_told_from_a_running_one() {
        #[allow(clippy::disallowed_methods)]
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(!is_stopped(pid), "running (sleeping) is not stopped");
        signal(pid, Signal::STOP);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !is_stopped(pid) {
            assert!(std::time::Instant::now() < deadline, "never seen stopped");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        kill_trees(&[pid]);
        child.wait().unwrap();
        assert!(!is_stopped(pid), "a reaped process is not stopped");
    }
}
