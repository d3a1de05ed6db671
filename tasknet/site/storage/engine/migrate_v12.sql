-- Schema v12: a user id is never given twice (issue 38).  Additive only,
-- like v3 to v11: the site applies it by itself at start, in one
-- transaction, and `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v12_postgres.sql: keep the two alike (a test compares the
-- schemas).
--
-- user.id is SQLite's rowid alias without AUTOINCREMENT, so a removed
-- user's id went to the next user added, who then saw the removed user's
-- completions and bytes in /api/stats (the throughput rollups keep them
-- under its id).  Rebuilding the table with AUTOINCREMENT would need
-- foreign keys off, which cannot change inside a transaction; instead
-- user_id_high is the highest id ever given (sqlite_sequence's idea), and
-- the trigger below moves a new user whose id is not above it past it, and
-- raises it, whoever inserts the user, in the inserter's transaction.  The
-- new row is moments old: nothing refers to it yet.
CREATE TABLE IF NOT EXISTS user_id_high (
    only_row  INTEGER NOT NULL PRIMARY KEY CHECK (only_row = 1),
    high      INTEGER NOT NULL CHECK (high >= 0)
);

-- The mark starts above every id still named anywhere: an id removed before
-- v12 whose stats or tombstones remain is not given again either.
INSERT INTO user_id_high (only_row, high)
    SELECT 1, MAX(0,
        (SELECT IFNULL(MAX(id), 0) FROM user),
        (SELECT IFNULL(MAX(user_id), 0) FROM task_operation),
        (SELECT IFNULL(MAX(user_id), 0) FROM notification_outbox),
        (SELECT IFNULL(MAX(user_id), 0) FROM throughput_minute),
        (SELECT IFNULL(MAX(user_id), 0) FROM throughput_total),
        (SELECT IFNULL(MAX(user_id), 0) FROM throughput_node),
        (SELECT IFNULL(MAX(user_id), 0) FROM task_count))
    WHERE true
    ON CONFLICT (only_row) DO NOTHING;

CREATE TRIGGER IF NOT EXISTS user_id_never_reused AFTER INSERT ON user
BEGIN
    UPDATE user_id_high SET high = MAX(high + 1, NEW.id);
    UPDATE user SET id = (SELECT high FROM user_id_high)
        WHERE id = NEW.id AND NEW.id <> (SELECT high FROM user_id_high);
END;

INSERT OR IGNORE INTO schema_version (version) VALUES (12);
