//! The fakes' HTTP servers on loopback.
//!
//! A fake that writes a response in two pieces (tiny_http writes the head
//! and the body separately) with Nagle's algorithm on holds the second piece
//! until the first is acknowledged, and the client's delayed ACK can hold
//! that for 40 ms: a stall that belongs to the fake, not to the path being
//! measured. The listener is made with `TCP_NODELAY`, which Linux passes on
//! to every connection it accepts, as real API front ends send.

use std::net::TcpListener;

/// A tiny_http server on a free loopback port whose connections send at once.
pub fn server() -> std::io::Result<tiny_http::Server> {
    server_on("127.0.0.1:0")
}

/// The same on a given address.
pub fn server_on(addr: &str) -> std::io::Result<tiny_http::Server> {
    let listener = TcpListener::bind(addr)?;
    socket2::SockRef::from(&listener).set_tcp_nodelay(true)?;
    tiny_http::Server::from_listener(listener, None).map_err(std::io::Error::other)
}
