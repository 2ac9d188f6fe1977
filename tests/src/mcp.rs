//! MCP servers for the tests: the reference servers from PyPI
//! (`mcp-server-time`, `mcp-server-git`) and the hostile ones of
//! `tests/mcp/hostile.py`, in a private venv made by `tests/mcp/setup.sh`
//! (kept in the target directory), started by Choir as its MCP servers.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::services_required as require_services;

/// The test servers' sources (`tests/mcp`).
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp")
}

fn venv_dir() -> PathBuf {
    #[allow(clippy::disallowed_methods)] // Where cargo builds: the venv lives beside it.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("mcp-venv")
}

/// The venv holding the servers.
pub struct Servers {
    venv: PathBuf,
}

impl Servers {
    /// Makes (or reuses) the venv. `None` when it cannot (printing why),
    /// unless the test run requires every service.
    pub fn prepare() -> Option<Servers> {
        let venv = venv_dir();
        let setup = Command::new(dir().join("setup.sh")).arg(&venv).output();
        let failed = match &setup {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(String::from_utf8_lossy(&o.stderr).into_owned()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = failed {
            assert!(!require_services(), "the MCP servers' environment could not be made: {why}");
            eprintln!("skipping: the MCP servers' environment could not be made: {why}");
            return None;
        }
        Some(Servers { venv })
    }

    /// The venv's Python (an absolute path, as a server's `command`).
    pub fn python(&self) -> String {
        self.venv.join("bin/python").display().to_string()
    }

    /// The venv's directory.
    pub fn venv(&self) -> &Path {
        &self.venv
    }

    /// `choirctl mcp add` arguments for the reference time server.
    pub fn time_args(&self) -> Vec<String> {
        vec!["--command".into(), self.python(), "--arg".into(), "-m".into(), "--arg".into(), "mcp_server_time".into()]
    }

    /// `choirctl mcp add` arguments for a hostile server in `mode`.
    pub fn hostile_args(&self, mode: &str) -> Vec<String> {
        vec![
            "--command".into(),
            self.python(),
            "--arg".into(),
            dir().join("hostile.py").display().to_string(),
            "--arg".into(),
            mode.into(),
        ]
    }
}

/// An agent base image holding the servers: `choir-base:bookworm-python`
/// (`make base-image-python`) with the venv's packages in
/// `/opt/mcp/site-packages` and `hostile.py` in `/opt/mcp`; removed when
/// dropped.
pub struct Image {
    /// Its tag.
    pub tag: String,
}

/// The base image MCP images are built on.
pub const PYTHON_BASE: &str = "choir-base:bookworm-python";

impl Image {
    /// Builds it (the caller holds [`crate::docker::exclusive`]).
    pub fn build(servers: &Servers) -> Image {
        let engine = crate::docker::engine();
        assert!(
            engine.image(PYTHON_BASE).unwrap().is_some(),
            "the base image {PYTHON_BASE} is missing: make base-image-python"
        );
        let mut tar = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8], mode: u32| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            h.set_mtime(0);
            tar.append_data(&mut h, path, data).unwrap();
        };
        add("Dockerfile", format!("FROM {PYTHON_BASE}\nCOPY mcp/ /opt/mcp/\n").as_bytes(), 0o644);
        add("mcp/hostile.py", &std::fs::read(dir().join("hostile.py")).unwrap(), 0o644);
        let site = servers.venv().join("lib/python3.11/site-packages");
        for entry in walkdir(&site) {
            let rel = entry.strip_prefix(&site).unwrap().display().to_string();
            if rel.contains("__pycache__") || rel.starts_with("pip") {
                continue;
            }
            add(&format!("mcp/site-packages/{rel}"), &std::fs::read(&entry).unwrap(), 0o644);
        }
        let context = tar.into_inner().unwrap();
        let mut rnd = [0u8; 4];
        std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd)).unwrap();
        let tag = format!("choirtest-mcp:{}", rnd.iter().map(|b| format!("{b:02x}")).collect::<String>());
        engine.build(context, &tag, &serde_json::json!({}), &serde_json::json!({}), |_| {}).unwrap();
        Image { tag }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = crate::docker::engine().remove_image(&self.tag);
    }
}

/// Every regular file under `root`, sorted.
fn walkdir(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// A server of `tests/mcp/serve_http.py` on a loopback port (the reference
/// time server, or a hostile mode), stopped when dropped.
pub struct HttpServer {
    child: std::process::Child,
    /// Its endpoint (`http://127.0.0.1:PORT/mcp`).
    pub url: String,
}

impl HttpServer {
    /// Starts `which` (`time` or a hostile mode) and waits until it listens
    /// (on a port it bound itself and printed: no race with other tests).
    pub fn start(servers: &Servers, which: &str) -> HttpServer {
        let mut child = Command::new(servers.python())
            .arg(dir().join("serve_http.py"))
            .arg(which)
            .current_dir(dir())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        let port: u16 = line.trim().parse().unwrap_or_else(|_| panic!("serve_http.py {which} printed {line:?}"));
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "serve_http.py {which} never listened");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        HttpServer { child, url: format!("http://127.0.0.1:{port}/mcp") }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
