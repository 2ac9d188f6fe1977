//! HTTP/1.1 over a Unix domain socket for ureq: the agent's RPC client, choirctl's
//! admin client and (later) the Docker Engine client all speak through this one
//! connector. URLs keep the usual shape (`http://localhost/path`); the host part
//! is ignored and every connection goes to the configured socket path.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, LazyBuffers, NextTimeout, Transport};

/// `s` as a URL query value (`application/x-www-form-urlencoded`: what
/// choird's admin API and the Docker Engine API both decode).
pub fn query_value(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Builds a ureq agent whose every request goes to the Unix socket at `path`.
/// Non-2xx statuses are returned as responses, not errors, so callers can read
/// the structured error body.
pub fn agent_for_socket(path: &Path, timeout: Option<Duration>) -> ureq::Agent {
    pooled_agent_for_socket(path, timeout, DEFAULT_IDLE)
}

/// ureq's own default of idle connections kept per host.
const DEFAULT_IDLE: usize = 3;

/// Bytes of each of a socket connection's two buffers. ureq's defaults are
/// 128 KiB each, allocated zero-filled at a connection's first request and
/// kept while it is pooled: 256 KiB resident for every open connection —
/// most of an agent's own memory. Bodies stream through
/// the buffer whatever their size.
pub const SOCKET_BUFFER: usize = 16 * 1024;
/// The largest answer head read from a socket (choird's and the Docker
/// engine's are a few hundred bytes). Below [`SOCKET_BUFFER`]: a head that
/// fills the whole buffer would end as "peer disconnected" instead of
/// ureq's `LargeResponseHeader`.
pub const SOCKET_MAX_HEAD: usize = 8 * 1024;

/// [`agent_for_socket`] keeping up to `idle` idle connections for reuse (a
/// client making that many requests at once finds them all open again next
/// time; past it, a connection is closed after its request).
pub fn pooled_agent_for_socket(path: &Path, timeout: Option<Duration>, idle: usize) -> ureq::Agent {
    let config = Config::builder()
        .http_status_as_error(false)
        .timeout_global(timeout)
        .max_idle_connections(idle.max(DEFAULT_IDLE))
        .max_idle_connections_per_host(idle)
        .input_buffer_size(SOCKET_BUFFER)
        .output_buffer_size(SOCKET_BUFFER)
        .max_response_header_size(SOCKET_MAX_HEAD)
        .build();
    ureq::Agent::with_parts(config, UnixConnector { path: path.to_owned() }, NoResolver)
}

/// Connects every request to one Unix socket.
#[derive(Debug)]
pub struct UnixConnector {
    path: PathBuf,
}

impl<In: Transport> Connector<In> for UnixConnector {
    type Out = UnixTransport;

    fn connect(&self, details: &ConnectionDetails, _chained: Option<In>) -> Result<Option<Self::Out>, ureq::Error> {
        let stream = UnixStream::connect(&self.path)?;
        let config = details.config;
        Ok(Some(UnixTransport {
            stream,
            buffers: LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size()),
        }))
    }
}

/// A Unix socket carrying one HTTP/1.1 connection.
#[derive(Debug)]
pub struct UnixTransport {
    stream: UnixStream,
    buffers: LazyBuffers,
}

fn io_timeout(timeout: NextTimeout) -> Option<Duration> {
    timeout.not_zero().map(|d| *d)
}

fn map_timeout(e: io::Error, timeout: &NextTimeout) -> ureq::Error {
    if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) {
        ureq::Error::Timeout(timeout.reason)
    } else {
        ureq::Error::Io(e)
    }
}

impl Transport for UnixTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let timeout = timeout.for_write();
        self.stream.set_write_timeout(io_timeout(timeout))?;
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output).map_err(|e| map_timeout(e, &timeout))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let timeout = timeout.for_read();
        self.stream.set_read_timeout(io_timeout(timeout))?;
        let input = self.buffers.input_append_buf();
        let amount = loop {
            match self.stream.read(input) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other.map_err(|e| map_timeout(e, &timeout))?,
            }
        };
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        // A pooled connection is reusable only if the peer has not closed it and
        // sent nothing unsolicited: a non-blocking read must say "would block".
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut buf = [0u8; 1];
        let open = matches!(self.stream.read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        open && self.stream.set_nonblocking(false).is_ok()
    }
}

/// Unix sockets need no name resolution; ureq still wants an address.
#[derive(Debug)]
struct NoResolver;

impl Resolver for NoResolver {
    fn resolve(&self, _uri: &Uri, _config: &Config, _timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut addrs = self.empty();
        addrs.truncate(0);
        addrs.push(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 80)));
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::query_value;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(query_value(r#"{"label":["a=b"]}"#), "%7B%22label%22%3A%5B%22a%3Db%22%5D%7D");
        assert_eq!(query_value("choir/demo:abc"), "choir%2Fdemo%3Aabc");
        assert_eq!(query_value("a b&c=d#e"), "a+b%26c%3Dd%23e");
        assert_eq!(query_value("été"), "%C3%A9t%C3%A9");
    }
}
