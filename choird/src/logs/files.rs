//! The files: live `logs/<stream>.log`, archived
//! `logs/archive/<stream>.<UTC time>.log[.gz]`, and retention. Only choird
//! writes under `logs/`; files are still opened without following links.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use std::time::Duration;

use parking_lot::Mutex;

/// Size and age limits (config `logs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A live file is archived when it would grow past this.
    pub max_file_bytes: u64,
    /// Live files and archives together stay under this.
    pub max_total_bytes: u64,
    /// Archives older than this are deleted.
    pub max_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 16 * 1024 * 1024,
            max_total_bytes: 512 * 1024 * 1024,
            max_age: Duration::from_secs(14 * 24 * 3600),
        }
    }
}

/// Work for the archiver thread.
pub enum Job {
    /// Compress this just-archived file, then apply retention.
    Compress(PathBuf),
    /// Apply retention (limits changed).
    Retention,
    /// Answer when everything before is done.
    Sync(crossbeam_channel::Sender<()>),
}

/// The open live files, by stream.
pub struct LiveFiles {
    dir: PathBuf,
    open: BTreeMap<String, (File, u64)>,
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

/// The live file of `stream`.
pub fn live_path(dir: &Path, stream: &str) -> PathBuf {
    dir.join(format!("{stream}.log"))
}

/// An archive file's stream and time (`None` for anything else).
pub fn archive_name(name: &str) -> Option<(&str, &str)> {
    let stem = name.strip_suffix(".log.gz").or_else(|| name.strip_suffix(".log"))?;
    let (stream, time) = stem.rsplit_once('.')?;
    (time.len() == 22 && time.ends_with('Z') && time.as_bytes()[8] == b'T').then_some((stream, time))
}

impl LiveFiles {
    /// No file open yet.
    pub fn new(dir: &Path) -> LiveFiles {
        LiveFiles { dir: dir.to_owned(), open: BTreeMap::new() }
    }

    /// Bytes written to each live file (the ones opened by this process and
    /// any other on disk).
    pub fn sizes(&self) -> BTreeMap<String, u64> {
        let mut sizes = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let (Some(stream), Ok(meta)) = (name.strip_suffix(".log"), e.metadata()) {
                    if meta.is_file() {
                        sizes.insert(stream.to_owned(), meta.len());
                    }
                }
            }
        }
        for (stream, (_, size)) in &self.open {
            sizes.insert(stream.clone(), *size);
        }
        sizes
    }

    /// Appends one line; when it would take the file past `max`, the file is
    /// archived first and its new path returned (for compression).
    pub fn append(&mut self, stream: &str, line: &[u8], max: u64) -> std::io::Result<Option<PathBuf>> {
        if !self.open.contains_key(stream) {
            let f = open_append(&live_path(&self.dir, stream))?;
            let size = f.metadata()?.len();
            self.open.insert(stream.to_owned(), (f, size));
        }
        let mut moved = None;
        if let Some((_, size)) = self.open.get(stream) {
            if *size > 0 && size + line.len() as u64 > max {
                moved = Some(self.rotate(stream)?);
            }
        }
        if let Some((f, size)) = self.open.get_mut(stream) {
            f.write_all(line)?;
            *size += line.len() as u64;
        }
        Ok(moved)
    }

    fn rotate(&mut self, stream: &str) -> std::io::Result<PathBuf> {
        self.open.remove(stream);
        let archive = self.dir.join("archive");
        std::fs::create_dir_all(&archive)?;
        let time = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%S%6fZ").to_string();
        let mut to = archive.join(format!("{stream}.{time}.log"));
        let mut n = 0;
        while to.exists() || to.with_extension("log.gz").exists() {
            // Two rotations in one microsecond: the next microsecond's name.
            n += 1;
            let t = jiff::Timestamp::now() + jiff::SignedDuration::from_micros(n);
            to = archive.join(format!("{stream}.{}.log", t.strftime("%Y%m%dT%H%M%S%6fZ")));
        }
        std::fs::rename(live_path(&self.dir, stream), &to)?;
        let f = open_append(&live_path(&self.dir, stream))?;
        self.open.insert(stream.to_owned(), (f, 0));
        Ok(to)
    }
}

/// Compresses an archived file (`x.log` → `x.log.gz`, the original removed
/// only once the compressed copy is complete), then applies retention.
/// `lock` is held while the directory changes, never while compressing.
pub fn archive(dir: &Path, job: Job, limits: &Limits, lock: &Mutex<()>) {
    if let Job::Compress(path) = &job {
        let done_already = !path.exists(); // compressed by a retention pass
        if let Err(e) = compress(path, lock).or_else(|e| if done_already { Ok(()) } else { Err(e) }) {
            eprintln!("choird: cannot compress {}: {e}", path.display());
        }
    }
    retention(dir, limits, lock);
}

fn compress(path: &Path, lock: &Mutex<()>) -> std::io::Result<()> {
    let gz = path.with_extension("log.gz");
    let tmp = path.with_extension("log.gz.tmp");
    let mut input = File::open(path)?;
    let out = OpenOptions::new().create(true).truncate(true).write(true).mode(0o640).open(&tmp)?;
    let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    std::io::copy(&mut input, &mut enc)?;
    enc.finish()?.sync_all()?;
    let _listing = lock.lock();
    std::fs::rename(&tmp, &gz)?;
    std::fs::remove_file(path)
}

/// One archive on disk.
struct Archived {
    path: PathBuf,
    stream: String,
    time: String,
    bytes: u64,
    modified: SystemTime,
}

fn archives(dir: &Path) -> Vec<Archived> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir.join("archive")) else { return out };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((stream, time)) = archive_name(&name) else { continue };
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_file() {
            out.push(Archived {
                path: e.path(),
                stream: stream.to_owned(),
                time: time.to_owned(),
                bytes: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
    }
    out.sort_by(|a, b| a.time.cmp(&b.time));
    out
}

/// Compresses leftovers, deletes archives older than the age limit, then —
/// while the archives exceed what the total leaves them (the total less a
/// full live file per stream, so disk use stays under the total however the
/// live files grow until their next rotation) — the oldest archive of the
/// stream that uses the most (so one stream's flood costs its own history
/// first, not everyone's).
pub fn retention(dir: &Path, limits: &Limits, lock: &Mutex<()>) {
    // One listing: each uncompressed archive in it is compressed first and
    // counted at its compressed size; one rotated after the listing is left
    // to its own compression job (which runs retention again).
    let now = SystemTime::now();
    let mut kept = Vec::new();
    for mut a in archives(dir) {
        if a.path.extension().is_some_and(|e| e == "log") && compress(&a.path, lock).is_ok() {
            a.path = a.path.with_extension("log.gz");
            a.bytes = std::fs::metadata(&a.path).map_or(0, |m| m.len());
        }
        let age = now.duration_since(a.modified).unwrap_or_default();
        if age > limits.max_age {
            let _listing = lock.lock();
            let _ = std::fs::remove_file(&a.path);
        } else {
            kept.push(a);
        }
    }
    let mut per_stream: BTreeMap<String, u64> = BTreeMap::new();
    let live = LiveFiles::new(dir).sizes();
    for (stream, size) in &live {
        *per_stream.entry(stream.clone()).or_default() += size;
    }
    for a in &kept {
        *per_stream.entry(a.stream.clone()).or_default() += a.bytes;
    }
    let budget = limits.max_total_bytes.saturating_sub(live.len() as u64 * limits.max_file_bytes);
    let mut total: u64 = kept.iter().map(|a| a.bytes).sum();
    while total > budget {
        let biggest = per_stream
            .iter()
            .filter(|(s, _)| kept.iter().any(|a| &a.stream == *s))
            .max_by_key(|(_, b)| **b)
            .map(|(s, _)| s.clone());
        let Some(stream) = biggest else { break };
        let Some(i) = kept.iter().position(|a| a.stream == stream) else { break };
        let a = kept.remove(i);
        let _listing = lock.lock();
        if std::fs::remove_file(&a.path).is_ok() || !a.path.exists() {
            total -= a.bytes;
            if let Some(b) = per_stream.get_mut(&stream) {
                *b -= a.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_are_recognised() {
        assert_eq!(archive_name("a1.20261123T113306123456Z.log.gz"), Some(("a1", "20261123T113306123456Z")));
        assert_eq!(archive_name("choird.20261123T113306123456Z.log"), Some(("choird", "20261123T113306123456Z")));
        assert_eq!(archive_name("a1.log"), None);
        assert_eq!(archive_name("a1.x.log.gz.tmp"), None);
    }
}
