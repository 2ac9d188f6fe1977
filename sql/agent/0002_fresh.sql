-- Fresh embeddings (issue 19, item 5). A new item's vector is stored here
-- first, outside the HNSW index, and found by an exact scan (the partial
-- index lists these rows) until the `memory-index` thread moves it into
-- `embedding` in the background, one short transaction per few items. An
-- upsert then costs no graph search: inserting into pgvector's HNSW graph is
-- a search at ef_construction plus neighbour-list rewrites, 5-30 ms an item
-- at a million items, and stays that whoever does it.
-- At most memory.fresh_max items per agent wait here (the batcher sends the
-- rest straight into the index), so the exact scan stays bounded.
-- Invariant: an item has at most one vector, in `fresh` or in `embedding`.
ALTER TABLE {schema}.items ADD COLUMN fresh vector({dims});
ALTER TABLE {schema}.items ADD CONSTRAINT items_one_vector CHECK (fresh IS NULL OR embedding IS NULL) NOT VALID;
CREATE INDEX items_fresh ON {schema}.items (id) WHERE fresh IS NOT NULL;
-- Statistics for the new column now (a sample, fast at a million rows):
-- without them the planner takes `fresh IS NOT NULL` to hold for 99.5 % of
-- rows. The statements that read fresh rows also turn sequential scans off.
ANALYZE {schema}.items (fresh);
