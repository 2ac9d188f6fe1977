//! The `docker` runtime (R-LIFE-2): the one audited template every agent
//! container is created from. Nothing in it can be overridden by agent config
//! except the resource limits and the network mode, which are validated fields.
//!
//! **Invariant:** an agent container is never privileged, has no capabilities,
//! cannot gain privileges, has a read-only root filesystem with a size-limited
//! `/tmp`, runs as a non-root user, shares no host namespace, sees no device,
//! has pids/memory/CPU limits, and mounts exactly two host paths: its workspace
//! at `/workspace` and its own socket directory at `/run/choir`. Never the
//! Docker socket. No secret is in its environment, labels or command line: the
//! lease token arrives on stdin, secrets through GET_SECRETS.

use std::path::Path;

use choir_common::ids::AgentId;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::config::{NetworkMode, Resources};
use crate::home::Home;

/// Where the agent's socket directory is mounted in the container.
pub const SOCKET_DIR_IN_CONTAINER: &str = "/run/choir";
/// The uid/gid agents run as when choird is root (matches the base image's `choir` user).
pub const AGENT_UID: u32 = 10001;

/// Open files of any process in an agent container.
pub const NOFILE: u64 = 4096;
/// Processes of the agent's user (RLIMIT_NPROC counts them host-wide; the
/// cgroup's `PidsLimit` is the per-container bound).
pub const NPROC: u64 = 8192;

/// Checks the engine applies its built-in default seccomp profile to
/// containers that name none (as ours do): `GET /info` must list
/// `name=seccomp,profile=default` (20.10) or `profile=builtin` (later
/// engines). An engine without seccomp, or whose daemon replaces the default
/// profile, is refused: the agent's syscall surface is then not what this
/// template promises.
pub fn check_seccomp(info: &Value) -> Result<(), String> {
    let opts: Vec<&str> =
        info["SecurityOptions"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let seccomp: Vec<&&str> = opts.iter().filter(|o| o.starts_with("name=seccomp")).collect();
    match seccomp.as_slice() {
        [] => Err("the Docker engine applies no seccomp profile (it reports no seccomp support); choird runs agents \
                   only under the engine's built-in default profile"
            .into()),
        [one] if one.ends_with("profile=default") || one.ends_with("profile=builtin") => Ok(()),
        other => Err(format!(
            "the Docker engine's default seccomp profile is not its built-in one ({}); choird runs agents only under \
             the built-in profile: remove the daemon's seccomp-profile setting",
            other.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Label naming the choird home a container belongs to.
pub const LABEL_HOME: &str = "choir.home";
/// Label naming the agent.
pub const LABEL_AGENT: &str = "choir.agent";
/// Label naming the session (lease) the container was started for.
pub const LABEL_SESSION: &str = "choir.session";

/// A short stable hash of the home directory, so containers of different
/// homes (two choirds, or tests) never mix.
pub fn home_label(home: &Home) -> String {
    let path = home.root().canonicalize().unwrap_or_else(|_| home.root().to_owned());
    hex::encode(Sha256::digest(path.to_string_lossy().as_bytes()))[..12].to_owned()
}

/// The container name of an agent.
pub fn container_name(home_label: &str, id: &AgentId) -> String {
    format!("choir-{home_label}-{id}")
}

/// The uid and gid an agent container runs as: choird's own when it is not
/// root (so the socket and workspace it owns are the agent's), else
/// [`AGENT_UID`] (and choird hands the agent its socket and workspace).
pub fn agent_ids() -> (u32, u32) {
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        (AGENT_UID, AGENT_UID)
    } else {
        (uid.as_raw(), rustix::process::getegid().as_raw())
    }
}

/// What varies between agent containers.
pub struct ContainerSpec<'a> {
    /// Image tag.
    pub image: &'a str,
    /// Agent id.
    pub agent: &'a AgentId,
    /// Session id (a label, for adoption after a choird restart).
    pub session: i64,
    /// Host workspace directory.
    pub workspace: &'a Path,
    /// Host directory holding the agent's socket.
    pub socket_dir: &'a Path,
    /// Resource limits.
    pub resources: &'a Resources,
    /// Network mode.
    pub network: NetworkMode,
    /// Home label.
    pub home_label: &'a str,
    /// `/tmp` size in MiB.
    pub tmp_mb: u64,
}

/// The container configuration (`POST /containers/create` body).
pub fn hardened(spec: &ContainerSpec<'_>) -> Value {
    let (uid, gid) = agent_ids();
    let memory = spec.resources.memory_mb as i64 * 1024 * 1024;
    json!({
        "Image": spec.image,
        "Cmd": [
            "--agent", spec.agent.as_str(),
            "--token-stdin",
            "--connect", format!("unix:{SOCKET_DIR_IN_CONTAINER}/choird.sock"),
            "--workspace", "/workspace",
            "--choir-dir", "/choir"
        ],
        "User": format!("{uid}:{gid}"),
        "Env": ["RUST_LOG=info"],
        "WorkingDir": "/workspace",
        "Labels": {
            LABEL_HOME: spec.home_label,
            LABEL_AGENT: spec.agent.as_str(),
            LABEL_SESSION: spec.session.to_string(),
        },
        "AttachStdin": true,
        "OpenStdin": true,
        "StdinOnce": true,
        "Tty": false,
        "NetworkDisabled": spec.network == NetworkMode::None,
        "HostConfig": {
            "Privileged": false,
            "CapDrop": ["ALL"],
            "CapAdd": [],
            // No seccomp option: the engine's built-in default profile, which
            // `check_engine` requires the engine to have (never unconfined).
            "SecurityOpt": ["no-new-privileges:true"],
            "ReadonlyRootfs": true,
            "Tmpfs": {"/tmp": format!("rw,nosuid,nodev,size={}m", spec.tmp_mb)},
            "Binds": [
                format!("{}:/workspace:rw", spec.workspace.display()),
                // choird's directory, read-only: the agent connects to its socket
                // (connect() works on a read-only mount) and can plant nothing.
                format!("{}:{SOCKET_DIR_IN_CONTAINER}:ro", spec.socket_dir.display()),
            ],
            "NetworkMode": spec.network.as_str(),
            "PidMode": "",
            "IpcMode": "private",
            "UTSMode": "",
            "UsernsMode": "",
            "Devices": [],
            "DeviceCgroupRules": [],
            "PidsLimit": spec.resources.pids,
            // Per-process limits, besides the cgroup's: descriptors, and
            // processes of the agent's user (counted host-wide by the kernel).
            "Ulimits": [
                {"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE},
                {"Name": "nproc", "Soft": NPROC, "Hard": NPROC},
            ],
            "Memory": memory,
            "MemorySwap": memory,
            "NanoCpus": (spec.resources.cpus * 1e9) as i64,
            // No init of the engine's: the agent is the container's PID 1
            // (it reaps everything below it anyway), so no process of the
            // agent's uid sits outside its tree for a tool to seize, and the
            // kernel drops SIGSTOP and SIGKILL sent to it from inside the
            // container: a tool cannot freeze or kill its agent.
            "Init": false,
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": false,
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}},
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_is_hardened_whatever_the_agent_config() {
        let id = AgentId::parse("demo").unwrap();
        let resources = Resources { memory_mb: 512, cpus: 0.5, pids: 64 };
        let spec = ContainerSpec {
            image: "choir-agent-demo:abc",
            agent: &id,
            session: 7,
            workspace: Path::new("/srv/ws"),
            socket_dir: Path::new("/srv/socks/demo"),
            resources: &resources,
            network: NetworkMode::None,
            home_label: "h",
            tmp_mb: 64,
        };
        let c = hardened(&spec);
        let h = &c["HostConfig"];
        assert_eq!(h["Privileged"], false);
        assert_eq!(h["CapDrop"], json!(["ALL"]));
        assert_eq!(h["ReadonlyRootfs"], true);
        assert_eq!(h["Init"], false, "the agent is PID 1: no init of the agent's uid outside its tree");
        assert_eq!(h["Binds"], json!(["/srv/ws:/workspace:rw", "/srv/socks/demo:/run/choir:ro"]));
        assert_eq!(
            (h["Memory"].as_i64(), h["NanoCpus"].as_i64(), h["PidsLimit"].as_u64()),
            (Some(512 << 20), Some(500_000_000), Some(64))
        );
        assert_eq!(c["NetworkDisabled"], true);
        assert!(!c.to_string().contains("docker.sock"));
        assert_ne!(c["User"], "0:0");
        assert!(!c.to_string().contains("seccomp"), "the engine's built-in profile, never an override");
        assert_eq!(h["Ulimits"][0], json!({"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE}));
    }

    #[test]
    fn only_the_engines_builtin_seccomp_profile_is_accepted() {
        assert!(check_seccomp(&json!({"SecurityOptions": ["name=apparmor", "name=seccomp,profile=default"]})).is_ok());
        assert!(check_seccomp(&json!({"SecurityOptions": ["name=seccomp,profile=builtin"]})).is_ok());
        assert!(check_seccomp(&json!({"SecurityOptions": ["name=apparmor"]})).unwrap_err().contains("no seccomp"));
        let custom = check_seccomp(&json!({"SecurityOptions": ["name=seccomp,profile=/etc/x.json"]})).unwrap_err();
        assert!(custom.contains("profile=/etc/x.json"), "{custom}");
    }
}
