-- Schema v5: fencing and trust (issue 19).  Additive only, like v3 and v4:
-- the site applies it by itself at start, in one transaction, and
-- `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v5_postgres.sql: keep the two alike (a test compares the schemas).

-- == fencing (SCALE.md "Fencing" 2) ==

-- An UNKNOWN settled by a reap: the earliest moment a "not_submitted"
-- verdict may be given (the dead instance's last lease confirmation + the
-- upstream timeout + the lease timeout; ISO 8601 UTC).  NULL: no wait.
ALTER TABLE task_operation ADD COLUMN verdict_not_before TEXT;
-- When the dead instance last confirmed its lease, as the reap found it.
ALTER TABLE instance_reap ADD COLUMN lease_confirmed_at TEXT;
-- Each instance's lease timeout and upstream timeout (seconds), so that the
-- site reaping it computes the verdict's wait with the dead one's figures.
ALTER TABLE site_instance ADD COLUMN lease_timeout REAL;
ALTER TABLE site_instance ADD COLUMN upstream_timeout REAL;
-- Which kernel and pid namespace the instance ran in (Linux: boot id and
-- pid namespace): a reaper in the same one can tell a dead process (its pid
-- is gone) from a paused one, and need not wait out a dead one's lease.
ALTER TABLE site_instance ADD COLUMN process_space TEXT;

-- When each instance last confirmed its lease (its lease check found its
-- lock held), by the database's clock: a reaper settles a gone instance
-- only once this is a lease timeout old, so that the instance, were it
-- only paused, finds its own lease stale whenever it resumes (SCALE.md
-- "Fencing" 1).  Not in site_instance: every write transaction of a site
-- reads that row FOR SHARE, which an UPDATE here would have to wait for.
CREATE TABLE IF NOT EXISTS instance_lease (
    instance_id   INTEGER PRIMARY KEY,
    confirmed_at  TEXT    NOT NULL
);

-- == browser sessions (INTERFACES.md "Sessions and downloads") ==

-- One row per signed-in browser: the cookie holds a random id, stored here
-- only as its sha256 (id_hash).  A session ends at sign-out, at its idle or
-- absolute expiry, when its user's token is rotated or revoked, or by an
-- admin (tasknet-admin session end).
CREATE TABLE IF NOT EXISTS web_session (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    id_hash       TEXT    NOT NULL UNIQUE,
    user_id       INTEGER NOT NULL REFERENCES "user"(id) ON DELETE CASCADE,
    created_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_seen_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    idle_until    TEXT    NOT NULL,
    expires_at    TEXT    NOT NULL,
    ended_at      TEXT,
    ended_why     TEXT
);
CREATE INDEX IF NOT EXISTS web_session_user ON web_session(user_id) WHERE ended_at IS NULL;

-- == users an admin disabled (tasknet-admin user disable|enable) ==

-- When the user was disabled (ISO 8601 UTC); NULL while enabled.  A
-- disabled user's token and sessions authenticate nothing; its tasks stay.
ALTER TABLE "user" ADD COLUMN disabled_at TEXT;

-- == queued work and the node's word on a task (issue 21, items 2 and 3) ==

-- A task its node holds but has not started (a v2 TaskReport entry's
-- ``queued``): 1 while the last applied entry said so, else 0.  Shown as
-- SUBMITTED (已提交), counted apart from DOWNLOADING.
ALTER TABLE gallery ADD COLUMN queued INTEGER NOT NULL DEFAULT 0;
-- What the node says of the task (the entry's ``detail``: retrying,
-- upstream unreachable, disk full; at most 256 characters); NULL: nothing.
ALTER TABLE gallery ADD COLUMN detail TEXT;

-- == report receipts by a key of their own (issue 22) ==

-- Retention pages receipts in insert order: by their key ``id`` (until v4
-- SQLite's implicit rowid, which PostgreSQL had to imitate), the same on
-- both engines.  Each receipt keeps its rowid as its id, so the order stays.
ALTER TABLE report_receipt RENAME TO report_receipt_v4;
CREATE TABLE report_receipt (
    id           INTEGER PRIMARY KEY,
    report_id    TEXT    NOT NULL UNIQUE,
    node_id      TEXT    NOT NULL,
    revision     INTEGER NOT NULL,
    received_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT INTO report_receipt (id, report_id, node_id, revision, received_at)
    SELECT rowid, report_id, node_id, revision, received_at FROM report_receipt_v4;
DROP TABLE report_receipt_v4;

INSERT OR IGNORE INTO schema_version (version) VALUES (5);
