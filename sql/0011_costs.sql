-- The cost ledger: each relayed model call's estimated cost (from the
-- operator's price table at the time of the call; NULL when its model had
-- no price), and an index for usage by agent over time.
ALTER TABLE llm_calls ADD COLUMN cost_usd double precision;
CREATE INDEX llm_calls_agent_at ON llm_calls (agent_id, at);
