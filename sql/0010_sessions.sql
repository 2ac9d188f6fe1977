-- `choirctl sessions`: what a session ran in (a container id, or a process
-- id), and indexes to count a session's commits and model tokens.
ALTER TABLE sessions ADD COLUMN instance text;
CREATE INDEX commit_events_session ON commit_events (session_id);
CREATE INDEX llm_calls_session ON llm_calls (session_id);
