-- Quotas (hostile agents): tokens spent per agent and UTC day, so the token
-- budget holds across sessions and restarts; relayed calls whose endpoint
-- reported no usage are marked as estimated; embedding outbox items that
-- kept failing are set aside instead of being retried forever.
CREATE TABLE token_usage (
    agent_id  text    NOT NULL,
    day       date    NOT NULL,
    tokens    bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, day)
);
INSERT INTO token_usage (agent_id, day, tokens)
    SELECT agent_id, (at AT TIME ZONE 'UTC')::date, sum(prompt_tokens + completion_tokens)
    FROM llm_calls GROUP BY 1, 2;

ALTER TABLE llm_calls ADD COLUMN estimated boolean NOT NULL DEFAULT false;

ALTER TABLE embedding_outbox ADD COLUMN failed_at timestamptz;
