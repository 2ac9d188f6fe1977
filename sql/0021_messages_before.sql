-- What a message's store knows of its agent's messages once it holds the
-- agent's lock (0018): the highest id still waiting for an answer, and
-- whether the message's conversation had messages before. Every writer of
-- the agent's messages takes that lock and holds it to its commit, so the
-- fresh snapshot each statement of a VOLATILE function takes after the
-- lock sees every earlier message of the agent.
--
-- choird hands a message it just stored to the agent's waiting long-poll
-- from memory, instead of reading it back, when it knows every pending
-- message before it was handed out already: `pending` no higher than what
-- the poll last knew. Otherwise the poll asks, as before.
CREATE FUNCTION agent_messages_before(agent text, conv text, OUT pending bigint, OUT earlier boolean)
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM lock_agent_messages(agent);
    SELECT (SELECT max(id) FROM messages WHERE agent_id = agent AND replied_at IS NULL),
           EXISTS (SELECT 1 FROM messages WHERE agent_id = agent AND conversation = conv)
      INTO pending, earlier;
END
$$;
