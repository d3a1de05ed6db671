-- Schema v12 in PostgreSQL's spelling (migrate_v12.sql is SQLite's; keep the
-- two alike: a test compares the schemas).  A user id is never given twice:
-- see migrate_v12.sql.  The identity column alone does not reuse ids, but an
-- id given explicitly (a copy, a tool) could be one given before; so here
-- too user_id_high is the highest id ever given and a new user's id is
-- always above it (the trigger sets it before the insert).  The sequence
-- may then lag behind the mark: the trigger still moves each id past it.
CREATE TABLE user_id_high (
    only_row  INTEGER NOT NULL PRIMARY KEY CHECK (only_row = 1),
    high      BIGINT  NOT NULL CHECK (high >= 0)
);

INSERT INTO user_id_high (only_row, high)
    SELECT 1, GREATEST(0,
        (SELECT MAX(id) FROM "user"),
        (SELECT MAX(user_id) FROM task_operation),
        (SELECT MAX(user_id) FROM notification_outbox),
        (SELECT MAX(user_id) FROM throughput_minute),
        (SELECT MAX(user_id) FROM throughput_total),
        (SELECT MAX(user_id) FROM throughput_node),
        (SELECT MAX(user_id) FROM task_count))
    ON CONFLICT (only_row) DO NOTHING;

CREATE FUNCTION user_id_never_reused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE user_id_high SET high = GREATEST(high + 1, NEW.id) RETURNING high INTO NEW.id;
    RETURN NEW;
END $$;

CREATE TRIGGER user_id_never_reused BEFORE INSERT ON "user"
    FOR EACH ROW EXECUTE FUNCTION user_id_never_reused();

INSERT INTO schema_version (version) VALUES (12) ON CONFLICT DO NOTHING;
