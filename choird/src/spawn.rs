//! The one place choird starts other programs (STYLE practice 7): the agent
//! child processes of the `process` runtime and the PostgreSQL tools of the
//! managed cluster. Everything goes through [`Cmd`], which clears the
//! environment to a fixed minimum so no secret of choird's leaks by accident.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// Environment variables passed through to children; everything else is dropped.
const PASS_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "RUST_LOG", "RUST_BACKTRACE"];

/// A command about to be run.
pub struct Cmd {
    inner: Command,
    display: String,
}

impl Cmd {
    /// A command running `program` with a scrubbed environment.
    #[allow(clippy::disallowed_methods)] // This is the wrapper.
    pub fn new(program: impl AsRef<Path>) -> Cmd {
        let program = program.as_ref();
        let mut inner = Command::new(program);
        inner.env_clear();
        for key in PASS_ENV {
            if let Some(v) = std::env::var_os(key) {
                inner.env(key, v);
            }
        }
        Cmd { inner, display: program.display().to_string() }
    }

    /// Runs `program` as `user` through `runuser` when choird runs as root
    /// (PostgreSQL refuses to run as root); otherwise as choird's own user.
    pub fn as_user_if_root(program: impl AsRef<Path>, user: &str) -> Cmd {
        if rustix::process::geteuid().is_root() {
            let mut cmd = Cmd::new("runuser");
            cmd.args(["-u", user, "--"]).arg(program.as_ref());
            cmd.display = format!("runuser -u {user} -- {}", program.as_ref().display());
            cmd
        } else {
            Cmd::new(program)
        }
    }

    /// Adds one argument.
    pub fn arg(&mut self, a: impl Into<OsString>) -> &mut Cmd {
        let a = a.into();
        self.display.push(' ');
        self.display.push_str(&a.to_string_lossy());
        self.inner.arg(a);
        self
    }

    /// Adds several arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(&mut self, args: I) -> &mut Cmd {
        for a in args {
            self.arg(a);
        }
        self
    }

    /// Sets one environment variable for the child.
    pub fn env(&mut self, k: &str, v: impl Into<OsString>) -> &mut Cmd {
        self.inner.env(k, v.into());
        self
    }

    /// Sets the working directory.
    pub fn current_dir(&mut self, dir: &Path) -> &mut Cmd {
        self.inner.current_dir(dir);
        self
    }

    /// Runs the child in a process group of its own (so all it starts can
    /// be killed together).
    pub fn own_process_group(&mut self) -> &mut Cmd {
        std::os::unix::process::CommandExt::process_group(&mut self.inner, 0);
        self
    }

    /// Runs the child as `uid`:`gid` (choird must be root); supplementary
    /// groups are dropped.
    pub fn as_ids(&mut self, uid: u32, gid: u32) -> &mut Cmd {
        std::os::unix::process::CommandExt::uid(&mut self.inner, uid);
        std::os::unix::process::CommandExt::gid(&mut self.inner, gid);
        self
    }

    /// Hands the child these descriptors at these numbers; they stay open
    /// in choird until this `Cmd` is dropped (drop it right after spawning).
    pub fn with_fds(&mut self, fds: Vec<command_fds::FdMapping>) -> Result<&mut Cmd, SpawnError> {
        command_fds::CommandFdExt::fd_mappings(&mut self.inner, fds).map_err(|e| SpawnError::Start {
            cmd: self.display.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(self)
    }

    /// The command line, for logs and error messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Runs to completion, capturing output; a non-zero exit is an error that
    /// carries the command line and its stderr.
    pub fn run(&mut self) -> Result<Output, SpawnError> {
        let out = self.output()?;
        if !out.status.success() {
            return Err(SpawnError::Failed {
                cmd: self.display.clone(),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(out)
    }

    /// Runs to completion, capturing output, whatever its exit status (for
    /// a program whose non-zero statuses mean more than failure).
    pub fn output(&mut self) -> Result<Output, SpawnError> {
        self.inner.stdin(Stdio::null()).output().map_err(|e| SpawnError::Start { cmd: self.display.clone(), source: e })
    }

    /// Starts the child with the given stdio.
    pub fn spawn(&mut self, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> Result<Child, SpawnError> {
        self.inner
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| SpawnError::Start { cmd: self.display.clone(), source: e })
    }
}

/// A child process could not be run.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program could not be started at all (missing binary, permissions).
    #[error("cannot run `{cmd}`: {source}")]
    Start {
        /// Command line.
        cmd: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        /// Command line.
        cmd: String,
        /// Exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
}
