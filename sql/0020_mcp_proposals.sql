-- MCP servers' catalogs are proposed for pinning (an agent files what a
-- server lists; the operator adds a server with choirctl mcp add).
ALTER TABLE approvals DROP CONSTRAINT approvals_kind_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_kind_check
    CHECK (kind IN ('tool', 'skill', 'config_change', 'call', 'schedule', 'mcp'));
