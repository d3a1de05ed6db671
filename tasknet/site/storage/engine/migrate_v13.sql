-- Schema v13: custody, the site knows what each node holds (DELIVERY.md,
-- issue 34).  Additive, like v3 to v12: the site applies it by itself at
-- start, in one transaction, and `tasknet-migrate` applies it too.
-- PostgreSQL's copy is migrate_v13_postgres.sql: keep the two alike (a
-- test compares the schemas).

-- == a completed generation whose archive no node holds any more ==

-- Set by storage/custody.py (a release, an inventory that misses it, a
-- retired node), cleared with the rest of the row when the gid is created
-- again.  The reason is the release's (PROTOCOL.md) or NODE_RETIRED.
ALTER TABLE gallery ADD COLUMN archive_gone_reason TEXT CHECK (archive_gone_reason IN
    ('EXPIRED', 'DISK_BUDGET', 'CORRUPT', 'MISSING', 'CANCELLED', 'NODE_RETIRED'));
ALTER TABLE gallery ADD COLUMN archive_gone_at TEXT;
ALTER TABLE gallery ADD COLUMN archive_gone_node TEXT;

-- Creating such a gid again is a new generation over a SUBMITTED one
-- (confirmCharge): allowed only while its archive is gone, and only then
-- may its operationId be replaced.
INSERT OR IGNORE INTO task_transition (from_state, to_state) VALUES ('SUBMITTED', 'RESERVED');

CREATE TRIGGER IF NOT EXISTS task_operation_recreate_only_when_gone
BEFORE UPDATE OF state ON task_operation
WHEN OLD.state = 'SUBMITTED' AND NEW.state = 'RESERVED'
 AND NOT EXISTS (SELECT 1 FROM gallery WHERE gid = NEW.gid AND archive_gone_reason IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'illegal task_operation transition: the archive is not gone');
END;

DROP TRIGGER IF EXISTS task_operation_id_stable;
CREATE TRIGGER task_operation_id_stable
BEFORE UPDATE OF operation_id ON task_operation
WHEN NEW.operation_id <> OLD.operation_id
 AND NOT (OLD.state = 'DELETED' AND NEW.state = 'RESERVED')
 AND NOT (OLD.state = 'SUBMITTED' AND NEW.state = 'RESERVED'
          AND EXISTS (SELECT 1 FROM gallery WHERE gid = NEW.gid AND archive_gone_reason IS NOT NULL))
BEGIN
    SELECT RAISE(ABORT, 'operationId may not be rewritten');
END;

-- == the stored display-status key learns ARCHIVE_GONE (v6's triggers) ==

-- It outranks the node code, not a delete or an unsettled submission
-- (tasknet.status.display_status; views.stored_key is the same in Python).
DROP TRIGGER IF EXISTS gallery_status_key_insert;
DROP TRIGGER IF EXISTS gallery_status_key_update;
DROP TRIGGER IF EXISTS task_operation_status_key_insert;
DROP TRIGGER IF EXISTS task_operation_status_key_update;
DROP TRIGGER IF EXISTS task_operation_status_key_delete;

CREATE TRIGGER IF NOT EXISTS gallery_status_key_insert AFTER INSERT ON gallery
BEGIN
    UPDATE gallery SET status_key = (
        SELECT CASE
            WHEN o.state = 'DELETE_PENDING' AND o.delete_result = 'FAILED' THEN 'DELETE_FAILED'
            WHEN o.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
            WHEN o.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
            WHEN o.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
            WHEN o.state = 'DELETED' THEN 'DELETED'
            WHEN NEW.archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
            WHEN NEW.status = 1 AND COALESCE(NEW.queued, 0) <> 0 THEN 'QUEUED'
            WHEN NEW.status = 1 THEN 'DOWNLOADING'
            WHEN NEW.status = 2 THEN 'WAITING_COMPRESSION'
            WHEN NEW.status = 3 THEN 'COMPRESSING'
            WHEN NEW.status = 4 THEN 'COMPLETED'
            WHEN NEW.status IS NULL OR NEW.status = 0 THEN 'SUBMITTED'
            ELSE '' END
        FROM (SELECT 1) LEFT JOIN task_operation AS o ON o.gid = NEW.gid)
    WHERE id = NEW.id;
END;

CREATE TRIGGER IF NOT EXISTS gallery_status_key_update
AFTER UPDATE OF status, queued, gid, archive_gone_reason ON gallery
WHEN NEW.status IS NOT OLD.status OR NEW.queued IS NOT OLD.queued OR NEW.gid IS NOT OLD.gid
     OR NEW.archive_gone_reason IS NOT OLD.archive_gone_reason
BEGIN
    UPDATE gallery SET status_key = (
        SELECT CASE
            WHEN o.state = 'DELETE_PENDING' AND o.delete_result = 'FAILED' THEN 'DELETE_FAILED'
            WHEN o.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
            WHEN o.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
            WHEN o.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
            WHEN o.state = 'DELETED' THEN 'DELETED'
            WHEN NEW.archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
            WHEN NEW.status = 1 AND COALESCE(NEW.queued, 0) <> 0 THEN 'QUEUED'
            WHEN NEW.status = 1 THEN 'DOWNLOADING'
            WHEN NEW.status = 2 THEN 'WAITING_COMPRESSION'
            WHEN NEW.status = 3 THEN 'COMPRESSING'
            WHEN NEW.status = 4 THEN 'COMPLETED'
            WHEN NEW.status IS NULL OR NEW.status = 0 THEN 'SUBMITTED'
            ELSE '' END
        FROM (SELECT 1) LEFT JOIN task_operation AS o ON o.gid = NEW.gid)
    WHERE id = NEW.id AND status_key IS NOT (
        SELECT CASE
            WHEN o.state = 'DELETE_PENDING' AND o.delete_result = 'FAILED' THEN 'DELETE_FAILED'
            WHEN o.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
            WHEN o.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
            WHEN o.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
            WHEN o.state = 'DELETED' THEN 'DELETED'
            WHEN NEW.archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
            WHEN NEW.status = 1 AND COALESCE(NEW.queued, 0) <> 0 THEN 'QUEUED'
            WHEN NEW.status = 1 THEN 'DOWNLOADING'
            WHEN NEW.status = 2 THEN 'WAITING_COMPRESSION'
            WHEN NEW.status = 3 THEN 'COMPRESSING'
            WHEN NEW.status = 4 THEN 'COMPLETED'
            WHEN NEW.status IS NULL OR NEW.status = 0 THEN 'SUBMITTED'
            ELSE '' END
        FROM (SELECT 1) LEFT JOIN task_operation AS o ON o.gid = NEW.gid);
END;

CREATE TRIGGER IF NOT EXISTS task_operation_status_key_insert AFTER INSERT ON task_operation
BEGIN
    UPDATE gallery SET status_key = CASE
        WHEN NEW.state = 'DELETE_PENDING' AND NEW.delete_result = 'FAILED' THEN 'DELETE_FAILED'
        WHEN NEW.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN NEW.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN NEW.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN NEW.state = 'DELETED' THEN 'DELETED'
        WHEN archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END
    WHERE gid = NEW.gid AND status_key IS NOT (CASE
        WHEN NEW.state = 'DELETE_PENDING' AND NEW.delete_result = 'FAILED' THEN 'DELETE_FAILED'
        WHEN NEW.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN NEW.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN NEW.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN NEW.state = 'DELETED' THEN 'DELETED'
        WHEN archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END);
END;

CREATE TRIGGER IF NOT EXISTS task_operation_status_key_update
AFTER UPDATE OF state, delete_result, gid ON task_operation
WHEN NEW.state IS NOT OLD.state OR NEW.delete_result IS NOT OLD.delete_result
     OR NEW.gid IS NOT OLD.gid
BEGIN
    UPDATE gallery SET status_key = CASE
        WHEN NEW.state = 'DELETE_PENDING' AND NEW.delete_result = 'FAILED' THEN 'DELETE_FAILED'
        WHEN NEW.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN NEW.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN NEW.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN NEW.state = 'DELETED' THEN 'DELETED'
        WHEN archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END
    WHERE gid = NEW.gid AND status_key IS NOT (CASE
        WHEN NEW.state = 'DELETE_PENDING' AND NEW.delete_result = 'FAILED' THEN 'DELETE_FAILED'
        WHEN NEW.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN NEW.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN NEW.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN NEW.state = 'DELETED' THEN 'DELETED'
        WHEN archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END);
END;

CREATE TRIGGER IF NOT EXISTS task_operation_status_key_delete AFTER DELETE ON task_operation
BEGIN
    UPDATE gallery SET status_key = CASE
        WHEN archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END
    WHERE gid = OLD.gid AND status_key IS NOT (CASE
        WHEN archive_gone_reason IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END);
END;

-- == what each node owes and holds ==

-- CANCELs owed to a node: a generation moved off it (reassignment) that it
-- may still hold.  Sent when it logs in; settled by its CANCELLED release.
CREATE TABLE IF NOT EXISTS node_cancel (
    node_id       TEXT    NOT NULL,
    gid           INTEGER NOT NULL,
    operation_id  TEXT    NOT NULL,
    queued_at     TEXT    NOT NULL,
    PRIMARY KEY (node_id, operation_id)
);

-- Archives a node's inventory listed that the site has no live generation
-- for, and no tombstone's delete id to remove them with: an operator's call.
CREATE TABLE IF NOT EXISTS node_archive_orphan (
    node_id       TEXT    NOT NULL,
    gid           INTEGER NOT NULL,
    operation_id  TEXT    NOT NULL,
    size          INTEGER NOT NULL CHECK (size >= 0),
    sha256        TEXT    NOT NULL,
    found_at      TEXT    NOT NULL,
    PRIMARY KEY (node_id, operation_id)
);

-- Each node's last judged inventory.
CREATE TABLE IF NOT EXISTS node_inventory (
    node_id       TEXT    PRIMARY KEY,
    inventory_id  TEXT    NOT NULL,
    archives      INTEGER NOT NULL CHECK (archives >= 0),
    bytes         INTEGER NOT NULL CHECK (bytes >= 0),
    missing       INTEGER NOT NULL CHECK (missing >= 0),
    orphans       INTEGER NOT NULL CHECK (orphans >= 0),
    judged_at     TEXT    NOT NULL
);

-- Every operator action on a node's custody (reassign now, retire).
CREATE TABLE IF NOT EXISTS node_custody_audit (
    id        INTEGER PRIMARY KEY,
    node_id   TEXT    NOT NULL,
    action    TEXT    NOT NULL CHECK (action IN ('REASSIGN', 'RETIRE')),
    actor     TEXT    NOT NULL,
    note      TEXT    NOT NULL,
    tasks     INTEGER NOT NULL DEFAULT 0 CHECK (tasks >= 0),
    archives  INTEGER NOT NULL DEFAULT 0 CHECK (archives >= 0),
    at        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS node_custody_audit_node ON node_custody_audit(node_id, id);

INSERT OR IGNORE INTO schema_version (version) VALUES (13);
