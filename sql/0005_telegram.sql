-- The Telegram gateway (R-GW). An update is stored here before its offset is
-- confirmed to Telegram (by the next getUpdates), and handled exactly once:
-- the user message it becomes and its `handled_at` are written in one
-- transaction, and a message row is unique per (bot, update).
CREATE TABLE telegram_updates (
    bot          text        NOT NULL,
    update_id    bigint      NOT NULL,
    payload      jsonb       NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    handled_at   timestamptz,
    outcome      text,
    PRIMARY KEY (bot, update_id)
);
CREATE INDEX telegram_updates_pending ON telegram_updates (bot, update_id) WHERE handled_at IS NULL;

-- Per bot, the offset to ask for next: every update below it is stored above.
CREATE TABLE telegram_offsets (
    bot          text        PRIMARY KEY,
    next_offset  bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- What the gateway sends, in id order per chat. A row is written in the same
-- transaction as the answer it carries, so an answer recorded is sent even
-- across a restart; `sent_at` is set once Telegram accepted it.
CREATE TABLE telegram_outbox (
    id                   bigserial   PRIMARY KEY,
    bot                  text        NOT NULL,
    chat_id              bigint      NOT NULL,
    kind                 text        NOT NULL CHECK (kind IN ('text', 'file', 'edit')),
    body                 jsonb       NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    attempts             integer     NOT NULL DEFAULT 0,
    last_error           text,
    sent_at              timestamptz,
    failed               text,
    telegram_message_id  bigint
);
CREATE INDEX telegram_outbox_unsent ON telegram_outbox (bot, id) WHERE sent_at IS NULL AND failed IS NULL;

-- Users a bot does not know, refused once each.
CREATE TABLE telegram_refused (
    bot      text        NOT NULL,
    user_id  bigint      NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bot, user_id)
);

-- Unknown users who asked to be let in (bots with `pairing`), and the decision.
CREATE TABLE telegram_pairings (
    bot           text        NOT NULL,
    user_id       bigint      NOT NULL,
    username      text,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved', 'refused')),
    decided_by    text,
    decided_at    timestamptz,
    PRIMARY KEY (bot, user_id)
);

-- Where a message came from, when it came from Telegram:
-- {"bot", "update_id", "chat_id", "user_id", "message_id"}.
ALTER TABLE messages ADD COLUMN origin jsonb;
CREATE UNIQUE INDEX messages_telegram_update ON messages ((origin->>'bot'), (origin->>'update_id'))
    WHERE origin IS NOT NULL;
