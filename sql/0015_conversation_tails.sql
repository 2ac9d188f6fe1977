-- An agent holds at most a few conversations in memory and recalls the
-- others' tails from here when they speak again (issue 19): reading one
-- conversation's messages, and its latest compaction, must not scan the
-- agent's whole history. The first index also serves the hand-out's
-- "messages before this one?" probe and the notice check (`addressed`).
CREATE INDEX messages_conversation ON messages (agent_id, conversation, id);

CREATE INDEX commit_events_compactions
    ON commit_events (agent_id, (event->'input'->>'conversation'), seq DESC)
    WHERE event->>'kind' = 'compaction' AND event->>'outcome' = 'ok';
