//! The name resolver of choird's clients of configured services (the LLM
//! endpoints, the Bot API, Notion, embeddings, transcription, search).
//!
//! ureq resolves a request's host on every request — before it looks for a
//! kept-alive connection in its pool — and, when the request has a timeout
//! (every one of ours does), in a thread it spawns for that lookup. So each
//! model step paid a thread and a DNS lookup even on an open connection.
//! [`Cached`] answers an IP literal at once and keeps a name's addresses for
//! [`TTL`] (at most [`MAX_NAMES`] names; the oldest is dropped first).
//!
//! **Invariant:** only hosts from config.json are resolved here. URLs an
//! agent chooses go through `web::common::Pinned`, checked by the egress
//! policy at every request; a cached answer never reaches them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ureq::config::ConfigBuilder;
use ureq::typestate::AgentScope;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// How long a name's addresses are used before it is looked up again.
pub const TTL: Duration = Duration::from_secs(60);
/// Names kept at once.
pub const MAX_NAMES: usize = 64;

/// A resolver with IP literals answered directly and names cached.
#[derive(Debug, Default)]
pub struct Cached {
    lookup: DefaultResolver,
    names: Mutex<HashMap<String, (Instant, Vec<SocketAddr>)>>,
}

impl Cached {
    fn answer(&self, addrs: &[SocketAddr]) -> ResolvedSocketAddrs {
        let mut out = self.empty();
        for a in addrs {
            out.push(*a);
        }
        out
    }
}

impl Resolver for Cached {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let Some(authority) = uri.authority() else { return self.lookup.resolve(uri, config, timeout) };
        let port = authority.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(self.answer(&[SocketAddr::new(ip, port)]));
        }
        let key = format!("{host}:{port}");
        if let Some((at, addrs)) = self.names.lock().get(&key) {
            if at.elapsed() < TTL {
                return Ok(self.answer(addrs));
            }
        }
        let fresh = self.lookup.resolve(uri, config, timeout)?;
        let mut names = self.names.lock();
        if names.len() >= MAX_NAMES && !names.contains_key(&key) {
            if let Some(oldest) = names.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone()) {
                names.remove(&oldest);
            }
        }
        names.insert(key, (Instant::now(), fresh.iter().copied().collect()));
        Ok(fresh)
    }
}

/// Bytes of an outward connection's input buffer (ureq's default 128 KiB).
pub const INPUT_BUFFER: usize = 48 * 1024;
/// The largest response head read (ureq's default 64 KiB; servers' own
/// limits are commonly 8–16 KiB). Below [`INPUT_BUFFER`]: a head that fills
/// the whole buffer would end as "peer disconnected" instead of ureq's
/// `LargeResponseHeader`.
pub const MAX_HEAD: usize = 32 * 1024;
/// Bytes of an outward connection's output buffer (ureq's default 128 KiB);
/// a request body larger than it goes out in pieces of this size.
pub const OUTPUT_BUFFER: usize = 16 * 1024;

/// `builder` with the buffer sizes of every outward client of choird. ureq
/// allocates a connection's two buffers zero-filled at its first request
/// and keeps them while it is pooled: at its defaults, 256 KiB resident for
/// every kept connection. Bodies stream through the
/// input buffer whatever their size; only a response head must fit in it.
pub fn sized(builder: ConfigBuilder<AgentScope>) -> ConfigBuilder<AgentScope> {
    builder.input_buffer_size(INPUT_BUFFER).max_response_header_size(MAX_HEAD).output_buffer_size(OUTPUT_BUFFER)
}

/// A client configured by `builder` ([`sized`]) with the [`Cached`] resolver.
pub fn agent(builder: ConfigBuilder<AgentScope>) -> ureq::Agent {
    ureq::Agent::with_parts(sized(builder).build(), DefaultConnector::new(), Cached::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(r: &Cached, url: &str) -> Vec<SocketAddr> {
        let uri: ureq::http::Uri = url.parse().unwrap();
        let config = ureq::config::Config::default();
        let timeout = NextTimeout {
            after: ureq::unversioned::transport::time::Duration::NotHappening,
            reason: ureq::Timeout::Resolve,
            per_read: None,
            per_write: None,
        };
        r.resolve(&uri, &config, timeout).unwrap().iter().copied().collect()
    }

    #[test]
    fn literals_are_answered_as_written_and_names_are_looked_up_once_per_ttl() {
        let r = Cached::default();
        assert_eq!(resolve(&r, "http://127.0.0.1:8080/v1"), ["127.0.0.1:8080".parse::<SocketAddr>().unwrap()]);
        assert_eq!(resolve(&r, "https://[::1]/x"), ["[::1]:443".parse::<SocketAddr>().unwrap()]);
        assert!(r.names.lock().is_empty(), "literals are not cached");
        let first = resolve(&r, "http://localhost:9/");
        assert!(first.iter().all(|a| a.ip().is_loopback() && a.port() == 9), "{first:?}");
        assert_eq!(r.names.lock().len(), 1);
        // A cached answer is served as stored (planted here to tell it apart).
        let planted: SocketAddr = "127.0.0.9:9".parse().unwrap();
        r.names.lock().insert("localhost:9".into(), (Instant::now(), vec![planted]));
        assert_eq!(resolve(&r, "http://localhost:9/"), [planted]);
        // An expired one is looked up again.
        r.names.lock().insert("localhost:9".into(), (Instant::now() - TTL - Duration::from_secs(1), vec![planted]));
        assert!(!resolve(&r, "http://localhost:9/").contains(&planted));
    }

    #[test]
    fn at_most_max_names_are_kept_and_the_oldest_goes_first() {
        let r = Cached::default();
        let long_ago = Instant::now() - Duration::from_secs(30);
        for i in 0..MAX_NAMES {
            r.names.lock().insert(format!("h{i}:80"), (long_ago + Duration::from_millis(i as u64), Vec::new()));
        }
        resolve(&r, "http://localhost:1/");
        let names = r.names.lock();
        assert_eq!(names.len(), MAX_NAMES, "one dropped for the new one");
        assert!(names.contains_key("localhost:1") && !names.contains_key("h0:80"), "the oldest was dropped");
    }
}
