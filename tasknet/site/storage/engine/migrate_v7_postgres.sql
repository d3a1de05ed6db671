-- Schema v7 (PostgreSQL): each node's tasks counted from an index (issue 23: the node
-- panel and dispatch).  Additive only, like v3 to v5: the site applies it
-- by itself at start, in one transaction, and `tasknet-migrate` applies it
-- too.  SQLite's copy is migrate_v7.sql: keep the two alike
-- (a test compares the schemas).  It depends on nothing of v6.
--
-- /api/admin/nodes counts every listed node's tasks by status and queued
-- flag, and the dispatcher counts its nodes' open tasks (storage/stats.py
-- node_activity, storage/dispatch.py node_loads): with this index both read
-- the index alone, never a task's row (B9: 1.1 s to 211 ms for 1,000 nodes
-- over 1,000,000 tasks).
CREATE INDEX IF NOT EXISTS gallery_node_status ON gallery(node_id, status, queued);

INSERT INTO schema_version (version) VALUES (7) ON CONFLICT DO NOTHING;
