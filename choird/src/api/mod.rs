//! choird's HTTP endpoints, each a thin edge over the daemon: the admin API
//! ([`admin`], choirctl's, on `socks/choird.sock` only), the agents' RPC
//! ([`rpc`], the eight verbs), the LLM relay ([`relay`], where the model API
//! key is added) and the Prometheus scrape ([`metrics`]).
//!
//! **Invariant:** a request's [`Route`] is decided once, by [`Router`]'s
//! `admit`, from its head and the listener it came in on, before any body
//! byte is read: an agent route carries the agent its lease token
//! authenticated, an admin route exists only on the admin socket. Handlers
//! take the route as decided and never parse the path again.

pub mod admin;
pub mod egress;
pub mod metrics;
pub mod relay;
pub mod relay_events;
pub mod relay_fit;
pub mod rpc;

use std::sync::Arc;

use choir_common::rpc::Verb;

use crate::config::Lane;
use crate::daemon::{Daemon, RateClass};
use crate::error::Error;
use crate::http::{printable, Admitted, Caller, Handler, Head, ListenerKind, Request, Response};
use admin::AdminRequest;

/// Where an admitted request goes.
#[derive(Debug)]
pub enum Route {
    /// `GET /metrics` on the metrics listener.
    Metrics,
    /// `POST /rpc/v1/<VERB>` from an authenticated agent.
    Rpc { verb: Verb, caller: Caller },
    /// `POST /llm/<lane>/v1/chat/completions` from an authenticated agent.
    Llm { lane: Lane, caller: Caller },
    /// `/admin/v1/...` on the admin socket.
    Admin(AdminRequest),
    /// `POST /egress/v1?server=&host=&port=` from an authenticated agent:
    /// a tunnel for one of its MCP servers' network grants.
    Egress { ask: egress::Ask, caller: Caller },
}

/// Largest body of an admin request (chat messages, proposals shown back, …).
const MAX_ADMIN_BODY: usize = 1024 * 1024;

/// Routes a request to the admin API, the agent RPC or the LLM relay,
/// according to what the listener exposes.
pub struct Router {
    /// The control plane.
    pub daemon: Arc<Daemon>,
    /// The Telegram gateway's handle (status, pairings, metrics).
    pub tg: crate::telegram::Handle,
    /// The operator's console (opened from the admin API).
    pub console: Arc<crate::console::Console>,
}

impl Router {
    fn route(&self, kind: &ListenerKind, head: &Head) -> Result<(Route, usize), Error> {
        let d = &self.daemon;
        if *kind == ListenerKind::Metrics {
            // The metrics listener serves one read-only page and nothing else.
            return match (head.method.as_str(), head.path.as_str()) {
                ("GET", "/metrics") => Ok((Route::Metrics, 0)),
                _ => Err(Error::NotFound("only GET /metrics is served here".into())),
            };
        }
        if let Some(verb) = Verb::from_path(&head.path) {
            let class = if verb == Verb::Heartbeat { RateClass::Heartbeat } else { RateClass::Verb };
            let caller = d.authenticate(kind, head.bearer.as_deref(), verb.name(), class)?;
            if head.method != "POST" {
                return Err(Error::Malformed(format!("{} must be POSTed", verb.name())));
            }
            return Ok((Route::Rpc { verb, caller }, rpc::max_body(verb)));
        }
        if let Some(rest) = head.path.strip_prefix("/llm/") {
            let (lane, tail) = rest.split_once('/').unwrap_or((rest, ""));
            let class = if lane == "core" { RateClass::CoreModel } else { RateClass::EdgeModel };
            let caller = d.authenticate(kind, head.bearer.as_deref(), "LLM", class)?;
            if tail != "v1/chat/completions" || head.method != "POST" {
                return Err(Error::NotFound(format!("no LLM endpoint {}", printable(&head.path))));
            }
            let lane =
                Lane::parse(lane).ok_or_else(|| Error::NotFound(format!("no lane {lane:?}; use edge or core")))?;
            return Ok((Route::Llm { lane, caller }, relay::MAX_REQUEST));
        }
        if head.path == "/egress/v1" {
            let caller = d.authenticate(kind, head.bearer.as_deref(), "EGRESS", RateClass::Verb)?;
            if head.method != "POST" {
                return Err(Error::Malformed("a tunnel must be POSTed".into()));
            }
            return Ok((Route::Egress { ask: egress::Ask::parse(head)?, caller }, 0));
        }
        if head.path.starts_with("/admin/") && *kind == ListenerKind::Admin {
            return Ok((Route::Admin(AdminRequest::parse(head)?), MAX_ADMIN_BODY));
        }
        // The admin API exists only on choird.sock; agents cannot reach it.
        Err(Error::NotFound(format!("no endpoint {} {}", printable(&head.method), printable(&head.path))))
    }
}

impl Handler for Router {
    type Route = Route;

    fn admit(&self, kind: &ListenerKind, head: &Head) -> Result<Admitted<Route>, Error> {
        let (route, max_body) = self.route(kind, head)?;
        Ok(Admitted { max_body, route })
    }

    fn handle(&self, _kind: &ListenerKind, route: Route, req: Request) -> Response {
        let d = &self.daemon;
        // The database connections an agent's request takes count against
        // the agent (`db::slots`): a flood of its requests waits for its own.
        let _acting = match &route {
            Route::Rpc { caller, .. } | Route::Llm { caller, .. } | Route::Egress { caller, .. } => {
                Some(crate::db::slots::acting_for(&caller.agent))
            }
            Route::Metrics | Route::Admin(_) => None,
        };
        let result = match route {
            Route::Metrics => {
                return Response {
                    status: 200,
                    body: metrics::render(d, &self.tg).into_bytes(),
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    headers: Vec::new(),
                    stream: None,
                    tunnel: None,
                }
            }
            Route::Rpc { verb, caller } => rpc::handle(d, verb, &caller, &req),
            Route::Llm { lane, caller } => relay::handle(d.shared(), lane, &caller, &req),
            Route::Admin(request) => admin::handle(d, &self.tg, &self.console, request, &req),
            Route::Egress { ask, caller } => egress::handle(d.shared(), &caller, &ask),
        };
        result.unwrap_or_else(Response::from)
    }
}
