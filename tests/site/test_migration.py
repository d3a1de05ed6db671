"""The v2 migration, its wrapper, the fresh-install path, the trigger, and
the additive upgrades past it."""

from __future__ import annotations

import glob
import pathlib
import sqlite3
import subprocess
import sys

import pytest

from tasknet.cli.migrate import main as migrate_main
from tasknet.site import transitions
from tasknet.site.storage.engine.database import connect, is_postgres
from tasknet.site.storage.engine.migrate import DuplicateGids, migrate
from tasknet.site.storage.engine.schema import (
    CURRENT_VERSION,
    UPGRADES,
    UPGRADES_POSTGRES,
    UnmigratedDatabase,
    apply_statements,
    load_script,
    postgres_upgrade_scripts,
    prepare_database,
    schema_version,
    split_statements,
)
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import BEGIN_WRITE, COMMIT, SERIALIZABLE
from tasknet.status import OperationState

TABLES = ("user", "gallery", "favorite", "weekly_usage")


def legacy_database(path: str, *, duplicate: bool = False) -> None:
    """A v1 database as the old site left it, with data."""
    connection = sqlite3.connect(path)
    connection.executescript(load_script("schema_v1.sql"))
    connection.execute("INSERT INTO user (id, name, token_hash) VALUES (1, 'old', 'h1')")
    connection.execute("INSERT INTO user (id, name, token_hash) VALUES (2, 'older', 'h2')")
    for gid in range(1, 51):
        connection.execute(
            "INSERT INTO gallery (gid, user_id, name, url, status, progress, cost) "
            "VALUES (?, 1, ?, ?, ?, 0.5, 3)",
            (gid, f"g{gid}", f"http://up/files/{gid}-1.bin", (gid % 4) + 1),
        )
    if duplicate:
        connection.execute("INSERT INTO gallery (gid, user_id, name) VALUES (7, 2, 'dup')")
        connection.execute("INSERT INTO gallery (gid, user_id, name) VALUES (9, 2, 'dup')")
        connection.execute("INSERT INTO gallery (gid, user_id, name) VALUES (9, 1, 'dup2')")
    connection.execute("INSERT INTO favorite (user_id, gid) VALUES (1, 3), (2, 4)")
    connection.execute("INSERT INTO weekly_usage (user_id, week, used) VALUES (1, '2026-W48', 150)")
    connection.commit()
    connection.close()


def _v1_columns() -> dict[str, str]:
    memory = sqlite3.connect(":memory:")
    try:
        memory.executescript(load_script("schema_v1.sql"))
        return {
            table: ", ".join(f'"{r[1]}"' for r in memory.execute(f'PRAGMA table_info("{table}")'))
            for table in TABLES
        }
    finally:
        memory.close()


def dump(path: str) -> dict[str, list[tuple]]:
    """Every row of the v1 tables, in their v1 columns (later schema versions
    may only add columns, which start empty)."""
    columns = _v1_columns()
    connection = sqlite3.connect(path)
    try:
        return {
            table: connection.execute(
                f'SELECT {columns[table]} FROM "{table}" ORDER BY rowid'
            ).fetchall()
            for table in TABLES
        }
    finally:
        connection.close()


def schema_sql(path: str) -> list[tuple]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(
            "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
    finally:
        connection.close()


def test_v1_database_with_data_migrates_and_keeps_every_row(tmp_path):
    path = str(tmp_path / "old.sqlite")
    legacy_database(path)
    before = dump(path)
    lines: list[str] = []
    result = migrate(path, lines.append)
    assert not result.already_migrated
    assert dump(path) == before
    assert result.rows_before == {"user": 2, "gallery": 50, "favorite": 2, "weekly_usage": 1}
    connection = sqlite3.connect(path)
    assert schema_version(connection) == CURRENT_VERSION
    connection.close()
    assert any(line.startswith("backup:") for line in lines)  # progress shown
    assert any(line.startswith("[1/") for line in lines)
    # The backup is a faithful copy of the legacy database.
    assert result.backup and dump(result.backup) == before
    backup = sqlite3.connect(result.backup)
    assert schema_version(backup) == 1
    backup.close()


def test_duplicate_gids_stop_the_migration_with_a_list_and_delete_nothing(tmp_path, capsys):
    path = str(tmp_path / "dup.sqlite")
    legacy_database(path, duplicate=True)
    before = dump(path)
    with pytest.raises(DuplicateGids) as stopped:
        migrate(path, lambda _: None)
    assert [(d.gid, d.count) for d in stopped.value.duplicates] == [(7, 2), (9, 3)]
    assert stopped.value.duplicates[1].row_ids == [9, 52, 53]
    assert "gid 9: 3 rows (gallery ids 9, 52, 53)" in str(stopped.value)
    assert dump(path) == before  # nothing deleted, nothing added
    connection = sqlite3.connect(path)
    assert schema_version(connection) == 1
    connection.close()
    backups = glob.glob(path + ".bak-*")
    assert len(backups) == 1 and dump(backups[0]) == before
    # The command line says the same and exits non-zero.
    assert migrate_main(["--db", path]) == 2
    err = capsys.readouterr().err
    assert "gid 7: 2 rows" in err and "nothing was changed" in err


def test_second_run_changes_nothing(tmp_path, capsys):
    path = str(tmp_path / "old.sqlite")
    legacy_database(path)
    assert migrate_main(["--db", path]) == 0
    schema = schema_sql(path)
    data = dump(path)
    backups = glob.glob(path + ".bak-*")
    assert migrate_main(["--db", path]) == 0
    assert "already migrated" in capsys.readouterr().out
    assert schema_sql(path) == schema and dump(path) == data
    assert glob.glob(path + ".bak-*") == backups  # no new backup either


def test_failing_statement_rolls_the_whole_migration_back(tmp_path):
    path = str(tmp_path / "old.sqlite")
    legacy_database(path)
    connection = sqlite3.connect(path)
    # A table in the way of a statement late in the script: an error mid-way.
    connection.execute("CREATE TABLE notification_outbox (oops INTEGER)")
    connection.commit()
    connection.close()
    before = schema_sql(path)
    with pytest.raises(sqlite3.Error):
        migrate(path, lambda _: None)
    assert schema_sql(path) == before  # task_operation etc. rolled back too


def test_migrate_command_runs_as_a_process(tmp_path):
    path = str(tmp_path / "old.sqlite")
    legacy_database(path)
    done = subprocess.run(
        [sys.executable, "-m", "tasknet.cli.migrate", "--db", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"migrated to schema v{CURRENT_VERSION}" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "tasknet.cli.migrate", "--db", str(tmp_path / "none.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "no database" in missing.stderr


def test_fresh_database_is_initialised_and_unmigrated_one_refused(tmp_path):
    fresh = str(tmp_path / "fresh.sqlite")
    assert prepare_database(fresh) is True
    assert prepare_database(fresh) is False  # now migrated: accepted as is
    old = str(tmp_path / "old.sqlite")
    legacy_database(old)
    before = dump(old)
    with pytest.raises(UnmigratedDatabase) as refused:
        prepare_database(old)
    assert f"tasknet-migrate --db {old}" in str(refused.value)
    assert dump(old) == before
    # A fresh install and a migrated one end with the same schema.
    migrate(old, lambda _: None)
    assert [r[:2] for r in schema_sql(old)] == [r[:2] for r in schema_sql(fresh)]


def test_trigger_rejects_illegal_transition_written_with_raw_sql(tmp_path):
    path = str(tmp_path / "t.sqlite")
    prepare_database(path)
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("INSERT INTO user (id, name, token_hash) VALUES (1, 'u', 'h')")
    for bad in ("SUBMITTING", "UNKNOWN", "DELETE_PENDING", "DELETED"):
        with pytest.raises(sqlite3.IntegrityError, match="illegal task_operation transition"):
            connection.execute(
                "INSERT INTO task_operation (gid, operation_id, state) VALUES (1, 'a', ?)", (bad,)
            )
    connection.execute(
        "INSERT INTO task_operation (gid, operation_id, state) VALUES (1, 'a', 'RESERVED')"
    )
    for bad in ("SUBMITTED", "UNKNOWN", "DELETE_PENDING", "DELETED"):
        with pytest.raises(sqlite3.IntegrityError, match="illegal task_operation transition"):
            connection.execute("UPDATE task_operation SET state = ? WHERE gid = 1", (bad,))
    connection.execute("UPDATE task_operation SET state = 'SUBMITTING' WHERE gid = 1")
    connection.execute("UPDATE task_operation SET state = 'SUBMITTED' WHERE gid = 1")
    with pytest.raises(sqlite3.IntegrityError, match="illegal task_operation transition"):
        connection.execute("DELETE FROM task_operation WHERE gid = 1")
    with pytest.raises(sqlite3.IntegrityError, match="operationId may not be rewritten"):
        connection.execute("UPDATE task_operation SET operation_id = 'b' WHERE gid = 1")
    assert connection.execute("SELECT state, operation_id FROM task_operation").fetchone() == (
        "SUBMITTED",
        "a",
    )
    connection.close()


def test_sql_transition_table_equals_transitions_allowed(tmp_path):
    path = str(tmp_path / "t.sqlite")
    prepare_database(path)
    connection = sqlite3.connect(path)
    rows = set(connection.execute("SELECT from_state, to_state FROM task_transition").fetchall())
    connection.close()

    def name(state: OperationState | None) -> str:
        return "NONE" if state is None else state.value

    assert rows == {(name(a), name(b)) for a, b in transitions.ALLOWED}


def test_split_statements_respects_trigger_bodies_and_comments():
    statements = split_statements(load_script("migrate_task_operation_v2.sql"))
    triggers = [s for s in statements if "CREATE TRIGGER" in s]
    assert len(triggers) == 4 and all(s.rstrip().endswith("END;") for s in triggers)
    assert all(sqlite3.complete_statement(s) for s in statements)
    assert split_statements("-- only a comment; with a semicolon\n") == []


def test_v2_database_is_upgraded_in_place_by_the_site(tmp_path: pathlib.Path) -> None:
    """A database at v2 (what the previous release left) gets the additive
    upgrades at site start, in one transaction, with every row kept."""
    path = str(tmp_path / "v2.sqlite")
    legacy_database(path)
    connection = sqlite3.connect(path)
    connection.execute("BEGIN")
    for statement in split_statements(load_script("migrate_task_operation_v2.sql")):
        connection.execute(statement)
    connection.commit()
    assert schema_version(connection) == 2
    connection.close()
    before = dump(path)

    assert prepare_database(path) is False

    connection = sqlite3.connect(path)
    try:
        assert schema_version(connection) == CURRENT_VERSION
    finally:
        connection.close()
    assert dump(path) == before
    assert prepare_database(path) is False  # a second start is a no-op


def _at_v4(target: str) -> None:
    """A database at v4, the last release's schema (report receipts keyed by
    their report id, paged by SQLite's rowid or PostgreSQL's stand-in)."""
    connection = connect(target)
    try:
        if is_postgres(target):
            connection.execute(BEGIN_WRITE[SERIALIZABLE])
            for script in postgres_upgrade_scripts(0):  # up to v4
                if script == UPGRADES_POSTGRES[5]:
                    break
                connection.run_script(load_script(script))  # type: ignore[union-attr]
        else:
            cursor = connection.cursor()
            cursor.execute(BEGIN_WRITE[SERIALIZABLE])
            apply_statements(cursor, split_statements(load_script("schema_v1.sql")))
            for version in (2, 3, 4):
                apply_statements(cursor, split_statements(load_script(UPGRADES[version])))
        connection.execute(COMMIT)
        assert schema_version(connection) == 4
        for report in ("r1", "r2", "r3"):
            connection.execute(_RECEIPT, (report, "n1", int(report[1:])))
        connection.execute(_FORGET_RECEIPT, ("r2",))
    finally:
        connection.close()


_RECEIPT = sql("INSERT INTO report_receipt (report_id, node_id, revision) VALUES (?, ?, ?)")
_FORGET_RECEIPT = sql("DELETE FROM report_receipt WHERE report_id = ?")
_RECEIPTS = sql("SELECT id, report_id FROM report_receipt ORDER BY id")


def test_v5_gives_report_receipts_a_key_of_their_own_in_their_order(db_target: str) -> None:
    """v5: receipts are paged by ``id`` on both engines (until v4 SQLite's
    rowid, and a column standing for it on PostgreSQL), kept in order."""
    _at_v4(db_target)
    assert prepare_database(db_target) is False
    connection = connect(db_target)
    try:
        assert schema_version(connection) == CURRENT_VERSION
        assert [tuple(r) for r in connection.execute(_RECEIPTS)] == [(1, "r1"), (3, "r3")]
        connection.execute(_RECEIPT, ("r4", "n1", 4))
        assert [tuple(r) for r in connection.execute(_RECEIPTS)][-1] == (4, "r4")
    finally:
        connection.close()


def test_the_backup_reports_its_progress_by_tenths_not_by_step(tmp_path: pathlib.Path) -> None:
    from tasknet.site.storage.engine.migrate import backup

    path = str(tmp_path / "big.sqlite")
    source = sqlite3.connect(path)
    source.execute("CREATE TABLE filler (b BLOB)")
    source.executemany("INSERT INTO filler VALUES (zeroblob(4000))", [()] * 3000)  # ~3,000 pages
    source.commit()
    lines: list[str] = []
    try:
        copy = backup(source, path, lines.append)
    finally:
        source.close()
    steps = [line for line in lines if line.startswith("backup: ")]
    assert 2 <= len(steps) <= 11, steps  # a 1.6 GB file printed 1,568 of these
    total = steps[-1].split("/")[1].split()[0]
    assert steps[-1] == f"backup: {total}/{total} pages"
    assert int(total) > 2000 and lines[-1] == f"backup written to {copy}"
