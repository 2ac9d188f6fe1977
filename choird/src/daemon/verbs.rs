//! The eight verbs agents call (R-RPC-2), for an authenticated caller:
//! INIT_HELLO, GET_SECRETS, HEARTBEAT (replication of the commit log, answers
//! and their delivery, the long-poll for messages), REPORT_STATUS,
//! TERMINATE_SELF, FETCH_DYNAMIC_CONFIG and EXECUTE_HOST_TOOL (through the
//! host-tool registry). REQUEST_APPROVAL is in [`super::approvals`].

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use choir_common::ids::AgentId;
use choir_common::rpc::{
    Bindings, ConversationTail, DynamicConfig, ExecuteHostToolRequest, ExecuteHostToolResponse, HeartbeatRequest,
    HeartbeatResponse, HostToolBinding, InboundMessage, InitHelloRequest, InitHelloResponse, LaneModels, OutboundReply,
    RecoverySnapshot, ReportStatusRequest, MAX_CONVERSATION_KEY, RECOVERED_CONVERSATIONS,
};
use serde_json::json;

use super::{Authed, Daemon, LEASE_TTL, MAX_WAIT};
use crate::config::Lane;
use crate::error::Error;
use crate::events::Event;
use crate::sessions::{HAND_OUT_AT_ONCE, STATUS_WAIT};
use crate::shared::{clip, Hourly};
use crate::store::turns::{Replies, TurnError};
use crate::store::{Recorded, ReplicationError};

/// Answered exchanges per conversation handed to a (re)started agent.
const RECOVERED_EXCHANGES: i64 = 10;

impl Daemon {
    /// INIT_HELLO: binds the session and hands out the recovery snapshot.
    pub fn init_hello(&self, who: &Authed, req: &InitHelloRequest) -> Result<InitHelloResponse, Error> {
        if req.agent_id != who.agent.as_str() {
            self.audit("agent-rpc", Some(&who.agent), "INIT_HELLO", "refused", json!({"claimed": clip(&req.agent_id)}));
            return Err(Error::Forbidden(format!(
                "this lease belongs to agent {}, not {:?}",
                who.agent,
                clip(&req.agent_id)
            )));
        }
        if req.protocol_version != choir_common::PROTOCOL_VERSION {
            return Err(Error::Malformed(format!(
                "protocol version {} not supported (choird speaks {}); rebuild the agent",
                req.protocol_version,
                choir_common::PROTOCOL_VERSION
            )));
        }
        let position = self.store.agent_position(&who.agent)?;
        self.store.session_hello(who.session)?;
        // Whatever a served host tool needs (e.g. the memory schema) is made
        // before the agent runs.
        self.host_tools.prepare(&who.agent)?;
        let served = self.host_tools.served(&who.agent);
        let config = self.config();
        // An agent removed from config while running still gets a valid answer.
        let agent_cfg = config.agents.get(&who.agent).cloned().unwrap_or_default();
        self.sessions.hello(&who.agent, position.head.seq, position.resume_from);
        self.audit(
            "agent-rpc",
            Some(&who.agent),
            "INIT_HELLO",
            "ok",
            json!({"session": who.session, "agent_version": clip(&req.agent_version), "local_head": req.local_head.seq,
                   "replicated_head": position.head.seq, "resume_from": position.resume_from}),
        );
        Ok(InitHelloResponse {
            session_id: who.session,
            agent_id: who.agent.to_string(),
            bindings: Bindings {
                secrets: agent_cfg.secrets.clone(),
                models: LaneModels {
                    edge: config.model(&who.agent, Lane::Edge),
                    core: config.model(&who.agent, Lane::Core),
                },
                host_tools: served.iter().map(|(name, _)| name.clone()).collect(),
                host_tool_manifests: served
                    .into_iter()
                    .filter_map(|(_, m)| m.map(|manifest| HostToolBinding { manifest }))
                    .collect(),
            },
            recovery: RecoverySnapshot {
                conversations: self.recovered_conversations(&who.agent, position.processed)?,
                replicated_head: position.head,
                processed_upto: position.resume_from,
            },
            config: self.dynamic_config(&who.agent),
            lease_ttl_ms: LEASE_TTL.as_millis() as u64,
        })
    }

    /// What a (re)started agent needs to keep its conversations: for the
    /// conversations it may hold (the most recently answered), the latest
    /// compaction summary of each, then the answered exchanges after it.
    fn recovered_conversations(&self, agent: &AgentId, processed: u64) -> Result<Vec<ConversationTail>, Error> {
        let keys = self.store.recent_conversations(agent, processed, RECOVERED_CONVERSATIONS as i64)?;
        keys.iter().map(|key| self.tail_of(agent, key, processed)).collect()
    }

    /// The tail of one of the agent's conversations, for a HEARTBEAT's
    /// `recall`: the agent dropped it from memory and it speaks again. The
    /// key is only looked up among the agent's own messages.
    fn recalled(&self, agent: &AgentId, conversation: &str) -> Result<ConversationTail, Error> {
        if conversation.len() > MAX_CONVERSATION_KEY {
            return Err(Error::Malformed(format!(
                "recall: a conversation key is at most {MAX_CONVERSATION_KEY} bytes"
            )));
        }
        if conversation.contains('\0') {
            return Err(Error::Malformed("recall: a conversation key cannot hold a NUL character".into()));
        }
        self.tail_of(agent, conversation, i64::MAX as u64)
    }

    /// A conversation's tail as a (re)started or recalling agent gets it: its
    /// latest compaction summary, then the last answered exchanges with
    /// `id <= upto` the summary did not fold. Two index probes.
    fn tail_of(&self, agent: &AgentId, conversation: &str, upto: u64) -> Result<ConversationTail, Error> {
        let (summary, folded) = match self.store.compaction_of(agent, conversation)? {
            Some((summary, folded)) => (Some(summary), folded),
            None => (None, 0),
        };
        let turns = self.store.exchanges_after(agent, conversation, folded, upto, RECOVERED_EXCHANGES)?;
        Ok(ConversationTail { conversation: conversation.to_owned(), summary, turns })
    }

    /// The hot-reloadable config of one agent.
    pub fn dynamic_config(&self, id: &AgentId) -> DynamicConfig {
        let config = self.config();
        let agent = config.agents.get(id).cloned().unwrap_or_default();
        DynamicConfig {
            version: self.config_version(),
            kill_switch: self.kill_switch(),
            max_steps_per_turn: agent.max_steps_per_turn,
            retry_budget: agent.retry_budget,
            context_tokens: agent.context_tokens,
            max_core_jobs: agent.max_core_jobs,
            core_budget: agent.core_budget,
            tool_exposure: agent.tool_exposure.as_str().to_owned(),
            fail_closed_s: agent.fail_closed_s,
            argument_policy: (*self.argument_policy(id)).clone(),
            tool_policy: agent.tools.clone(),
        }
    }

    /// GET_SECRETS: values of secrets bound to the agent, and nothing else.
    pub fn get_secrets(&self, who: &Authed, names: &[String]) -> Result<BTreeMap<String, String>, Error> {
        let config = self.config();
        let bound = config.agents.get(&who.agent).map(|a| a.secrets.clone()).unwrap_or_default();
        let secrets = self.secrets();
        let mut out = BTreeMap::new();
        for name in names {
            if !bound.contains(name) {
                self.audit("agent-rpc", Some(&who.agent), "GET_SECRETS", "refused", json!({"name": name}));
                return Err(Error::Forbidden(format!("secret {:?} is not bound to agent {}", clip(name), who.agent)));
            }
            match secrets.get(name) {
                Some(v) => {
                    out.insert(name.clone(), v.to_owned());
                }
                None => {
                    return Err(Error::NotFound(format!(
                        "secret {name:?} is bound to agent {} but not set in secrets.json",
                        who.agent
                    )))
                }
            }
        }
        self.audit("agent-rpc", Some(&who.agent), "GET_SECRETS", "ok", json!({"names": names}));
        Ok(out)
    }

    /// HEARTBEAT: recalls a conversation's tail if asked, stores replicated
    /// events and replies, then hands out new messages, waiting up to
    /// `wait_ms` for some to arrive. The recall is read first: a refused key
    /// fails the request before anything is stored.
    pub fn heartbeat(&self, who: &Authed, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Error> {
        // A long-poll is what shows the agent alive between its requests
        // (`Sessions::silent`): noted while it is open, and how it ended.
        let mut polling = (req.receive && req.wait_ms > 0).then(|| self.sessions.polling(&who.agent, who.session));
        let answer = self.heartbeat_held(who, req);
        if let (Ok(_), Some(p)) = (&answer, polling.as_mut()) {
            p.answered();
        }
        answer
    }

    fn heartbeat_held(&self, who: &Authed, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Error> {
        super::schedule::check_firing_reports(&req.firings)?;
        check_covers(&req.replies)?;
        req.status.as_ref().map(check_status).transpose()?;
        let recalled = req.recall.as_deref().map(|c| self.recalled(&who.agent, c)).transpose()?;
        if let Some(status) = &req.status {
            // Carried by the poller, it answers the asks it was told of.
            self.sessions.report(&who.agent, who.session, status.clone(), req.receive);
        }
        let mut reply = self.exchange(who, req)?;
        reply.recalled = recalled;
        Ok(reply)
    }

    /// HEARTBEAT's exchange: what it stores and what it hands out.
    fn exchange(&self, who: &Authed, req: &HeartbeatRequest) -> Result<HeartbeatResponse, Error> {
        if !req.replies.is_empty() {
            choir_common::hop::mark("reply.in");
            // Before the transaction: a chat registering its waiter meanwhile
            // reads its answer from the store (Sessions::wait_for_answer).
            self.sessions.storing_replies(&who.agent);
        }
        let (acked, recorded) = self.store_turn(who, req)?;
        if !req.replies.is_empty() {
            choir_common::hop::mark("reply.stored");
        }
        // At once after the commit: a failure below must not keep the
        // waiting chats from their answers (a retried HEARTBEAT finds its
        // replies recorded already and would not pass them on again).
        let partials: Vec<(u64, String)> = req.partials.iter().map(|p| (p.in_reply_to, p.text.clone())).collect();
        let failed: Vec<u64> =
            req.replies.iter().filter(|r| r.failed).flat_map(|r| r.answers().iter().copied()).collect();
        let acked_seq = self.sessions.replicated(&who.agent, acked, &recorded.new, &partials, &failed);
        self.answer_retried(who, req, &recorded.new);
        self.sessions.config_seen(&who.agent, req.config_version);
        let accepted = if req.firings.is_empty() { Vec::new() } else { self.firing_reports(who, &req.firings)? };
        for conversation in &recorded.refused {
            self.audit(
                "agent-rpc",
                Some(&who.agent),
                "HEARTBEAT",
                "notice_refused",
                json!({"conversation": clip(conversation), "reason": "the agent was never addressed there"}),
            );
        }
        // Files the agent left to send go after its answer, to the same chat.
        for conversation in recorded.delivered {
            self.events.send(Event::Answered { agent: who.agent.clone(), conversation });
        }

        let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_WAIT);
        loop {
            let mut poll = self.sessions.poll(&who.agent, who.session, req.receive, req.received_upto);
            if poll.ended {
                return Err(Error::Unauthorized("the session ended".into()));
            }
            if poll.stop || !req.receive {
                let mut reply = self.heartbeat_reply(acked_seq, Vec::new(), poll.stop);
                reply.accepted = accepted;
                return Ok(reply);
            }
            // The query is skipped when every pending message is known: none
            // woke the agent since every one was handed out but messages
            // whose store told what they followed (a message handed out as
            // its chat stored it, and the re-poll after it while the edge
            // works on it: one round trip less each).
            let (messages, every_one) = match poll.known.take() {
                Some(known) => (known, true),
                None => match self.store.pending_messages(&who.agent, poll.after, HAND_OUT_AT_ONCE as i64) {
                    Ok(m) => {
                        let every_one = m.len() < HAND_OUT_AT_ONCE;
                        (m, every_one)
                    }
                    Err(e) => {
                        // What the poll took goes to the next one.
                        self.sessions.give_back(&who.agent, poll);
                        return Err(e.into());
                    }
                },
            };
            let decisions = if poll.decisions_due {
                match self.store.take_decisions(&who.agent) {
                    Ok(d) => d,
                    Err(e) => {
                        self.sessions.give_back(&who.agent, poll);
                        return Err(e.into());
                    }
                }
            } else {
                Vec::new()
            };
            let firings = if poll.firings_due {
                match self.offer_firings(who) {
                    Ok(f) => f,
                    Err(e) => {
                        // The messages still go out; the scheduler's sweep
                        // wakes the agent for its firings again within 5 s
                        // (not at once: a failing offer would spin the poll).
                        log::warn!("agent {}: offering scheduled firings failed: {e}", who.agent);
                        Vec::new()
                    }
                }
            } else {
                Vec::new()
            };
            // A concurrent HEARTBEAT may have handed some of these out already.
            let messages: Vec<InboundMessage> = self
                .sessions
                .hand_out(&who.agent, who.session, messages, every_one.then_some(poll.wake))
                .unwrap_or_default();
            if !messages.is_empty()
                || !decisions.is_empty()
                || !poll.cancels.is_empty()
                || !firings.is_empty()
                || poll.status
            {
                if !messages.is_empty() {
                    choir_common::hop::mark("poll.handout");
                }
                let mut reply = self.heartbeat_reply(acked_seq, messages, false);
                reply.decisions = decisions;
                reply.cancel = poll.cancels;
                reply.report_status = poll.status;
                reply.firings = firings;
                reply.accepted = accepted;
                return Ok(reply);
            }
            if Instant::now() >= deadline || self.shutting_down.load(Ordering::SeqCst) {
                // Nothing came this period: now and then the next poll
                // asks PostgreSQL again, in case a message's wake was lost.
                self.sessions.look_again(&who.agent, who.session, Instant::now());
                let mut reply = self.heartbeat_reply(acked_seq, Vec::new(), false);
                reply.accepted = accepted;
                return Ok(reply);
            }
            self.sessions.wait_wake(&who.agent, poll.wake, deadline);
        }
    }

    /// A retried HEARTBEAT (its first try committed, but the commit's
    /// acknowledgement was lost on the way back) finds its answers recorded
    /// already, so `replicated` never saw them: chats still waiting for
    /// them read them from the store. Only messages a chat waits for are
    /// read, at most one query each; a failure is logged (the HEARTBEAT's
    /// own commit stands).
    fn answer_retried(&self, who: &Authed, req: &HeartbeatRequest, new: &[(u64, String)]) {
        let answered: Vec<u64> = req
            .replies
            .iter()
            .flat_map(|r| r.answers().iter().copied())
            .filter(|id| !new.iter().any(|(n, _)| n == id))
            .collect();
        if answered.is_empty() {
            return;
        }
        for id in self.sessions.waiting_among(&who.agent, &answered) {
            match self.store.reply_of(&who.agent, id) {
                Ok(Some(text)) => {
                    let failed: Vec<u64> =
                        req.replies.iter().filter(|r| r.failed && r.answers().contains(&id)).map(|_| id).collect();
                    self.sessions.replicated(&who.agent, None, &[(id, text)], &[], &failed);
                }
                Ok(None) => {}
                Err(e) => log::warn!("agent {}: reading the recorded answer to message {id}: {e}", who.agent),
            }
        }
    }

    /// Stores the HEARTBEAT's events and replies in one transaction: event
    /// content PostgreSQL cannot store is refused naming the event (the agent
    /// quarantines it instead of retrying it forever), a chain that does not
    /// extend choird's copy is refused as a fork, and then nothing of the
    /// HEARTBEAT is stored. Returns the stored head when there were events,
    /// and what of the replies was recorded.
    fn store_turn(&self, who: &Authed, req: &HeartbeatRequest) -> Result<(Option<u64>, Recorded), Error> {
        for ev in &req.events {
            if let Err(reason) = ev.storable() {
                self.audit(
                    "agent-rpc",
                    Some(&who.agent),
                    "HEARTBEAT",
                    "event_refused",
                    json!({"seq": ev.seq, "reason": reason}),
                );
                return Err(Error::EventRefused { seq: ev.seq, reason });
            }
        }
        let speaks = !(req.replies.is_empty() && req.processed_upto == 0 && req.partials.is_empty());
        if req.events.is_empty() && !speaks {
            return Ok((None, Recorded::default()));
        }
        let replies = if speaks { self.speakable_replies(who, &req.replies) } else { Vec::new() };
        let half = speaks.then(|| Replies {
            replies: &replies,
            processed_upto: req.processed_upto,
            delivery: self.delivery.as_ref(),
        });
        match self.store.store_turn(&who.agent, who.session, &req.events, half) {
            Ok(stored) => {
                if !req.events.is_empty() {
                    if let Some(memory) = &self.memory {
                        memory.note_sources(&who.agent, &req.events);
                    }
                }
                Ok(stored)
            }
            Err(TurnError::Db(e)) => Err(e.into()),
            Err(TurnError::Events(ReplicationError::Chain(e))) => {
                log::error!("ALERT: agent {}: {e}; replication refused", who.agent);
                self.audit(
                    "agent-rpc",
                    Some(&who.agent),
                    "HEARTBEAT",
                    "chain_refused",
                    json!({"error": e.to_string()}),
                );
                Err(Error::Conflict(format!("commit log refused: {e}")))
            }
            Err(TurnError::Events(ReplicationError::Db(e))) if e.is_data_error() => {
                let seq = req.events.first().map_or(0, |e| e.seq);
                log::error!("agent {}: the database refused event {seq}: {e}", who.agent);
                Err(Error::EventRefused { seq, reason: "the database refused its content".into() })
            }
            Err(TurnError::Events(ReplicationError::Db(e))) => Err(e.into()),
        }
    }

    /// The replies of a HEARTBEAT as choird stores them: text PostgreSQL
    /// cannot hold escaped; a notice only where the agent was addressed,
    /// to a Telegram chat it serves under the current config, within its
    /// hourly quota (others dropped and audited).
    fn speakable_replies(&self, who: &Authed, replies: &[OutboundReply]) -> Vec<OutboundReply> {
        let config = self.config();
        let mut out = Vec::with_capacity(replies.len());
        for r in replies {
            let mut r = r.clone();
            for s in [&mut r.text, &mut r.conversation, &mut r.key] {
                if let std::borrow::Cow::Owned(escaped) = choir_common::text::nul_escaped(s) {
                    *s = escaped;
                }
            }
            if r.in_reply_to == 0 {
                let refuse = |reason: &str| {
                    self.audit(
                        "agent-rpc",
                        Some(&who.agent),
                        "HEARTBEAT",
                        "notice_refused",
                        json!({"conversation": clip(&r.conversation), "reason": reason}),
                    );
                };
                if let Some((bot, chat)) = crate::conversations::telegram_chat(&r.conversation) {
                    if !config.serves_chat(&bot, chat, &who.agent) {
                        refuse("not a chat this agent serves");
                        continue;
                    }
                }
                if !self.store.addressed(&who.agent, &r.conversation).unwrap_or(false) {
                    refuse("the agent was never addressed there");
                    continue;
                }
                let quota = config.agents.get(&who.agent).map(|a| a.quotas.notices_per_hour).unwrap_or_default();
                if let Hourly::Over = self.hourly(&who.agent, "notices", quota) {
                    refuse("over quotas.notices_per_hour");
                    continue;
                }
            }
            out.push(r);
        }
        out
    }

    fn heartbeat_reply(&self, acked_seq: u64, messages: Vec<InboundMessage>, stop: bool) -> HeartbeatResponse {
        HeartbeatResponse {
            acked_seq,
            messages,
            config_version: self.config_version(),
            stop,
            decisions: Vec::new(),
            cancel: Vec::new(),
            firings: Vec::new(),
            accepted: Vec::new(),
            recalled: None,
            report_status: false,
        }
    }

    /// REPORT_STATUS: keeps the latest report for `choirctl agent status`.
    /// The first RUNNING report marks the end of the agent's set-up: from then
    /// on it counts as running (and a waiting `agent start` returns).
    pub fn report_status(&self, who: &Authed, req: ReportStatusRequest) {
        self.sessions.report(&who.agent, who.session, req, false);
    }

    /// Asks the running agent `only` (or every running agent) what its
    /// lanes are doing and waits, at most [`STATUS_WAIT`], for the answers:
    /// what a reader of lanes (`agent status`, `/status`, the console, a
    /// rollout waiting for idle lanes) calls first. An agent that answered
    /// within `max_age` is not asked again; one that does not answer in
    /// time shows what it said last. Whether every agent asked answered.
    pub fn refresh_status(&self, only: Option<&AgentId>, max_age: Duration) -> bool {
        let asked = self.sessions.ask_status(only, max_age);
        asked.is_empty() || self.sessions.wait_status(&asked, Instant::now() + STATUS_WAIT)
    }

    /// TERMINATE_SELF: the session ends; the token stops working at once.
    pub fn terminate_self(&self, who: &Authed, reason: &str) -> Result<(), Error> {
        self.sessions.terminate(&who.agent, reason);
        self.store.end_session(who.session, &format!("terminated by agent: {}", clip(reason)))?;
        self.audit(
            "agent-rpc",
            Some(&who.agent),
            "TERMINATE_SELF",
            "ok",
            json!({"session": who.session, "reason": reason}),
        );
        Ok(())
    }

    /// EXECUTE_HOST_TOOL: a host tool for the authenticated agent, judged
    /// by its argument policy over what choird witnessed (see
    /// `host_calls.rs`), then run through the registry (tool policy,
    /// validated, audited, at most once when not idempotent).
    pub fn execute_host_tool(
        &self,
        who: &Authed,
        req: &ExecuteHostToolRequest,
    ) -> Result<ExecuteHostToolResponse, Error> {
        self.judge_host_call(who, req)?;
        Ok(ExecuteHostToolResponse { result: self.host_tools.execute(who, req)? })
    }
}

/// Refuses a HEARTBEAT whose status report is larger than REPORT_STATUS
/// takes ([`choir_common::rpc::MAX_STATUS_BYTES`]): before anything of it
/// is stored or kept.
fn check_status(status: &ReportStatusRequest) -> Result<(), Error> {
    let bytes = choir_common::rpc::json_len(status);
    if bytes > choir_common::rpc::MAX_STATUS_BYTES {
        return Err(Error::Malformed(format!(
            "a status report of {bytes} bytes; at most {} (nothing of this HEARTBEAT was stored)",
            choir_common::rpc::MAX_STATUS_BYTES
        )));
    }
    Ok(())
}

/// Refuses a HEARTBEAT with a reply covering more than
/// [`choir_common::rpc::MAX_COVERS`] messages (the agent's edge never
/// makes one): before anything of it is stored.
fn check_covers(replies: &[OutboundReply]) -> Result<(), Error> {
    match replies.iter().find(|r| r.covers.len() > choir_common::rpc::MAX_COVERS) {
        Some(r) => Err(Error::Malformed(format!(
            "a reply covers {} messages; one reply answers at most {} (nothing of this HEARTBEAT was stored)",
            r.covers.len(),
            choir_common::rpc::MAX_COVERS
        ))),
        None => Ok(()),
    }
}
