-- Proposals agents make (R-TOOL-8) and the humans' decisions on them (R-CTL-1).
-- `content` is the canonical JSON (sorted keys) of the proposal exactly as it
-- was validated, and `sha256` its digest: an approval is bound to that digest,
-- so content that no longer hashes to it is not approved content.
CREATE TABLE approvals (
    id               bigserial PRIMARY KEY,
    agent_id         text        NOT NULL,
    kind             text        NOT NULL CHECK (kind IN ('tool', 'skill', 'config_change')),
    scope            text        NOT NULL CHECK (scope IN ('agent', 'global')),
    subject          text        NOT NULL,
    content          text        NOT NULL,
    sha256           text        NOT NULL,
    reason           text        NOT NULL,
    lane             text        NOT NULL,
    skill            text,
    state            text,
    conversation     text,
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'approved', 'rejected')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    decided_at       timestamptz,
    decided_by       text,
    decision_reason  text,
    -- How it was applied: the repository commit, or the config keys changed.
    applied          text,
    -- When the decision was handed to the agent (once).
    delivered_at     timestamptz
);
CREATE INDEX approvals_by_status ON approvals (status, id);
CREATE INDEX approvals_undelivered ON approvals (agent_id, id)
    WHERE decided_at IS NOT NULL AND delivered_at IS NULL;
