-- Prompt tokens a provider served from its prompt cache (cheaper) and wrote
-- to it (dearer), when it reports them: Anthropic's cache_read_input_tokens
-- and cache_creation_input_tokens, OpenAI's prompt_tokens_details.cached_tokens.
-- They are part of prompt_tokens too.
ALTER TABLE llm_calls ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE llm_calls ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;
