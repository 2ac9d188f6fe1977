-- The core job each relayed model call was for (as the agent names it;
-- attribution only), so usage can be summed per job (issue 17, item 7).
ALTER TABLE llm_calls ADD COLUMN job text;
