//! `approvals` and `logs`: how long approvals wait, and how logs rotate.

use super::*;

/// What follows an approval (R-CTL-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// An approved tool or skill is rolled out to its running agent at
    /// once: the image rebuilt (docker) and the agent restarted on it when
    /// it is between messages; its new session resumes from the recovery
    /// snapshot. Off: `choirctl agent update` does it.
    #[serde(default = "default_true")]
    pub auto_update: bool,
    /// How long a rollout waits for the agent to finish its current work
    /// before it restarts the agent anyway, in seconds.
    #[serde(default = "default_idle_wait")]
    pub idle_wait_s: u64,
}

fn default_idle_wait() -> u64 {
    300
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig { auto_update: true, idle_wait_s: default_idle_wait() }
    }
}

/// Log rotation and retention (R-CTL-3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsConfig {
    /// A log file is archived (and compressed) when it reaches this size.
    #[serde(default = "default_log_file_mb")]
    pub max_file_mb: f64,
    /// Live logs and archives together stay under this; the oldest archives
    /// of the stream using the most go first.
    #[serde(default = "default_log_total_mb")]
    pub max_total_mb: f64,
    /// Archives older than this are deleted.
    #[serde(default = "default_log_age_days")]
    pub max_age_days: u32,
}

fn default_log_file_mb() -> f64 {
    16.0
}
fn default_log_total_mb() -> f64 {
    512.0
}
fn default_log_age_days() -> u32 {
    14
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig {
            max_file_mb: default_log_file_mb(),
            max_total_mb: default_log_total_mb(),
            max_age_days: default_log_age_days(),
        }
    }
}

impl LogsConfig {
    /// The limits the log manager applies.
    pub fn limits(&self) -> crate::logs::Limits {
        crate::logs::Limits {
            max_file_bytes: (self.max_file_mb * 1024.0 * 1024.0) as u64,
            max_total_bytes: (self.max_total_mb * 1024.0 * 1024.0) as u64,
            max_age: std::time::Duration::from_secs(u64::from(self.max_age_days) * 24 * 3600),
        }
    }
}
