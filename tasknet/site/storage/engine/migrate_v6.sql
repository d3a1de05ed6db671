-- Schema v6: views over a million tasks (issue 23, item 2).  Additive only,
-- like v3 to v5: the site applies it by itself at start, in one
-- transaction, and `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v6_postgres.sql: keep the two alike (a test compares the schemas).

-- == the display-status key, stored (the status tabs, the counts) ==

-- The key of the task's display status (tasknet.status.display_status of
-- its task_operation state, node code, failed delete and queued flag), the
-- value `?status=` filters on: a TaskStatus value, except that a SUBMITTED
-- task queued on its node is 'QUEUED' (the SUBMITTED tab is both); a
-- DELETED row (never visible: its task row goes with it) is 'DELETED'.
-- Kept by the triggers below, whoever writes; views.STATUS_KEYS reads it
-- and tests/site/test_status_key_stored.py checks the two agree.
ALTER TABLE gallery ADD COLUMN status_key TEXT NOT NULL DEFAULT '';

UPDATE gallery SET status_key = (
    SELECT CASE
        WHEN o.state = 'DELETE_PENDING' AND o.delete_result = 'FAILED' THEN 'DELETE_FAILED'
        WHEN o.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN o.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN o.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN o.state = 'DELETED' THEN 'DELETED'
        WHEN gallery.status = 1 AND COALESCE(gallery.queued, 0) <> 0 THEN 'QUEUED'
        WHEN gallery.status = 1 THEN 'DOWNLOADING'
        WHEN gallery.status = 2 THEN 'WAITING_COMPRESSION'
        WHEN gallery.status = 3 THEN 'COMPRESSING'
        WHEN gallery.status = 4 THEN 'COMPLETED'
        WHEN gallery.status IS NULL OR gallery.status = 0 THEN 'SUBMITTED'
        ELSE '' END
    FROM (SELECT 1) LEFT JOIN task_operation AS o ON o.gid = gallery.gid);

-- A tab is a key's tasks newest first (or oldest first): one index range,
-- in order, for a user and for an admin.
CREATE INDEX IF NOT EXISTS gallery_user_status ON gallery(user_id, status_key, created_at, gid);
CREATE INDEX IF NOT EXISTS gallery_status ON gallery(status_key, created_at, gid);

-- A task row written (the create path inserts it after its operation row)
-- or its node code / queued flag changed.
CREATE TRIGGER IF NOT EXISTS gallery_status_key_insert AFTER INSERT ON gallery
BEGIN
    UPDATE gallery SET status_key = (
        SELECT CASE
            WHEN o.state = 'DELETE_PENDING' AND o.delete_result = 'FAILED' THEN 'DELETE_FAILED'
            WHEN o.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
            WHEN o.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
            WHEN o.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
            WHEN o.state = 'DELETED' THEN 'DELETED'
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

CREATE TRIGGER IF NOT EXISTS gallery_status_key_update AFTER UPDATE OF status, queued, gid ON gallery
WHEN NEW.status IS NOT OLD.status OR NEW.queued IS NOT OLD.queued OR NEW.gid IS NOT OLD.gid
BEGIN
    UPDATE gallery SET status_key = (
        SELECT CASE
            WHEN o.state = 'DELETE_PENDING' AND o.delete_result = 'FAILED' THEN 'DELETE_FAILED'
            WHEN o.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
            WHEN o.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
            WHEN o.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
            WHEN o.state = 'DELETED' THEN 'DELETED'
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
            WHEN NEW.status = 1 AND COALESCE(NEW.queued, 0) <> 0 THEN 'QUEUED'
            WHEN NEW.status = 1 THEN 'DOWNLOADING'
            WHEN NEW.status = 2 THEN 'WAITING_COMPRESSION'
            WHEN NEW.status = 3 THEN 'COMPRESSING'
            WHEN NEW.status = 4 THEN 'COMPLETED'
            WHEN NEW.status IS NULL OR NEW.status = 0 THEN 'SUBMITTED'
            ELSE '' END
        FROM (SELECT 1) LEFT JOIN task_operation AS o ON o.gid = NEW.gid);
END;

-- The operation row written, its state or delete result changed, or gone
-- (a task row without one is a legacy row: its node code decides).  A
-- change that leaves the key as it was writes nothing (RESERVED ->
-- SUBMITTING, a report on a task being deleted).
CREATE TRIGGER IF NOT EXISTS task_operation_status_key_insert AFTER INSERT ON task_operation
BEGIN
    UPDATE gallery SET status_key = CASE
        WHEN NEW.state = 'DELETE_PENDING' AND NEW.delete_result = 'FAILED' THEN 'DELETE_FAILED'
        WHEN NEW.state = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN NEW.state IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN NEW.state = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN NEW.state = 'DELETED' THEN 'DELETED'
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
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END
    WHERE gid = OLD.gid AND status_key IS NOT (CASE
        WHEN status = 1 AND COALESCE(queued, 0) <> 0 THEN 'QUEUED'
        WHEN status = 1 THEN 'DOWNLOADING'
        WHEN status = 2 THEN 'WAITING_COMPRESSION'
        WHEN status = 3 THEN 'COMPRESSING'
        WHEN status = 4 THEN 'COMPLETED'
        WHEN status IS NULL OR status = 0 THEN 'SUBMITTED'
        ELSE '' END);
END;

-- == substring search by index (`?q=`, three characters or more) ==

-- Trigrams of each task's name and of its gid in decimal (SQLite's FTS5
-- `trigram` tokenizer), external content on gallery (rowid: the gid), kept
-- by the triggers below.  The tokenizer folds case by Unicode, the search
-- by ASCII only: views.py asks it for candidates and keeps the `LIKE` that
-- decides (`gid IN (SELECT rowid FROM gallery_text WHERE … MATCH ?)`).
-- SQLite only: PostgreSQL's are pg_trgm indexes on gallery itself.
CREATE VIRTUAL TABLE IF NOT EXISTS gallery_text USING fts5(
    name, gid, content = 'gallery', content_rowid = 'gid', tokenize = 'trigram', columnsize = 0
);
INSERT INTO gallery_text(gallery_text) VALUES ('rebuild');

CREATE TRIGGER IF NOT EXISTS gallery_text_insert AFTER INSERT ON gallery
BEGIN
    INSERT INTO gallery_text(rowid, name, gid) VALUES (NEW.gid, NEW.name, NEW.gid);
END;

CREATE TRIGGER IF NOT EXISTS gallery_text_delete AFTER DELETE ON gallery
BEGIN
    INSERT INTO gallery_text(gallery_text, rowid, name, gid) VALUES ('delete', OLD.gid, OLD.name, OLD.gid);
END;

CREATE TRIGGER IF NOT EXISTS gallery_text_update AFTER UPDATE OF name, gid ON gallery
WHEN NEW.name IS NOT OLD.name OR NEW.gid IS NOT OLD.gid
BEGIN
    INSERT INTO gallery_text(gallery_text, rowid, name, gid) VALUES ('delete', OLD.gid, OLD.name, OLD.gid);
    INSERT INTO gallery_text(rowid, name, gid) VALUES (NEW.gid, NEW.name, NEW.gid);
END;

INSERT OR IGNORE INTO schema_version (version) VALUES (6);
