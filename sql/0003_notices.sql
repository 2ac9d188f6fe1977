-- What agents say on their own (not in answer to a message), e.g. the result of
-- a core job relayed by the edge lane. `key` is chosen by the agent so a resent
-- notice is stored once.
CREATE TABLE notices (
    id            bigserial PRIMARY KEY,
    agent_id      text        NOT NULL,
    conversation  text        NOT NULL,
    key           text        NOT NULL,
    text          text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    UNIQUE (agent_id, key)
);
CREATE INDEX notices_pending ON notices (agent_id, id) WHERE delivered_at IS NULL;
