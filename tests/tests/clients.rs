//! The buffers of Choir's HTTP clients: each kept
//! connection holds an input and an output buffer, smaller than ureq's
//! 128 KiB defaults — choird's and the agents' clients of a socket 16 KiB
//! each, choird's outward clients 48 KiB in and 16 KiB out. Bodies larger
//! than the buffers go through whole both ways; a response head larger than
//! the input buffer is refused at once with ureq's own error, not a hang.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// Serves until the client side is done: `/big` answers `len` bytes of a
/// pattern, `/echo` answers the sha256 of the body it got, `/fat-head` a
/// head with a header of `head` bytes.
fn serve(server: tiny_http::Server, len: usize, head: usize) {
    std::thread::spawn(move || {
        for mut rq in server.incoming_requests() {
            let url = rq.url().to_owned();
            let answer = match url.as_str() {
                "/big" => tiny_http::Response::from_data(pattern(len)),
                "/echo" => {
                    let mut body = Vec::new();
                    rq.as_reader().read_to_end(&mut body).unwrap();
                    tiny_http::Response::from_data(hex::encode(Sha256::digest(&body)).into_bytes())
                }
                _ => tiny_http::Response::from_data(b"ok".to_vec())
                    .with_header(tiny_http::Header::from_bytes(&b"X-Fat"[..], "a".repeat(head).as_bytes()).unwrap()),
            };
            let _ = rq.respond(answer);
        }
    });
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Checks one client against a server serving on `base`.
fn check(agent: &ureq::Agent, base: &str, limit: usize) {
    let mut big = agent.get(format!("{base}/big")).call().unwrap();
    let body = big.body_mut().with_config().limit(8 << 20).read_to_vec().unwrap();
    assert!(body == pattern(1 << 20), "a 1 MiB body streams through whole ({} bytes)", body.len());
    let sent = pattern(300_000);
    let mut echo = agent.post(format!("{base}/echo")).send(&sent[..]).unwrap();
    assert_eq!(echo.body_mut().read_to_string().unwrap(), hex::encode(Sha256::digest(&sent)), "sent whole");
    let started = std::time::Instant::now();
    let err = agent.get(format!("{base}/fat-head")).call().unwrap_err();
    assert!(matches!(err, ureq::Error::LargeResponseHeader(_, l) if l == limit), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "refused at once");
    // The connection is not poisoned for the next request.
    let mut again = agent.get(format!("{base}/big")).call().unwrap();
    assert_eq!(again.body_mut().with_config().limit(8 << 20).read_to_vec().unwrap().len(), 1 << 20);
}

#[test]
fn a_socket_client_streams_bodies_larger_than_its_buffers_and_refuses_a_head_larger_than_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let limit = choir_common::unix_http::SOCKET_MAX_HEAD;
    serve(tiny_http::Server::http_unix(&path).unwrap(), 1 << 20, limit + 1000);
    let agent = choir_common::unix_http::pooled_agent_for_socket(&path, Some(Duration::from_secs(10)), 2);
    let buffer = choir_common::unix_http::SOCKET_BUFFER;
    assert_eq!((agent.config().input_buffer_size(), agent.config().output_buffer_size()), (buffer, buffer));
    check(&agent, "http://localhost", limit);
}

#[test]
fn an_outward_client_streams_bodies_larger_than_its_buffers_and_refuses_a_head_larger_than_them() {
    let server = choir_tests::loopback::server().unwrap();
    let base = format!("http://{}", server.server_addr().to_ip().unwrap());
    let limit = choird::resolver::MAX_HEAD;
    serve(server, 1 << 20, limit + 1000);
    let agent = choird::resolver::agent(ureq::config::Config::builder().http_status_as_error(false));
    let sizes = (agent.config().input_buffer_size(), agent.config().output_buffer_size());
    assert_eq!(sizes, (choird::resolver::INPUT_BUFFER, choird::resolver::OUTPUT_BUFFER));
    check(&agent, &base, limit);
}
