-- An agent holds at most a few conversations in memory and recalls the
-- others' tails from here when they speak again (issue 19): reading one
-- conversation's answered messages, and its latest compaction, must not scan
-- the agent's whole history. Partial: a message enters the index when it is
-- answered (that UPDATE writes a new row version into every index anyway),
-- so storing an incoming message pays nothing for it. It also serves the
-- hand-out's "answered messages before this one?" probe.
CREATE INDEX messages_answered ON messages (agent_id, conversation, id) WHERE replied_at IS NOT NULL;

CREATE INDEX commit_events_compactions
    ON commit_events (agent_id, (event->'input'->>'conversation'), seq DESC)
    WHERE event->>'kind' = 'compaction' AND event->>'outcome' = 'ok';
