-- The legacy (v1) baseline schema, as the old site left it.
-- A fresh database gets this and then migrate_task_operation_v2.sql, so a new
-- install and a migrated old one end up with the same schema.

CREATE TABLE IF NOT EXISTS user (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    token_hash  TEXT    NOT NULL UNIQUE,      -- sha256 hex of the API token
    is_admin    INTEGER NOT NULL DEFAULT 0 CHECK (is_admin IN (0, 1)),
    quota       INTEGER NOT NULL DEFAULT 5000 CHECK (quota >= 0),
    created_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- v1 had no unique gid: the v2 migration adds the unique index.
CREATE TABLE IF NOT EXISTS gallery (
    id          INTEGER PRIMARY KEY,
    gid         INTEGER NOT NULL,
    user_id     INTEGER NOT NULL REFERENCES user(id),
    name        TEXT    NOT NULL DEFAULT '',
    token       TEXT    NOT NULL DEFAULT '',   -- the upstream token the user gave
    url         TEXT    NOT NULL DEFAULT '',   -- archive URL from the upstream
    status      INTEGER,                       -- last applied node code 1..4, NULL before any
    progress    REAL    NOT NULL DEFAULT 0,
    node_id     TEXT,                          -- assigned node (sticky)
    cost        INTEGER NOT NULL DEFAULT 0,
    created_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS gallery_user ON gallery(user_id, gid);

CREATE TABLE IF NOT EXISTS favorite (
    user_id     INTEGER NOT NULL REFERENCES user(id),
    gid         INTEGER NOT NULL,
    created_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (user_id, gid)
);

CREATE TABLE IF NOT EXISTS weekly_usage (
    user_id     INTEGER NOT NULL REFERENCES user(id),
    week        TEXT    NOT NULL,              -- ISO week, e.g. 2026-W49
    used        INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (user_id, week)
);
