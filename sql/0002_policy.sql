-- Operator policies that must survive a restart, e.g. the global kill switch.
CREATE TABLE policy (
    key         text        PRIMARY KEY,
    value       jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text        NOT NULL
);
