//! Ports for servers a test starts itself (mail servers, choird's TCP
//! listener). A port the kernel hands out for `bind(:0)` comes from the
//! ephemeral range, which every outgoing connection on the machine draws
//! from too: between the probe closing and the server binding, a client
//! elsewhere can take it (CI saw the SMTP server fail with "address
//! already in use" so). These ports come from below that range, where the
//! kernel never picks one on its own, each probed free, and never the
//! same one twice in a test process.

use parking_lot::Mutex;
use std::collections::HashSet;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// The lowest port this picks from; below it sit well-known services.
const FLOOR: u16 = 20_000;

/// The first port of the kernel's ephemeral range (32768 when unread).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .filter(|p| *p > FLOOR + 1000)
        .unwrap_or(32_768)
}

/// A loopback TCP port nothing listens on, outside the ephemeral range,
/// not handed out before in this process.
pub fn unused_port() -> u16 {
    // Spread processes apart: start where the pid and the clock point.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    pick(HANDED_OUT.lock().get_or_insert_with(HashSet::new), std::process::id().wrapping_mul(7919) ^ nanos)
}

/// The first free port below the ephemeral range from `start` on (wrapping)
/// that is not in `handed`, which then holds it too.
fn pick(handed: &mut HashSet<u16>, start: u32) -> u16 {
    let top = ephemeral_start();
    let span = u32::from(top - FLOOR);
    let mut at = start % span;
    for _ in 0..span {
        let port = FLOOR + u16::try_from(at).unwrap();
        at = (at + 1) % span;
        if handed.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.insert(port);
            return port;
        }
    }
    panic!("no free port between {FLOOR} and {top}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_free_and_never_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| unused_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice: {ports:?}");
        let top = ephemeral_start();
        assert!(ports.iter().all(|p| (FLOOR..top).contains(p)), "{ports:?} outside {FLOOR}..{top}");
    }

    #[test]
    fn a_port_something_listens_on_is_skipped_even_when_never_handed_out() {
        let start = 4321;
        let first = pick(&mut HashSet::new(), start);
        let held = std::net::TcpListener::bind(("127.0.0.1", first)).unwrap();
        // A fresh record knows nothing of it: only the probe keeps it out.
        assert_ne!(pick(&mut HashSet::new(), start), first, "a port with a listener was handed out");
        // Negative control: released, the same walk lands on it again.
        drop(held);
        assert_eq!(pick(&mut HashSet::new(), start), first);
    }
}
