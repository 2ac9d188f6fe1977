//! Turning an agent's output into log records. The output is hostile (a
//! shell in the container can write to it): lines are bounded, a level or
//! module is taken only from the exact shape `choir-agent` writes, and the
//! time is always choird's.

use std::io::Read;

use choir_common::admin::LogRecord;

/// Longest line kept; the rest of a longer one is counted, not stored.
pub const MAX_LINE: usize = 8 * 1024;

/// Splits a byte stream into lines of at most [`MAX_LINE`] bytes; a longer
/// line is cut and the cut is said at its end. Memory held: one line.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    dropped: usize,
}

impl LineSplitter {
    /// Feeds `bytes`; calls `emit` for every completed line (without its
    /// newline).
    pub fn push(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(String)) {
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.take(&bytes[..i]);
                    emit(self.finish());
                    bytes = &bytes[i + 1..];
                }
                None => {
                    self.take(bytes);
                    bytes = &[];
                }
            }
        }
    }

    /// The unterminated rest, if any (at end of stream).
    pub fn flush(&mut self, emit: &mut impl FnMut(String)) {
        if !self.buf.is_empty() || self.dropped > 0 {
            emit(self.finish());
        }
    }

    fn take(&mut self, part: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.buf.len());
        let kept = part.len().min(room);
        self.buf.extend_from_slice(&part[..kept]);
        self.dropped += part.len() - kept;
    }

    fn finish(&mut self) -> String {
        let mut line = String::from_utf8_lossy(&self.buf).into_owned();
        if line.ends_with('\r') {
            line.pop();
        }
        if self.dropped > 0 {
            line.push_str(&format!(" […{} more bytes not kept]", self.dropped));
        }
        self.buf.clear();
        self.dropped = 0;
        line
    }
}

/// A record for one line an agent wrote. `choir-agent` writes
/// `[<time> <LEVEL> <module>] <message>`; a line of exactly that shape keeps
/// its level and module (its time is replaced by choird's), anything else is
/// kept whole under `agent/<stream>` at INFO.
pub fn agent_record(agent: &str, stream: &str, line: &str, ts: String) -> LogRecord {
    let parsed = line.strip_prefix('[').and_then(|rest| {
        let (head, msg) = rest.split_once("] ")?;
        let mut words = head.split_whitespace();
        let (_time, level, module) = (words.next()?, words.next()?, words.next()?);
        let known = matches!(level, "ERROR" | "WARN" | "INFO" | "DEBUG" | "TRACE");
        let plain = module.len() <= 128 && module.chars().all(|c| c.is_ascii_alphanumeric() || "_:".contains(c));
        (known && plain && words.next().is_none()).then(|| (level.to_owned(), module.to_owned(), msg.to_owned()))
    });
    let (level, component, msg) =
        parsed.unwrap_or_else(|| ("INFO".to_owned(), format!("agent/{stream}"), line.to_owned()));
    LogRecord { ts, level, component, agent: Some(agent.to_owned()), msg: choir_common::text::one_line(&msg) }
}

/// Reads a container's log stream as the engine sends it without a TTY
/// (frames: stream byte, three zeros, big-endian length, payload) and calls
/// `emit(stream, line)` per line; a stream that is not framed is read as
/// plain stdout. Ends at end of stream or on a read error.
pub fn read_frames(mut r: impl Read, mut emit: impl FnMut(&'static str, String)) {
    let (mut out, mut err) = (LineSplitter::default(), LineSplitter::default());
    let mut header = [0u8; 8];
    let mut chunk = vec![0u8; 16 * 1024];
    let mut framed: Option<bool> = None;
    loop {
        if framed == Some(false) {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.push(&chunk[..n], &mut |l| emit("stdout", l)),
            }
            continue;
        }
        if r.read_exact(&mut header).is_err() {
            break;
        }
        if framed.is_none() {
            let looks_framed = header[0] <= 2 && header[1..4] == [0, 0, 0];
            framed = Some(looks_framed);
            if !looks_framed {
                out.push(&header, &mut |l| emit("stdout", l));
                continue;
            }
        }
        let (name, splitter) = if header[0] == 2 { ("stderr", &mut err) } else { ("stdout", &mut out) };
        let mut left = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        while left > 0 {
            let want = left.min(chunk.len());
            if r.read_exact(&mut chunk[..want]).is_err() {
                splitter.flush(&mut |l| emit(name, l));
                return;
            }
            splitter.push(&chunk[..want], &mut |l| emit(name, l));
            left -= want;
        }
    }
    out.flush(&mut |l| emit("stdout", l));
    err.flush(&mut |l| emit("stderr", l));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| out.push(l));
        }
        s.flush(&mut |l| out.push(l));
        out
    }

    #[test]
    fn lines_are_split_across_chunks() {
        assert_eq!(split(&[b"ab", b"c\nde", b"\r\n", b"f"]), ["abc", "de", "f"]);
    }

    #[test]
    fn a_huge_line_is_cut_and_says_so() {
        let big = vec![b'x'; MAX_LINE + 100];
        let lines = split(&[&big, b"\nnext\n"]);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with(&"x".repeat(MAX_LINE)));
        assert!(lines[0].ends_with("[…100 more bytes not kept]"), "{}", &lines[0][MAX_LINE..]);
        assert_eq!(lines[1], "next");
    }

    #[test]
    fn the_agent_format_keeps_level_and_module_but_not_time() {
        let r = agent_record("a1", "stderr", "[2020-01-01T00:00:00Z WARN  choir_agent::lanes] slow\x1b[2J", "T".into());
        assert_eq!((r.level.as_str(), r.component.as_str(), r.ts.as_str()), ("WARN", "choir_agent::lanes", "T"));
        assert!(!r.msg.contains('\x1b'), "{:?}", r.msg);
        let forged = agent_record("a1", "stdout", "[x FATAL choird::serve] owned", "T".into());
        assert_eq!((forged.level.as_str(), forged.component.as_str()), ("INFO", "agent/stdout"));
        assert_eq!(forged.msg, "[x FATAL choird::serve] owned");
        assert_eq!(forged.agent.as_deref(), Some("a1"));
    }

    #[test]
    fn engine_frames_are_read_per_stream() {
        let mut bytes = Vec::new();
        for (stream, payload) in [(1u8, &b"out one\nout "[..]), (2, b"err\n"), (1, b"two\n")] {
            bytes.extend_from_slice(&[stream, 0, 0, 0]);
            bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            bytes.extend_from_slice(payload);
        }
        let mut got = Vec::new();
        read_frames(&bytes[..], |s, l| got.push(format!("{s}:{l}")));
        assert_eq!(got, ["stdout:out one", "stderr:err", "stdout:out two"]);
        let mut plain = Vec::new();
        read_frames(&b"a tty line\nmore"[..], |s, l| plain.push(format!("{s}:{l}")));
        assert_eq!(plain, ["stdout:a tty line", "stdout:more"]);
    }
}
