-- Schema v11 in PostgreSQL's spelling (migrate_v11.sql is SQLite's; keep the
-- two alike: a test compares the schemas).  A completed task's archive
-- digest: see migrate_v11.sql.
ALTER TABLE gallery ADD COLUMN archive_size BIGINT
    CHECK (archive_size IS NULL OR archive_size >= 0);
ALTER TABLE gallery ADD COLUMN archive_sha256 TEXT
    CHECK (archive_sha256 IS NULL OR archive_sha256 ~ '^[0-9a-f]{64}$');

INSERT INTO schema_version (version) VALUES (11) ON CONFLICT DO NOTHING;
