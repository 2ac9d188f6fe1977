//! Two byte streams joined both ways: the tunnels that carry an MCP server's
//! granted network traffic (the agent's loopback proxy to choird's socket,
//! choird's socket to the site).
//!
//! **Invariants:** each direction carries at most [`Limits::max_bytes`];
//! a tunnel with no byte either way for [`Limits::idle`] is closed; when one
//! side ends its writing, the other side's writing end is shut (a half-close
//! passes through), and when either direction fails or runs over, both
//! streams are shut at once so neither thread outlives the tunnel.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A stream that can be read and written from two threads and shut.
pub trait Duplex: Read + Write + Send {
    /// A second handle on the same stream.
    fn clone_duplex(&self) -> io::Result<Box<dyn Duplex>>;
    /// The longest a read waits.
    fn read_timeout(&self, wait: Option<Duration>) -> io::Result<()>;
    /// Shuts one or both ends.
    fn shut(&self, how: Shutdown);
}

impl Duplex for TcpStream {
    fn clone_duplex(&self) -> io::Result<Box<dyn Duplex>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn read_timeout(&self, wait: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(wait)
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

impl Duplex for UnixStream {
    fn clone_duplex(&self) -> io::Result<Box<dyn Duplex>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn read_timeout(&self, wait: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(wait)
    }
    fn shut(&self, how: Shutdown) {
        let _ = self.shutdown(how);
    }
}

/// A tunnel's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Silence both ways after which the tunnel is closed.
    pub idle: Duration,
    /// Bytes each direction carries at most.
    pub max_bytes: u64,
}

/// How a tunnel ended: bytes carried each way and why it closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// From `a` to `b`.
    pub a_to_b: u64,
    /// From `b` to `a`.
    pub b_to_a: u64,
    /// `None` when both sides closed; else what cut it.
    pub cut: Option<String>,
}

/// The tick a waiting read wakes at to look whether the other direction
/// moved (the idle clock is shared by both).
const TICK: Duration = Duration::from_millis(500);

/// Copies `a` → `b` and `b` → `a` until both are done (or one is cut), on
/// this thread and one more. Returns what was carried.
pub fn splice(a: Box<dyn Duplex>, b: Box<dyn Duplex>, limits: Limits) -> io::Result<Carried> {
    let (a2, b2) = (a.clone_duplex()?, b.clone_duplex()?);
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let last2 = last.clone();
    let other = std::thread::Builder::new().name("splice".into()).spawn(move || pump(a, b2, limits, start, &last2))?;
    let back = pump(b, a2, limits, start, &last);
    let forth = other.join().unwrap_or((0, Some("a tunnel thread failed".into())));
    Ok(Carried { a_to_b: forth.0, b_to_a: back.0, cut: forth.1.or(back.1) })
}

/// One direction: bytes carried and, when cut, why.
fn pump(
    mut from: Box<dyn Duplex>,
    mut to: Box<dyn Duplex>,
    limits: Limits,
    start: Instant,
    last: &AtomicU64,
) -> (u64, Option<String>) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut carried = 0u64;
    let cut = |from: &dyn Duplex, to: &dyn Duplex| {
        from.shut(Shutdown::Both);
        to.shut(Shutdown::Both);
    };
    if from.read_timeout(Some(TICK.min(limits.idle))).is_err() {
        cut(&*from, &*to);
        return (0, Some("the stream could not be set up".into()));
    }
    loop {
        match from.read(&mut buf) {
            Ok(0) => {
                to.shut(Shutdown::Write);
                return (carried, None);
            }
            Ok(n) => {
                carried += n as u64;
                if carried > limits.max_bytes {
                    cut(&*from, &*to);
                    return (carried, Some(format!("over {} bytes one way", limits.max_bytes)));
                }
                last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).and_then(|_| to.flush()).is_err() {
                    cut(&*from, &*to);
                    return (carried, None);
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                let quiet = start.elapsed().saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
                if quiet >= limits.idle {
                    cut(&*from, &*to);
                    return (carried, Some(format!("no byte either way for {} s", limits.idle.as_secs())));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                cut(&*from, &*to);
                return (carried, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// An echo server on loopback that answers every byte it reads.
    fn echo() -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        addr
    }

    fn tunnel(limits: Limits) -> (UnixStream, std::thread::JoinHandle<Carried>) {
        let (client, inner) = UnixStream::pair().unwrap();
        let site = TcpStream::connect(echo()).unwrap();
        let t = std::thread::spawn(move || splice(Box::new(inner), Box::new(site), limits).unwrap());
        (client, t)
    }

    #[test]
    fn bytes_go_both_ways_and_a_half_close_passes_through() {
        let (mut client, t) = tunnel(Limits { idle: Duration::from_secs(5), max_bytes: 1 << 20 });
        client.write_all(b"hello tunnel").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"hello tunnel");
        let carried = t.join().unwrap();
        assert_eq!((carried.a_to_b, carried.b_to_a, carried.cut), (12, 12, None));
    }

    #[test]
    fn a_tunnel_over_its_bytes_is_cut_and_says_so() {
        let (mut client, t) = tunnel(Limits { idle: Duration::from_secs(5), max_bytes: 1000 });
        let _ = client.write_all(&[7u8; 4000]);
        let mut back = Vec::new();
        let _ = client.read_to_end(&mut back);
        let carried = t.join().unwrap();
        assert!(carried.cut.as_deref().unwrap_or_default().contains("over 1000 bytes"), "{carried:?}");
        assert!(back.len() <= 1000, "{} bytes came back past the cap", back.len());
    }

    #[test]
    fn a_silent_tunnel_is_closed_after_its_idle_time() {
        let (mut client, t) = tunnel(Limits { idle: Duration::from_millis(600), max_bytes: 1 << 20 });
        let started = Instant::now();
        let mut back = Vec::new();
        let _ = client.read_to_end(&mut back);
        let carried = t.join().unwrap();
        assert!(carried.cut.as_deref().unwrap_or_default().contains("no byte either way"), "{carried:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
