//! An IMAP session for an account: TCP, then TLS from the first byte
//! (`tls`), after `STARTTLS` (`starttls`), or none (loopback only), then
//! LOGIN. Every socket has read and write timeouts; no error names the
//! password.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::config::Security;

use super::account::Account;

/// A byte stream IMAP runs over.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A logged-in session.
pub type Session = imap::Session<Box<dyn Stream>>;

/// How long a connection may wait on the server.
const TIMEOUT: Duration = Duration::from_secs(30);

fn tcp(host: &str, port: u16) -> Result<TcpStream, String> {
    let addrs: Vec<_> = (host, port).to_socket_addrs().map_err(|_| format!("{host} could not be resolved"))?.collect();
    let mut last = format!("{host}:{port} has no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(10)) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(TIMEOUT));
                let _ = s.set_write_timeout(Some(TIMEOUT));
                return Ok(s);
            }
            Err(e) => last = format!("{host}:{port} cannot be reached ({})", e.kind()),
        }
    }
    Err(last)
}

/// Wraps `tcp` in TLS for `host`, handshake done (so a certificate problem
/// is reported here, clearly).
pub fn tls(account: &Account, host: &str, mut tcp: TcpStream) -> Result<Box<dyn Stream>, String> {
    let config = super::tls::client_config(&account.cfg)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let mut conn = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| format!("TLS with {host} failed: {e}"))?;
    }
    Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
}

/// One line from a raw stream (byte by byte: nothing is read past it).
fn line(s: &mut TcpStream) -> Result<String, String> {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while out.len() < 8192 {
        match s.read(&mut b) {
            Ok(1) => {
                out.push(b[0]);
                if out.ends_with(b"\r\n") {
                    return Ok(String::from_utf8_lossy(&out).trim_end().to_owned());
                }
            }
            _ => return Err("the IMAP server closed the connection".into()),
        }
    }
    Err("the IMAP server sent an over-long line".into())
}

/// Connects and logs in.
pub fn open(account: &Account) -> Result<Session, String> {
    let s = &account.cfg.imap;
    let mut raw = tcp(&s.host, s.port)?;
    let stream: Box<dyn Stream> = match s.security {
        Security::Tls => tls(account, &s.host, raw)?,
        Security::None => Box::new(raw),
        Security::Starttls => {
            let greeting = line(&mut raw)?;
            if !greeting.starts_with("* OK") {
                return Err(format!("the IMAP server greeted with {:?}", choir_common::text::clipped(&greeting, 80)));
            }
            raw.write_all(b"c0 STARTTLS\r\n").map_err(|e| e.to_string())?;
            loop {
                let l = line(&mut raw)?;
                if let Some(rest) = l.strip_prefix("c0 ") {
                    if !rest.starts_with("OK") {
                        return Err("the IMAP server refused STARTTLS".into());
                    }
                    break;
                }
            }
            tls(account, &s.host, raw)?
        }
    };
    let mut client = imap::Client::new(stream);
    if s.security != Security::Starttls {
        client.read_greeting().map_err(|e| format!("the IMAP server's greeting: {e}"))?;
    }
    client.login(&account.cfg.username, &account.password).map_err(|(e, _)| match e {
        imap::Error::No(_) | imap::Error::Bad(_) => {
            "the IMAP server refused the login; the operator must check the account's username and password".to_owned()
        }
        other => format!("IMAP login failed: {other}"),
    })
}
