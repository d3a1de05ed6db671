-- Task lifecycle v2 (LIFECYCLE.md). Standalone statements only: no BEGIN or
-- COMMIT. The wrapper (tasknet-migrate, and the site on a fresh database)
-- runs the whole script in one transaction after a backup. Every statement is
-- idempotent, so a second run changes nothing.

-- Fails on a database with duplicate gids; the wrapper lists them first and
-- stops, it never deletes rows.
CREATE UNIQUE INDEX IF NOT EXISTS gallery_gid_unique ON gallery(gid);

-- One row per gid: the current generation (or its DELETED tombstone).
CREATE TABLE IF NOT EXISTS task_operation (
    gid                  INTEGER PRIMARY KEY,
    operation_id         TEXT    NOT NULL UNIQUE,
    state                TEXT    NOT NULL CHECK (state IN
        ('RESERVED', 'SUBMITTING', 'SUBMITTED', 'UNKNOWN', 'DELETE_PENDING', 'DELETED')),
    user_id              INTEGER REFERENCES user(id),
    cost                 INTEGER,                -- known after prepare
    metered              INTEGER NOT NULL DEFAULT 0 CHECK (metered IN (0, 1)),
    metered_week         TEXT,                   -- ISO week the cost was added to
    archive_url          TEXT,
    legacy               INTEGER NOT NULL DEFAULT 0 CHECK (legacy IN (0, 1)),  -- backfilled
    step                 TEXT,                   -- last lifecycle step reached (evidence)
    error                TEXT,                   -- why it became UNKNOWN (evidence)
    unknown_at           TEXT,
    last_revision        INTEGER,                -- last applied report revision
    dispatched           INTEGER NOT NULL DEFAULT 0 CHECK (dispatched IN (0, 1)),
    delete_operation_id  TEXT UNIQUE,
    delete_result        TEXT CHECK (delete_result IN ('FAILED')),
    delete_reason        TEXT,
    created_at           TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at           TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS task_operation_state ON task_operation(state, gid);

-- Dispatch pages a node's tasks by gid and counts each node's load; without
-- this index every page would scan the whole gallery table.
CREATE INDEX IF NOT EXISTS gallery_node ON gallery(node_id, gid);

-- The allowed transitions, mirrored from tasknet/site/transitions.py (a test
-- compares the two). 'NONE' stands for "no row".
CREATE TABLE IF NOT EXISTS task_transition (
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT OR IGNORE INTO task_transition (from_state, to_state) VALUES
    ('NONE', 'RESERVED'),
    ('DELETED', 'RESERVED'),
    ('NONE', 'SUBMITTED'),
    ('RESERVED', 'SUBMITTING'),
    ('RESERVED', 'NONE'),
    ('SUBMITTING', 'SUBMITTED'),
    ('SUBMITTING', 'UNKNOWN'),
    ('SUBMITTING', 'NONE'),
    ('UNKNOWN', 'SUBMITTED'),
    ('UNKNOWN', 'NONE'),
    ('SUBMITTED', 'DELETE_PENDING'),
    ('DELETE_PENDING', 'DELETED');

CREATE TRIGGER IF NOT EXISTS task_operation_insert_allowed
BEFORE INSERT ON task_operation
WHEN NOT EXISTS (SELECT 1 FROM task_transition
                 WHERE from_state = 'NONE' AND to_state = NEW.state)
BEGIN
    SELECT RAISE(ABORT, 'illegal task_operation transition');
END;

CREATE TRIGGER IF NOT EXISTS task_operation_update_allowed
BEFORE UPDATE OF state ON task_operation
WHEN NEW.state <> OLD.state
 AND NOT EXISTS (SELECT 1 FROM task_transition
                 WHERE from_state = OLD.state AND to_state = NEW.state)
BEGIN
    SELECT RAISE(ABORT, 'illegal task_operation transition');
END;

CREATE TRIGGER IF NOT EXISTS task_operation_delete_allowed
BEFORE DELETE ON task_operation
WHEN NOT EXISTS (SELECT 1 FROM task_transition
                 WHERE from_state = OLD.state AND to_state = 'NONE')
BEGIN
    SELECT RAISE(ABORT, 'illegal task_operation transition');
END;

-- An operationId is never rewritten, except by a new CREATE over a tombstone.
CREATE TRIGGER IF NOT EXISTS task_operation_id_stable
BEFORE UPDATE OF operation_id ON task_operation
WHEN NEW.operation_id <> OLD.operation_id
 AND NOT (OLD.state = 'DELETED' AND NEW.state = 'RESERVED')
BEGIN
    SELECT RAISE(ABORT, 'operationId may not be rewritten');
END;

-- A node's report, recorded in the transaction that applied it.
CREATE TABLE IF NOT EXISTS report_receipt (
    report_id    TEXT    PRIMARY KEY,
    node_id      TEXT    NOT NULL,
    revision     INTEGER NOT NULL,
    received_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Notifications, written in the transaction of the change they announce and
-- delivered after commit by the outbox executor.
CREATE TABLE IF NOT EXISTS notification_outbox (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    gid                INTEGER NOT NULL,
    user_id            INTEGER,
    payload            TEXT    NOT NULL,          -- JSON: {"type": "task", "task": {...}}
    created_at         TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    ws_delivered_at    TEXT,
    webhook_state      TEXT    NOT NULL DEFAULT 'pending'
        CHECK (webhook_state IN ('pending', 'delivered', 'skipped', 'failed')),
    webhook_attempts   INTEGER NOT NULL DEFAULT 0,
    webhook_error      TEXT
);
CREATE INDEX IF NOT EXISTS notification_outbox_pending
    ON notification_outbox(ws_delivered_at, webhook_state);

-- Every reconciliation verdict, who gave it and why.
CREATE TABLE IF NOT EXISTS reconciliation_audit (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    gid           INTEGER NOT NULL,
    operation_id  TEXT    NOT NULL,
    verdict       TEXT    NOT NULL CHECK (verdict IN ('submitted', 'not_submitted')),
    actor         TEXT    NOT NULL,
    note          TEXT    NOT NULL DEFAULT '',
    evidence      TEXT,                           -- JSON snapshot shown to the actor
    resolved_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Node secrets managed by tasknet-admin (in addition to --node-key options).
CREATE TABLE IF NOT EXISTS node_key (
    node_id     TEXT PRIMARY KEY,
    secret      TEXT NOT NULL,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER PRIMARY KEY,
    applied_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT OR IGNORE INTO schema_version (version) VALUES (2);
