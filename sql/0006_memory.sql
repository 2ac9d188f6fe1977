-- Agent memory (R-MEM-1, -2). Each agent's items live in its own schema,
-- `agent_<id>`, made by the per-agent migrations in sql/agent/ (recorded
-- here, per agent, with the embedding dimension they were made for).
CREATE TABLE agent_migrations (
    agent_id    text        NOT NULL,
    version     integer     NOT NULL,
    name        text        NOT NULL,
    dimensions  integer     NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, version)
);

-- Items waiting for their embedding: written with the item, deleted when the
-- embedding is stored. The endpoint being down only makes this wait longer.
CREATE TABLE embedding_outbox (
    id          bigserial   PRIMARY KEY,
    agent_id    text        NOT NULL,
    item_id     bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    attempts    integer     NOT NULL DEFAULT 0,
    last_error  text,
    UNIQUE (agent_id, item_id)
);

-- Embeddings of tool descriptions (choir.tools.find), by the sha256 of the
-- text embedded and the model: made once per distinct description.
CREATE TABLE tool_embeddings (
    text_sha256  text        NOT NULL,
    model        text        NOT NULL,
    embedding    real[]      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (text_sha256, model)
);
