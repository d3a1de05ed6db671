-- Schema v8: /api/stats from rollups (issue 23, item 4).  Additive only,
-- like v3 to v5: the site applies it by itself at start, in one
-- transaction, and `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v8_postgres.sql: keep the two alike (a test compares the schemas).
-- It depends on nothing of v6 or v7.
--
-- Both tables are written by tasknet/site/storage/throughput.py in the same
-- statements' transaction as throughput_minute (the report's own), so they
-- say exactly what its rows say, and are pruned with it (older than
-- throughput.KEEP_MINUTES).  user_id 0 stands for every user (the admin's
-- view); real user ids start at 1.

-- Bytes and completions per user and minute, and of every user (0) per
-- minute: a chart's total line without reading a row per node.
CREATE TABLE IF NOT EXISTS throughput_total (
    user_id    INTEGER NOT NULL,
    minute     INTEGER NOT NULL,
    bytes      INTEGER NOT NULL DEFAULT 0,
    completed  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, minute)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS throughput_total_minute ON throughput_total(minute);

-- Bytes per user (0: every user) and node in coarse slots: grain 900 (a
-- quarter of an hour), 3600 or 21600 seconds, slot = unix time // grain.
-- The top nodes of a window and their 15-minute buckets are read from here.
CREATE TABLE IF NOT EXISTS throughput_node (
    user_id  INTEGER NOT NULL,
    grain    INTEGER NOT NULL,
    slot     INTEGER NOT NULL,
    node_id  TEXT    NOT NULL,
    bytes    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, grain, slot, node_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS throughput_node_slot ON throughput_node(grain, slot);

-- The history so far (throughput_minute is kept 25 hours).
INSERT INTO throughput_total (user_id, minute, bytes, completed)
    SELECT user_id, minute, SUM(bytes), SUM(completed) FROM throughput_minute
    GROUP BY user_id, minute;
INSERT INTO throughput_total (user_id, minute, bytes, completed)
    SELECT 0, minute, SUM(bytes), SUM(completed) FROM throughput_minute GROUP BY minute;
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes)
    SELECT user_id, 900, minute / 15, node_id, SUM(bytes) FROM throughput_minute
    WHERE bytes > 0 GROUP BY user_id, minute / 15, node_id;
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes)
    SELECT 0, 900, minute / 15, node_id, SUM(bytes) FROM throughput_minute
    WHERE bytes > 0 GROUP BY minute / 15, node_id;
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes)
    SELECT user_id, 3600, minute / 60, node_id, SUM(bytes) FROM throughput_minute
    WHERE bytes > 0 GROUP BY user_id, minute / 60, node_id;
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes)
    SELECT 0, 3600, minute / 60, node_id, SUM(bytes) FROM throughput_minute
    WHERE bytes > 0 GROUP BY minute / 60, node_id;
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes)
    SELECT user_id, 21600, minute / 360, node_id, SUM(bytes) FROM throughput_minute
    WHERE bytes > 0 GROUP BY user_id, minute / 360, node_id;
INSERT INTO throughput_node (user_id, grain, slot, node_id, bytes)
    SELECT 0, 21600, minute / 360, node_id, SUM(bytes) FROM throughput_minute
    WHERE bytes > 0 GROUP BY minute / 360, node_id;

INSERT OR IGNORE INTO schema_version (version) VALUES (8);
