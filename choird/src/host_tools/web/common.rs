//! What the web tools share: whether an agent has a `web` section, and an
//! HTTP client pinned to the one address the egress policy checked.

use std::net::SocketAddr;

use choir_common::ids::AgentId;

use crate::config::{AgentWeb, Config};
use crate::host_tools::ToolStatus;

/// The agent's `web` section, or why the web tools are not served to it.
pub fn agent_web<'a>(config: &'a Config, agent: &AgentId) -> Result<&'a AgentWeb, ToolStatus> {
    config
        .agents
        .get(agent)
        .and_then(|a| a.web.as_ref())
        .ok_or_else(|| ToolStatus::Available(format!("agents.{agent}.web is not configured")))
}

/// A resolver that answers every lookup with one address: the one the
/// egress policy checked (resolve once, connect there).
#[derive(Debug)]
pub struct Pinned(pub SocketAddr);

impl ureq::unversioned::resolver::Resolver for Pinned {
    fn resolve(
        &self,
        _uri: &ureq::http::Uri,
        _config: &ureq::config::Config,
        _timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let mut v = self.empty();
        v.push(self.0);
        Ok(v)
    }
}

/// An HTTP client that connects only to `addr`, follows no redirects and
/// treats every status as an answer.
pub fn pinned_agent(addr: SocketAddr, timeout: std::time::Duration) -> ureq::Agent {
    let config = crate::resolver::sized(ureq::config::Config::builder())
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(timeout))
        .user_agent("choird")
        .build();
    ureq::Agent::with_parts(config, ureq::unversioned::transport::DefaultConnector::new(), Pinned(addr))
}
