-- Schema v10 in PostgreSQL's spelling: nothing changes here.  v10 rebuilds
-- SQLite's trigram table of the task search (migrate_v10.sql); PostgreSQL's
-- pg_trgm indexes serve the ILIKE itself and stay as v6 made them.

INSERT INTO schema_version (version) VALUES (10) ON CONFLICT DO NOTHING;
