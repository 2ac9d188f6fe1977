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
