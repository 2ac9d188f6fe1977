//! systemd's readiness protocol (`sd_notify(3)`): one datagram of
//! `KEY=VALUE` lines to the socket `NOTIFY_SOCKET` names, so the unit
//! (`Type=notify`) is "started" only once choird answers on its admin
//! socket, and "stopping" while it takes its agents down.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) nothing is sent. A send that
//! fails is logged once at debug and never stops choird.

use std::ffi::OsString;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Where the notifications go, if anywhere.
pub struct Notifier {
    to: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// The notifier for `NOTIFY_SOCKET`'s value (a path, or `@name` in the
    /// abstract namespace); none for no value or one that cannot be used.
    pub fn new(socket: Option<OsString>) -> Notifier {
        let to = socket.and_then(|s| {
            let addr = match s.as_encoded_bytes().strip_prefix(b"@") {
                Some(name) => {
                    use std::os::linux::net::SocketAddrExt;
                    SocketAddr::from_abstract_name(name)
                }
                None => SocketAddr::from_pathname(&s),
            };
            match (addr, UnixDatagram::unbound()) {
                (Ok(addr), Ok(sock)) => Some((sock, addr)),
                (Err(e), _) | (_, Err(e)) => {
                    log::warn!("NOTIFY_SOCKET {s:?} cannot be used: {e}");
                    None
                }
            }
        });
        Notifier { to }
    }

    /// Sends `state` (`READY=1`, `STOPPING=1`, `STATUS=…`).
    pub fn send(&self, state: &str) {
        if let Some((sock, addr)) = &self.to {
            if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
                log::debug!("cannot tell systemd {state:?}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_reach_a_path_socket_and_an_abstract_one() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        Notifier::new(Some(path.into_os_string())).send("READY=1");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("choir-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        Notifier::new(Some(format!("@{name}").into())).send("STOPPING=1");
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        Notifier::new(None).send("READY=1"); // nothing to send to: nothing happens
    }
}
