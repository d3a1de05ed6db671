-- Schema v6 in PostgreSQL's spelling (migrate_v6.sql is SQLite's; keep the
-- two alike: a test compares the schemas).

-- == the display-status key, stored (see migrate_v6.sql) ==

ALTER TABLE gallery ADD COLUMN status_key TEXT NOT NULL DEFAULT '';

-- The key of (task_operation state, its delete result, the node code, the
-- queued flag): the one definition on PostgreSQL, used by the triggers.
CREATE FUNCTION gallery_status_key(st TEXT, dr TEXT, sc INTEGER, q INTEGER)
RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN st = 'DELETE_PENDING' AND dr = 'FAILED' THEN 'DELETE_FAILED'
        WHEN st = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN st IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN st = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN st = 'DELETED' THEN 'DELETED'
        WHEN sc = 1 AND COALESCE(q, 0) <> 0 THEN 'QUEUED'
        WHEN sc = 1 THEN 'DOWNLOADING'
        WHEN sc = 2 THEN 'WAITING_COMPRESSION'
        WHEN sc = 3 THEN 'COMPRESSING'
        WHEN sc = 4 THEN 'COMPLETED'
        WHEN sc IS NULL OR sc = 0 THEN 'SUBMITTED'
        ELSE '' END
$$;

UPDATE gallery AS g SET status_key = gallery_status_key(o.state, o.delete_result, g.status, g.queued)
    FROM task_operation AS o WHERE o.gid = g.gid;
UPDATE gallery AS g SET status_key = gallery_status_key(NULL, NULL, g.status, g.queued)
    WHERE NOT EXISTS (SELECT 1 FROM task_operation AS o WHERE o.gid = g.gid);

CREATE INDEX gallery_user_status ON gallery(user_id, status_key, created_at, gid);
CREATE INDEX gallery_status ON gallery(status_key, created_at, gid);

CREATE FUNCTION gallery_status_key_set() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    st TEXT;
    dr TEXT;
BEGIN
    SELECT o.state, o.delete_result INTO st, dr FROM task_operation AS o WHERE o.gid = NEW.gid;
    NEW.status_key := gallery_status_key(st, dr, NEW.status, NEW.queued);
    RETURN NEW;
END;
$$;
CREATE TRIGGER gallery_status_key_insert
    BEFORE INSERT ON gallery
    FOR EACH ROW EXECUTE FUNCTION gallery_status_key_set();
CREATE TRIGGER gallery_status_key_update
    BEFORE UPDATE OF status, queued, gid ON gallery
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status OR NEW.queued IS DISTINCT FROM OLD.queued
          OR NEW.gid IS DISTINCT FROM OLD.gid)
    EXECUTE FUNCTION gallery_status_key_set();

CREATE FUNCTION task_operation_status_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE gallery SET status_key = gallery_status_key(NULL, NULL, status, queued)
            WHERE gid = OLD.gid
              AND status_key IS DISTINCT FROM gallery_status_key(NULL, NULL, status, queued);
        RETURN OLD;
    END IF;
    -- (a change that leaves the key as it was writes nothing)
    UPDATE gallery SET status_key = gallery_status_key(NEW.state, NEW.delete_result, status, queued)
        WHERE gid = NEW.gid
          AND status_key IS DISTINCT FROM
              gallery_status_key(NEW.state, NEW.delete_result, status, queued);
    RETURN NEW;
END;
$$;
CREATE TRIGGER task_operation_status_key_insert
    AFTER INSERT ON task_operation
    FOR EACH ROW EXECUTE FUNCTION task_operation_status_key();
CREATE TRIGGER task_operation_status_key_update
    AFTER UPDATE OF state, delete_result, gid ON task_operation
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state
          OR NEW.delete_result IS DISTINCT FROM OLD.delete_result
          OR NEW.gid IS DISTINCT FROM OLD.gid)
    EXECUTE FUNCTION task_operation_status_key();
CREATE TRIGGER task_operation_status_key_delete
    AFTER DELETE ON task_operation
    FOR EACH ROW EXECUTE FUNCTION task_operation_status_key();

-- == substring search by index (`?q=`, three characters or more) ==

-- pg_trgm GIN indexes on exactly what views.py's search compares: the name
-- in the C collation (what `{ilike}` renders: `name COLLATE "C" ILIKE`; an
-- index on the name in the database's collation is not used by it) and the
-- gid in decimal.  The index only finds candidates; the ILIKE / LIKE
-- decides, so the result is the scan's.  Where pg_trgm cannot be had (not
-- installed: Debian ships it with the server, in postgresql-contrib
-- elsewhere; or the role may not create it) the indexes are left out and
-- the search scans, as before v6, with a notice.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm')
       AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS pg_trgm;
        EXCEPTION WHEN insufficient_privilege OR feature_not_supported OR undefined_file THEN
            RAISE NOTICE 'pg_trgm not created (%): the task search scans', SQLERRM;
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm') THEN
        EXECUTE 'CREATE INDEX gallery_name_trgm ON gallery'
                ' USING gin (name COLLATE "C" gin_trgm_ops)';
        EXECUTE 'CREATE INDEX gallery_gid_trgm ON gallery'
                ' USING gin ((CAST(gid AS TEXT)) gin_trgm_ops)';
    ELSE
        RAISE NOTICE 'pg_trgm is not available: the task search scans';
    END IF;
END;
$$;

INSERT INTO schema_version (version) VALUES (6) ON CONFLICT DO NOTHING;
