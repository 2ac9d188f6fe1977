-- Scheduled jobs (R-SCHED-1, issue 18). A job belongs to one agent and is
-- made only by a person (choirctl) or an approved proposal. next_due is the
-- next time it fires (by the scheduler's clock), NULL while paused.
CREATE TABLE schedule_jobs (
    id              bigserial   PRIMARY KEY,
    agent_id        text        NOT NULL,
    name            text        NOT NULL,
    spec            jsonb       NOT NULL,
    paused          boolean     NOT NULL DEFAULT false,
    paused_reason   text,
    failures        integer     NOT NULL DEFAULT 0,
    next_due        timestamptz,
    -- The precondition's fingerprint at its last check.
    precondition_state text,
    created_by      text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, name)
);
CREATE INDEX schedule_jobs_due ON schedule_jobs (next_due) WHERE NOT paused;

-- One row per (job, scheduled time): the claim. A firing moves
-- due → offered (handed to a session) → running (the agent's start was
-- accepted) → done | failed | interrupted; or ends as refused, missed or
-- skipped (the precondition saw nothing new). The UNIQUE constraint is what
-- makes a firing happen at most once.
CREATE TABLE schedule_firings (
    id              bigserial   PRIMARY KEY,
    job_id          bigint      NOT NULL REFERENCES schedule_jobs (id) ON DELETE CASCADE,
    scheduled_for   timestamptz NOT NULL,
    state           text        NOT NULL,
    session_id      bigint,
    offered_at      timestamptz,
    started_at      timestamptz,
    finished_at     timestamptz,
    tokens          bigint,
    detail          text        NOT NULL DEFAULT '',
    UNIQUE (job_id, scheduled_for)
);
CREATE INDEX schedule_firings_open ON schedule_firings (job_id) WHERE state IN ('due', 'offered', 'running');

-- An agent proposes a scheduled job for itself (choir.propose.schedule).
ALTER TABLE approvals DROP CONSTRAINT approvals_kind_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_kind_check
    CHECK (kind IN ('tool', 'skill', 'config_change', 'call', 'schedule'));
