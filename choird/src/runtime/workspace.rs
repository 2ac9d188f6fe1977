//! An agent's workspace as a file system of its own, so that nothing an
//! agent runs can fill the host's disk or use up its inodes: a sparse ext4
//! image per agent (`<home>/workspace-images/<id>.ext4`, `quotas.workspace_mb`
//! bytes, about `quotas.workspace_inodes` inodes), loop-mounted `nosuid,
//! nodev,discard` on the agent's workspace directory before the agent
//! starts. A write past the quota fails inside the agent with ENOSPC; the
//! host's disk holds only the blocks the agent really wrote (the image is
//! sparse, and `discard` gives deleted blocks back to the host).
//!
//! Why an image: a Debian host's root file system is ext4, where the other
//! choices need more than choird has (project quotas need the quota
//! feature enabled at mkfs time of the host's own file system; XFS project
//! quota needs an XFS volume; Docker's `--storage-opt size` covers only the
//! container's layer, not a bind-mounted workspace, and only on overlay2
//! over XFS). An image needs nothing but e2fsprogs and util-linux's mount,
//! both in every Debian install, and works the same for both runtimes.
//!
//! Mounting takes root. choird does it itself when it runs as root; the
//! systemd unit (choird as user `choir`) runs `choird workspaces mount`
//! with full privileges before choird starts and before each reload, and
//! `choird workspaces release` after it stops. An unprivileged choird never
//! starts an agent whose quota is on but whose image is not mounted: it
//! refuses, saying which command mounts it.
//!
//! Invariants:
//! - An image is never mounted through two loop devices at once (that
//!   would be two writers of one ext4): an image already attached (say to a
//!   container's mount that outlived choird's) is mounted through the loop
//!   device it is attached to, which shares the one superblock.
//! - Nothing already in the workspace directory is hidden by the mount: a
//!   first mount copies it into the new image (`mkfs.ext4 -d`, which copies
//!   links as links and follows none) and moves the directory aside as
//!   `<workspace>.before-quota`; a directory that holds files beside an
//!   existing image is refused, not covered.
//! - Unmounting is lazy (`MNT_DETACH`): a process still inside keeps the
//!   file system until it leaves, so releasing never fails and never cuts
//!   a running container off its workspace.
//! - A quota of 0 (`quotas.workspace_mb: 0`) turns this off: the workspace
//!   is a plain directory on choird's disk, and `choird doctor` says so.

use std::path::{Path, PathBuf};

use crate::config::Quotas;
use crate::home::Home;
use crate::spawn::Cmd;
use choir_common::ids::AgentId;

/// Mount options: no set-uid programs or device nodes from a file system the
/// agent writes, and blocks freed inside are freed on the host.
const MOUNT_OPTIONS: &str = "nosuid,nodev,discard";

/// What [`prepare`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// The quota is off: the workspace is a plain directory.
    Unlimited,
    /// The image was already mounted on the workspace.
    AlreadyMounted,
    /// choird mounted it now (and created it, copying what the directory
    /// held, when `created`).
    Mounted { created: bool },
}

impl std::fmt::Display for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Prepared::Unlimited => "no quota (quotas.workspace_mb is 0): a plain directory",
            Prepared::AlreadyMounted => "already mounted",
            Prepared::Mounted { created: false } => "mounted",
            Prepared::Mounted { created: true } => "created and mounted",
        })
    }
}

/// Makes sure the agent's workspace is its image, mounted (creating and
/// mounting it when choird may), owned by `owner`. An error says why the
/// agent must not start and what the operator can do.
pub fn prepare(
    home: &Home,
    id: &AgentId,
    workspace: &Path,
    quotas: &Quotas,
    owner: (u32, u32),
) -> Result<Prepared, String> {
    if quotas.workspace_mb == 0 {
        return Ok(Prepared::Unlimited);
    }
    let image = home.workspace_image(id);
    if is_mounted(&image, workspace) {
        if std::fs::metadata(&image).is_ok_and(|m| m.len() < quotas.workspace_mb.saturating_mul(1024 * 1024)) {
            log::warn!(
                "agent {id}: quotas.workspace_mb = {} is applied when its workspace is next mounted (at choird's \
                 next start)",
                quotas.workspace_mb
            );
        }
        return Ok(Prepared::AlreadyMounted);
    }
    if !rustix::process::geteuid().is_root() {
        return Err(format!(
            "agent {id}'s workspace quota (quotas.workspace_mb = {}) needs its image {} mounted on {}: run \
             `choird workspaces mount` as root (the systemd unit does, before choird starts and on reload), or set \
             quotas.workspace_mb to 0 to run this agent without a quota",
            quotas.workspace_mb,
            image.display(),
            workspace.display()
        ));
    }
    let created = if image.exists() {
        if holds_anything(workspace)? {
            return Err(format!(
                "agent {id}'s workspace {} holds files beside its image {}: mounting would hide them; move them \
                 away (they can be copied in once the agent runs) and start it again",
                workspace.display(),
                image.display()
            ));
        }
        grow_if_asked(&image, quotas)?;
        false
    } else {
        create(&image, workspace, quotas)?;
        true
    };
    mount(&image, workspace)?;
    // The ext4 root is the agent's, and looks like the empty directory it
    // replaces (e2fsck makes lost+found again if it ever needs one).
    let _ = std::fs::remove_dir(workspace.join("lost+found"));
    super::handover::hand_over(workspace, owner.0, owner.1)?;
    log::info!(
        "agent {id}: workspace {} is {}{} ({} MiB, about {} inodes)",
        workspace.display(),
        image.display(),
        if created { ", created now" } else { "" },
        quotas.workspace_mb,
        quotas.workspace_inodes
    );
    Ok(Prepared::Mounted { created })
}

/// Unmounts the agent's image from its workspace (lazily: see the module's
/// invariants). Returns whether it was mounted. Only root can; an
/// unprivileged choird leaves it to `choird workspaces release`.
pub fn release(home: &Home, id: &AgentId, workspace: &Path) -> Result<bool, String> {
    let image = home.workspace_image(id);
    if !is_mounted(&image, workspace) || !rustix::process::geteuid().is_root() {
        return Ok(false);
    }
    rustix::mount::unmount(workspace, rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| format!("cannot unmount {}: {e}", workspace.display()))?;
    Ok(true)
}

/// Whether `image` is what is mounted on `workspace`.
pub fn is_mounted(image: &Path, workspace: &Path) -> bool {
    mounted_image(workspace).is_some_and(|m| same_file(&m, image))
}

/// Whether two paths name one file (by device and inode, whatever their
/// spelling).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The image mounted on `dir`, if a loop-mounted image is (`None` for a
/// plain directory or any other file system).
pub fn mounted_image(dir: &Path) -> Option<PathBuf> {
    let dir = dir.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // The last mount on the path is the one seen there.
    let source = info.lines().filter_map(parse_mountinfo).rfind(|m| m.mount_point == dir)?.source;
    let name = source.strip_prefix("/dev/")?;
    backing_file(name)
}

/// The file a loop device (`loop3`) is attached to.
fn backing_file(device: &str) -> Option<PathBuf> {
    if !device.starts_with("loop") || device.contains('/') {
        return None;
    }
    let raw = std::fs::read_to_string(format!("/sys/block/{device}/loop/backing_file")).ok()?;
    let raw = raw.trim_end_matches('\n');
    // A file removed while attached reads "<path> (deleted)": not ours any more.
    (!raw.ends_with(" (deleted)")).then(|| PathBuf::from(raw))
}

/// Every mount point at or below `root`, deepest first (for a test's or
/// a removed home's clean-up).
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(root) = root.canonicalize() else { return Vec::new() };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> =
        info.lines().filter_map(parse_mountinfo).map(|m| m.mount_point).filter(|p| p.starts_with(&root)).collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// The loop device `image` is attached to already, if any.
fn attached_device(image: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|name| backing_file(name).is_some_and(|f| same_file(&f, image)))
        .map(|name| PathBuf::from("/dev").join(name))
}

/// One line of /proc/self/mountinfo, the parts used here.
#[derive(Debug, PartialEq, Eq)]
struct MountLine {
    mount_point: PathBuf,
    source: String,
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
/// (proc(5)): the fifth field is the mount point, the second after `-` the
/// source; both with octal escapes for space, tab, newline and backslash.
fn parse_mountinfo(line: &str) -> Option<MountLine> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let source = right.split(' ').nth(1)?;
    Some(MountLine { mount_point: PathBuf::from(unescape(mount_point)), source: unescape(source) })
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a directory holds any entry (a missing one holds nothing).
fn holds_anything(dir: &Path) -> Result<bool, String> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("cannot read {}: {e}", dir.display())),
    }
}

/// Bytes and inodes a directory tree takes (links not followed).
fn tree_use(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            inodes += 1;
            bytes += std::os::unix::fs::MetadataExt::blocks(&m) * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// Creates the sparse image, holding what `workspace` holds now (which is
/// then moved aside, so the mount hides nothing).
fn create(image: &Path, workspace: &Path, quotas: &Quotas) -> Result<(), String> {
    let bytes = quotas.workspace_mb.saturating_mul(1024 * 1024);
    let existing = holds_anything(workspace)?;
    if existing {
        let (used, inodes) = tree_use(workspace);
        // ext4's own metadata takes a few per cent; say so before mkfs does.
        if used.saturating_add(used / 16) > bytes || inodes >= quotas.workspace_inodes {
            return Err(format!(
                "workspace {} holds {} in {inodes} files, more than its quota (quotas.workspace_mb = {}, \
                 quotas.workspace_inodes = {}): raise the quota or free space there, then start the agent again",
                workspace.display(),
                choir_common::text::human_bytes(used),
                quotas.workspace_mb,
                quotas.workspace_inodes
            ));
        }
    }
    let dir = image.parent().ok_or("an image path has a parent")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let partial = image.with_extension("ext4.partial");
    let _ = std::fs::remove_file(&partial);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
        .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
    file.set_len(bytes).map_err(|e| format!("cannot size {}: {e}", partial.display()))?;
    drop(file);
    let mut mkfs = Cmd::new("mkfs.ext4");
    // -m 0: no blocks kept for root (the agent may be root in the process
    // runtime; the quota is the quota). The file is new and sparse, so
    // zero already: no inode tables or journal to write.
    mkfs.args(["-q", "-F", "-m", "0", "-N", &quotas.workspace_inodes.to_string()]).args([
        "-E",
        "assume_storage_prezeroed=1",
        "-L",
        "choir-workspace",
    ]);
    if existing {
        mkfs.arg("-d").arg(workspace.as_os_str());
    }
    mkfs.arg(partial.as_os_str());
    if let Err(e) = mkfs.run() {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("cannot make the workspace's file system: {e}"));
    }
    std::fs::rename(&partial, image).map_err(|e| format!("cannot put {} in place: {e}", image.display()))?;
    if existing {
        let aside = aside_path(workspace);
        std::fs::rename(workspace, &aside)
            .and_then(|()| std::fs::create_dir(workspace))
            .map_err(|e| format!("cannot move {} aside to {}: {e}", workspace.display(), aside.display()))?;
        log::warn!(
            "the files of {} were copied into its new image {}; the originals are kept at {} (remove them once \
             you have looked)",
            workspace.display(),
            image.display(),
            aside.display()
        );
    }
    Ok(())
}

/// Where a workspace's files from before its quota are kept.
pub fn aside_path(workspace: &Path) -> PathBuf {
    let mut name = workspace.file_name().unwrap_or_default().to_owned();
    name.push(".before-quota");
    workspace.with_file_name(name)
}

fn mount(image: &Path, workspace: &Path) -> Result<(), String> {
    let mut cmd = Cmd::new("mount");
    match attached_device(image) {
        // Attached already (a container's mount outlived choird's): the same
        // device, so the same superblock — never a second writer.
        Some(device) => cmd.args(["-t", "ext4", "-o", MOUNT_OPTIONS]).arg(device.as_os_str()),
        None => cmd.args(["-t", "ext4", "-o"]).arg(format!("loop,{MOUNT_OPTIONS}")).arg(image.as_os_str()),
    };
    cmd.arg(workspace.as_os_str());
    cmd.run().map(drop).map_err(|e| format!("cannot mount the workspace's image: {e}"))
}

/// Grows an image that is not mounted to a raised `quotas.workspace_mb`
/// (checked by e2fsck first, as resize2fs asks). A lowered quota is not
/// applied: shrinking may not fit what the agent wrote; the log says so.
/// Growing is never done while mounted (online resizing needs
/// CAP_SYS_RESOURCE, which a confined root may lack).
fn grow_if_asked(image: &Path, quotas: &Quotas) -> Result<(), String> {
    let wanted = quotas.workspace_mb.saturating_mul(1024 * 1024);
    let have = std::fs::metadata(image).map_err(|e| format!("cannot stat {}: {e}", image.display()))?.len();
    if wanted < have {
        log::warn!(
            "{} is {} MiB, more than quotas.workspace_mb = {}: a quota is only ever raised in place",
            image.display(),
            have / (1024 * 1024),
            quotas.workspace_mb
        );
        return Ok(());
    }
    if wanted == have {
        return Ok(());
    }
    if attached_device(image).is_some() {
        log::warn!("{} is in use; it grows to {} MiB once nothing holds it", image.display(), quotas.workspace_mb);
        return Ok(());
    }
    // e2fsck: 0 clean, 1 errors corrected (lost+found made again, which
    // the workspace leaves out); anything else is not fit to grow.
    let mut check = Cmd::new("e2fsck");
    check.args(["-f", "-p"]).arg(image.as_os_str());
    let out = check.output().map_err(|e| e.to_string())?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!(
            "`{}` found {} not fit to grow ({}): {}",
            check.display(),
            image.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .and_then(|f| f.set_len(wanted))
        .map_err(|e| format!("cannot grow {}: {e}", image.display()))?;
    Cmd::new("resize2fs").arg(image.as_os_str()).run().map_err(|e| e.to_string())?;
    log::info!("{} grown to {} MiB", image.display(), quotas.workspace_mb);
    Ok(())
}

/// What `choird workspaces` did for one agent, or why it could not.
pub type Outcome = Result<String, String>;

/// `choird workspaces mount|release`, run as root for an unprivileged
/// choird: every configured agent's workspace mounted (owned by the home's
/// owner, the user choird runs as) or released. Each agent's outcome, in
/// the order of the config.
pub fn for_every_agent(root: &Path, release: bool) -> Result<Vec<(AgentId, Outcome)>, String> {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return Err("mounting and unmounting takes root; run it as root (the systemd unit's + lines do)".into());
    }
    let home = Home::new(root.to_owned());
    let config = crate::config::Config::load(&home.config()).map_err(|e| e.to_string())?;
    let owned = std::fs::metadata(root).map_err(|e| format!("cannot stat {}: {e}", root.display()))?;
    let owner = (owned.uid(), owned.gid());
    let mut out = Vec::new();
    for (id, agent) in &config.agents {
        let workspace = config.workspace(&home, id);
        let outcome = if release {
            self::release(&home, id, &workspace).map(|was| if was { "released" } else { "not mounted" }.to_owned())
        } else {
            std::fs::create_dir_all(&workspace)
                .map_err(|e| format!("cannot create {}: {e}", workspace.display()))
                .and_then(|()| prepare(&home, id, &workspace, &agent.quotas, owner))
                .map(|p| p.to_string())
        };
        out.push((id.clone(), outcome));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_read_with_their_escapes() {
        let l =
            parse_mountinfo("43 27 7:0 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:1 - ext4 /dev/loop0 rw,discard")
                .unwrap();
        assert_eq!(l, MountLine { mount_point: PathBuf::from("/tmp/a b"), source: "/dev/loop0".into() });
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("tail\\04"), "tail\\04", "a cut escape stays as it is");
        assert!(parse_mountinfo("garbage").is_none());
    }

    #[test]
    fn only_loop_devices_name_backing_files() {
        assert_eq!(backing_file("sda"), None);
        assert_eq!(backing_file("loop0/../../etc"), None);
    }

    #[test]
    fn the_files_of_before_are_kept_beside_the_workspace() {
        assert_eq!(aside_path(Path::new("/srv/ws/demo")), PathBuf::from("/srv/ws/demo.before-quota"));
    }
}
