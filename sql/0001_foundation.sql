-- Foundation: choird's system of record. Sessions (leases), replicated commit
-- events, the audit trail, user messages and LLM relay accounting.
-- pgvector is required from the start (agent memory builds on it).
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE sessions (
    id            bigserial PRIMARY KEY,
    agent_id      text        NOT NULL,
    runtime       text        NOT NULL,
    token_sha256  bytea       NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    hello_at      timestamptz,
    ended_at      timestamptz,
    end_reason    text
);
CREATE INDEX sessions_agent ON sessions (agent_id, id DESC);

-- One row per committed event of an agent's log; (agent_id, seq) has no gaps.
CREATE TABLE commit_events (
    agent_id     text        NOT NULL,
    seq          bigint      NOT NULL CHECK (seq > 0),
    prev_hash    text        NOT NULL,
    hash         text        NOT NULL,
    session_id   bigint      REFERENCES sessions (id),
    event        jsonb       NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, seq)
);

CREATE TABLE audit (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    agent_id  text,
    action    text        NOT NULL,
    outcome   text        NOT NULL,
    detail    jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_agent ON audit (agent_id, id);

-- User messages to agents and the agents' answers.
CREATE TABLE messages (
    id            bigserial PRIMARY KEY,
    agent_id      text        NOT NULL,
    conversation  text        NOT NULL,
    sender        text        NOT NULL,
    text          text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    reply         text,
    replied_at    timestamptz
);
CREATE INDEX messages_pending ON messages (agent_id, id) WHERE replied_at IS NULL;

-- Per-agent position: highest message processed, replicated chain head.
CREATE TABLE agent_state (
    agent_id        text   PRIMARY KEY,
    processed_upto  bigint NOT NULL DEFAULT 0,
    head_seq        bigint NOT NULL DEFAULT 0,
    head_hash       text   NOT NULL
);

CREATE TABLE llm_calls (
    id                 bigserial PRIMARY KEY,
    at                 timestamptz NOT NULL DEFAULT now(),
    agent_id           text        NOT NULL,
    session_id         bigint      REFERENCES sessions (id),
    lane               text        NOT NULL,
    model              text        NOT NULL,
    status             integer     NOT NULL,
    prompt_tokens      bigint      NOT NULL DEFAULT 0,
    completion_tokens  bigint      NOT NULL DEFAULT 0,
    duration_ms        bigint      NOT NULL
);
