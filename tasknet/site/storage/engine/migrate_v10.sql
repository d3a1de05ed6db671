-- Schema v10: the task search's trigram table answers exactly (issue 23,
-- B9: an admin's name search over a million tasks).  Additive in effect,
-- like v3 to v9: the site applies it by itself at start, in one
-- transaction, and `tasknet-migrate` applies it too.  PostgreSQL has
-- nothing to change (migrate_v10_postgres.sql records the version): its
-- pg_trgm indexes serve the ILIKE itself.
--
-- v6's table held each name as it is and folded case by Unicode, wider
-- than the search (ASCII letters only, storage/views.py), so a match was
-- only a candidate: every one was read back from gallery and tested with
-- LIKE (5,016 rows for 'phoenix': 10 ms of the 12.6 ms count).  This one
-- holds the name with its ASCII letters lowered (SQLite's lower() folds
-- A-Z only, as LIKE does) and compares case-sensitively, so a phrase of
-- the lowered search text matches exactly the rows LIKE '%text%' matches:
-- the count is FTS5's alone, and a page's rows are only looked up.
-- Contentless (nothing read back): the triggers give each delete the very
-- values its insert indexed.
DROP TRIGGER IF EXISTS gallery_text_insert;
DROP TRIGGER IF EXISTS gallery_text_delete;
DROP TRIGGER IF EXISTS gallery_text_update;
DROP TABLE IF EXISTS gallery_text;

CREATE VIRTUAL TABLE gallery_text USING fts5(
    name, gid, content = '', tokenize = 'trigram case_sensitive 1', columnsize = 0
);
INSERT INTO gallery_text(rowid, name, gid) SELECT gid, lower(name), gid FROM gallery;

CREATE TRIGGER gallery_text_insert AFTER INSERT ON gallery
BEGIN
    INSERT INTO gallery_text(rowid, name, gid) VALUES (NEW.gid, lower(NEW.name), NEW.gid);
END;

CREATE TRIGGER gallery_text_delete AFTER DELETE ON gallery
BEGIN
    INSERT INTO gallery_text(gallery_text, rowid, name, gid)
        VALUES ('delete', OLD.gid, lower(OLD.name), OLD.gid);
END;

CREATE TRIGGER gallery_text_update AFTER UPDATE OF name, gid ON gallery
WHEN NEW.name IS NOT OLD.name OR NEW.gid IS NOT OLD.gid
BEGIN
    INSERT INTO gallery_text(gallery_text, rowid, name, gid)
        VALUES ('delete', OLD.gid, lower(OLD.name), OLD.gid);
    INSERT INTO gallery_text(rowid, name, gid) VALUES (NEW.gid, lower(NEW.name), NEW.gid);
END;

INSERT OR IGNORE INTO schema_version (version) VALUES (10);
