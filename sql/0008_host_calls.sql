-- At-most-once host tool calls: a call of a host tool that is not
-- idempotent is claimed here, by (agent, call id), before it runs, and its
-- outcome stored after; a repeat gets the stored outcome instead of a
-- second run.
CREATE TABLE host_calls (
    agent_id      text        NOT NULL,
    call_id       text        NOT NULL,
    tool          text        NOT NULL,
    input_sha256  text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    outcome       jsonb,
    PRIMARY KEY (agent_id, call_id)
);
