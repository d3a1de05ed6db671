-- Schema v8 in PostgreSQL's spelling (migrate_v8.sql is SQLite's; keep the
-- two alike: a test compares the schemas).  /api/stats from rollups: see
-- migrate_v8.sql.  user_id 0 stands for every user.

CREATE TABLE throughput_total (
    user_id    BIGINT  NOT NULL,
    minute     BIGINT  NOT NULL,
    bytes      BIGINT  NOT NULL DEFAULT 0,
    completed  BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, minute)
);
CREATE INDEX throughput_total_minute ON throughput_total(minute);

CREATE TABLE throughput_node (
    user_id  BIGINT  NOT NULL,
    grain    INTEGER NOT NULL,
    slot     BIGINT  NOT NULL,
    node_id  TEXT    NOT NULL,
    bytes    BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, grain, slot, node_id)
);
CREATE INDEX throughput_node_slot ON throughput_node(grain, slot);

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

INSERT INTO schema_version (version) VALUES (8) ON CONFLICT DO NOTHING;
