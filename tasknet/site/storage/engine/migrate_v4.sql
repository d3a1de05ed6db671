-- Schema v4: several sites on one database (SCALE.md).  Additive only, like
-- v3: the site applies it by itself at start, in one transaction, and
-- `tasknet-migrate` applies it too.  PostgreSQL's copy is
-- migrate_v4_postgres.sql: keep the two alike (a test compares the schemas).

-- Settings the site records for the tools sharing its database (users.py);
-- created here so that both backends' schemas have it from the start
-- (PostgreSQL's schema file has it too).
CREATE TABLE IF NOT EXISTS site_setting (name TEXT PRIMARY KEY, value TEXT NOT NULL);

-- == instances (site processes, their leases, reaping) ==

-- One row per run of a site process: an instance.  Whether it is alive is
-- not written here but judged by the database: on PostgreSQL each instance
-- holds the session-level advisory lock (LEASE_CLASS, id) on a connection
-- of its own (tasknet/site/storage/lease.py), so a lock another session can
-- take means its holder is gone; on SQLite the flock on <database>.lock is
-- the lease, and there is one instance at a time.  ended_at: it stopped
-- cleanly; reaped_at/reaped_by: another (or a later) instance judged it
-- gone and settled what it left in flight.
CREATE TABLE IF NOT EXISTS site_instance (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL,
    host          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    -- PostgreSQL: the server pid of the lease session (what an operator
    -- would give pg_terminate_backend); NULL on SQLite.
    lease_pid     INTEGER,
    started_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    heartbeat_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    ended_at      TEXT,
    reaped_at     TEXT,
    reaped_by     INTEGER
);
CREATE INDEX IF NOT EXISTS site_instance_open ON site_instance(id)
    WHERE ended_at IS NULL AND reaped_at IS NULL;

-- The instance that wrote a generation's RESERVED / SUBMITTING: recovery
-- settles only the in-flight generations of instances that are gone
-- (NULL: written before v4, by a site that recorded no instance).
ALTER TABLE task_operation ADD COLUMN instance_id INTEGER;
CREATE INDEX IF NOT EXISTS task_operation_in_flight ON task_operation(instance_id, gid)
    WHERE state IN ('RESERVED', 'SUBMITTING');

-- Every generation settled because its instance was gone (DRILLS.md D9):
-- whose it was, who settled it and when, and what became of it
-- (SUBMITTING -> UNKNOWN, or RESERVED released).
CREATE TABLE IF NOT EXISTS instance_reap (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id   INTEGER,
    reaped_by     INTEGER NOT NULL,
    reaped_at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    gid           INTEGER NOT NULL,
    operation_id  TEXT    NOT NULL,
    from_state    TEXT    NOT NULL,
    outcome       TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS instance_reap_instance ON instance_reap(instance_id, id);

INSERT OR IGNORE INTO schema_version (version) VALUES (4);

-- node ownership (node-ownership helper)

-- Which site holds each node (SCALE.md 5), one row per node that ever
-- logged in (tasknet/site/storage/node_sessions.py).  A login at any site
-- takes the row in one transaction: epoch + 1 and the new holder's
-- instance and --name (newest wins across sites); the site holding the
-- older connection learns it (NOTIFY tasknet_node_taken, or its periodic
-- check) and closes it.  connected_at is NULL while no site holds the node.
CREATE TABLE IF NOT EXISTS node_session (
    node_id       TEXT    PRIMARY KEY,
    epoch         INTEGER NOT NULL,                -- +1 at every login, never reset
    instance_id   INTEGER,                         -- holder (NULL: a site without one)
    site_name     TEXT    NOT NULL,                -- holder's --name
    protocol      INTEGER NOT NULL,
    features      TEXT    NOT NULL DEFAULT '[]',   -- JSON array
    connected_at  TEXT,                            -- null while no site holds it
    changed_at    TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS node_session_instance ON node_session(instance_id)
    WHERE connected_at IS NOT NULL;

-- How far each instance's WebSocket tail has read the outbox (several
-- sites on PostgreSQL; tasknet/site/storage/outbox.py): a row is fanned
-- out once every open instance's tail has passed it.  Unused on SQLite
-- (one site: ws_delivered_at alone says it).
CREATE TABLE IF NOT EXISTS outbox_reader (
    instance_id   INTEGER PRIMARY KEY,
    after_id      INTEGER NOT NULL,
    updated_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Webhook delivery claims (several sites on PostgreSQL): the instance
-- delivering a pending row and until when (a lease it renews; an expired
-- or released one is claimed again by any site).
ALTER TABLE notification_outbox ADD COLUMN webhook_claimed_by INTEGER;
ALTER TABLE notification_outbox ADD COLUMN webhook_claimed_until TEXT;
CREATE INDEX IF NOT EXISTS notification_outbox_webhook_pending
    ON notification_outbox(id) WHERE webhook_state = 'pending';
