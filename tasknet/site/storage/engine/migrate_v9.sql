-- Schema v9: the task counts kept, not counted (issue 23: /api/tasks/counts,
-- a page's total and the node panel over a million tasks).  Additive only, like v3 to v8:
-- the site applies it by itself at start, in one transaction, and
-- `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v9_postgres.sql: keep the two alike (a test compares the
-- schemas).  It builds on v6's gallery.status_key.
--
-- task_count holds, per user and stored status key, how many task rows
-- have it: exactly `SELECT user_id, status_key, COUNT(*) FROM gallery
-- GROUP BY 1, 2` (rows may stay at 0).  The triggers below keep it,
-- whoever writes a task row, in the writer's transaction: an insert adds
-- one to its key, a delete takes one off, a change of key (or of owner)
-- moves one.  storage/views.py reads it for the counts and for the total of
-- a page filtered by owner and status only; an admin's is the sum over the
-- users (one row per user and key, not one per task).  Each change is an
-- upsert of -1 and one of +1: a key created at insert as '' and then set
-- by v6's trigger leaves its '' row at 0, in whichever order they fire.
CREATE TABLE IF NOT EXISTS task_count (
    user_id     INTEGER NOT NULL,
    status_key  TEXT    NOT NULL,
    n           INTEGER NOT NULL,
    PRIMARY KEY (user_id, status_key)
);

INSERT INTO task_count (user_id, status_key, n)
    SELECT user_id, status_key, COUNT(*) FROM gallery WHERE true GROUP BY user_id, status_key
    ON CONFLICT (user_id, status_key) DO UPDATE SET n = excluded.n;

CREATE TRIGGER IF NOT EXISTS task_count_insert AFTER INSERT ON gallery
BEGIN
    INSERT INTO task_count (user_id, status_key, n) VALUES (NEW.user_id, NEW.status_key, 1)
        ON CONFLICT (user_id, status_key) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS task_count_delete AFTER DELETE ON gallery
BEGIN
    INSERT INTO task_count (user_id, status_key, n) VALUES (OLD.user_id, OLD.status_key, -1)
        ON CONFLICT (user_id, status_key) DO UPDATE SET n = n - 1;
END;

CREATE TRIGGER IF NOT EXISTS task_count_update AFTER UPDATE OF status_key, user_id ON gallery
WHEN NEW.status_key IS NOT OLD.status_key OR NEW.user_id IS NOT OLD.user_id
BEGIN
    INSERT INTO task_count (user_id, status_key, n) VALUES (OLD.user_id, OLD.status_key, -1)
        ON CONFLICT (user_id, status_key) DO UPDATE SET n = n - 1;
    INSERT INTO task_count (user_id, status_key, n) VALUES (NEW.user_id, NEW.status_key, 1)
        ON CONFLICT (user_id, status_key) DO UPDATE SET n = n + 1;
END;

-- node_task_count holds, per node and (gallery.status, queued), how many
-- task rows assigned to that node have them, -1 standing for a status of
-- NULL: exactly `SELECT node_id, COALESCE(status, -1), queued, COUNT(*)
-- FROM gallery WHERE node_id IS NOT NULL GROUP BY 1, 2, 3`.  The node panel
-- (storage/stats.py node_activity) and the dispatcher's loads
-- (storage/dispatch.py node_loads) read it: at 1,000 nodes over 1,000,000
-- tasks, a few thousand rows instead of every task's index entry.  A
-- report that only moves progress writes none of these columns.
CREATE TABLE IF NOT EXISTS node_task_count (
    node_id  TEXT    NOT NULL,
    status   INTEGER NOT NULL,
    queued   INTEGER NOT NULL,
    n        INTEGER NOT NULL,
    PRIMARY KEY (node_id, status, queued)
);

INSERT INTO node_task_count (node_id, status, queued, n)
    SELECT node_id, COALESCE(status, -1), queued, COUNT(*) FROM gallery
    WHERE node_id IS NOT NULL GROUP BY node_id, COALESCE(status, -1), queued
    ON CONFLICT (node_id, status, queued) DO UPDATE SET n = excluded.n;

CREATE TRIGGER IF NOT EXISTS node_task_count_insert AFTER INSERT ON gallery
WHEN NEW.node_id IS NOT NULL
BEGIN
    INSERT INTO node_task_count (node_id, status, queued, n)
        VALUES (NEW.node_id, COALESCE(NEW.status, -1), NEW.queued, 1)
        ON CONFLICT (node_id, status, queued) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS node_task_count_delete AFTER DELETE ON gallery
WHEN OLD.node_id IS NOT NULL
BEGIN
    INSERT INTO node_task_count (node_id, status, queued, n)
        VALUES (OLD.node_id, COALESCE(OLD.status, -1), OLD.queued, -1)
        ON CONFLICT (node_id, status, queued) DO UPDATE SET n = n - 1;
END;

CREATE TRIGGER IF NOT EXISTS node_task_count_update_old
AFTER UPDATE OF node_id, status, queued ON gallery
WHEN OLD.node_id IS NOT NULL AND (NEW.node_id IS NOT OLD.node_id
    OR NEW.status IS NOT OLD.status OR NEW.queued IS NOT OLD.queued)
BEGIN
    INSERT INTO node_task_count (node_id, status, queued, n)
        VALUES (OLD.node_id, COALESCE(OLD.status, -1), OLD.queued, -1)
        ON CONFLICT (node_id, status, queued) DO UPDATE SET n = n - 1;
END;

CREATE TRIGGER IF NOT EXISTS node_task_count_update_new
AFTER UPDATE OF node_id, status, queued ON gallery
WHEN NEW.node_id IS NOT NULL AND (NEW.node_id IS NOT OLD.node_id
    OR NEW.status IS NOT OLD.status OR NEW.queued IS NOT OLD.queued)
BEGIN
    INSERT INTO node_task_count (node_id, status, queued, n)
        VALUES (NEW.node_id, COALESCE(NEW.status, -1), NEW.queued, 1)
        ON CONFLICT (node_id, status, queued) DO UPDATE SET n = n + 1;
END;

INSERT OR IGNORE INTO schema_version (version) VALUES (9);
