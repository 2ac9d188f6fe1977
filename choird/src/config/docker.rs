//! `docker`: the engine socket, the base image and how agent images are named.

use super::*;

/// The docker runtime's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerConfig {
    /// The engine's Unix socket.
    #[serde(default = "default_docker_socket")]
    pub socket: PathBuf,
    /// The base image agent images are built `FROM` (scripts/build-base-image.sh makes it).
    #[serde(default = "default_base_image")]
    pub base_image: String,
    /// Agent images are named `<image_prefix>-agent-<id>:<input hash>`.
    #[serde(default = "default_image_prefix")]
    pub image_prefix: String,
    /// Leave agent containers running when choird stops (they reconnect with
    /// their lease when it comes back); false stops them with choird.
    #[serde(default = "default_true")]
    pub keep_agents_on_shutdown: bool,
    /// Size of each agent's `/tmp` (tmpfs), in MiB.
    #[serde(default = "default_tmp_mb")]
    pub tmp_mb: u64,
}

fn default_docker_socket() -> PathBuf {
    PathBuf::from("/var/run/docker.sock")
}
fn default_base_image() -> String {
    "choir-base:bookworm".to_owned()
}
fn default_image_prefix() -> String {
    "choir".to_owned()
}
fn default_tmp_mb() -> u64 {
    64
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            socket: default_docker_socket(),
            base_image: default_base_image(),
            image_prefix: default_image_prefix(),
            keep_agents_on_shutdown: true,
            tmp_mb: default_tmp_mb(),
        }
    }
}
