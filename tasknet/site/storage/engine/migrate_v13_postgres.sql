-- Schema v13 in PostgreSQL's spelling (migrate_v13.sql is SQLite's; keep the
-- two alike: a test compares the schemas).  Custody: see migrate_v13.sql.

-- == a completed generation whose archive no node holds any more ==

ALTER TABLE gallery ADD COLUMN archive_gone_reason TEXT CHECK (archive_gone_reason IN
    ('EXPIRED', 'DISK_BUDGET', 'CORRUPT', 'MISSING', 'CANCELLED', 'NODE_RETIRED'));
ALTER TABLE gallery ADD COLUMN archive_gone_at TEXT;
ALTER TABLE gallery ADD COLUMN archive_gone_node TEXT;

INSERT INTO task_transition (from_state, to_state) VALUES ('SUBMITTED', 'RESERVED')
    ON CONFLICT DO NOTHING;

CREATE FUNCTION task_operation_recreate_only_when_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'SUBMITTED' AND NEW.state = 'RESERVED'
       AND NOT EXISTS (SELECT 1 FROM gallery
                       WHERE gid = NEW.gid AND archive_gone_reason IS NOT NULL) THEN
        RAISE EXCEPTION 'illegal task_operation transition: the archive is not gone'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER task_operation_recreate_only_when_gone
    BEFORE UPDATE OF state ON task_operation
    FOR EACH ROW EXECUTE FUNCTION task_operation_recreate_only_when_gone();

CREATE OR REPLACE FUNCTION task_operation_id_stable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.operation_id <> OLD.operation_id
       AND NOT (OLD.state = 'DELETED' AND NEW.state = 'RESERVED')
       AND NOT (OLD.state = 'SUBMITTED' AND NEW.state = 'RESERVED'
                AND EXISTS (SELECT 1 FROM gallery
                            WHERE gid = NEW.gid AND archive_gone_reason IS NOT NULL)) THEN
        RAISE EXCEPTION 'operationId may not be rewritten'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- == the stored display-status key learns ARCHIVE_GONE (v6's function) ==

-- The key with the archive's state: the one definition from v13 on; v6's
-- four-argument function stays for nothing but its own name.
CREATE FUNCTION gallery_status_key(st TEXT, dr TEXT, sc INTEGER, q INTEGER, gone TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN st = 'DELETE_PENDING' AND dr = 'FAILED' THEN 'DELETE_FAILED'
        WHEN st = 'DELETE_PENDING' THEN 'DELETE_PENDING'
        WHEN st IN ('RESERVED', 'SUBMITTING') THEN 'SUBMITTING'
        WHEN st = 'UNKNOWN' THEN 'SUBMIT_UNKNOWN'
        WHEN st = 'DELETED' THEN 'DELETED'
        WHEN gone IS NOT NULL THEN 'ARCHIVE_GONE'
        WHEN sc = 1 AND COALESCE(q, 0) <> 0 THEN 'QUEUED'
        WHEN sc = 1 THEN 'DOWNLOADING'
        WHEN sc = 2 THEN 'WAITING_COMPRESSION'
        WHEN sc = 3 THEN 'COMPRESSING'
        WHEN sc = 4 THEN 'COMPLETED'
        WHEN sc IS NULL OR sc = 0 THEN 'SUBMITTED'
        ELSE '' END
$$;

CREATE OR REPLACE FUNCTION gallery_status_key_set() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    st TEXT;
    dr TEXT;
BEGIN
    SELECT o.state, o.delete_result INTO st, dr FROM task_operation AS o WHERE o.gid = NEW.gid;
    NEW.status_key := gallery_status_key(st, dr, NEW.status, NEW.queued, NEW.archive_gone_reason);
    RETURN NEW;
END;
$$;
DROP TRIGGER gallery_status_key_update ON gallery;
CREATE TRIGGER gallery_status_key_update
    BEFORE UPDATE OF status, queued, gid, archive_gone_reason ON gallery
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status OR NEW.queued IS DISTINCT FROM OLD.queued
          OR NEW.gid IS DISTINCT FROM OLD.gid
          OR NEW.archive_gone_reason IS DISTINCT FROM OLD.archive_gone_reason)
    EXECUTE FUNCTION gallery_status_key_set();

CREATE OR REPLACE FUNCTION task_operation_status_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE gallery SET status_key = gallery_status_key(NULL, NULL, status, queued, archive_gone_reason)
            WHERE gid = OLD.gid
              AND status_key IS DISTINCT FROM
                  gallery_status_key(NULL, NULL, status, queued, archive_gone_reason);
        RETURN OLD;
    END IF;
    -- (a change that leaves the key as it was writes nothing)
    UPDATE gallery SET status_key =
            gallery_status_key(NEW.state, NEW.delete_result, status, queued, archive_gone_reason)
        WHERE gid = NEW.gid
          AND status_key IS DISTINCT FROM
              gallery_status_key(NEW.state, NEW.delete_result, status, queued, archive_gone_reason);
    RETURN NEW;
END;
$$;

-- == what each node owes and holds (see migrate_v13.sql) ==

CREATE TABLE node_cancel (
    node_id       TEXT    NOT NULL,
    gid           BIGINT  NOT NULL,
    operation_id  TEXT    NOT NULL,
    queued_at     TEXT    NOT NULL,
    PRIMARY KEY (node_id, operation_id)
);

CREATE TABLE node_archive_orphan (
    node_id       TEXT    NOT NULL,
    gid           BIGINT  NOT NULL,
    operation_id  TEXT    NOT NULL,
    size          BIGINT  NOT NULL CHECK (size >= 0),
    sha256        TEXT    NOT NULL,
    found_at      TEXT    NOT NULL,
    PRIMARY KEY (node_id, operation_id)
);

CREATE TABLE node_inventory (
    node_id       TEXT    PRIMARY KEY,
    inventory_id  TEXT    NOT NULL,
    archives      BIGINT  NOT NULL CHECK (archives >= 0),
    bytes         BIGINT  NOT NULL CHECK (bytes >= 0),
    missing       BIGINT  NOT NULL CHECK (missing >= 0),
    orphans       BIGINT  NOT NULL CHECK (orphans >= 0),
    judged_at     TEXT    NOT NULL
);

CREATE TABLE node_custody_audit (
    id        BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    node_id   TEXT    NOT NULL,
    action    TEXT    NOT NULL CHECK (action IN ('REASSIGN', 'RETIRE')),
    actor     TEXT    NOT NULL,
    note      TEXT    NOT NULL,
    tasks     BIGINT  NOT NULL DEFAULT 0 CHECK (tasks >= 0),
    archives  BIGINT  NOT NULL DEFAULT 0 CHECK (archives >= 0),
    at        TEXT    NOT NULL
);
CREATE INDEX node_custody_audit_node ON node_custody_audit(node_id, id);

INSERT INTO schema_version (version) VALUES (13) ON CONFLICT DO NOTHING;
