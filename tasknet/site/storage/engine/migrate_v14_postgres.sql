-- Schema v14 in PostgreSQL's spelling (migrate_v14.sql is SQLite's; keep the
-- two alike: a test compares the schemas).  A node's control: see migrate_v14.sql.

CREATE TABLE node_control (
    node_id         TEXT    PRIMARY KEY,
    mode            TEXT    NOT NULL CHECK (mode IN ('ACTIVE', 'DRAINING', 'PAUSED')),
    download_limit  BIGINT  CHECK (download_limit IS NULL OR download_limit >= 1),
    actor           TEXT    NOT NULL,
    note            TEXT    NOT NULL,
    changed_at      TEXT    NOT NULL
);

INSERT INTO schema_version (version) VALUES (14) ON CONFLICT DO NOTHING;
