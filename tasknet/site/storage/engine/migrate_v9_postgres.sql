-- Schema v9 in PostgreSQL's spelling (migrate_v9.sql is SQLite's; keep the
-- two alike: a test compares the schemas).  The task counts kept, not
-- counted: see migrate_v9.sql.
--
-- One trigger function, after the row is written (v6's BEFORE triggers have
-- set status_key by then).  Its -1 and +1 are one statement, in key order,
-- so two transactions moving tasks of one user take that statement's row
-- locks in the same order; a deadlock between longer transactions (two
-- sites' report batches) is 40P01, which the engine runs again like a
-- serialization failure.  The update trigger has no column list: v6's
-- triggers change status_key without naming it in an UPDATE, which a
-- column list would not see; the WHEN clause skips every other change.
CREATE TABLE task_count (
    user_id     BIGINT  NOT NULL,
    status_key  TEXT    NOT NULL,
    n           BIGINT  NOT NULL,
    PRIMARY KEY (user_id, status_key)
);

INSERT INTO task_count (user_id, status_key, n)
    SELECT user_id, status_key, COUNT(*) FROM gallery GROUP BY user_id, status_key;

CREATE FUNCTION task_count_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO task_count AS c (user_id, status_key, n)
            VALUES (NEW.user_id, NEW.status_key, 1)
            ON CONFLICT (user_id, status_key) DO UPDATE SET n = c.n + 1;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO task_count AS c (user_id, status_key, n)
            VALUES (OLD.user_id, OLD.status_key, -1)
            ON CONFLICT (user_id, status_key) DO UPDATE SET n = c.n - 1;
    ELSE
        INSERT INTO task_count AS c (user_id, status_key, n)
            SELECT u, k, d FROM (VALUES (OLD.user_id, OLD.status_key, -1),
                                        (NEW.user_id, NEW.status_key, 1)) AS v (u, k, d)
            ORDER BY u, k
            ON CONFLICT (user_id, status_key) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER task_count_insert
    AFTER INSERT ON gallery
    FOR EACH ROW EXECUTE FUNCTION task_count_change();
CREATE TRIGGER task_count_delete
    AFTER DELETE ON gallery
    FOR EACH ROW EXECUTE FUNCTION task_count_change();
CREATE TRIGGER task_count_update
    AFTER UPDATE ON gallery
    FOR EACH ROW
    WHEN (NEW.status_key IS DISTINCT FROM OLD.status_key
          OR NEW.user_id IS DISTINCT FROM OLD.user_id)
    EXECUTE FUNCTION task_count_change();

-- node_task_count: see migrate_v9.sql.  A node's rows are written by the
-- site that holds the node (its reports, its dispatch), so two sites seldom
-- meet on them.
CREATE TABLE node_task_count (
    node_id  TEXT    NOT NULL,
    status   INTEGER NOT NULL,
    queued   INTEGER NOT NULL,
    n        BIGINT  NOT NULL,
    PRIMARY KEY (node_id, status, queued)
);

INSERT INTO node_task_count (node_id, status, queued, n)
    SELECT node_id, COALESCE(status, -1), queued, COUNT(*) FROM gallery
    WHERE node_id IS NOT NULL GROUP BY node_id, COALESCE(status, -1), queued;

CREATE FUNCTION node_task_count_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.node_id IS NOT NULL THEN
        INSERT INTO node_task_count AS c (node_id, status, queued, n)
            VALUES (OLD.node_id, COALESCE(OLD.status, -1), OLD.queued, -1)
            ON CONFLICT (node_id, status, queued) DO UPDATE SET n = c.n - 1;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.node_id IS NOT NULL THEN
        INSERT INTO node_task_count AS c (node_id, status, queued, n)
            VALUES (NEW.node_id, COALESCE(NEW.status, -1), NEW.queued, 1)
            ON CONFLICT (node_id, status, queued) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER node_task_count_insert
    AFTER INSERT ON gallery
    FOR EACH ROW WHEN (NEW.node_id IS NOT NULL)
    EXECUTE FUNCTION node_task_count_change();
CREATE TRIGGER node_task_count_delete
    AFTER DELETE ON gallery
    FOR EACH ROW WHEN (OLD.node_id IS NOT NULL)
    EXECUTE FUNCTION node_task_count_change();
CREATE TRIGGER node_task_count_update
    AFTER UPDATE OF node_id, status, queued ON gallery
    FOR EACH ROW
    WHEN (NEW.node_id IS DISTINCT FROM OLD.node_id
          OR NEW.status IS DISTINCT FROM OLD.status
          OR NEW.queued IS DISTINCT FROM OLD.queued)
    EXECUTE FUNCTION node_task_count_change();

INSERT INTO schema_version (version) VALUES (9) ON CONFLICT DO NOTHING;
