//! Giving back the pages of code that only start-up ran (issue 19, item 2).
//!
//! A process's resident memory counts every page of its binary mapped into
//! it, and the kernel maps the neighbours of each page a process faults in
//! (fault-around, 64 KiB). Start-up runs through code nothing runs again —
//! the configuration's and the schemas' parsing, jsonschema's compiler, the
//! first connections — so choird held ~10 MB of its binary resident of which
//! ~2.4 MB was referenced in steady turns (DESIGN.md, "Measurements").
//! [`give_back`] drops those pages from this process's page tables once
//! start-up is done; what runs after faults its pages in again from the page
//! cache (minor faults, no disk read while the file's pages stay cached).
//!
//! Invariant: only mappings of this process's own executable (the file
//! holding this function's code, by device and inode) that are private,
//! not writable, and hold no private (copied-on-write) page are given back.
//! For such a mapping every page equals the file's, so dropping it loses
//! nothing: `MADV_DONTNEED` on a private file mapping brings back the file's
//! contents on the next touch. A writable mapping (`.data`, `.bss`) or one
//! written once (the RELRO segment, relocated before it was made read-only)
//! holds anonymous pages and is never touched.

use std::ops::Range;

/// One mapping of `/proc/self/smaps` that may be given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Droppable {
    /// The mapping's address range.
    pub range: Range<usize>,
    /// Its resident bytes when smaps was read.
    pub resident: u64,
}

/// What [`give_back`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GivenBack {
    /// Mappings given back.
    pub mappings: usize,
    /// Their resident bytes before.
    pub resident_before: u64,
}

/// Why nothing was given back.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/proc/self/smaps` could not be read.
    #[error("cannot read /proc/self/smaps: {0}")]
    Read(std::io::Error),
    /// No mapping holds this function's code (not Linux's smaps format).
    #[error("no mapping in /proc/self/smaps holds this binary's code")]
    NoOwnMapping,
    /// The kernel refused the advice.
    #[error("madvise: {0}")]
    Advise(std::io::Error),
}

/// A mapping's header line and the fields read from its block.
#[derive(Debug)]
struct Mapping<'a> {
    range: Range<usize>,
    perms: &'a str,
    file: (&'a str, u64),
    rss_kib: Option<u64>,
    anonymous_kib: Option<u64>,
}

/// Parses a header line: `start-end perms offset dev inode [path]`. `None`
/// for anything else (the field lines of a block).
fn header(line: &str) -> Option<Mapping<'_>> {
    let mut parts = line.split_ascii_whitespace();
    let (start, end) = parts.next()?.split_once('-')?;
    let range = usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?;
    let perms = parts.next()?;
    let _offset = parts.next()?;
    let dev = parts.next()?;
    let inode = parts.next()?.parse().ok()?;
    if perms.len() != 4 || range.start >= range.end {
        return None;
    }
    Some(Mapping { range, perms, file: (dev, inode), rss_kib: None, anonymous_kib: None })
}

/// The value in KiB of a field line such as `Rss:   1234 kB`.
fn kib(line: &str, field: &str) -> Option<u64> {
    let rest = line.strip_prefix(field)?.strip_prefix(':')?;
    rest.trim().strip_suffix("kB")?.trim().parse().ok()
}

/// The mappings of `smaps` (the text of `/proc/self/smaps`) that may be
/// given back: those of the file that holds address `own` (inode ≠ 0),
/// private, not writable, whose block says `Anonymous: 0 kB` and some pages
/// resident. A block without its `Anonymous:` or `Rss:` line is never
/// chosen. `None` when no file mapping holds `own`.
pub fn droppable(smaps: &str, own: usize) -> Option<Vec<Droppable>> {
    let mut maps: Vec<Mapping<'_>> = Vec::new();
    for line in smaps.lines() {
        if let Some(m) = header(line) {
            maps.push(m);
        } else if let Some(m) = maps.last_mut() {
            if let Some(v) = kib(line, "Rss") {
                m.rss_kib = Some(v);
            } else if let Some(v) = kib(line, "Anonymous") {
                m.anonymous_kib = Some(v);
            }
        }
    }
    let exe = maps.iter().find(|m| m.range.contains(&own) && m.file.1 != 0)?.file;
    Some(
        maps.iter()
            .filter(|m| m.file == exe)
            .filter(|m| m.perms.as_bytes()[1] != b'w' && m.perms.as_bytes()[3] == b'p')
            .filter(|m| m.anonymous_kib == Some(0))
            .filter_map(|m| match m.rss_kib {
                Some(rss) if rss > 0 => Some(Droppable { range: m.range.clone(), resident: rss * 1024 }),
                _ => None,
            })
            .collect(),
    )
}

/// Drops this process's resident pages of its own binary that equal the
/// file's (see the module's invariant). Call it once start-up is done, and
/// again after a reload; what runs afterwards comes back on its own.
#[cfg(target_os = "linux")]
pub fn give_back() -> Result<GivenBack, Error> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(Error::Read)?;
    let own = give_back as fn() -> Result<GivenBack, Error> as usize;
    let chosen = droppable(&smaps, own).ok_or(Error::NoOwnMapping)?;
    let mut done = GivenBack::default();
    for m in chosen {
        // SAFETY: the range is a whole mapping of this process's executable,
        // private, not writable, holding no copied-on-write page (checked
        // above from smaps; nothing in Choir makes such a mapping writable),
        // so each of its pages equals the file's: MADV_DONTNEED only drops
        // them from the page tables, and the next touch maps the file's
        // page again. No Rust reference points into it as mutable data.
        #[allow(unsafe_code)]
        unsafe {
            rustix::mm::madvise(
                m.range.start as *mut std::ffi::c_void,
                m.range.end - m.range.start,
                rustix::mm::Advice::LinuxDontNeed,
            )
        }
        .map_err(|e| Error::Advise(e.into()))?;
        done.mappings += 1;
        done.resident_before += m.resident;
    }
    Ok(done)
}

/// [`give_back`] with its outcome logged; never fatal (on failure the pages
/// only stay resident).
pub fn give_back_logged() {
    match give_back() {
        Ok(g) => log::info!(
            "gave back {} KiB of code pages start-up ran through ({} mappings); what runs again comes back",
            g.resident_before / 1024,
            g.mappings
        ),
        Err(e) => log::warn!("start-up's code pages not given back: {e}"),
    }
}

/// Elsewhere, nothing is given back.
#[cfg(not(target_os = "linux"))]
pub fn give_back() -> Result<GivenBack, Error> {
    Ok(GivenBack::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An excerpt of a PIE binary's smaps: its four segments (headers and
    /// rodata, text, RELRO, data), its bss, the heap and libc's text.
    const SMAPS: &str = "\
55d0c3000000-55d0c3200000 r--p 00000000 fd:01 4242 /usr/bin/choird
Size:               2048 kB
Rss:                 900 kB
Anonymous:             0 kB
55d0c3200000-55d0c4000000 r-xp 00200000 fd:01 4242 /usr/bin/choird
Size:              14336 kB
Rss:               10000 kB
Anonymous:             0 kB
55d0c4000000-55d0c4100000 r--p 01000000 fd:01 4242 /usr/bin/choird
Size:               1024 kB
Rss:                 600 kB
Anonymous:           600 kB
55d0c4100000-55d0c4110000 rw-p 01100000 fd:01 4242 /usr/bin/choird
Size:                 64 kB
Rss:                  64 kB
Anonymous:            16 kB
55d0c4110000-55d0c4120000 rw-p 00000000 00:00 0
Size:                 64 kB
Rss:                   8 kB
Anonymous:             8 kB
55d0c5000000-55d0c5400000 rw-p 00000000 00:00 0 [heap]
Rss:                2400 kB
Anonymous:          2400 kB
7f0000000000-7f0000100000 r-xp 00028000 fd:01 777 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1000 kB
Anonymous:             0 kB
";

    #[test]
    fn only_the_binarys_read_only_pages_that_equal_the_file_are_chosen() {
        let got = droppable(SMAPS, 0x55d0_c350_0000).unwrap();
        assert_eq!(
            got,
            vec![
                Droppable { range: 0x55d0_c300_0000..0x55d0_c320_0000, resident: 900 * 1024 },
                Droppable { range: 0x55d0_c320_0000..0x55d0_c400_0000, resident: 10000 * 1024 },
            ]
        );
    }

    #[test]
    fn the_relro_segment_data_and_other_files_are_never_chosen() {
        // Asked from libc's text, only libc's text (the same rules) is chosen.
        let got = droppable(SMAPS, 0x7f00_0000_0100).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].range.start, 0x7f00_0000_0000);
        // An address in anonymous memory names no file: nothing.
        assert_eq!(droppable(SMAPS, 0x55d0_c500_0000), None);
        // A shared mapping, or a block that does not say it holds no
        // anonymous page, is kept.
        let shared = SMAPS.replace("r-xp 00200000", "r-xs 00200000");
        assert!(droppable(&shared, 0x55d0_c350_0000).unwrap().iter().all(|d| d.range.start != 0x55d0_c320_0000));
        let unsaid = SMAPS.replacen("Anonymous:             0 kB\n55d0c3200000", "55d0c3200000", 1);
        assert!(droppable(&unsaid, 0x55d0_c350_0000).unwrap().iter().all(|d| d.range.start != 0x55d0_c300_0000));
    }

    #[test]
    fn malformed_smaps_chooses_nothing_and_does_not_panic() {
        for text in ["", "garbage\n", "1-0 r-xp 0 fd:01 4242 x\nRss: 4 kB\nAnonymous: 0 kB\n", "zz-1 r-xp\n"] {
            assert_eq!(droppable(text, 0), None, "{text:?}");
        }
        let truncated = "55d0c3200000-55d0c4000000 r-xp 00200000 fd:01 4242 /usr/bin/choird\nRss: 10 kB\nAnonym";
        assert_eq!(droppable(truncated, 0x55d0_c350_0000), Some(vec![]));
    }

    /// The resident bytes of this test binary's code mapping.
    fn own_text_resident() -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let own = own_text_resident as fn() -> u64 as usize;
        let mut current = false;
        for line in smaps.lines() {
            if let Some(m) = header(line) {
                current = m.range.contains(&own);
            } else if current {
                if let Some(v) = kib(line, "Rss") {
                    return v * 1024;
                }
            }
        }
        panic!("no mapping holds this test's code");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn giving_back_lowers_the_resident_code_and_the_code_still_runs() {
        let before = own_text_resident();
        let done = give_back().unwrap();
        let after = own_text_resident();
        assert!(done.mappings >= 1, "{done:?}");
        assert!(done.resident_before >= before / 2, "{done:?} vs {before}");
        assert!(after < before, "resident code {before} -> {after} bytes");
        // Code dropped is faulted in again: parsing (not run since) still works.
        assert_eq!(droppable(SMAPS, 0x55d0_c350_0000).unwrap().len(), 2);
    }
}
