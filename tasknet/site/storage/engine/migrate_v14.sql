-- Schema v14: an operator's control of a node (issue 36, item 6).
-- Additive, like v3 to v13: the site applies it by itself at start, in one
-- transaction, and `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v14_postgres.sql: keep the two alike (a test compares the schemas).

-- A node that takes no new work: DRAINING (finishes what it holds, then is
-- drained) or PAUSED (until resumed); download_limit bounds the tasks the
-- site's dispatcher gives it that are not yet completed (NULL: no bound).
-- No row: ACTIVE with no bound.  Read by storage/node_control.py, which
-- storage/dispatch.py's assignment consults in the same transaction.
CREATE TABLE IF NOT EXISTS node_control (
    node_id         TEXT    PRIMARY KEY,
    mode            TEXT    NOT NULL CHECK (mode IN ('ACTIVE', 'DRAINING', 'PAUSED')),
    download_limit  INTEGER CHECK (download_limit IS NULL OR download_limit >= 1),
    actor           TEXT    NOT NULL,
    note            TEXT    NOT NULL,
    changed_at      TEXT    NOT NULL
);

INSERT OR IGNORE INTO schema_version (version) VALUES (14);
