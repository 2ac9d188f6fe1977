-- The processed position in a row of its own (issue 19, item 1). The
-- agent's answers (its link-reply thread) store it, while HEARTBEATs of
-- replicated events (link-push) hold agent_state's row locked from the
-- chain head's lock to their commit: in the same row an answer waited for
-- the core jobs' replication commit before its own.
CREATE TABLE agent_processed (
    agent_id       text   PRIMARY KEY,
    processed_upto bigint NOT NULL DEFAULT 0
);
-- A position past every message (the agent's word, stored as sent before
-- positions were cut to the highest message id) would keep its agent from
-- being handed a message again: it is cut here too.
INSERT INTO agent_processed (agent_id, processed_upto)
    SELECT agent_id, LEAST(processed_upto, (SELECT coalesce(max(id), 0) FROM messages)) FROM agent_state;
ALTER TABLE agent_state DROP COLUMN processed_upto;
