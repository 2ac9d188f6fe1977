//! What the agent and every process it starts may not do: a seccomp filter
//! of Choir's own, installed on all the agent's threads at start, before it
//! reads its token or starts a tool. Filters are inherited across `fork`
//! and `execve` and can be added to, never removed, so every tool process
//! and everything it starts carries it. The agent itself never makes these
//! calls.
//!
//! It refuses (`EPERM`) the calls that reach into another process: `ptrace`
//! (attaching to or seizing any process, the container's PID 1 included),
//! `process_vm_readv`/`process_vm_writev` (reading or writing another
//! process's memory) and `pidfd_getfd` (taking another process's open
//! files). A shell the model drives can therefore not take over a process it
//! did not start, nor read a secret out of one; its own children it
//! controls anyway.
//!
//! **Invariant:** no tool process runs without the filter: if it cannot be
//! installed the agent does not start (fail closed). Installing it sets
//! `no_new_privs` too: nothing below the agent gains privileges by `execve`.

use std::sync::OnceLock;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The calls refused to every tool process.
pub const REFUSED: [(&str, i64); 4] = [
    ("ptrace", libc_nr::PTRACE),
    ("process_vm_readv", libc_nr::PROCESS_VM_READV),
    ("process_vm_writev", libc_nr::PROCESS_VM_WRITEV),
    ("pidfd_getfd", libc_nr::PIDFD_GETFD),
];

/// System call numbers of this architecture.
mod libc_nr {
    #[cfg(target_arch = "x86_64")]
    pub const PTRACE: i64 = 101;
    #[cfg(target_arch = "x86_64")]
    pub const PROCESS_VM_READV: i64 = 310;
    #[cfg(target_arch = "x86_64")]
    pub const PROCESS_VM_WRITEV: i64 = 311;
    #[cfg(target_arch = "aarch64")]
    pub const PTRACE: i64 = 117;
    #[cfg(target_arch = "aarch64")]
    pub const PROCESS_VM_READV: i64 = 270;
    #[cfg(target_arch = "aarch64")]
    pub const PROCESS_VM_WRITEV: i64 = 271;
    /// The same on every architecture (the unified table).
    pub const PIDFD_GETFD: i64 = 438;
}

/// The compiled filter (built once, before any fork: building allocates).
pub fn program() -> Result<&'static BpfProgram, String> {
    static PROGRAM: OnceLock<Result<BpfProgram, String>> = OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
            let rules = REFUSED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
            let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(1), arch)
                .map_err(|e| format!("the tool process filter cannot be built: {e}"))?;
            BpfProgram::try_from(filter).map_err(|e| format!("the tool process filter cannot be compiled: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Installs the filter on every thread of this process (and so on every
/// process it starts from now on).
pub fn install() -> Result<(), String> {
    let program = program()?;
    seccompiler::apply_filter_all_threads(program)
        .map_err(|e| format!("the tool process filter cannot be installed: {e}"))
}
