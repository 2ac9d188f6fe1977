//! The one place choir-agent starts programs (external tools, `choir.exec`,
//! ripgrep). Children get a cleared environment plus what the caller sets, their
//! own process group (so a timeout kills the whole tree), are registered with
//! the [`crate::process::reaper`], and are reaped with a deadline; when one ends,
//! whatever it left behind outside its group is swept before its call
//! returns.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The fixed minimum environment of every child.
pub const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long a start refused with `ETXTBSY` is tried again.
pub const EXEC_BUSY_WAIT: Duration = Duration::from_millis(500);

/// A command about to run.
pub struct Cmd {
    inner: Command,
}

impl Cmd {
    /// `program` with an empty environment except `PATH`, in its own process group.
    #[allow(clippy::disallowed_methods)] // This is the wrapper.
    pub fn new(program: impl AsRef<Path>) -> Cmd {
        let mut inner = Command::new(program.as_ref());
        inner.env_clear().env("PATH", BASE_PATH).process_group(0);
        Cmd { inner }
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(&mut self, args: I) -> &mut Cmd {
        for a in args {
            self.inner.arg(a.into());
        }
        self
    }

    /// Sets an environment variable.
    pub fn env(&mut self, k: &str, v: impl Into<OsString>) -> &mut Cmd {
        self.inner.env(k, v.into());
        self
    }

    /// Working directory.
    pub fn cwd(&mut self, dir: &Path) -> &mut Cmd {
        self.inner.current_dir(dir);
        self
    }

    /// Starts the child (registered with the reaper, so no sweep takes it
    /// for a stray).
    ///
    /// An exec refused because the program is open for writing (`ETXTBSY`)
    /// is tried again for a bounded time ([`EXEC_BUSY_WAIT`]): another
    /// thread's fork between its `fork` and `exec` holds every descriptor
    /// of this process, a just-written program's included, so the refusal
    /// is transient. A program held open for writing longer than that is
    /// still refused, with the system's error.
    pub fn spawn(&mut self, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> std::io::Result<Child> {
        let inner = self.inner.stdin(stdin).stdout(stdout).stderr(stderr);
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match crate::process::reaper::spawn(|| inner.spawn()) {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && started.elapsed() < EXEC_BUSY_WAIT => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                ended => return ended,
            }
        }
    }
}

/// How a child ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited (or was killed by a signal not ours).
    Exited(ExitStatus),
    /// We killed its process group at the deadline.
    TimedOut,
}

impl Ended {
    /// The exit code, or `128 + signal`, or -1 after a timeout.
    pub fn code(&self) -> i32 {
        match self {
            Ended::Exited(s) => s.code().or_else(|| s.signal().map(|n| 128 + n)).unwrap_or(-1),
            Ended::TimedOut => -1,
        }
    }
}

/// Reaps a child that is known to be ending (its output was read to the
/// end, or its group was killed), then sweeps what it left behind.
pub fn reap(child: &mut Child) -> std::io::Result<ExitStatus> {
    let status = child.wait();
    kill_group(child);
    crate::process::reaper::forget(child);
    crate::process::reaper::sweep();
    status
}

/// Kills the child's whole process group.
pub fn kill_group(child: &Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Waits for the child until `deadline`; past it, kills its process group.
/// Either way, what it left behind (in its group, or reparented to the agent)
/// is killed before this returns.
pub fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Ended> {
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            // Children it left behind in its group go too, and any that left it.
            kill_group(child);
            crate::process::reaper::forget(child);
            crate::process::reaper::sweep();
            return Ok(Ended::Exited(status));
        }
        if Instant::now() >= deadline {
            kill_group(child);
            let _ = child.wait();
            crate::process::reaper::forget(child);
            crate::process::reaper::sweep();
            return Ok(Ended::TimedOut);
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}

/// Reads a pipe to its end on a thread, keeping at most `cap` bytes.
/// Returns (bytes, whether more was discarded).
pub fn capture(
    pipe: impl Read + Send + 'static,
    cap: usize,
    name: &str,
) -> std::io::Result<JoinHandle<(Vec<u8>, bool)>> {
    std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        let mut pipe = pipe;
        let mut kept = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let mut dropped = false;
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = cap.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                    dropped |= n > room;
                }
            }
        }
        (kept, dropped)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path) -> (std::path::PathBuf, std::fs::File) {
        let p = dir.join("busy.sh");
        let mut f = std::fs::File::create(&p).unwrap();
        std::io::Write::write_all(&mut f, b"#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        (p, f)
    }

    /// A program written a moment ago is open for writing in a sibling
    /// thread's fork until that fork execs: the start must wait it out,
    /// not fail the tool call (`tool_failed` for a tool that did nothing).
    #[test]
    fn regression_a_just_written_program_failed_to_start_when_another_thread_forked() {
        let dir = tempfile::tempdir().unwrap();
        let (p, writer) = script(dir.path());
        // The writer stays open for 100 ms, as a fork that has not exec'd yet holds it.
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(writer);
        });
        let mut child = Cmd::new(&p)
            .spawn(Stdio::null(), Stdio::null(), Stdio::null())
            .expect("the start waits until the program is no longer open for writing");
        assert!(reap(&mut child).unwrap().success());
        closer.join().unwrap();
    }

    /// Negative control: a program held open for writing past the bound
    /// is refused with the system's error, after about the bound.
    #[test]
    fn a_program_held_open_for_writing_is_refused_after_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _writer) = script(dir.path());
        let started = Instant::now();
        let e = Cmd::new(&p).spawn(Stdio::null(), Stdio::null(), Stdio::null()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ExecutableFileBusy, "{e}");
        assert!(started.elapsed() >= EXEC_BUSY_WAIT, "gave up after {:?}", started.elapsed());
    }
}
