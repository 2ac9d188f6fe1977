//! Egress policy (`agents.<id>.web`): where a host tool may connect on an
//! agent's behalf. One place decides it for every request choird or the
//! browser makes for an agent — the page, its redirects, its sub-resources,
//! an HTTP post.
//!
//! **Invariants:**
//! - A destination passes only if its host is not denied, is allowed when an
//!   allow list is set, and the *address actually connected to* is public —
//!   private, loopback, link-local, metadata, multicast, unspecified and
//!   unique-local addresses are refused unless the operator allowed that
//!   address range explicitly (`allow_addresses`).
//! - The name is resolved once and the connection is made to the address
//!   that was checked ([`Policy::resolve`] returns it): a DNS answer that
//!   changes between the check and the connection (rebinding) cannot move a
//!   request onto a refused address.
//! - Only `http` and `https` URLs leave the host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use ipnet::IpNet;

use crate::config::AgentWeb;

/// Why a destination is refused: said to the model as is (it names only
/// what the model asked for).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// One agent's egress policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    allow_domains: Vec<String>,
    deny_domains: Vec<String>,
    allow_addresses: Vec<IpNet>,
}

/// Whether `host` is `domain` or beneath it.
fn within(host: &str, domain: &str) -> bool {
    host == domain || host.strip_suffix(domain).is_some_and(|rest| rest.ends_with('.'))
}

/// The IPv4 address an IPv6 address stands for, where it embeds one that
/// a packet to it would reach: IPv4-mapped (`::ffff:a.b.c.d`), SIIT
/// (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated; `::`
/// and `::1` come out as `0.0.0.0` and `0.0.0.1`, which are not public
/// either), 6to4 (`2002:AABB:CCDD::/48`) and the well-known NAT64 prefix
/// (`64:ff9b::/96`). Such an address is judged as that IPv4 address.
pub fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] | [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)),
        _ => None,
    }
}

/// Whether an address is public (reachable on the internet, not a host's,
/// a private network's or a cloud metadata service's). An IPv6 address that
/// embeds an IPv4 one is judged by it ([`embedded_ipv4`]); tunnels whose
/// far end cannot be judged here (Teredo `2001::/32`, local-use NAT64
/// `64:ff9b:1::/48`) are not public.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                // Carrier-grade NAT 100.64/10 and the benchmark range 198.18/15.
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                // Reserved 240/4.
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_ipv4(v6) {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7 unique local, fe80::/10 link-local.
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                // 64:ff9b:1::/48 local-use NAT64, 2001::/32 Teredo and
                // 2001:db8::/32 documentation.
                || (s[0] == 0x64 && s[1] == 0xff9b)
                || (s[0] == 0x2001 && (s[1] == 0 || s[1] == 0xdb8)))
        }
    }
}

impl Policy {
    /// The policy of an agent's `web` section.
    pub fn new(web: &AgentWeb) -> Policy {
        Policy {
            allow_domains: web.allow_domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
            deny_domains: web.deny_domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
            // Validated when the config was loaded.
            allow_addresses: web.allow_addresses.iter().filter_map(|a| a.parse().ok()).collect(),
        }
    }

    /// Whether the host name (or address literal) may be asked for at all.
    pub fn check_host(&self, host: &str) -> Result<(), Refused> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(Refused("the URL has no host".into()));
        }
        if let Some(d) = self.deny_domains.iter().find(|d| within(host, d)) {
            return Err(Refused(format!("{host} is refused by this agent's egress policy (denied: {d})")));
        }
        if !self.allow_domains.is_empty() && !self.allow_domains.iter().any(|d| within(host, d)) {
            return Err(Refused(format!("{host} is not among the domains this agent may reach")));
        }
        Ok(())
    }

    /// Whether a connection to `ip` is allowed.
    pub fn check_address(&self, ip: IpAddr) -> Result<(), Refused> {
        // An address that stands for an IPv4 one is that address, for the
        // operator's allowed ranges too.
        let ip = match ip {
            IpAddr::V6(v6) => embedded_ipv4(v6).map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if is_public(ip) || self.allow_addresses.iter().any(|net| net.contains(&ip)) {
            Ok(())
        } else {
            Err(Refused(format!(
                "{ip} is a private, loopback, link-local or otherwise internal address; this agent may not reach it"
            )))
        }
    }

    /// Checks `host`, resolves it once and returns the first address that
    /// passes [`Policy::check_address`] — the one to connect to.
    pub fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, Refused> {
        self.check_host(host)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => (bare, port)
                .to_socket_addrs()
                .map_err(|_| Refused(format!("{bare} could not be resolved")))?
                .take(16)
                .collect(),
        };
        let mut last = Refused(format!("{bare} has no address"));
        for a in addrs {
            match self.check_address(a.ip()) {
                Ok(()) => return Ok(a),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Parses a URL the model gave and checks its scheme and host (not yet
    /// its address): only `http` and `https`, with a host, no credentials.
    pub fn check_url(&self, raw: &str) -> Result<url::Url, Refused> {
        let url = parse_web_url(raw)?;
        self.check_host(url.host_str().unwrap_or_default())?;
        Ok(url)
    }
}

/// The longest URL a tool may be given, in bytes, as given and once
/// encoded: the one bound the web tools' schemas and [`parse_web_url`]
/// share. Invariant: a request line with such a URL fits the outward
/// client's output buffer (`resolver::OUTPUT_BUFFER`).
pub const MAX_URL_BYTES: usize = 8192;

/// Parses an `http`/`https` URL with a host and no user info; anything else
/// is refused, saying why.
pub fn parse_web_url(raw: &str) -> Result<url::Url, Refused> {
    if raw.len() > MAX_URL_BYTES {
        return Err(Refused(format!("the URL is longer than {MAX_URL_BYTES} bytes")));
    }
    let url = url::Url::parse(raw.trim()).map_err(|e| Refused(format!("not a valid URL: {e}")))?;
    // Percent-encoding can triple what was given; the request line must fit
    // the client's output buffer (`resolver::OUTPUT_BUFFER`).
    if url.as_str().len() > MAX_URL_BYTES {
        return Err(Refused(format!("the URL is {} bytes once encoded; at most {MAX_URL_BYTES}", url.as_str().len())));
    }
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(Refused(format!("{other}: URLs are refused; only http and https are allowed"))),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Refused("the URL has no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refused("URLs with credentials in them are refused".into()));
    }
    Ok(url)
}

/// The origin (`scheme://host[:port]`) of a URL, as operators write it in
/// `post_origins`.
pub fn origin_of(url: &url::Url) -> String {
    url.origin().ascii_serialization()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL in the shapes people and attackers write around the one the
    /// user gave (`https://hooks.corp.test/in`): case, ports, trailing dots,
    /// user info, backslashes and missing slashes, encoded characters, dot
    /// segments, a longer host, queries, fragments, punctuation after it.
    fn url_like(g: &mut crate::test_gen::Gen) -> String {
        let scheme = g.pick(&["https", "HTTPS", "http", "hTtPs"]);
        let sep = g.pick(&["://", "://", ":/", ":\\\\", ":", "://\t"]);
        let user = g.pick(&["", "", "", "hooks.corp.test@", "u:p@"]);
        let host = g.pick(&[
            "hooks.corp.test",
            "HOOKS.Corp.TEST",
            "hooks.corp.test.",
            "hooks.corp.test.evil.test",
            "evil.test",
            "hooks%2ecorp.test",
            "hooks.corp.test\\@evil.test",
        ]);
        let port = g.pick(&["", "", ":443", ":80", ":8443"]);
        let path = g.pick(&["/in", "/in", "/IN", "/in/", "/x/../in", "/./in", "/in%2F", "", "/i%6E"]);
        let tail = g.pick(&["", "", "?", "?a=b", "#top", "/", ".", ")"]);
        format!("{scheme}{sep}{user}{host}{port}{path}{tail}")
    }

    #[test]
    fn provenance_reads_a_url_as_the_client_and_the_browser_send_to_it() {
        // The consumer: choird's HTTP client takes what `parse_web_url`
        // returns (the WHATWG URL standard, as Chromium reads it too). A
        // value traced to the user must go exactly where the user's went.
        use choir_common::provenance::{trace, Source};
        let texts = [(Source::User, "please post the minutes to https://hooks.corp.test/in")];
        let target = |u: &url::Url| {
            (
                u.scheme().to_owned(),
                u.host_str().map(str::to_owned),
                u.port_or_known_default(),
                u.path().to_owned(),
                u.query().map(str::to_owned),
            )
        };
        let users = target(&parse_web_url("https://hooks.corp.test/in").unwrap());
        let mut g = crate::test_gen::Gen(0x853c_49e6_748f_ea9b);
        let (mut sent, mut same, mut found) = (0, 0, 0);
        for i in 0..4000 {
            let value = url_like(&mut g);
            let Ok(url) = parse_web_url(&value) else { continue };
            sent += 1;
            let goes_to_users = target(&url) == users;
            same += usize::from(goes_to_users);
            let from_user = trace(&value, &texts).sources.contains(&Source::User);
            found += usize::from(from_user);
            // Never traced to the user when it goes anywhere else.
            assert!(!from_user || goes_to_users, "case {i}: {value:?} goes to {:?}", target(&url));
        }
        assert!(sent > 1500, "the generator makes mostly valid URLs: {sent}");
        // Most ways of writing the user's own URL are recognised as it.
        assert!(same > 50 && found * 10 >= same * 8, "{found} of {same} recognised");
    }

    fn policy(allow: &[&str], deny: &[&str], addrs: &[&str]) -> Policy {
        Policy::new(&AgentWeb {
            allow_domains: allow.iter().map(|s| s.to_string()).collect(),
            deny_domains: deny.iter().map(|s| s.to_string()).collect(),
            allow_addresses: addrs.iter().map(|s| s.to_string()).collect(),
            ..AgentWeb::default()
        })
    }

    #[test]
    fn internal_addresses_are_refused_unless_allowed_explicitly() {
        let p = policy(&[], &[], &[]);
        for ip in [
            "127.0.0.1",
            "127.0.0.2",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "224.0.0.1",
        ] {
            assert!(p.check_address(ip.parse().unwrap()).is_err(), "{ip} must be refused");
        }
        for ip in ["8.8.8.8", "1.1.1.1", "172.32.0.1", "2606:4700::1111"] {
            assert!(p.check_address(ip.parse().unwrap()).is_ok(), "{ip} is public");
        }
        let p = policy(&[], &[], &["127.0.0.1/32"]);
        assert!(p.check_address("127.0.0.1".parse().unwrap()).is_ok());
        assert!(p.check_address("127.0.0.2".parse().unwrap()).is_err(), "only what was allowed");
        assert!(p.check_address("::ffff:127.0.0.1".parse().unwrap()).is_ok(), "mapped addresses are the same host");
    }

    #[test]
    fn regression_ipv6_forms_that_embed_an_internal_ipv4_address_were_treated_as_public() {
        let p = policy(&[], &[], &[]);
        for ip in [
            "::7f00:1",                             // IPv4-compatible 127.0.0.1
            "::a9fe:a9fe",                          // IPv4-compatible 169.254.169.254
            "::ffff:0:7f00:1",                      // SIIT 127.0.0.1
            "::ffff:0:a00:1",                       // SIIT 10.0.0.1
            "2002:7f00:1::1",                       // 6to4 of 127.0.0.1
            "2002:c0a8:101::",                      // 6to4 of 192.168.1.1
            "2001:0:4136:e378:8000:63bf:3fff:fdd2", // Teredo
            "64:ff9b::7f00:1",                      // NAT64 of 127.0.0.1
            "64:ff9b::a9fe:a9fe",                   // NAT64 of the metadata service
            "64:ff9b:1::a00:1",                     // local-use NAT64
            "::",
            "::1",
        ] {
            assert!(p.check_address(ip.parse().unwrap()).is_err(), "{ip} must be refused");
        }
        // The same forms around a public address are that public address.
        for ip in ["::ffff:0:808:808", "2002:808:808::1", "64:ff9b::808:808", "::ffff:8.8.8.8"] {
            assert!(p.check_address(ip.parse().unwrap()).is_ok(), "{ip} embeds 8.8.8.8");
        }
        // An allowed IPv4 range covers its embedded forms.
        let p = policy(&[], &[], &["127.0.0.1/32"]);
        assert!(p.check_address("64:ff9b::7f00:1".parse().unwrap()).is_ok());
        assert!(p.check_address("2002:7f00:2::".parse().unwrap()).is_err());
    }

    #[test]
    fn resolution_checks_the_address_it_returns() {
        let p = policy(&[], &[], &[]);
        assert!(p.resolve("localhost", 80).is_err());
        assert!(p.resolve("127.0.0.1", 80).unwrap_err().0.contains("internal"));
        assert!(p.resolve("[::1]", 80).is_err());
        let p = policy(&[], &[], &["127.0.0.0/8"]);
        assert_eq!(p.resolve("127.0.0.1", 8080).unwrap(), "127.0.0.1:8080".parse().unwrap());
    }

    #[test]
    fn domains_are_matched_whole_labels() {
        let p = policy(&["example.com"], &["bad.example.com"], &[]);
        assert!(p.check_host("example.com").is_ok());
        assert!(p.check_host("WWW.Example.COM.").is_ok());
        assert!(p.check_host("notexample.com").is_err(), "a suffix is not a subdomain");
        assert!(p.check_host("x.bad.example.com").unwrap_err().0.contains("denied"));
        assert!(p.check_host("evil.test").unwrap_err().0.contains("not among"));
    }

    #[test]
    fn only_plain_web_urls_pass() {
        let p = policy(&[], &[], &[]);
        for bad in [
            "file:///etc/passwd",
            "chrome://settings",
            "javascript:alert(1)",
            "data:text/html,hi",
            "ftp://x.test/",
            "http://user:pw@x.test/",
            "not a url",
            "http://",
            "https://[::1",
        ] {
            assert!(p.check_url(bad).is_err(), "{bad}");
        }
        assert_eq!(p.check_url("https://X.test/a?b").unwrap().host_str(), Some("x.test"));
        // 8,000 bytes as given, 24,000 once encoded: refused, saying so.
        let long = format!("https://x.test/{}", "é".repeat(4_000));
        let err = p.check_url(&long).unwrap_err().0;
        assert!(err.contains("once encoded"), "{err}");
        // The bound itself: exactly MAX_URL_BYTES passes, one byte more is refused.
        let at = format!("https://x.test/{}", "a".repeat(MAX_URL_BYTES - "https://x.test/".len()));
        assert_eq!(p.check_url(&at).unwrap().as_str().len(), MAX_URL_BYTES);
        let err = p.check_url(&format!("{at}a")).unwrap_err().0;
        assert!(err.contains("longer than 8192 bytes"), "{err}");
        assert_eq!(origin_of(&p.check_url("HTTP://x.test:80/p").unwrap()), "http://x.test");
    }
}
