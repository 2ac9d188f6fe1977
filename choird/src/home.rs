//! The state directory (`~/.choir.d` by default): its layout, the permission
//! rules on `secrets.json`, and the instance lock that keeps a second choird off
//! the same home.
//!
//! **Invariant:** while a [`HomeLock`] lives, no other choird serves this home.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use choir_common::ids::AgentId;

/// The file choird writes on first start: a docker-runtime setup with an
/// OpenAI endpoint and no agents, valid as it stands.
pub const STARTER_CONFIG: &str = r#"{
  "runtime": "docker",
  "llm": {
    "edge": { "base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini", "api_key_secret": "openai_api_key" },
    "core": { "base_url": "https://api.openai.com/v1", "model": "gpt-4o", "api_key_secret": "openai_api_key" }
  },
  "agents": {}
}
"#;

/// Paths inside a Choir home.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

/// What went wrong with the state directory.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// A file or directory could not be created or read.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// `secrets.json` can be read by other users.
    #[error("{path} is readable by group or others (mode {mode:o}); secrets must be private: run `chmod 600 {path}`")]
    SecretsMode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Another choird holds the instance lock.
    #[error(
        "another choird is already running on {home} (lock {lock} is held{pid}); stop it first, or use another --home"
    )]
    AlreadyRunning {
        /// The home.
        home: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// ", by pid N" when known.
        pid: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HomeError + '_ {
    move |source| HomeError::Io { path: path.to_owned(), source }
}

impl Home {
    /// A home rooted at `root` (not created yet).
    pub fn new(root: PathBuf) -> Home {
        Home { root }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `config.json`.
    pub fn config(&self) -> PathBuf {
        self.root.join("config.json")
    }
    /// `secrets.json`.
    pub fn secrets(&self) -> PathBuf {
        self.root.join("secrets.json")
    }
    /// `socks/` (mode 0700).
    pub fn socks(&self) -> PathBuf {
        self.root.join("socks")
    }
    /// The admin socket `socks/choird.sock`.
    pub fn admin_socket(&self) -> PathBuf {
        self.socks().join("choird.sock")
    }
    /// The directory holding one agent's socket (mounted into its container).
    pub fn agent_socket_dir(&self, id: &AgentId) -> PathBuf {
        self.socks().join("agents").join(id.as_str())
    }

    /// The agent-only socket of one agent.
    pub fn agent_socket(&self, id: &AgentId) -> PathBuf {
        self.agent_socket_dir(id).join("choird.sock")
    }
    /// `logs/`.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// Present after a restore: Telegram polling and the scheduler wait
    /// for the operator (`choirctl resume`), since the backed-up host may
    /// still poll the same bots and fire the same jobs. Holds why.
    pub fn restore_hold(&self) -> PathBuf {
        self.root.join("held-after-restore")
    }
    /// The agents a stopping choird stopped, which the next one starts again
    /// (one id a line; read and removed at start).
    pub fn agents_to_resume(&self) -> PathBuf {
        self.root.join("agents-to-resume")
    }
    /// `repos/`.
    pub fn repos(&self) -> PathBuf {
        self.root.join("repos")
    }
    /// The image an agent's workspace is mounted from
    /// (`workspace-images/<id>.ext4`; see `runtime::workspace`).
    pub fn workspace_image(&self, id: &AgentId) -> PathBuf {
        self.root.join("workspace-images").join(format!("{id}.ext4"))
    }
    /// Default workspace directory of an agent.
    pub fn default_workspace(&self, id: &AgentId) -> PathBuf {
        self.root.join("workspaces").join(id.as_str())
    }
    /// choird's spool of an agent's files waiting to be sent to a chat.
    pub fn spool(&self, id: &AgentId) -> PathBuf {
        self.root.join("telegram").join("spool").join(id.as_str())
    }
    /// Directory of the managed PostgreSQL cluster.
    pub fn pg(&self) -> PathBuf {
        self.root.join("pg")
    }

    /// The lock held by whichever process keeps the managed cluster running
    /// (choird, or `choird cluster`: `db::keeping`).
    pub fn pg_keeper_lock(&self) -> PathBuf {
        self.root.join("pg-keeper.lock")
    }

    /// Creates the layout: directories, a starter `config.json` and an empty
    /// `secrets.json` (mode 0600) when they do not exist. Existing files are
    /// never rewritten. Returns whether the starter config was written now
    /// (a first start).
    pub fn ensure_layout(&self) -> Result<bool, HomeError> {
        if self.root.exists() && !self.root.is_dir() {
            return Err(HomeError::Io {
                path: self.root.clone(),
                source: std::io::Error::other("the home is a file, not a directory: give --home a directory"),
            });
        }
        for dir in [self.root.clone(), self.repos().join("global"), self.repos().join("agents"), self.logs()] {
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        for private in [self.socks(), self.socks().join("agents")] {
            fs::create_dir_all(&private).map_err(io_err(&private))?;
            fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).map_err(io_err(&private))?;
        }
        let config = self.config();
        let first = !config.exists();
        if first {
            write_new(&config, STARTER_CONFIG.as_bytes(), 0o644)?;
        }
        let secrets = self.secrets();
        if !secrets.exists() {
            write_new(&secrets, b"{}\n", 0o600)?;
        }
        Ok(first)
    }

    /// Refuses a `secrets.json` that group or others can read or write.
    pub fn check_secrets_mode(&self) -> Result<(), HomeError> {
        let path = self.secrets();
        let meta = fs::metadata(&path).map_err(io_err(&path))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(HomeError::SecretsMode { path, mode });
        }
        Ok(())
    }

    /// Takes the instance lock (`choird.lock`, `flock`), recording our pid in it.
    pub fn lock(&self) -> Result<HomeLock, HomeError> {
        let path = self.root.join("choird.lock");
        match pid_lock(&path).map_err(io_err(&path))? {
            Some(file) => Ok(HomeLock { _file: file }),
            None => Err(HomeError::AlreadyRunning {
                home: self.root.clone(),
                pid: lock_holder(&path).map(|p| format!(", by pid {p}")).unwrap_or_default(),
                lock: path,
            }),
        }
    }
}

/// Takes an exclusive `flock` on the file at `path` (made 0600 when
/// missing) and writes this process's pid into it: `Some(file)`, held
/// until the file closes (the kernel releases it however the process
/// ends), or `None` when another open of it holds the lock. A link at
/// `path` is refused, never followed.
pub fn pid_lock(path: &Path) -> std::io::Result<Option<File>> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Ok(None);
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(Some(file))
}

/// The pid a [`pid_lock`] file names (its holder's, while it is held).
pub fn lock_holder(path: &Path) -> Option<u32> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .ok()?
        .take(32)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

/// Bytes of the regular files directly in `dir` (0 when it is missing).
pub fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
        })
        .unwrap_or(0)
}

/// Held for the life of the daemon; the kernel releases the lock when the file
/// closes, also if choird is killed.
pub struct HomeLock {
    _file: File,
}

fn write_new(path: &Path, content: &[u8], mode: u32) -> Result<(), HomeError> {
    let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(path).map_err(io_err(path))?;
    f.write_all(content).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}
