//! The `process` runtime (R-LIFE-5): the agent runs as a plain child process of
//! choird. It is **not sandboxed** — it has choird's user, filesystem view and
//! network — and every start says so in the log and the audit trail. Meant for
//! development and for machines without a Docker engine.
//!
//! The lease token reaches the child on its stdin (one line, then EOF), never on
//! the command line or in the environment, where other processes could read it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use choir_common::ids::AgentId;

use crate::home::Home;
use crate::spawn::{Cmd, SpawnError};

/// Lays out the agent's `/choir` equivalent for the process runtime:
/// `<home>/run/<id>/choir/{tools,skills,mcp}/{global,agent}` as symlinks into the
/// repo clones (`repos/global/…`, `repos/agents/<id>/…`), so the agent loads
/// what an image build would bake in.
pub fn prepare_choir_dir(home: &Home, id: &AgentId) -> std::io::Result<PathBuf> {
    let choir = home.root().join("run").join(id.as_str()).join("choir");
    for kind in ["tools", "skills", "mcp"] {
        let dir = choir.join(kind);
        std::fs::create_dir_all(&dir)?;
        for (layer, target) in [
            ("global", home.repos().join("global").join(kind)),
            ("agent", home.repos().join("agents").join(id.as_str()).join(kind)),
        ] {
            let link = dir.join(layer);
            if link.symlink_metadata().is_ok() {
                std::fs::remove_file(&link)?;
            }
            std::os::unix::fs::symlink(target, link)?;
        }
    }
    Ok(choir)
}

/// Starts `choir-agent` for `id`, connected to `connect` (`unix:PATH` or
/// `http://HOST:PORT`), confined (by its own
/// path rules, not by a sandbox) to `workspace`, loading tools from
/// `choir_dir`. Its stdout and stderr are pipes, for the log manager.
pub fn spawn(
    binary: &Path,
    id: &AgentId,
    connect: &str,
    workspace: &Path,
    choir_dir: &Path,
    token: &str,
) -> Result<Child, SpawnError> {
    let (out, err) = (Stdio::piped(), Stdio::piped());
    let mut cmd = Cmd::new(binary);
    cmd.args(["--agent", id.as_str(), "--token-stdin", "--connect"])
        .arg(connect)
        .arg("--workspace")
        .arg(workspace.as_os_str())
        .arg("--choir-dir")
        .arg(choir_dir.as_os_str())
        .current_dir(workspace);
    let display = cmd.display().to_owned();
    let mut child = cmd.spawn(Stdio::piped(), out, err)?;
    let written = match child.stdin.take() {
        Some(mut stdin) => writeln!(stdin, "{token}"),
        None => Err(std::io::Error::other("no stdin pipe")),
    };
    if let Err(e) = written {
        let _ = child.kill();
        let _ = child.wait();
        return Err(SpawnError::Start { cmd: display, source: e });
    }
    Ok(child)
}
