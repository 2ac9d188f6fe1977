-- Messages of one agent commit in the order of their ids.
--
-- An agent is handed its messages past a position (`id > delivered_upto`)
-- and its processed position moves to the highest id it answered. Ids come
-- from one sequence every writer shares, so a message that drew its id
-- before another message of its agent and committed after it (two chats at
-- once, a Telegram batch beside a chat or the dispatcher) was passed over
-- for good: its agent had moved past it. Every statement that queues a
-- message calls this first, for each agent it queues for (in the order of
-- their names, so two callers never wait for each other in a cycle), and
-- holds the lock until its commit: a later message of the agent draws its
-- id only once the earlier one is visible. Messages of other agents do not
-- wait.
CREATE FUNCTION lock_agent_messages(agent text) RETURNS void
    LANGUAGE sql VOLATILE
    AS $$ SELECT pg_advisory_xact_lock(hashtextextended('choir.messages:' || agent, 0)) $$;
