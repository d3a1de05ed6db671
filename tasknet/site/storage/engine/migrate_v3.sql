-- Schema v3: additive only (new tables, new nullable or defaulted columns,
-- new indexes).  The site applies it by itself at start, in one transaction,
-- to a v2 database; `tasknet-migrate` applies it too.  Nothing here rewrites
-- or deletes existing rows.

-- == ownership (node ownership, per-node revision epochs) ==

-- Per node: the highest revision of a report recorded from it in its current
-- epoch.  A fresh report at or below it means the node's revisions went
-- backwards (its data was wiped, its clock is behind): that report starts a
-- new epoch (epoch + 1) and the tasks assigned to the node forget their
-- last_revision (PROTOCOL.md "Ownership"; docs/protocol.md).
CREATE TABLE IF NOT EXISTS node_revision (
    node_id           TEXT    PRIMARY KEY,
    high_revision     INTEGER NOT NULL,
    epoch             INTEGER NOT NULL DEFAULT 0,
    epoch_started_at  TEXT
);
-- Seeded from the receipts a v2 site kept, so the first report after the
-- upgrade is judged against what the node really sent before.
INSERT OR IGNORE INTO node_revision (node_id, high_revision)
    SELECT node_id, MAX(revision) FROM report_receipt GROUP BY node_id;

-- Report entries dropped, per node and reason (not_owner, stale, ...): what
-- /api/admin/nodes shows as droppedEntries.
CREATE TABLE IF NOT EXISTS node_dropped_entry (
    node_id   TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    count     INTEGER NOT NULL DEFAULT 0,
    last_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (node_id, reason)
) WITHOUT ROWID;

-- == growth (pruning, rate limits, bounded traces) ==

-- The ISO week the create's quota check counted this generation against
-- (written with SUBMITTING): an UNKNOWN resolved "submitted" is metered
-- into it, not into the week of the resolution.
ALTER TABLE task_operation ADD COLUMN quota_week TEXT;

-- == operator safety (force delete, instance lock) ==
-- Every forced completion of a stuck DELETE_PENDING: who, why, and what the
-- node would have had to confirm (the instance lock is a file, not a table).
CREATE TABLE IF NOT EXISTS force_delete_audit (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    gid                  INTEGER NOT NULL,
    operation_id         TEXT    NOT NULL,
    delete_operation_id  TEXT    NOT NULL,
    node_id              TEXT,
    actor                TEXT    NOT NULL,
    note                 TEXT    NOT NULL,
    forced_at            TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS force_delete_audit_gid ON force_delete_audit(gid, id);

-- == views (sizes, bytes, speed, completion time, nodes seen) ==

-- Per task (a gallery row is one generation, so these reset with it):
-- the archive size from prepare, when the COMPLETED report was applied, and
-- the throughput sample of the last applied report (tasknet/site/storage/
-- throughput.py): smoothed bytes/s, when sampled, when progress last moved
-- (unix seconds, as the site's clock gives them).
ALTER TABLE gallery ADD COLUMN size INTEGER;
ALTER TABLE gallery ADD COLUMN completed_at TEXT;
ALTER TABLE gallery ADD COLUMN speed REAL;
ALTER TABLE gallery ADD COLUMN sampled_at REAL;
ALTER TABLE gallery ADD COLUMN moved_at REAL;

-- Keyset pages of GET /api/tasks in creation order (everyone's, one user's).
CREATE INDEX IF NOT EXISTS gallery_created ON gallery(created_at, gid);
CREATE INDEX IF NOT EXISTS gallery_user_created ON gallery(user_id, created_at, gid);

-- Bytes downloaded and tasks completed per minute (unix minute number), by
-- node and owner, for GET /api/stats; kept a little over the largest window.
CREATE TABLE IF NOT EXISTS throughput_minute (
    minute     INTEGER NOT NULL,
    node_id    TEXT    NOT NULL,
    user_id    INTEGER NOT NULL,
    bytes      INTEGER NOT NULL DEFAULT 0,
    completed  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, node_id, user_id)
) WITHOUT ROWID;

-- Bytes downloaded per node since the database was created (never pruned):
-- the site's byte counters are read from here, so they only count what
-- committed.
CREATE TABLE IF NOT EXISTS node_bytes (
    node_id  TEXT    PRIMARY KEY,
    bytes    INTEGER NOT NULL DEFAULT 0
);

-- Every node that logged in, with when it was last seen, so the node panel
-- keeps disconnected nodes (those seen in the last 7 days).
CREATE TABLE IF NOT EXISTS node_seen (
    node_id         TEXT    PRIMARY KEY,
    protocol        INTEGER,
    features        TEXT    NOT NULL DEFAULT '[]',   -- JSON array
    connected_at    TEXT,                            -- null while disconnected
    last_seen_at    TEXT    NOT NULL,
    last_report_at  TEXT
);

INSERT OR IGNORE INTO schema_version (version) VALUES (3);
