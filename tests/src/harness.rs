//! A running choird for tests: a hermetic temporary home with the given
//! `config.json` and `secrets.json`, the real `choird` binary started on it, and
//! `choirctl` run against it. Dropping the handle stops choird with SIGTERM (as
//! systemd would) and deletes the home.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Path of a workspace binary built next to the test executable.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // Tests live in target/<profile>/deps/, binaries (like bench-docker) in
    // target/<profile>/; the workspace binaries are in target/<profile>/.
    let here = exe.parent().expect("exe dir");
    let dir = if here.ends_with("deps") { here.parent().expect("target dir") } else { here };
    let path = dir.join(name);
    assert!(path.is_file(), "{} is not built; run `cargo build --workspace` (make test does)", path.display());
    path
}

/// A temporary Choir home.
pub struct TempHome {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TempHome {
    /// Creates a home with `config` and `secrets` (mode 0600).
    pub fn new(config: &Value, secrets: &Value) -> TempHome {
        let dir = tempfile::Builder::new().prefix("choir-home-").tempdir().expect("temp home");
        // Traversable, so a managed cluster running as `postgres` can reach <home>/pg.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let path = dir.path().to_owned();
        std::fs::write(path.join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
        let secrets_path = path.join("secrets.json");
        std::fs::write(&secrets_path, secrets.to_string()).unwrap();
        std::fs::set_permissions(&secrets_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        TempHome { dir: Some(dir), path }
    }

    /// An empty home directory (traversable, as [`TempHome::new`]'s), for
    /// `choirctl restore` to fill.
    pub fn empty() -> TempHome {
        let dir = tempfile::Builder::new().prefix("choir-home-").tempdir().expect("temp home");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let path = dir.path().to_owned();
        TempHome { dir: Some(dir), path }
    }

    /// The home directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs choird on this home expecting it to exit by itself (start-up
    /// failures); returns its status and stderr.
    pub fn run_choird_to_exit(&self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let mut cmd = Command::new(bin("choird"));
        cmd.arg("--home").arg(&self.path).stdin(Stdio::null()).stdout(Stdio::null());
        run_to_exit(cmd, timeout)
    }
}

/// Runs `cmd` to its end with stderr captured; returns its status and
/// stderr. Panics (after killing it) when it runs past `timeout`.
pub fn run_to_exit(mut cmd: Command, timeout: Duration) -> (std::process::ExitStatus, String) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    // Read stderr on the side: a chatty child must not block on a full pipe.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut err);
        err
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().unwrap_or_default())
}

/// Sends SIGTERM to `child` and waits for it, SIGKILL after `patience`;
/// returns its status. A child that has ended already is not signalled
/// (its reaped pid may belong to another process by now).
pub fn terminate(child: &mut std::process::Child, patience: Duration) -> Option<std::process::ExitStatus> {
    if let Ok(Some(s)) = child.try_wait() {
        return Some(s);
    }
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + patience;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            eprintln!("pid {} ignored SIGTERM for {patience:?}; killing it", child.id());
            let _ = child.kill();
            return child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        if crate::keep() {
            if let Some(d) = self.dir.take() {
                eprintln!("CHOIR_TEST_KEEP: keeping {}", d.keep().display());
            }
            return;
        }
        // Workspace images a choird that was killed left mounted: detached,
        // so the directory can go and the loop devices are freed.
        for mount in choird::runtime::workspace::mounts_under(&self.path) {
            if let Err(e) = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH) {
                eprintln!("cannot unmount {}: {e}", mount.display());
            }
        }
    }
}

/// The file a test clock is read from, in a home.
const CLOCK_FILE: &str = "test-clock";

/// The file holding the `RUST_LOG` filters choird runs with, in a home
/// (else `CHOIR_TEST_RUST_LOG`, else `info`).
const RUST_LOG_FILE: &str = "test-rust-log";

/// The command that runs choird on `home`; with the home's test clock when
/// it has one.
fn choird_command(home: &Path, stderr: std::fs::File) -> Command {
    let filters = std::fs::read_to_string(home.join(RUST_LOG_FILE))
        .ok()
        .or_else(|| std::env::var("CHOIR_TEST_RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let mut cmd = Command::new(bin("choird"));
    cmd.arg("--home")
        .arg(home)
        .env("RUST_LOG", filters.trim())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    if home.join(CLOCK_FILE).exists() {
        cmd.env("CHOIR_TEST_CLOCK_FILE", home.join(CLOCK_FILE));
    }
    cmd
}

/// A running choird.
pub struct Choird {
    child: Option<Child>,
    /// Its home (deleted after choird stops).
    pub home: TempHome,
    /// For docker tests: the image prefix whose images are removed on drop.
    docker_prefix: Option<String>,
}

impl Choird {
    /// Starts choird on a new home and waits until its admin socket answers.
    pub fn start(config: &Value, secrets: &Value) -> Choird {
        Choird::start_in(TempHome::new(config, secrets))
    }

    /// Starts choird whose scheduler reads the time from a file the test
    /// moves ([`Choird::set_clock`]), starting at `at` (RFC 3339).
    pub fn start_at(config: &Value, secrets: &Value, at: &str) -> Choird {
        let home = TempHome::new(config, secrets);
        std::fs::write(home.path().join(CLOCK_FILE), at).unwrap();
        Choird::start_in(home)
    }

    /// Starts choird (and through it its process-runtime agents) with these
    /// `RUST_LOG` filters, e.g. `info,choir::hop=trace` for turn marks.
    pub fn start_logging(config: &Value, secrets: &Value, filters: &str) -> Choird {
        let home = TempHome::new(config, secrets);
        std::fs::write(home.path().join(RUST_LOG_FILE), filters).unwrap();
        Choird::start_in(home)
    }

    /// The `RUST_LOG` filters choird (and its agents) start with next time
    /// (as [`Choird::start_logging`] gives them to a new home).
    pub fn set_log_filters(&self, filters: &str) {
        std::fs::write(self.home.path().join(RUST_LOG_FILE), filters).unwrap();
    }

    /// Moves the scheduler's clock to `at` (see [`Choird::start_at`]).
    pub fn set_clock(&self, at: &str) {
        let tmp = self.home.path().join("test-clock.new");
        std::fs::write(&tmp, at).unwrap();
        std::fs::rename(tmp, self.home.path().join(CLOCK_FILE)).unwrap();
    }

    /// Starts choird on an existing home.
    pub fn start_in(home: TempHome) -> Choird {
        let stderr = std::fs::File::create(home.path().join("choird.stderr")).unwrap();
        let child = choird_command(home.path(), stderr).spawn().expect("spawn choird");
        let docker_prefix = std::fs::read_to_string(home.path().join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .filter(|c| c["runtime"] == "docker")
            .and_then(|c| c["docker"]["image_prefix"].as_str().map(str::to_owned));
        let mut c = Choird { child: Some(child), home, docker_prefix };
        c.wait_ready();
        c
    }

    /// Spawns choird on `home` with `env` added (`NOTIFY_SOCKET`, …) and
    /// returns at once, not waiting for its admin socket
    /// ([`Choird::wait_ready`] does).
    pub fn spawn_with_env(home: TempHome, env: &[(&str, &std::ffi::OsStr)]) -> Choird {
        let stderr = std::fs::File::create(home.path().join("choird.stderr")).unwrap();
        let mut cmd = choird_command(home.path(), stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn choird");
        Choird { child: Some(child), home, docker_prefix: None }
    }

    /// Waits until the admin socket answers (panics if choird exits first).
    pub fn wait_ready(&mut self) {
        let socket = self.home.path().join("socks/choird.sock");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("choird exited during start-up ({status}):\n{}", self.stderr());
            }
            if socket.exists() && std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "choird not ready after 60 s:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// choird's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.home.path().join("choird.stderr")).unwrap_or_default()
    }

    /// choird's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Runs `choirctl --home <home> ARGS`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(bin("choirctl")).arg("--home").arg(self.home.path()).args(args).output().expect("run choirctl")
    }

    /// Runs `choirctl --home <home> ARGS` with `input` on its stdin.
    pub fn ctl_with_input(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child = Command::new(bin("choirctl"))
            .arg("--home")
            .arg(self.home.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run choirctl");
        let _ = child.stdin.take().expect("stdin").write_all(input.as_bytes());
        child.wait_with_output().expect("choirctl output")
    }

    /// Runs choirctl and returns stdout, failing the test on a non-zero exit.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "choirctl {args:?} failed: {}\n--- choird stderr ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.stderr()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The agent's workspace under this home.
    pub fn workspace(&self, agent: &str) -> PathBuf {
        self.home.path().join("workspaces").join(agent)
    }

    /// Stops choird (SIGTERM) and starts it again on the same home.
    pub fn restart(&mut self) {
        self.restart_with(|| {});
    }

    /// Like [`Choird::restart`], running `meanwhile` while choird is down.
    pub fn restart_with(&mut self, meanwhile: impl FnOnce()) {
        let status = self.stop();
        assert!(status.is_some_and(|s| s.success()), "choird did not stop cleanly:\n{}", self.stderr());
        meanwhile();
        self.respawn();
    }

    /// Kills choird with SIGKILL — no shutdown at all — and starts it again
    /// on the same home.
    pub fn kill_and_restart(&mut self) {
        self.kill_and_restart_with(|| {});
    }

    /// Kills choird with SIGKILL and leaves it down.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Like [`Choird::kill_and_restart`], running `meanwhile` while choird is down.
    pub fn kill_and_restart_with(&mut self, meanwhile: impl FnOnce()) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        meanwhile();
        self.respawn();
    }

    fn respawn(&mut self) {
        self.spawn_again();
        self.wait_ready();
    }

    /// Starts choird again on this home (after [`Choird::stop`]) and returns
    /// at once, not waiting for its admin socket (the start-up benchmark
    /// times that itself).
    pub fn spawn_again(&mut self) {
        let stderr = std::fs::OpenOptions::new().append(true).open(self.home.path().join("choird.stderr")).unwrap();
        let child = choird_command(self.home.path(), stderr).spawn().expect("spawn choird");
        self.child = Some(child);
    }

    /// The repo directory holding tools of `layer` (`global` or an agent id).
    pub fn tools_dir(&self, layer: &str) -> PathBuf {
        let dir = match layer {
            "global" => self.home.path().join("repos/global/tools"),
            agent => self.home.path().join("repos/agents").join(agent).join("tools"),
        };
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Waits (up to 60 s) until `agent` runs again (after choird restarted it).
    pub fn wait_running(&self, agent: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.ctl(&["--json", "agent", "status", agent]);
            let state = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok().map(|s| s["state"].clone());
            if state.as_ref().is_some_and(|s| s == "running") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "agent {agent} not running again after 60 s: {state:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs choirctl expecting failure; returns stderr.
    pub fn ctl_err(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            !out.status.success(),
            "choirctl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    /// Stops choird with SIGTERM and waits (SIGKILL after 30 s); returns its status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        terminate(&mut self.child.take()?, Duration::from_secs(30))
    }
}

impl Drop for Choird {
    fn drop(&mut self) {
        self.stop();
        if let Some(prefix) = &self.docker_prefix {
            if crate::keep() {
                return;
            }
            // The containers of this home and the images this test tagged go.
            let engine = crate::docker::engine();
            let label = choird::runtime::docker::home_label(&choird::home::Home::new(self.home.path().to_owned()));
            for c in engine.containers_with_label(&format!("choir.home={label}")).unwrap_or_default() {
                let _ = engine.remove(c["Id"].as_str().unwrap_or_default());
            }
            for image in crate::docker::images_with_prefix(&engine, prefix) {
                let _ = engine.remove_image(&image);
            }
        }
    }
}

/// A config for docker tests: like [`test_config`] with the docker runtime and
/// an image prefix of this test's own (its images are removed on drop).
pub fn docker_config(llm_base_url: &str, database_url: Option<&str>, agents: &[&str]) -> Value {
    let mut c = test_config(llm_base_url, database_url, agents);
    let mut rnd = [0u8; 4];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd)).unwrap();
    let prefix = format!("choirtest-{}", rnd.iter().map(|b| format!("{b:02x}")).collect::<String>());
    c["runtime"] = Value::String("docker".into());
    c["docker"] = serde_json::json!({"image_prefix": prefix, "keep_agents_on_shutdown": true});
    c
}

/// A config for tests: process runtime, both lanes on `llm_base_url`, one agent
/// per id, and `database_url` when given (else the managed cluster).
pub fn test_config(llm_base_url: &str, database_url: Option<&str>, agents: &[&str]) -> Value {
    let agents: serde_json::Map<String, Value> =
        agents.iter().map(|a| (a.to_string(), serde_json::json!({}))).collect();
    let mut c = serde_json::json!({
        "runtime": "process",
        "llm": {
            "edge": {"base_url": llm_base_url, "model": "fake-edge", "api_key_secret": "llm_key", "timeout_s": 30},
            "core": {"base_url": llm_base_url, "model": "fake-core", "api_key_secret": "llm_key", "timeout_s": 30}
        },
        "agents": agents,
    });
    if let Some(url) = database_url {
        c["database_url"] = Value::String(url.to_owned());
    }
    c
}

/// [`test_config`] with the core lane on its own endpoint.
pub fn two_lane_config(edge_url: &str, core_url: &str, database_url: &str, agents: &[&str]) -> Value {
    let mut c = test_config(edge_url, Some(database_url), agents);
    c["llm"]["core"]["base_url"] = Value::String(core_url.to_owned());
    c
}

/// Compares `actual` with the snapshot `tests/snapshots/<name>.json`; with
/// `CHOIR_UPDATE_SNAPSHOTS=1` the snapshot is (re)written instead.
pub fn assert_snapshot(name: &str, actual: &Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots").join(format!("{name}.json"));
    let pretty = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var("CHOIR_UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &pretty).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (CHOIR_UPDATE_SNAPSHOTS=1 creates it)", path.display()));
    assert_eq!(
        pretty,
        expected,
        "snapshot {} differs (CHOIR_UPDATE_SNAPSHOTS=1 updates it after review)",
        path.display()
    );
}

/// Copies the shipped `tools/<file>` (manifest and executable) into `dir`.
pub fn install_shipped_tool(dir: &Path, stem: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools");
    for name in [format!("{stem}.json"), stem.to_owned()] {
        std::fs::copy(src.join(&name), dir.join(&name)).unwrap();
    }
}

/// `choird cluster` on a home, as the `choir-db` unit runs it: the managed
/// cluster kept by a process of its own, which a choird on that home adopts
/// and leaves running. Dropping it stops it with SIGTERM (it stops the
/// cluster); a postmaster still alive after that (its home deleted under
/// it) gets PostgreSQL's immediate shutdown, so no test leaves one behind.
pub struct ClusterKeeper {
    child: Child,
    postmaster: Option<u32>,
}

impl ClusterKeeper {
    /// Starts `choird cluster` on `home` and waits (60 s at most) for its
    /// READY=1, read from a notify socket of the test's own.
    pub fn start(home: &Path) -> ClusterKeeper {
        let dir = tempfile::tempdir().unwrap();
        let notify = dir.path().join("notify");
        let sock = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let child = ClusterKeeper::command(home)
            .env("NOTIFY_SOCKET", &notify)
            .stderr(std::fs::File::create(home.join("cluster.stderr")).unwrap())
            .spawn()
            .expect("spawn choird cluster");
        let mut keeper = ClusterKeeper { child, postmaster: None };
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap_or_else(|e| {
            let err = std::fs::read_to_string(home.join("cluster.stderr")).unwrap_or_default();
            panic!("choird cluster said nothing to systemd within 60 s ({e}):\n{err}")
        });
        assert_eq!(&buf[..n], b"READY=1", "choird cluster's first word to systemd");
        keeper.postmaster = choird::db::cluster::ManagedCluster::postmaster_pid(&home.join("pg"));
        assert!(keeper.postmaster.is_some(), "the cluster runs once choird cluster says READY");
        keeper
    }

    /// The command running `choird cluster` on `home`.
    pub fn command(home: &Path) -> Command {
        let mut cmd = Command::new(bin("choird"));
        cmd.arg("cluster").arg("--home").arg(home).stdin(Stdio::null()).stdout(Stdio::null());
        cmd
    }

    /// The postmaster's pid when `choird cluster` said READY.
    pub fn postmaster(&self) -> u32 {
        self.postmaster.unwrap_or(0)
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it (SIGTERM) and returns its exit status (at once when it has
    /// ended already: a reaped pid is never signalled, it may be reused).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let status = terminate(&mut self.child, Duration::from_secs(30));
        // Still there (not a reused pid: it is still PostgreSQL's) only when
        // the clean stop failed.
        let left = self
            .postmaster
            .take()
            .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with("postgres")));
        if let Some(pid) = left.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::QUIT);
        }
        status
    }
}

impl Drop for ClusterKeeper {
    fn drop(&mut self) {
        self.stop();
    }
}
