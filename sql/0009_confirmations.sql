-- Confirmations: a human agrees to one exact tool call (kind 'call') before
-- it runs. The lane waits for the decision up to `expires_at`; a call not
-- decided by then is refused, and can no longer be approved.
ALTER TABLE approvals DROP CONSTRAINT approvals_kind_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_kind_check CHECK (kind IN ('tool', 'skill', 'config_change', 'call'));
ALTER TABLE approvals ADD COLUMN expires_at timestamptz;
