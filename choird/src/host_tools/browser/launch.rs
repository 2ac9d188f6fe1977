//! Starting and stopping the one Chromium process of a choird (Debian's
//! `chromium` package), headless, driven over `--remote-debugging-pipe`.
//!
//! **Invariants:**
//! - Chromium never runs as root: when choird is root it runs as
//!   `web.browser.uid` (default `nobody`) with its own sandbox on; its
//!   profile is a fresh private directory owned by that uid, removed when
//!   the browser stops.
//! - It leaves no process behind: it runs in its own process group, which
//!   [`Process::stop`] (and `Drop`) kills; and because it exits when its
//!   debugging pipe closes, it also ends when choird dies without stopping it.
//! - Every request it makes goes through a context's egress proxy: the
//!   browser-wide proxy is a closed port, so nothing outside a context (the
//!   default context, background services) reaches the network.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use command_fds::FdMapping;

use super::cdp::Connection;
use crate::config::BrowserConfig;
use crate::spawn::Cmd;

/// A running browser.
pub struct Process {
    child: Child,
    /// The connection to it.
    pub conn: Connection,
    profile: Option<tempfile::TempDir>,
}

/// The Chromium binary: the configured one, else Debian's.
pub fn chromium_binary(config: &BrowserConfig) -> Option<PathBuf> {
    let candidates = match &config.chromium {
        Some(p) => vec![p.clone()],
        None => vec![PathBuf::from("/usr/bin/chromium"), PathBuf::from("/usr/lib/chromium/chromium")],
    };
    candidates.into_iter().find(|p| p.is_file())
}

fn io(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// A port on loopback nothing listens on (bound, then released): the
/// browser-wide proxy, so requests outside a context fail.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(9)
}

impl Process {
    /// Starts Chromium and checks that it answers.
    pub fn start(config: &BrowserConfig) -> Result<Process, String> {
        let binary = chromium_binary(config)
            .ok_or("Chromium is not installed (Debian's chromium package; or set web.browser.chromium)")?;
        let root = rustix::process::geteuid().is_root();
        let profile = tempfile::Builder::new()
            .prefix("choird-browser-")
            .tempdir()
            .map_err(|e| format!("cannot make the browser's profile directory: {e}"))?;
        if root {
            let id = Some(rustix::fs::Uid::from_raw(config.uid));
            let gid = Some(rustix::fs::Gid::from_raw(config.uid));
            rustix::fs::chown(profile.path(), id, gid).map_err(|e| format!("cannot hand the profile over: {e}"))?;
        }
        let (ours_read, theirs_write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e).to_string())?;
        let (theirs_read, ours_write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e).to_string())?;
        let mut cmd = Cmd::new(&binary);
        cmd.args([
            "--headless",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-breakpad",
            "--disable-client-side-phishing-detection",
            "--disable-domain-reliability",
            "--no-pings",
            "--disable-features=AutofillServerCommunication,OptimizationHints,MediaRouter,Translate,\
             CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions,SafeBrowsing",
            "--disable-crash-reporter",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--mute-audio",
            "--hide-scrollbars",
            "--password-store=basic",
            // WebRTC over UDP would go around the proxy (an HTTP proxy
            // carries no UDP): only proxied (TCP, through the context's
            // proxy and its policy) is allowed. Both spellings: Chromium
            // with --headless reads the first (the command-line pref
            // store), headless-shell builds the second.
            "--webrtc-ip-handling-policy=disable_non_proxied_udp",
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
            "--window-size=1280,800",
            "--proxy-bypass-list=<-loopback>",
        ])
        .arg(format!("--proxy-server=http://127.0.0.1:{}", dead_port()))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .env("HOME", profile.path())
        .env("XDG_CONFIG_HOME", profile.path())
        .env("XDG_CACHE_HOME", profile.path())
        // Its own temporary files (the singleton socket's directory) too:
        // removed with the profile, even after a SIGKILL.
        .env("TMPDIR", profile.path())
        .own_process_group();
        if root {
            cmd.as_ids(config.uid, config.uid);
        }
        cmd.with_fds(vec![
            FdMapping { parent_fd: theirs_read, child_fd: 3 },
            FdMapping { parent_fd: theirs_write, child_fd: 4 },
        ])
        .map_err(|e| e.to_string())?;
        let spawned = cmd.spawn(Stdio::null(), Stdio::null(), Stdio::piped());
        // The child's ends must close here, or the browser's exit is never seen.
        drop(cmd);
        let mut child = spawned.map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let stderr = child.stderr.take();
        let conn = Connection::new(File::from(ours_write), File::from(ours_read));
        let mut process = Process { child, conn, profile: Some(profile) };
        match process.conn.call("Browser.getVersion", serde_json::json!({}), None, Duration::from_secs(20)) {
            Ok(v) => {
                log::info!("browser: {} started (pid {})", v["product"].as_str().unwrap_or("?"), process.child.id());
                // Chromium's chatter goes to choird's log at debug level.
                if let Some(err) = stderr {
                    let _ = std::thread::Builder::new().name("browser-stderr".into()).spawn(move || {
                        use std::io::BufRead;
                        for line in std::io::BufReader::new(err).lines().map_while(Result::ok).take(10_000) {
                            log::debug!("chromium: {line}");
                        }
                    });
                }
                Ok(process)
            }
            Err(e) => {
                process.stop();
                let mut text = String::new();
                if let Some(mut err) = stderr {
                    use std::io::Read;
                    let _ = (&mut err).take(64 * 1024).read_to_string(&mut text);
                }
                let last: Vec<&str> = text.lines().filter(|l| !l.contains("dbus")).rev().take(3).collect();
                Err(format!("Chromium did not start ({e}): {}", last.join(" | ")))
            }
        }
    }

    /// The browser's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running and answering.
    pub fn alive(&self) -> bool {
        !self.conn.is_closed() && !self.exited()
    }

    /// Whether the browser's main process has exited (it is left a zombie,
    /// not reaped, so its pid — its group's id — cannot be reused yet).
    fn exited(&self) -> bool {
        let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) else { return true };
        let options = rustix::process::WaitIdOptions::EXITED
            | rustix::process::WaitIdOptions::NOHANG
            | rustix::process::WaitIdOptions::NOWAIT;
        !matches!(rustix::process::waitid(rustix::process::WaitId::Pid(pid), options), Ok(None))
    }

    /// Stops it: closes the pipe (it exits by itself), waits up to 2 s, then
    /// kills whatever is left of its process group and reaps it; removes
    /// its profile.
    pub fn stop(&mut self) {
        self.conn.close();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && !self.exited() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(pgid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            // The renderers and helpers share its group; the leader is not
            // reaped yet, so the group id is still this browser's.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(p) = self.profile.take() {
            let _ = p.close();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}
