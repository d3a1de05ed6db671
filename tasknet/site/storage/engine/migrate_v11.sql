-- Schema v11: a completed task's archive digest (DELIVERY.md "Integrity").
-- Additive only, like v3 to v10: the site applies it by itself at start, in
-- one transaction, and `tasknet-migrate` applies it too.  PostgreSQL's copy
-- is migrate_v11_postgres.sql: keep the two alike (a test compares the
-- schemas).
--
-- archive_size and archive_sha256 are what the node that completed the
-- task reported with the completion (a v2 TaskReport entry of status 4):
-- NULL when unknown (a legacy node, an older v2 node, a task not complete)
-- and cleared when the gid is created again (storage/create.py).  v3's
-- `size` is the archive size from prepare, known before the download; these
-- are the bytes the node wrote, as the user will fetch and verify them.
ALTER TABLE gallery ADD COLUMN archive_size INTEGER
    CHECK (archive_size IS NULL OR archive_size >= 0);
ALTER TABLE gallery ADD COLUMN archive_sha256 TEXT
    CHECK (archive_sha256 IS NULL
           OR (length(archive_sha256) = 64 AND archive_sha256 NOT GLOB '*[^0-9a-f]*'));

INSERT OR IGNORE INTO schema_version (version) VALUES (11);
