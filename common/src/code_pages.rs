//! Giving back the pages of code that only start-up ran.
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
//! Invariant: only the mappings the loader made of this process's own
//! executable for its *read-only* loadable segments (`PT_LOAD` without
//! `PF_W`, read from the executable's program headers: at the address the
//! segment's virtual address and the load bias give, within the segment's
//! pages of the file) are given back, and of those only the ones smaps shows
//! private, not writable, with no copied-on-write page resident or swapped
//! out. Every page of such a mapping equals the file's, so dropping it loses
//! nothing: `MADV_DONTNEED` on a private file mapping brings back the file's
//! contents on the next touch. The RELRO area (relocated, then made
//! read-only) lies in the writable segment and is never chosen, whatever
//! smaps says of it (its relocated pages may be swapped out, leaving
//! `Anonymous: 0 kB`); so is any other mapping of the same file (std's
//! backtrace symbolizer maps the executable whole, elsewhere, and may unmap
//! it at any time).
//!
//! The shared libraries' code is given back too ([`droppable_libraries`]):
//! libc alone held 1.3 MB of an agent's 6 MB, most of it mapped by the
//! fault-around of start-up's calls. The same invariant holds for each
//! library: only the mappings its loader made of its read-only loadable
//! segments — the segments read from the file its mappings name, placed at
//! the one load bias at which every segment's first page is a mapping of
//! that file at its offset (a mapping of the whole file elsewhere, as a
//! symbolizer makes, fits no such bias) — and of those only the ones smaps
//! shows private, not writable, with no copied-on-write page resident or
//! swapped out. A library whose file cannot be read as ELF (replaced,
//! deleted, not a regular file) gives nothing back.

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
    /// Mappings given back (the binary's and its libraries').
    pub mappings: usize,
    /// Of them, mappings of shared libraries.
    pub library_mappings: usize,
    /// Their resident bytes before.
    pub resident_before: u64,
    /// Mappings the kernel refused the advice for (locked ones, say): they
    /// stay resident.
    pub refused: usize,
}

/// Why nothing was given back.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/proc/self/smaps` or the executable's head could not be read.
    #[error("cannot read /proc/self: {0}")]
    Read(std::io::Error),
    /// No mapping holds this function's code (not Linux's smaps format).
    #[error("no mapping in /proc/self/smaps holds this binary's code")]
    NoOwnMapping,
    /// The executable's program headers could not be read from its head.
    #[error("the executable is not ELF, or its program headers are not in its first {} bytes", HEAD)]
    Headers,
}

/// A mapping's header line and the fields read from its block.
#[derive(Debug)]
struct Mapping<'a> {
    range: Range<usize>,
    perms: &'a str,
    offset: u64,
    file: (&'a str, u64),
    /// The path smaps names (empty for none).
    path: &'a str,
    rss_kib: Option<u64>,
    anonymous_kib: Option<u64>,
    swap_kib: Option<u64>,
}

/// A loadable segment (`PT_LOAD`) of the executable, from its program headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// `p_offset .. p_offset + p_filesz`: its bytes in the file.
    pub file: Range<u64>,
    /// `p_vaddr`: where it is loaded, before the load bias.
    pub vaddr: u64,
    /// `PF_W`: the loader maps it writable (RELRO is inside such a segment).
    pub writable: bool,
}

/// The page size the loader aligns segments to (x86-64, aarch64 with 4 KiB
/// pages). With larger pages a mapping's file offset lies below the 4 KiB
/// alignment of its segment, so no mapping is chosen: nothing is given back,
/// never a wrong one (the address must match too).
const PAGE: u64 = 4096;

/// The loadable segments of an ELF executable whose first bytes are `head`
/// (the program headers must lie within it). `None` if it is not ELF, or
/// they do not.
pub fn segments(head: &[u8]) -> Option<Vec<Segment>> {
    use object::elf::{FileHeader64, PF_W, PT_LOAD};
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::Endianness;
    let header = FileHeader64::<Endianness>::parse(head).ok()?;
    let endian = header.endian().ok()?;
    let phdrs = header.program_headers(endian, head).ok()?;
    Some(
        phdrs
            .iter()
            .filter(|p| p.p_type(endian) == PT_LOAD)
            .map(|p| {
                let offset = p.p_offset(endian);
                Segment {
                    file: offset..offset.saturating_add(p.p_filesz(endian)),
                    vaddr: p.p_vaddr(endian),
                    writable: p.p_flags(endian) & PF_W == PF_W,
                }
            })
            .collect(),
    )
}

/// Whether the loader mapped `m` from a read-only segment and from no
/// writable one: `m`'s pages of the file lie within the segment's, and `m`
/// sits where the segment's address plus `bias` puts them. False for any
/// other mapping of the file, and for one a writable segment (which holds
/// RELRO) could also have made, whatever the read-only one says.
fn loaded_read_only(m: &Mapping<'_>, bias: i128, segments: &[Segment]) -> bool {
    let mut from = segments.iter().filter(|s| within(m, s) && address(s, m.offset) + bias == m.range.start as i128);
    let first = from.next();
    first.is_some_and(|s| !s.writable) && from.all(|s| !s.writable)
}

/// Whether `m`'s pages of the file lie within `s`'s (segments may share a
/// page of the file at their edges).
fn within(m: &Mapping<'_>, s: &Segment) -> bool {
    let len = (m.range.end - m.range.start) as u64;
    let first_page = s.file.start / PAGE * PAGE;
    // Past u64 (junk headers): within nothing.
    let Some(end_page) = s.file.end.div_ceil(PAGE).checked_mul(PAGE) else { return false };
    first_page <= m.offset && m.offset.saturating_add(len) <= end_page
}

/// Where `s` puts the byte at file `offset`, before the load bias.
fn address(s: &Segment, offset: u64) -> i128 {
    i128::from(s.vaddr) - i128::from(s.file.start) + i128::from(offset)
}

/// Parses a header line: `start-end perms offset dev inode [path]`. `None`
/// for anything else (the field lines of a block).
fn header(line: &str) -> Option<Mapping<'_>> {
    let (span, rest) = token(line)?;
    let (perms, rest) = token(rest)?;
    let (offset, rest) = token(rest)?;
    let (dev, rest) = token(rest)?;
    let (inode, rest) = token(rest)?;
    let (start, end) = span.split_once('-')?;
    let range = usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?;
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let inode = inode.parse().ok()?;
    if perms.len() != 4 || range.start >= range.end {
        return None;
    }
    Some(Mapping {
        range,
        perms,
        offset,
        file: (dev, inode),
        // The rest of the line, but for the padding before it (a path may
        // hold spaces, even at its end).
        path: rest.trim_start_matches([' ', '\t']),
        rss_kib: None,
        anonymous_kib: None,
        swap_kib: None,
    })
}

/// The first word of `text` and what follows it.
fn token(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start_matches([' ', '\t']);
    let end = text.find([' ', '\t']).unwrap_or(text.len());
    (end > 0).then(|| text.split_at(end))
}

/// The value in KiB of a field line such as `Rss:   1234 kB`.
fn kib(line: &str, field: &str) -> Option<u64> {
    let rest = line.strip_prefix(field)?.strip_prefix(':')?;
    rest.trim().strip_suffix("kB")?.trim().parse().ok()
}

/// The mappings of `smaps` (the text of `/proc/self/smaps`) that may be
/// given back, `segments` being the loadable segments of the executable
/// that holds address `own` (its code): the mappings of that file (device
/// and inode; inode ≠ 0) the loader made of its read-only segments, private,
/// not writable, whose block says `Anonymous: 0 kB` and `Swap: 0 kB` and
/// that have some pages resident. A block without those lines, or after a
/// line that is neither a field nor a header, is never chosen. `None` when
/// no mapping of `segments` holds `own`.
pub fn droppable(smaps: &str, own: usize, segments: &[Segment]) -> Option<Vec<Droppable>> {
    droppable_in(&parse(smaps), own, segments)
}

/// [`droppable`] of parsed mappings.
fn droppable_in(maps: &[Mapping<'_>], own: usize, segments: &[Segment]) -> Option<Vec<Droppable>> {
    let own_map = executable(maps, own)?;
    let exe = own_map.file;
    // The load bias, from the one segment whose pages hold the mapping of
    // this function's code (none, or more than one: nothing is chosen).
    let mut holding = segments.iter().filter(|s| within(own_map, s));
    let own_segment = holding.next()?;
    if holding.next().is_some() {
        return None;
    }
    let bias = own_map.range.start as i128 - address(own_segment, own_map.offset);
    Some(chosen(maps, exe, bias, segments))
}

/// The mapping of a file (inode ≠ 0) that holds address `own`: the
/// executable's, when `own` is its code.
fn executable<'m, 'a>(maps: &'m [Mapping<'a>], own: usize) -> Option<&'m Mapping<'a>> {
    maps.iter().find(|m| m.range.contains(&own) && m.file.1 != 0)
}

/// The mappings of shared libraries in `smaps` that may be given back:
/// for every file mapped (device and inode; inode ≠ 0) but the executable
/// holding address `own`, named by an absolute path that is not deleted,
/// whose loadable segments `read` gives for that path and inode (`None`:
/// nothing of it is chosen), the mappings [`loader_bias`] and the checks of
/// [`droppable`] choose. Empty when `own` lies in no mapping of a file.
pub fn droppable_libraries(
    smaps: &str,
    own: usize,
    read: impl FnMut(&str, u64) -> Option<Vec<Segment>>,
) -> Vec<Droppable> {
    libraries_in(&parse(smaps), own, read)
}

/// [`droppable_libraries`] of parsed mappings.
fn libraries_in(
    maps: &[Mapping<'_>],
    own: usize,
    mut read: impl FnMut(&str, u64) -> Option<Vec<Segment>>,
) -> Vec<Droppable> {
    let Some(exe) = executable(maps, own).map(|m| m.file) else {
        return Vec::new();
    };
    let mut files: Vec<((&str, u64), &str)> = Vec::new();
    for m in maps {
        let named = m.path.starts_with('/') && !m.path.ends_with("(deleted)");
        if m.file.1 != 0 && m.file != exe && named && !files.iter().any(|(f, _)| *f == m.file) {
            files.push((m.file, m.path));
        }
    }
    let mut out = Vec::new();
    for (file, path) in files {
        let Some(segments) = read(path, file.1) else { continue };
        if let Some(bias) = loader_bias(maps, file, &segments) {
            out.extend(chosen(maps, file, bias, &segments));
        }
    }
    out
}

/// The mappings of `smaps`, with the fields read from each block. A block
/// after a line that is neither a field nor a header loses its
/// `Anonymous` (so it is never chosen).
fn parse(smaps: &str) -> Vec<Mapping<'_>> {
    let mut maps: Vec<Mapping<'_>> = Vec::new();
    let mut current = false;
    for line in smaps.lines() {
        if let Some(m) = header(line) {
            maps.push(m);
            current = true;
        } else if let (true, Some(m)) = (current, maps.last_mut()) {
            if let Some(v) = kib(line, "Rss") {
                m.rss_kib = Some(v);
            } else if let Some(v) = kib(line, "Anonymous") {
                m.anonymous_kib = Some(v);
            } else if let Some(v) = kib(line, "Swap") {
                m.swap_kib = Some(v);
            } else if !line.split_once(':').is_some_and(|(k, _)| !k.is_empty() && !k.contains(char::is_whitespace)) {
                // Neither a field nor a header: what follows is not this
                // mapping's; it is not chosen.
                m.anonymous_kib = None;
                current = false;
            }
        }
    }
    maps
}

/// The mappings of `file` the loader made of its read-only `segments` at
/// `bias` that may be given back: private, not writable, whose block says
/// `Anonymous: 0 kB` and `Swap: 0 kB`, with some pages resident.
fn chosen(maps: &[Mapping<'_>], file: (&str, u64), bias: i128, segments: &[Segment]) -> Vec<Droppable> {
    maps.iter()
        .filter(|m| m.file == file)
        .filter(|m| loaded_read_only(m, bias, segments))
        .filter(|m| m.perms.as_bytes()[1] != b'w' && m.perms.as_bytes()[3] == b'p')
        .filter(|m| m.anonymous_kib == Some(0) && m.swap_kib == Some(0))
        .filter_map(|m| match m.rss_kib {
            Some(rss) if rss > 0 => Some(Droppable { range: m.range.clone(), resident: rss.saturating_mul(1024) }),
            _ => None,
        })
        .collect()
}

/// The load bias at which the loader placed `file`, whose loadable segments
/// are `segments`: the one bias, among those its mappings suggest, at which
/// the first page of every segment lies in a mapping of `file` at that page's
/// offset. `None` when no bias fits, or more than one does (then nothing of
/// the file is chosen).
fn loader_bias(maps: &[Mapping<'_>], file: (&str, u64), segments: &[Segment]) -> Option<i128> {
    let of_file: Vec<&Mapping<'_>> = maps.iter().filter(|m| m.file == file).collect();
    let fits = |bias: i128| {
        !segments.is_empty()
            && segments.iter().all(|s| {
                let offset = s.file.start / PAGE * PAGE;
                let at = address(s, offset) + bias;
                of_file.iter().any(|m| {
                    (m.range.start as i128..m.range.end as i128).contains(&at)
                        && i128::from(m.offset) + (at - m.range.start as i128) == i128::from(offset)
                })
            })
    };
    let mut candidates: Vec<i128> = of_file
        .iter()
        .flat_map(|m| segments.iter().filter(|s| within(m, s)).map(|s| m.range.start as i128 - address(s, m.offset)))
        .filter(|&bias| fits(bias))
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    match candidates[..] {
        [bias] => Some(bias),
        _ => None,
    }
}

/// How much of the executable is read for its program headers.
const HEAD: u64 = 64 * 1024;

/// The loadable segments of this process's executable (`/proc/self/exe`,
/// the file the process was started from even if renamed or deleted since).
#[cfg(target_os = "linux")]
fn own_segments() -> Result<Vec<Segment>, Error> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open("/proc/self/exe").and_then(|f| f.take(HEAD).read_to_end(&mut head)).map_err(Error::Read)?;
    segments(&head).ok_or(Error::Headers)
}

/// The loadable segments of the library at `path` (as smaps names it) if
/// it is still the file of inode `inode` smaps shows mapped: looked at
/// without opening it (`O_PATH`, no link followed), then, only if it is a
/// regular file of that inode, opened through its descriptor (no device's
/// open side effects, no FIFO's blocking, no controlling terminal) and its
/// head read. `None` if it cannot be read, is another file, or is not ELF.
/// (The device is not compared: overlayfs shows a mapping's underlying one.)
#[cfg(target_os = "linux")]
fn library_segments(path: &str, inode: u64) -> Option<Vec<Segment>> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let at = rustix::fs::open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let stat = rustix::fs::fstat(&at).ok()?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_ino != inode {
        return None;
    }
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(format!("/proc/self/fd/{}", at.as_raw_fd()), flags, Mode::empty()).ok()?;
    let mut head = Vec::new();
    std::fs::File::from(fd).take(HEAD).read_to_end(&mut head).ok()?;
    segments(&head)
}

#[cfg(target_os = "linux")]
pub fn give_back() -> Result<GivenBack, Error> {
    let segments = own_segments()?;
    let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(Error::Read)?;
    let own = give_back as fn() -> Result<GivenBack, Error> as usize;
    let maps = parse(&smaps);
    let chosen = droppable_in(&maps, own, &segments).ok_or(Error::NoOwnMapping)?;
    let libraries = libraries_in(&maps, own, library_segments);
    let mut done = GivenBack::default();
    let own_count = chosen.len();
    for (n, m) in chosen.into_iter().chain(libraries).enumerate() {
        // SAFETY: the range is a whole mapping the loader made of a
        // read-only segment of this process's executable or of a library it
        // loaded (not the RELRO area, which lies in a writable segment; not
        // a mapping anything else made, which could be unmapped and its
        // range reused; nothing in Choir unloads a library, so none of these
        // ranges is unmapped and reused between the read of smaps and here),
        // private,
        // not writable, with no copied-on-write page resident or swapped
        // (checked above; nothing in Choir makes such a mapping writable or
        // unmaps it), so each of its pages equals the file's: MADV_DONTNEED
        // only drops them from the page tables, and the next touch maps the
        // file's page again. No Rust reference points into it as mutable
        // data.
        #[allow(unsafe_code)]
        match unsafe {
            rustix::mm::madvise(
                m.range.start as *mut std::ffi::c_void,
                m.range.end - m.range.start,
                rustix::mm::Advice::LinuxDontNeed,
            )
        } {
            Ok(()) => {
                done.mappings += 1;
                done.library_mappings += usize::from(n >= own_count);
                done.resident_before += m.resident;
            }
            Err(_) => done.refused += 1,
        }
    }
    Ok(done)
}

/// [`give_back`] with its outcome logged (at debug: an internal of start-up,
/// no news for the operator's journal); never fatal (on failure the pages
/// only stay resident). Never inlined: `scripts/code-order.sh` splits its
/// profile of start-up from steady turns where this function is entered.
#[inline(never)]
pub fn give_back_logged() {
    match give_back() {
        Ok(g) => {
            log::debug!(
                "gave back {} KiB of code pages start-up ran through ({} mappings, {} of them libraries'); what runs again comes back",
                g.resident_before / 1024,
                g.mappings,
                g.library_mappings
            );
            if g.refused > 0 {
                log::debug!("{} mappings of the binary's code refused MADV_DONTNEED; they stay resident", g.refused);
            }
        }
        Err(e) => log::debug!("start-up's code pages not given back: {e}"),
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

    /// An excerpt of a PIE binary's smaps: its four segments' mappings
    /// (headers and rodata, text, the RELRO part of the writable segment,
    /// data), its bss, the heap, libc's text, and the whole binary mapped
    /// once more elsewhere (as std's backtrace symbolizer does).
    const SMAPS: &str = "\
55d0c3000000-55d0c3200000 r--p 00000000 fd:01 4242 /usr/bin/choird
Size:               2048 kB
Rss:                 900 kB
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd mr mw me sd
55d0c3200000-55d0c4000000 r-xp 00200000 fd:01 4242 /usr/bin/choird
Size:              14336 kB
Rss:               10000 kB
Anonymous:             0 kB
AnonHugePages:         0 kB
Swap:                  0 kB
THPeligible:    0
55d0c4000000-55d0c4100000 r--p 01000000 fd:01 4242 /usr/bin/choird
Size:               1024 kB
Rss:                 600 kB
Anonymous:           600 kB
Swap:                  0 kB
55d0c4100000-55d0c4110000 rw-p 01100000 fd:01 4242 /usr/bin/choird
Size:                 64 kB
Rss:                  64 kB
Anonymous:            16 kB
Swap:                  0 kB
55d0c4110000-55d0c4120000 rw-p 00000000 00:00 0
Size:                 64 kB
Rss:                   8 kB
Anonymous:             8 kB
Swap:                  0 kB
55d0c5000000-55d0c5400000 rw-p 00000000 00:00 0 [heap]
Rss:                2400 kB
Anonymous:          2400 kB
Swap:                  0 kB
7f0000000000-7f0000100000 r-xp 00028000 fd:01 777 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1000 kB
Anonymous:             0 kB
Swap:                  0 kB
7f1000000000-7f1001200000 r--p 00000000 fd:01 4242 /usr/bin/choird (deleted)
Rss:                 300 kB
Anonymous:             0 kB
Swap:                  0 kB
";

    /// The binary's program headers as the fixture's mappings imply them.
    fn fixture_segments() -> Vec<Segment> {
        vec![
            Segment { file: 0..0x1f_f800, vaddr: 0, writable: false },
            Segment { file: 0x20_0000..0xff_f400, vaddr: 0x20_0000, writable: false },
            Segment { file: 0x100_0000..0x110_8000, vaddr: 0x100_0000, writable: true },
        ]
    }

    const IN_TEXT: usize = 0x55d0_c350_0000;

    #[test]
    fn only_the_loaders_mappings_of_the_binarys_read_only_segments_are_chosen() {
        let got = droppable(SMAPS, IN_TEXT, &fixture_segments()).unwrap();
        assert_eq!(
            got,
            vec![
                Droppable { range: 0x55d0_c300_0000..0x55d0_c320_0000, resident: 900 * 1024 },
                Droppable { range: 0x55d0_c320_0000..0x55d0_c400_0000, resident: 10000 * 1024 },
            ]
        );
    }

    #[test]
    fn a_relro_segment_whose_relocated_pages_were_swapped_out_is_never_chosen() {
        // Its written pages swapped out: smaps shows no anonymous page there.
        let swapped = SMAPS.replacen(
            "Anonymous:           600 kB\nSwap:                  0 kB",
            "Anonymous:             0 kB\nSwap:                600 kB",
            1,
        );
        let got = droppable(&swapped, IN_TEXT, &fixture_segments()).unwrap();
        assert!(got.iter().all(|d| d.range.start != 0x55d0_c400_0000), "{got:?}");
        // Even if smaps said it held nothing of its own: it is part of the
        // writable segment.
        let clean = SMAPS.replacen("Anonymous:           600 kB", "Anonymous:             0 kB", 1);
        let got = droppable(&clean, IN_TEXT, &fixture_segments()).unwrap();
        assert!(got.iter().all(|d| d.range.start != 0x55d0_c400_0000), "{got:?}");
        // A read-only segment's page that was swapped out (a breakpoint's
        // copy, say) keeps its mapping.
        let text_swapped = SMAPS.replacen(
            "AnonHugePages:         0 kB\nSwap:                  0 kB",
            "AnonHugePages:         0 kB\nSwap:                  4 kB",
            1,
        );
        let got = droppable(&text_swapped, IN_TEXT, &fixture_segments()).unwrap();
        assert!(got.iter().all(|d| d.range.start != 0x55d0_c320_0000), "{got:?}");
    }

    #[test]
    fn data_other_files_and_other_mappings_of_the_binary_are_never_chosen() {
        let segments = fixture_segments();
        // The whole binary mapped again elsewhere is not the loader's.
        assert!(droppable(SMAPS, IN_TEXT, &segments).unwrap().iter().all(|d| d.range.start != 0x7f10_0000_0000));
        // An address in anonymous memory names no file: nothing.
        assert_eq!(droppable(SMAPS, 0x55d0_c500_0000, &segments), None);
        // Program headers that do not hold this code: nothing.
        assert_eq!(droppable(SMAPS, IN_TEXT, &segments[2..]), None);
        // A shared mapping, or a block that does not say it holds no
        // anonymous page, is kept.
        let shared = SMAPS.replace("r-xp 00200000", "r-xs 00200000");
        assert!(droppable(&shared, IN_TEXT, &segments).unwrap().iter().all(|d| d.range.start != 0x55d0_c320_0000));
        let unsaid = SMAPS.replacen("Anonymous:             0 kB\nSwap:                  0 kB\nVmFlags", "VmFlags", 1);
        assert!(droppable(&unsaid, IN_TEXT, &segments).unwrap().iter().all(|d| d.range.start != 0x55d0_c300_0000));
        // Segments that say the text is writable: not chosen.
        let mut rw = segments.clone();
        rw[1].writable = true;
        assert!(droppable(SMAPS, IN_TEXT, &rw).unwrap().iter().all(|d| d.range.start != 0x55d0_c320_0000));
    }

    #[test]
    fn segments_sharing_a_page_of_the_file_give_the_right_load_bias() {
        // As the linker lays out this workspace's test binaries: the text
        // segment starts in the last page of the file the read-only one
        // ends in, one page further on in memory.
        let segments = vec![
            Segment { file: 0..0x39_80d4, vaddr: 0, writable: false },
            Segment { file: 0x39_80e0..0xc9_41a0, vaddr: 0x39_90e0, writable: false },
            Segment { file: 0xc9_41a0..0xd2_97d0, vaddr: 0xc9_61a0, writable: true },
        ];
        let smaps = "\
5600_0000_0000-5600_0039_9000 r--p 00000000 fd:01 9 /t
Rss: 100 kB
Anonymous: 0 kB
Swap: 0 kB
5600_0039_9000-5600_00c9_6000 r-xp 00398000 fd:01 9 /t
Rss: 200 kB
Anonymous: 0 kB
Swap: 0 kB
5600_00c9_6000-5600_00d2_c000 r--p 00c94000 fd:01 9 /t
Rss: 300 kB
Anonymous: 0 kB
Swap: 300 kB
"
        .replace('_', "");
        let got = droppable(&smaps, 0x5600_0040_0000, &segments).unwrap();
        let starts: Vec<usize> = got.iter().map(|d| d.range.start).collect();
        assert_eq!(starts, vec![0x5600_0000_0000, 0x5600_0039_9000]);
    }

    #[test]
    fn malformed_smaps_chooses_nothing_and_does_not_panic() {
        let segments = fixture_segments();
        for text in ["", "garbage\n", "1-0 r-xp 0 fd:01 4242 x\nRss: 4 kB\nAnonymous: 0 kB\n", "zz-1 r-xp\n"] {
            assert_eq!(droppable(text, 0, &segments), None, "{text:?}");
        }
        let truncated = "55d0c3200000-55d0c4000000 r-xp 00200000 fd:01 4242 /usr/bin/choird\nRss: 10 kB\nAnonym";
        assert_eq!(droppable(truncated, IN_TEXT, &segments), Some(vec![]));
        // A line that is neither a header nor a field: the block it is in is
        // not trusted, even if a good-looking Anonymous line follows.
        let broken = SMAPS.replacen("AnonHugePages:         0 kB", "55d0c3200000 junk\nAnonymous: 0 kB", 1);
        assert!(droppable(&broken, IN_TEXT, &segments).unwrap().iter().all(|d| d.range.start != 0x55d0_c320_0000));
    }

    /// An excerpt of an agent's smaps: its text, libc as Debian 12's loader
    /// maps it (headers, text, rodata, the RELRO part of the writable
    /// segment with its relocated pages, data), libc mapped whole once more
    /// elsewhere (as a symbolizer does), a deleted library, a mapped file
    /// that is not ELF, and a library whose path holds a space.
    const LIB_SMAPS: &str = "\
55d0c3200000-55d0c4000000 r-xp 00200000 fd:01 4242 /usr/bin/choir-agent
Rss:               2000 kB
Anonymous:             0 kB
Swap:                  0 kB
7f9f1bee3000-7f9f1bf09000 r--p 00000000 fe:00 777                        /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 152 kB
Anonymous:             0 kB
Swap:                  0 kB
7f9f1bf09000-7f9f1c05f000 r-xp 00026000 fe:00 777                        /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1000 kB
Anonymous:             0 kB
Swap:                  0 kB
7f9f1c05f000-7f9f1c0b2000 r--p 0017c000 fe:00 777                        /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 128 kB
Anonymous:             0 kB
Swap:                  0 kB
7f9f1c0b2000-7f9f1c0b6000 r--p 001cf000 fe:00 777                        /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                  16 kB
Anonymous:            16 kB
Swap:                  0 kB
7f9f1c0b6000-7f9f1c0b8000 rw-p 001d3000 fe:00 777                        /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   8 kB
Anonymous:             8 kB
Swap:                  0 kB
7f2000000000-7f20001d5000 r--p 00000000 fe:00 777                        /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 400 kB
Anonymous:             0 kB
Swap:                  0 kB
7f3000000000-7f3000001000 r-xp 00000000 fe:00 778                        /usr/lib/libgone.so (deleted)
Rss:                   4 kB
Anonymous:             0 kB
Swap:                  0 kB
7f4000000000-7f4000050000 r--p 00000000 fe:00 779                        /usr/lib/locale/C.utf8/LC_CTYPE
Rss:                  40 kB
Anonymous:             0 kB
Swap:                  0 kB
7f5000000000-7f5000002000 r-xp 00000000 fe:00 780                        /opt/my libs/libx.so
Rss:                   8 kB
Anonymous:             0 kB
Swap:                  0 kB
";

    /// libc's loadable segments (Debian 12, `readelf -lW`).
    fn libc_segments() -> Vec<Segment> {
        vec![
            Segment { file: 0..0x2_5388, vaddr: 0, writable: false },
            Segment { file: 0x2_6000..0x17_b0fc, vaddr: 0x2_6000, writable: false },
            Segment { file: 0x17_c000..0x1c_ec31, vaddr: 0x17_c000, writable: false },
            Segment { file: 0x1c_f8d0..0x1d_4868, vaddr: 0x1c_f8d0, writable: true },
        ]
    }

    /// What each path reads as, and the paths asked.
    fn reader(asked: &mut Vec<String>) -> impl FnMut(&str, u64) -> Option<Vec<Segment>> + '_ {
        |path: &str, _inode: u64| {
            asked.push(path.to_owned());
            match path {
                "/usr/lib/x86_64-linux-gnu/libc.so.6" => Some(libc_segments()),
                "/opt/my libs/libx.so" => Some(vec![Segment { file: 0..0x1800, vaddr: 0, writable: false }]),
                _ => None,
            }
        }
    }

    #[test]
    fn only_the_loaders_mappings_of_a_librarys_read_only_segments_are_chosen() {
        let mut asked = Vec::new();
        let got = droppable_libraries(LIB_SMAPS, IN_TEXT, reader(&mut asked));
        assert_eq!(
            got,
            vec![
                Droppable { range: 0x7f9f_1bee_3000..0x7f9f_1bf0_9000, resident: 152 * 1024 },
                Droppable { range: 0x7f9f_1bf0_9000..0x7f9f_1c05_f000, resident: 1000 * 1024 },
                Droppable { range: 0x7f9f_1c05_f000..0x7f9f_1c0b_2000, resident: 128 * 1024 },
                Droppable { range: 0x7f50_0000_0000..0x7f50_0000_2000, resident: 8 * 1024 },
            ]
        );
        // The binary itself is droppable's; a deleted library is not read.
        assert_eq!(
            asked,
            ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/locale/C.utf8/LC_CTYPE", "/opt/my libs/libx.so"]
        );
        // Not a mapping of a file: nothing.
        assert_eq!(droppable_libraries(LIB_SMAPS, 0x10, reader(&mut Vec::new())), vec![]);
    }

    #[test]
    fn a_library_whose_mappings_fit_no_single_load_bias_gives_nothing() {
        // The loader's mappings of libc (either set, when loaded twice).
        let libc =
            |got: &[Droppable]| got.iter().filter(|d| [0x7f9f1, 0x7e9f1].contains(&(d.range.start >> 28))).count();
        // Headers that do not match the mappings (the file replaced since,
        // say): a segment where libc has no mapping.
        let mut moved = libc_segments();
        moved[2].vaddr += 0x10_0000;
        let got = droppable_libraries(LIB_SMAPS, IN_TEXT, |p: &str, _| p.contains("libc").then(|| moved.clone()));
        assert_eq!(libc(&got), 0, "{got:?}");
        // The RELRO page's mapping missing (unmapped, or never the loader's).
        let no_relro =
            LIB_SMAPS.replace("7f9f1c0b2000-7f9f1c0b6000 r--p 001cf000", "7f9f1c0b2000-7f9f1c0b6000 r--p 001ce000");
        let got = droppable_libraries(&no_relro, IN_TEXT, reader(&mut Vec::new()));
        assert_eq!(libc(&got), 0, "{got:?}");
        // Loaded twice (two whole sets of the loader's mappings): two
        // biases fit, and neither is trusted.
        let start = LIB_SMAPS.find("7f9f1bee3000").unwrap();
        let end = LIB_SMAPS.find("7f2000000000").unwrap();
        let second = LIB_SMAPS[start..end].replace("7f9f1", "7e9f1");
        let both = format!("{LIB_SMAPS}{second}");
        let got = droppable_libraries(&both, IN_TEXT, reader(&mut Vec::new()));
        assert_eq!(libc(&got), 0, "{got:?}");
        // A writable or shared text mapping, or one with a page of its own: kept.
        for (from, to) in [
            ("r-xp 00026000 fe:00 777", "rwxp 00026000 fe:00 777"),
            ("r-xp 00026000 fe:00 777", "r-xs 00026000 fe:00 777"),
        ] {
            let got = droppable_libraries(&LIB_SMAPS.replace(from, to), IN_TEXT, reader(&mut Vec::new()));
            assert!(got.iter().all(|d| d.range.start != 0x7f9f_1bf0_9000), "{to}: {got:?}");
        }
        let copied = LIB_SMAPS.replacen(
            "Rss:                1000 kB\nAnonymous:             0 kB",
            "Rss:                1000 kB\nAnonymous:             4 kB",
            1,
        );
        let got = droppable_libraries(&copied, IN_TEXT, reader(&mut Vec::new()));
        assert!(got.iter().all(|d| d.range.start != 0x7f9f_1bf0_9000), "{got:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_path_that_is_not_the_mapped_regular_elf_file_reads_as_nothing() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let inode = |p: &std::path::Path| std::fs::symlink_metadata(p).unwrap().ino();
        let fifo = dir.path().join("lib.so");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR).unwrap();
        // A FIFO put where a library was: never opened for a read (that
        // would block), whatever its inode.
        assert_eq!(library_segments(fifo.to_str().unwrap(), inode(&fifo)), None);
        let link = dir.path().join("link.so");
        std::os::unix::fs::symlink("/proc/self/exe", &link).unwrap();
        let exe_inode = std::fs::metadata("/proc/self/exe").unwrap().ino();
        assert_eq!(library_segments(link.to_str().unwrap(), exe_inode), None, "a link is not followed");
        let text = dir.path().join("text.so");
        std::fs::write(&text, "not elf").unwrap();
        assert_eq!(library_segments(text.to_str().unwrap(), inode(&text)), None);
        // A device: not opened (no open side effects), not read.
        assert_eq!(library_segments("/dev/null", inode(std::path::Path::new("/dev/null"))), None);
        let libc = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .find_map(|l| {
                let fields: Vec<&str> = l.split_ascii_whitespace().collect();
                (fields.len() == 6 && fields[5].contains("libc.so"))
                    .then(|| (fields[5].to_owned(), fields[4].parse::<u64>().unwrap()))
            })
            .unwrap();
        assert!(library_segments(&libc.0, libc.1).is_some_and(|s| s.iter().any(|s| !s.writable)), "{libc:?}");
        // The same bytes in another file (the library replaced since it was
        // mapped, say): not the mapped inode, nothing.
        let copy = dir.path().join("libc.so.6");
        std::fs::copy(&libc.0, &copy).unwrap();
        assert_eq!(library_segments(copy.to_str().unwrap(), libc.1), None);
        assert!(library_segments(copy.to_str().unwrap(), inode(&copy)).is_some());
    }

    #[test]
    fn junk_headers_ambiguous_segments_and_odd_paths_choose_nothing_wrong() {
        // A path is the rest of the line, trailing spaces and all.
        let m = header("7f5000000000-7f5000002000 r-xp 00000000 fe:00 780   /opt/x/lib.so ").unwrap();
        assert_eq!(m.path, "/opt/x/lib.so ");
        assert_eq!(header("7f5000000000-7f5000002000 r-xp 00000000 00:00 0").unwrap().path, "");
        // A segment whose end is past u64 (junk headers): holds nothing,
        // and nothing panics.
        let junk = vec![Segment { file: 0..u64::MAX, vaddr: 0, writable: false }];
        let got = droppable_libraries(LIB_SMAPS, IN_TEXT, |p: &str, _| p.contains("libx").then(|| junk.clone()));
        assert_eq!(got, vec![]);
        // A mapping a read-only and a writable segment could both have
        // made at the one bias (they share its page): not chosen, whatever
        // the read-only one says.
        let shared = vec![
            Segment { file: 0..0x1800, vaddr: 0, writable: false },
            Segment { file: 0x800..0x1800, vaddr: 0x800, writable: true },
        ];
        let got = droppable_libraries(LIB_SMAPS, IN_TEXT, |p: &str, _| p.contains("libx").then(|| shared.clone()));
        assert_eq!(got, vec![]);
        // The read-only one alone: chosen.
        let got =
            droppable_libraries(LIB_SMAPS, IN_TEXT, |p: &str, _| p.contains("libx").then(|| shared[..1].to_vec()));
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn the_program_headers_of_this_binary_are_read_and_junk_is_refused() {
        let mut head = Vec::new();
        use std::io::Read;
        std::fs::File::open("/proc/self/exe").unwrap().take(HEAD).read_to_end(&mut head).unwrap();
        let got = segments(&head).unwrap();
        assert!(got.iter().any(|s| !s.writable), "{got:?}");
        assert!(got.iter().any(|s| s.writable), "{got:?}");
        assert_eq!(segments(b"#!/bin/sh\necho not elf\n"), None);
        assert_eq!(segments(&head[..40]), None, "headers cut short");
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
        assert!(done.mappings >= 1 && done.refused == 0, "{done:?}");
        // libc's read-only segments (its text, at least) among them.
        assert!(done.library_mappings >= 1 && done.library_mappings < done.mappings, "{done:?}");
        assert!(done.resident_before >= before / 2, "{done:?} vs {before}");
        assert!(after < before, "resident code {before} -> {after} bytes");
        // Code dropped is faulted in again: parsing (not run since) still works.
        assert_eq!(droppable(SMAPS, IN_TEXT, &fixture_segments()).unwrap().len(), 2);
    }
}
