//! The preamble most end-to-end tests share, said once: a disposable
//! PostgreSQL, the fake model endpoint with a script, a config with some
//! agents, choird started on a home of its own, and the agents running.
//!
//! ```ignore
//! let Some(Scenario { pg, llm, choird }) =
//!     Scenario::new().model(vec![Step::Text("hi".into())]).running().build()
//! else {
//!     return; // no PostgreSQL here, and `cargo test` (not `make test`) may skip
//! };
//! ```
//!
//! Fields drop in declaration order: choird stops (its agents with it) before
//! the fake model and the cluster go away. Bind them in the order `pg, llm,
//! choird` (bindings drop in reverse), and give an unused one a `_name`, never
//! `_`, which would drop it at once.

use serde_json::Value;

use crate::fake_llm::{FakeLlm, Responder, Step};
use crate::harness::{test_config, Choird};
use crate::pg::TestPg;

/// A running test world.
pub struct Scenario {
    /// choird, on a temporary home.
    pub choird: Choird,
    /// The fake model endpoint both lanes call.
    pub llm: FakeLlm,
    /// The database choird uses.
    pub pg: TestPg,
}

/// A change to the config before choird reads it.
type Edit<'a> = Box<dyn FnOnce(&mut Value) + 'a>;

/// How to build a [`Scenario`]; [`Scenario::new`] starts one. Config edits
/// may borrow the test's locals (`'a`).
pub struct Builder<'a> {
    script: Vec<Step>,
    responder: Option<Responder>,
    agents: Vec<String>,
    edits: Vec<Edit<'a>>,
    secrets: Value,
    running: bool,
}

impl Scenario {
    /// A scenario with one agent, `demo`, not yet started, a model that
    /// answers nothing scripted, and the relay's key in `llm_key`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new<'a>() -> Builder<'a> {
        Builder {
            script: Vec::new(),
            responder: None,
            agents: vec!["demo".to_owned()],
            edits: Vec::new(),
            secrets: serde_json::json!({"llm_key": "sk-test-relay-key"}),
            running: false,
        }
    }
}

impl<'a> Builder<'a> {
    /// What the model answers, call by call.
    pub fn model(mut self, script: Vec<Step>) -> Builder<'a> {
        self.script = script;
        self
    }

    /// A model that answers each request by `responder` (the request body
    /// and its index), as [`FakeLlm::with_responder`].
    pub fn responder(mut self, responder: impl Fn(&Value, u64) -> Option<Step> + Send + Sync + 'static) -> Builder<'a> {
        self.responder = Some(std::sync::Arc::new(responder));
        self
    }

    /// The configured agents (instead of `demo`).
    pub fn agents(mut self, agents: &[&str]) -> Builder<'a> {
        self.agents = agents.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// Changes the config before choird reads it.
    pub fn config(mut self, edit: impl FnOnce(&mut Value) + 'a) -> Builder<'a> {
        self.edits.push(Box::new(edit));
        self
    }

    /// `secrets.json` (instead of the relay key's entry alone).
    pub fn secrets(mut self, secrets: Value) -> Builder<'a> {
        self.secrets = secrets;
        self
    }

    /// Starts every configured agent once choird is up (`choirctl agent
    /// start` returns once the agent said hello).
    pub fn running(mut self) -> Builder<'a> {
        self.running = true;
        self
    }

    /// The scenario, or `None` when there is no PostgreSQL here and the
    /// test may skip (never under `make test`).
    pub fn build(self) -> Option<Scenario> {
        let pg = TestPg::start()?;
        let llm = match self.responder {
            Some(responder) => FakeLlm::with_responder(move |req, n| responder(req, n)),
            None => FakeLlm::start(self.script),
        };
        let agents: Vec<&str> = self.agents.iter().map(String::as_str).collect();
        let mut config = test_config(&llm.base_url(), Some(&pg.url()), &agents);
        for edit in self.edits {
            edit(&mut config);
        }
        let choird = Choird::start(&config, &self.secrets);
        if self.running {
            for agent in &agents {
                choird.ctl_ok(&["agent", "start", agent]);
            }
        }
        Some(Scenario { choird, llm, pg })
    }
}
