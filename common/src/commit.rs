//! Commit events: the append-only, hash-chained record of everything the arbiter
//! decided. The agent writes them, choird replicates and verifies them; both use
//! the functions here so the chain is computed one way only.
//!
//! **Invariant:** `event.hash == sha256(prev_hash || canonical_json(body))` where
//! `body` is the event without its `hash` field and `canonical_json` sorts object
//! keys. The first event has `seq == 1` and `prev_hash == GENESIS_HASH`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// `prev_hash` of the first event of an agent's log.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What happened to a proposed tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool ran and reported success.
    Ok,
    /// The tool ran and reported a failure.
    Error,
    /// The arbiter refused the call; nothing was executed.
    Rejected,
    /// The tool ran past its timeout and was killed.
    Timeout,
}

/// The kind of a commit event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A tool call proposed by a model and decided by the arbiter.
    ToolCall,
    /// A lane folded older turns of a conversation into a summary.
    Compaction,
    /// A model proposal refused before any tool (e.g. text posing as a tool
    /// call, an empty answer), with the correction sent back.
    Correction,
    /// A lane started a skill (input validated).
    SkillStart,
    /// A running skill moved along one of its transitions.
    SkillTransition,
    /// A skill run ended: finished (with its output), failed, or cancelled.
    SkillEnd,
    /// Stands in for an event choird could not store (see
    /// [`CommitEvent::quarantined`]): it keeps the original's position and
    /// hash, so the chain continues, but not its content.
    Quarantined,
    /// A model step was answered by a fallback model choird chose (the
    /// lane's first was down, rate limited or overloaded): which one. The
    /// record of the switch that counts is choird's (its audit log and
    /// ledger); this one keeps it in the agent's own history too.
    ModelFallback,
    /// The arbiter is about to run a call that must not run twice (a host
    /// tool that is not idempotent), stored before it runs. The call's
    /// `tool_call` event completes it; an intent without one after it is a
    /// call interrupted by a crash, completed on restart from choird's
    /// stored outcome, never by running it again.
    Intent,
}

/// One committed event. Field order is part of the hash definition only through
/// [`canonical_json`], which sorts keys, so adding optional fields later is safe
/// as long as they are skipped when absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitEvent {
    /// Position in the agent's log, starting at 1, without gaps.
    pub seq: u64,
    /// Hash of the previous event (or [`GENESIS_HASH`]).
    pub prev_hash: String,
    /// Wall-clock time of the commit, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The lane that proposed the call (`edge`, or a core job name).
    pub lane: String,
    /// What kind of event this is.
    pub kind: EventKind,
    /// Canonical tool name.
    pub tool: String,
    /// The model's id for this call, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The user message (inbound message id) whose turn made this call, so a
    /// restarted lane can rebuild an interrupted turn from the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
    /// Active skill and state when the call was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// Active skill state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Validated input, with secret values redacted.
    pub input: Value,
    /// The arbiter's outcome.
    pub outcome: Outcome,
    /// The structured result (or error) returned to the model. For a tool
    /// call, exactly what the model was shown, which carries
    /// `"output_trust": "untrusted"` when its content came from a tool whose
    /// output is untrusted (see [`crate::trust`]; absent: trusted). For a
    /// compaction, a [`crate::compaction::CompactionResult`].
    pub result: Value,
    /// Time spent executing, in microseconds (0 for rejected calls).
    pub duration_us: u64,
    /// How the agent normalised content PostgreSQL cannot store (see
    /// [`normalize`]), when it had to: e.g. `"nul"` when NUL characters were
    /// written as the six characters `\u0000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escaped: Option<String>,
    /// Set on the record of a call of a tool whose `side_effect` is
    /// `external` that was executed: choird writes an audit record for each
    /// such event it stores, in the same transaction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external: bool,
    /// `sha256(prev_hash || canonical body)`, hex.
    pub hash: String,
}

impl CommitEvent {
    /// The hash this event must carry, computed from its other fields.
    pub fn compute_hash(&self) -> String {
        let mut body = match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            // A struct of strings, numbers and Values always serialises to an object.
            _ => serde_json::Map::new(),
        };
        body.remove("hash");
        let mut hasher = Sha256::new();
        hasher.update(self.prev_hash.as_bytes());
        hasher.update(canonical_json(&Value::Object(body)).as_bytes());
        hex::encode(hasher.finalize())
    }

    /// Fills in `hash` from the other fields.
    pub fn seal(mut self) -> CommitEvent {
        self.hash = self.compute_hash();
        self
    }

    /// The placeholder stored instead of this event when choird cannot store
    /// it: the same position, links and hash (so the chain continues), the
    /// same lane, tool and outcome, but none of the content, only why and the
    /// sha256 of what was left out. Its hash cannot be recomputed; chain
    /// verification checks only its links.
    pub fn quarantined(&self, reason: &str) -> CommitEvent {
        let content = canonical_json(&serde_json::to_value(self).unwrap_or(Value::Null));
        let reason: String = reason.chars().filter(|c| *c != '\0').take(500).collect();
        CommitEvent {
            seq: self.seq,
            prev_hash: self.prev_hash.clone(),
            ts_ms: self.ts_ms,
            lane: self.lane.clone(),
            kind: EventKind::Quarantined,
            tool: self.tool.clone(),
            call_id: self.call_id.clone(),
            turn: self.turn,
            skill: self.skill.clone(),
            state: self.state.clone(),
            input: Value::Object(serde_json::Map::new()),
            outcome: self.outcome,
            result: serde_json::json!({
                "quarantined": reason,
                "content_sha256": hex::encode(Sha256::digest(content.as_bytes())),
                "content_bytes": content.len(),
            }),
            duration_us: self.duration_us,
            escaped: None,
            external: self.external,
            hash: self.hash.clone(),
        }
    }

    /// Whether choird can store this event as it is: its serialised size is
    /// within [`MAX_EVENT_BYTES`], and no string in it (key or value) holds a
    /// character PostgreSQL refuses in text and `jsonb` (NUL).
    pub fn storable(&self) -> Result<(), String> {
        let strings = [&self.prev_hash, &self.lane, &self.tool, &self.hash]
            .into_iter()
            .chain(self.call_id.as_ref())
            .chain(self.skill.as_ref())
            .chain(self.state.as_ref())
            .chain(self.escaped.as_ref());
        for s in strings {
            if s.contains('\0') {
                return Err("a NUL character in one of its fields".into());
            }
        }
        if has_nul(&self.input) || has_nul(&self.result) {
            return Err("a NUL character in its input or result (agents write NUL as \\u0000)".into());
        }
        let size = serde_json::to_vec(self).map(|v| v.len()).unwrap_or(usize::MAX);
        if size > MAX_EVENT_BYTES {
            return Err(format!("{size} bytes, over the {MAX_EVENT_BYTES}-byte limit of one event"));
        }
        Ok(())
    }
}

/// Largest serialised event choird stores; agents elide long strings to stay
/// under it.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Makes `v` storable by PostgreSQL: every NUL character in a string (keys
/// included) is written as the six characters `\u0000`. Returns whether
/// anything changed. Other characters are left alone: Rust strings cannot
/// hold the lone surrogates `jsonb` would also refuse.
pub fn normalize(v: &mut Value) -> bool {
    match v {
        Value::String(s) if s.contains('\0') => {
            *s = s.replace('\0', "\\u0000");
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |acc, i| normalize(i) | acc),
        Value::Object(map) => {
            let mut changed = false;
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (k, val) in old {
                    map.insert(k.replace('\0', "\\u0000"), val);
                }
                changed = true;
            }
            map.values_mut().fold(changed, |acc, i| normalize(i) | acc)
        }
        _ => false,
    }
}

/// Shortens every string in `v` longer than `keep` bytes to its first `keep`
/// bytes (at a character boundary) and a note of what was left out, with
/// its length and sha256. Returns whether anything changed.
pub fn elide_long_strings(v: &mut Value, keep: usize) -> bool {
    match v {
        Value::String(s) if s.len() > keep => {
            let mut cut = keep;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            let note = format!(
                "…[{} bytes elided from the log; sha256 {}]",
                s.len() - cut,
                hex::encode(Sha256::digest(s.as_bytes()))
            );
            s.truncate(cut);
            s.push_str(&note);
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |acc, i| elide_long_strings(i, keep) | acc),
        Value::Object(map) => map.values_mut().fold(false, |acc, i| elide_long_strings(i, keep) | acc),
        _ => false,
    }
}

/// Why a sequence of events does not form a valid chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// An event's hash does not match its content (corruption or tampering).
    #[error("event {seq}: hash does not match its content")]
    BadHash {
        /// Offending sequence number.
        seq: u64,
    },
    /// The sequence skips or repeats a number.
    #[error("event {seq}: expected sequence number {expected} (gap or duplicate)")]
    Gap {
        /// Offending sequence number.
        seq: u64,
        /// The number that should have come next.
        expected: u64,
    },
    /// The event does not link to the hash of its predecessor (a fork).
    #[error("event {seq}: prev_hash does not match the hash of event {prev} (forked chain)")]
    Fork {
        /// Offending sequence number.
        seq: u64,
        /// The predecessor it should link to.
        prev: u64,
    },
}

/// The position a chain has reached: the last sequence number and its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    /// Last sequence number (0 for an empty log).
    pub seq: u64,
    /// Hash of that event ([`GENESIS_HASH`] for an empty log).
    pub hash: String,
}

impl ChainHead {
    /// The head of an empty log.
    pub fn genesis() -> ChainHead {
        ChainHead { seq: 0, hash: GENESIS_HASH.to_owned() }
    }
}

/// Verifies that `events` extend the chain at `head`, returning the new head.
/// Nothing is accepted past the first bad event.
pub fn verify_extension(head: &ChainHead, events: &[CommitEvent]) -> Result<ChainHead, ChainError> {
    let mut cur = head.clone();
    for ev in events {
        let expected = cur.seq + 1;
        if ev.seq != expected {
            return Err(ChainError::Gap { seq: ev.seq, expected });
        }
        if ev.prev_hash != cur.hash {
            return Err(ChainError::Fork { seq: ev.seq, prev: cur.seq });
        }
        // A placeholder keeps the hash of what it stands for: only its links
        // can be checked.
        if ev.kind != EventKind::Quarantined && ev.compute_hash() != ev.hash {
            return Err(ChainError::BadHash { seq: ev.seq });
        }
        cur = ChainHead { seq: ev.seq, hash: ev.hash.clone() };
    }
    Ok(cur)
}

/// Serialises a JSON value with object keys sorted at every level and no
/// insignificant whitespace, so that equal values give equal bytes whatever
/// order their keys arrived in (Postgres `jsonb`, for one, reorders them).
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write_canonical(&map[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(seq: u64, prev: &str) -> CommitEvent {
        CommitEvent {
            seq,
            prev_hash: prev.to_owned(),
            ts_ms: 1_700_000_000_000 + seq,
            lane: "edge".into(),
            kind: EventKind::ToolCall,
            tool: "choir.fs.write".into(),
            call_id: Some(format!("call_{seq}")),
            turn: Some(7),
            skill: None,
            state: None,
            input: json!({"path": "a.txt", "content": "x"}),
            outcome: Outcome::Ok,
            result: json!({"status": "success"}),
            duration_us: 12,
            escaped: None,
            external: false,
            hash: String::new(),
        }
        .seal()
    }

    fn chain(n: u64) -> Vec<CommitEvent> {
        let mut out: Vec<CommitEvent> = Vec::new();
        for seq in 1..=n {
            let prev = out.last().map(|e| e.hash.clone()).unwrap_or_else(|| GENESIS_HASH.to_owned());
            out.push(event(seq, &prev));
        }
        out
    }

    #[test]
    fn the_external_flag_is_hashed_when_set_and_absent_otherwise() {
        let plain = event(1, GENESIS_HASH);
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("external"), "events of before the flag keep their hash: {text}");
        let flagged = CommitEvent { external: true, ..plain.clone() }.seal();
        assert_ne!(flagged.hash, plain.hash);
        let back: CommitEvent = serde_json::from_str(&serde_json::to_string(&flagged).unwrap()).unwrap();
        assert!(back.external && back.compute_hash() == flagged.hash);
    }

    #[test]
    fn a_valid_chain_verifies() {
        let evs = chain(3);
        let head = verify_extension(&ChainHead::genesis(), &evs).unwrap();
        assert_eq!(head.seq, 3);
        assert_eq!(head.hash, evs[2].hash);
    }

    #[test]
    fn tampering_gaps_and_forks_are_named() {
        let mut evs = chain(3);
        evs[1].input = json!({"path": "b.txt"});
        assert_eq!(verify_extension(&ChainHead::genesis(), &evs), Err(ChainError::BadHash { seq: 2 }));

        let evs = chain(3);
        assert_eq!(
            verify_extension(&ChainHead::genesis(), &[evs[0].clone(), evs[2].clone()]),
            Err(ChainError::Gap { seq: 3, expected: 2 })
        );
        let other = event(2, &"f".repeat(64));
        assert_eq!(
            verify_extension(&ChainHead::genesis(), &[evs[0].clone(), other]),
            Err(ChainError::Fork { seq: 2, prev: 1 })
        );
    }

    #[test]
    fn nul_is_escaped_and_a_quarantined_event_keeps_the_chain() {
        let mut v = json!({"path": "nul.txt", "content": "before\0after", "k\0": ["\0"]});
        assert!(normalize(&mut v));
        assert_eq!(v, json!({"path": "nul.txt", "content": "before\\u0000after", "k\\u0000": ["\\u0000"]}));
        assert!(!normalize(&mut v));

        let mut evs = chain(3);
        evs[1].input = json!({"content": "a\0b"});
        evs[1] = evs[1].clone().seal();
        evs[2].prev_hash = evs[1].hash.clone();
        evs[2] = evs[2].clone().seal();
        assert!(evs[1].storable().unwrap_err().contains("NUL"));
        let placeholder = evs[1].quarantined("NUL");
        assert!(placeholder.storable().is_ok());
        assert_eq!(placeholder.hash, evs[1].hash);
        let stored = [evs[0].clone(), placeholder, evs[2].clone()];
        assert_eq!(verify_extension(&ChainHead::genesis(), &stored).unwrap().hash, evs[2].hash);

        let mut big = json!({"content": "é".repeat(700_000)});
        assert!(elide_long_strings(&mut big, 1001));
        let s = big["content"].as_str().unwrap();
        assert!(s.len() < 1200 && s.contains("bytes elided"), "{s}");
    }

    #[test]
    fn hash_survives_key_reordering() {
        let ev = event(1, GENESIS_HASH);
        let reparsed: CommitEvent = serde_json::from_str(&canonical_json(&serde_json::to_value(&ev).unwrap())).unwrap();
        assert_eq!(reparsed.compute_hash(), ev.hash);
        assert_eq!(canonical_json(&json!({"b": 1, "a": [true, null, "x\""]})), r#"{"a":[true,null,"x\""],"b":1}"#);
    }
}
