"""Durable node state: one SQLite file under ``--data``, through adbapi.

Every change is one named transaction function of a cursor, run on the single
pool connection (so transactions are serialised in submission order).  The
tables:

- ``task``: one row per gid the node holds (the current generation only).
- ``deletion``: the last delete command per gid and its result, kept until a
  report carrying it is ACKed (``result`` is NULL while the delete runs).
- ``meta``: the last revision used (``revision``).
- ``in_flight_report``: the one report sent and not yet ACKed, persisted
  before it is sent so that it is resent unchanged after a restart.
- ``received_command``: the commands received (drills read it).  A DOWNLOAD
  row is also the guard against downloading a generation twice: a DOWNLOAD
  whose (gid, operationId) was received before is a no-op, even after the
  task row is gone (completed and ACKed), unless a CANCEL of that generation
  came after it (then it starts again).
- ``settled_deletion``: gids whose delete the site has taken (see below).
- ``archive``: the archives the node holds, one row per (gid, operationId),
  with the size and SHA-256 computed while it was written.  Written in the
  transaction that marks the task complete; it outlives the ``task`` row
  (dropped once the completion is ACKed) and goes with the files: a DELETE
  that removed them, a new generation of the gid, or ``set_aside`` (the
  scrub found it damaged: the file moves to ``corrupt/``).
- ``released``: the generations the node stopped holding on its own
  (PROTOCOL.md "Archives (v2)": ``EXPIRED``, ``DISK_BUDGET``, ``CORRUPT``,
  ``MISSING``, ``CANCELLED``), each written in the transaction that removed
  its ``archive`` row (or, for a CANCEL, its task), and kept until an ACK for
  a v2 report that carried it, exactly as ``deletion`` rows are.  A legacy
  link never sends them: they wait for the next v2 connection.

Housekeeping (``docs/operations.md``): a gid's ``received_command`` rows up to
a DELETE are pruned once that delete is settled, a DELETED or NOT_FOUND
result the site ACKed (on the legacy wire: sent, which is all the old
protocol has), and ``COMMAND_RETENTION_DAYS`` have passed.  Safe for the
guard: the site wrote that gid's tombstone when it ACKed, so it never sends
those generations again, and a new generation comes with a new operationId.
Rows after that DELETE (a later generation, a stray late DOWNLOAD) stay.
Nothing else is pruned: the rows of a completed generation still guard it.
The wait only keeps the record for drills and operators.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorCore, IReactorTime
from twisted.logger import Logger

from tasknet.node.paths import DataDir
from tasknet.protocol.messages import HeldArchive, TaskEntry
from tasknet.runtime import IThreadPools, ThreadedConnectionPool
from tasknet.status import NodeCode

log = Logger()

SCHEMA = """
CREATE TABLE IF NOT EXISTS task (
    gid          INTEGER PRIMARY KEY,
    operation_id TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    url          TEXT    NOT NULL,
    protocol     INTEGER NOT NULL,           -- wire of the command that created it
    status       INTEGER NOT NULL CHECK (status BETWEEN 1 AND 4),
    progress     REAL    NOT NULL DEFAULT 0,
    size         INTEGER,                    -- total bytes, once the upstream said
    archive      TEXT,                       -- file name under archives/ once complete
    error        TEXT,                       -- last error of the current stage (1 or 3): the detail
    updated_at   REAL    NOT NULL,
    expected_size INTEGER NOT NULL DEFAULT 0  -- TaskCommand.size (0: unknown, or legacy)
);
CREATE TABLE IF NOT EXISTS deletion (
    gid          INTEGER PRIMARY KEY,
    operation_id TEXT    NOT NULL,           -- the delete operation id ('' on legacy)
    protocol     INTEGER NOT NULL,
    result       TEXT CHECK (result IN ('DELETED', 'NOT_FOUND', 'FAILED')),
    reason       TEXT    NOT NULL DEFAULT '',
    updated_at   REAL    NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS in_flight_report (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    report_id  TEXT    NOT NULL,
    revision   INTEGER NOT NULL,
    body       TEXT    NOT NULL,
    created_at REAL    NOT NULL
);
CREATE TABLE IF NOT EXISTS received_command (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    gid          INTEGER NOT NULL,
    operation_id TEXT,
    action       TEXT    NOT NULL,
    protocol     INTEGER NOT NULL,
    received_at  REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS received_command_by_gid
    ON received_command (gid, operation_id, action);
CREATE TABLE IF NOT EXISTS settled_deletion (
    gid          INTEGER PRIMARY KEY,
    upto_id      INTEGER NOT NULL,           -- received_command.id of the settled DELETE
    settled_at   REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS settled_deletion_by_time ON settled_deletion (settled_at);
CREATE TABLE IF NOT EXISTS archive (
    gid          INTEGER NOT NULL,
    operation_id TEXT    NOT NULL,
    name         TEXT    NOT NULL,           -- the task's name (the DOWNLOAD command's)
    file         TEXT    NOT NULL,           -- file name under archives/
    size         INTEGER NOT NULL,           -- bytes of the archive file
    sha256       TEXT    NOT NULL,           -- of exactly those bytes, lowercase hex
    completed_at REAL    NOT NULL,
    served_at    REAL,                       -- last served (NULL: never)
    scrubbed_at  REAL,                       -- last re-read whole by the scrub (NULL: never)
    PRIMARY KEY (gid, operation_id)
);
CREATE INDEX IF NOT EXISTS archive_by_scrub ON archive (COALESCE(scrubbed_at, completed_at));
CREATE INDEX IF NOT EXISTS archive_by_use ON archive (COALESCE(served_at, completed_at));
CREATE TABLE IF NOT EXISTS released (
    gid          INTEGER NOT NULL,
    operation_id TEXT    NOT NULL,
    reason       TEXT    NOT NULL CHECK (reason IN
                     ('EXPIRED', 'DISK_BUDGET', 'CORRUPT', 'MISSING', 'CANCELLED')),
    at           REAL    NOT NULL,
    PRIMARY KEY (gid, operation_id)
);
"""

#: Columns added after the first release, with their definitions: a database
#: of an older node gets them at its next start (``create_schema``).
ADDED_COLUMNS = {"task": [("expected_size", "INTEGER NOT NULL DEFAULT 0")]}

#: A report entry's ``detail`` is at most this long (PROTOCOL.md).
DETAIL_MAX = 256

#: How long the commands of a settled delete are kept before they are pruned.
COMMAND_RETENTION_DAYS = 7.0
#: Settled gids pruned per transaction (the prune rides on ACKs: keep it small).
PRUNE_BATCH = 50

DELETED = "DELETED"
NOT_FOUND = "NOT_FOUND"
FAILED = "FAILED"
LEGACY_DELETE_ID = ""  # a DeleteGallery carries no delete operation id
DELETE_RESULTS = (DELETED, NOT_FOUND, FAILED)

# Why the node stopped holding a generation (a ``released`` entry's reason).
EXPIRED = "EXPIRED"
DISK_BUDGET = "DISK_BUDGET"
CORRUPT = "CORRUPT"
MISSING = "MISSING"
CANCELLED = "CANCELLED"
RELEASE_REASONS = (EXPIRED, DISK_BUDGET, CORRUPT, MISSING, CANCELLED)

_TASK_COLUMNS = (
    "gid, operation_id, name, url, protocol, status, progress, size, archive, error, expected_size"
)
_SELECT_TASKS = f"SELECT {_TASK_COLUMNS} FROM task ORDER BY gid"  # noqa: S608 (constant)
_SELECT_TASK = f"SELECT {_TASK_COLUMNS} FROM task WHERE gid = ?"  # noqa: S608 (constant)
# Each takes (values..., updated_at, gid, operation_id): a write of a job only
# lands while its generation is still the task's current one.
# Bytes arriving again: the last attempt's error no longer describes the task.
_SET_PROGRESS = (
    "UPDATE task SET progress = ?, size = ?, error = NULL, updated_at = ?"
    " WHERE gid = ? AND operation_id = ? AND status = 1"
)
_SET_STATUS = (
    "UPDATE task SET status = ?, progress = ?, error = NULL, updated_at = ?"
    " WHERE gid = ? AND operation_id = ?"
)
_SET_ERROR = "UPDATE task SET error = ?, updated_at = ? WHERE gid = ? AND operation_id = ?"
_ARCHIVE_COLUMNS = (
    "gid, operation_id, name, file, size, sha256, completed_at, served_at, scrubbed_at"
)
_COMPLETE = (
    "UPDATE task SET status = 4, progress = 1.0, archive = ?, error = NULL, updated_at = ?"
    " WHERE gid = ? AND operation_id = ?"
)


@dataclass(frozen=True)
class TaskRow:
    gid: int
    operation_id: str
    name: str
    url: str
    protocol: int
    status: int
    progress: float
    size: int | None
    archive: str | None
    error: str | None
    #: The archive size the site expects (TaskCommand.size); 0: unknown.
    expected_size: int = 0


@dataclass(frozen=True)
class ArchiveRow:
    """An archive the node holds: ``file`` under ``archives/``
    (``DataDir.archive_file``), ``size`` bytes hashing to ``sha256``."""

    gid: int
    operation_id: str
    #: The task's name, from its DOWNLOAD command.
    name: str
    file: str
    size: int
    #: Lowercase hex SHA-256 of the file's bytes.
    sha256: str
    #: Unix seconds (the store's clock).
    completed_at: float
    served_at: float | None = None
    #: When the scrub last found it whole (None: not yet).
    scrubbed_at: float | None = None


@dataclass(frozen=True)
class DeletionRow:
    gid: int
    operation_id: str
    protocol: int
    result: str | None
    reason: str


@dataclass(frozen=True)
class PendingReport:
    """A persisted snapshot, exactly as it is (re)sent."""

    report_id: str
    revision: int
    gallery_tasks: tuple[TaskEntry, ...]
    operation_ids: dict[int, str]
    deleted: tuple[tuple[int, str, str, str], ...]
    #: (gid, operationId, reason) of the generations released (PROTOCOL.md).
    released: tuple[tuple[int, str, str], ...] = ()

    def to_json(self) -> str:
        body: dict[str, Any] = {
            # [gid, status, progress], plus queued and detail when they
            # say something, plus size and sha256 when a digest is known.
            "galleryTasks": [_entry_json(t) for t in self.gallery_tasks],
            "operationIds": {str(k): v for k, v in self.operation_ids.items()},
            "deleted": [list(d) for d in self.deleted],
        }
        if self.released:
            body["released"] = [list(r) for r in self.released]
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_row(cls, report_id: str, revision: int, body: str) -> PendingReport:
        data = json.loads(body)
        return cls(
            report_id=report_id,
            revision=revision,
            # A report persisted by an older node has three- or five-element entries.
            gallery_tasks=tuple(_entry(*t) for t in data["galleryTasks"]),
            operation_ids={int(k): str(v) for k, v in data["operationIds"].items()},
            deleted=tuple((int(g), str(o), str(r), str(w)) for g, o, r, w in data["deleted"]),
            # A report persisted by an older node has none.
            released=tuple((int(g), str(o), str(r)) for g, o, r in data.get("released", ())),
        )


def _entry_json(entry: TaskEntry) -> list[Any]:
    if entry.sha256:
        return list(entry)
    if entry.queued or entry.detail:
        return list(entry[:5])
    return list(entry[:3])


def _entry(
    gid: Any,
    status: Any,
    progress: Any,
    queued: Any = False,
    detail: Any = "",
    size: Any = 0,
    sha256: Any = "",
) -> TaskEntry:
    return TaskEntry(
        int(gid), int(status), float(progress), bool(queued), str(detail), int(size), str(sha256)
    )


def report_detail(error: str | None) -> str:
    """What a report entry says of a task's last error: at most 256 characters
    and no NUL (the wire refuses one)."""
    if not error:
        return ""
    text = error.replace("\x00", "")
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


@dataclass(frozen=True)
class DownloadAccepted:
    """What a DOWNLOAD command did: ``new``, ``duplicate`` or ``new_generation``."""

    kind: str
    operation_id: str
    old_operation_id: str | None = None


@dataclass(frozen=True)
class DeleteBegun:
    """``run``: the delete must be (re)done; ``repeat``: it already succeeded."""

    kind: str
    task: TaskRow | None


def _task(row: tuple[Any, ...]) -> TaskRow:
    return TaskRow(*row)


def _archive(row: tuple[Any, ...]) -> ArchiveRow:
    return ArchiveRow(*row)


def _get_archive(cursor: sqlite3.Cursor, gid: int, operation_id: str) -> ArchiveRow | None:
    cursor.execute(
        f"SELECT {_ARCHIVE_COLUMNS} FROM archive WHERE gid = ? AND operation_id = ?",  # noqa: S608 (constant)
        (gid, operation_id),
    )
    row = cursor.fetchone()
    return _archive(row) if row else None


def _drop_archives_of(cursor: sqlite3.Cursor, gid: int, keep: str | None = None) -> list[str]:
    """Forget the archives of ``gid`` (but generation ``keep``); their operation ids."""
    cursor.execute(
        "SELECT operation_id FROM archive WHERE gid = ? AND operation_id IS NOT ?"
        " ORDER BY operation_id",
        (gid, keep),
    )
    dropped = [row[0] for row in cursor.fetchall()]
    cursor.execute("DELETE FROM archive WHERE gid = ? AND operation_id IS NOT ?", (gid, keep))
    return dropped


def _record_command(
    cursor: sqlite3.Cursor,
    now: float,
    gid: int,
    operation_id: str | None,
    action: str,
    protocol: int,
) -> None:
    cursor.execute(
        "INSERT INTO received_command (gid, operation_id, action, protocol, received_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (gid, operation_id, action, protocol, now),
    )


def _get_task(cursor: sqlite3.Cursor, gid: int) -> TaskRow | None:
    cursor.execute(_SELECT_TASK, (gid,))
    row = cursor.fetchone()
    return _task(row) if row else None


def _accept_download(
    cursor: sqlite3.Cursor,
    now: float,
    gid: int,
    operation_id: str | None,
    name: str,
    url: str,
    protocol: int,
    legacy_operation_id: str,
    size: int,
) -> DownloadAccepted:
    current = _get_task(cursor, gid)
    if operation_id is None:
        # A legacy DownloadPost carries no operationId: the old node keeps one
        # task per gid and ignores a post for a gid it already holds.
        _record_command(cursor, now, gid, None, "DOWNLOAD", protocol)
        if current is not None:
            return DownloadAccepted("duplicate", current.operation_id)
        operation_id = legacy_operation_id
    else:
        # Received before, and not cancelled since (a CANCEL ends a
        # generation here: the site may send it again later, e.g. after
        # moving it back to this node).
        cursor.execute(
            "SELECT 1 FROM received_command WHERE gid = ? AND operation_id = ? AND action = ?"
            " AND id > (SELECT COALESCE(MAX(id), 0) FROM received_command"
            "  WHERE gid = ? AND operation_id = ? AND action = 'CANCEL')",
            (gid, operation_id, "DOWNLOAD", gid, operation_id),
        )
        seen_before = cursor.fetchone() is not None
        _record_command(cursor, now, gid, operation_id, "DOWNLOAD", protocol)
        if seen_before or (current is not None and current.operation_id == operation_id):
            return DownloadAccepted("duplicate", operation_id)
    cursor.execute(
        "INSERT OR REPLACE INTO task (gid, operation_id, name, url, protocol, status, progress,"
        " size, archive, error, updated_at, expected_size)"
        " VALUES (?, ?, ?, ?, ?, ?, 0, NULL, NULL, NULL, ?, ?)",
        (gid, operation_id, name, url, protocol, int(NodeCode.DOWNLOADING), now, size),
    )
    # Held again: a release of this generation not yet reported is void.
    cursor.execute("DELETE FROM released WHERE gid = ? AND operation_id = ?", (gid, operation_id))
    # The archive of an older generation (its task row gone once its
    # completion was ACKed) is replaced too: the caller removes its files.
    replaced = _drop_archives_of(cursor, gid, keep=operation_id)
    if current is not None:
        return DownloadAccepted("new_generation", operation_id, current.operation_id)
    if replaced:
        return DownloadAccepted("new_generation", operation_id, replaced[-1])
    return DownloadAccepted("new", operation_id)


def _begin_delete(
    cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str, protocol: int
) -> DeleteBegun:
    _record_command(cursor, now, gid, operation_id, "DELETE", protocol)
    task = _get_task(cursor, gid)
    cursor.execute("SELECT operation_id, result FROM deletion WHERE gid = ?", (gid,))
    row = cursor.fetchone()
    if row is not None and row[0] == operation_id and row[1] in (DELETED, NOT_FOUND):
        return DeleteBegun("repeat", task)
    cursor.execute(
        "INSERT OR REPLACE INTO deletion (gid, operation_id, protocol, result, reason, updated_at)"
        " VALUES (?, ?, ?, NULL, '', ?)",
        (gid, operation_id, protocol, now),
    )
    return DeleteBegun("run", task)


def _finish_delete(
    cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str, result: str, reason: str
) -> None:
    if result not in DELETE_RESULTS:
        raise ValueError(f"unknown delete result {result!r}")
    cursor.execute(
        "UPDATE deletion SET result = ?, reason = ?, updated_at = ?"
        " WHERE gid = ? AND operation_id = ?",
        (result, reason, now, gid, operation_id),
    )
    if result != FAILED:
        cursor.execute("DELETE FROM task WHERE gid = ?", (gid,))
        _drop_archives_of(cursor, gid)


def _complete(
    cursor: sqlite3.Cursor,
    now: float,
    gid: int,
    operation_id: str,
    archive: str,
    size: int,
    sha256: str,
) -> bool:
    if not _set_state(cursor, now, _COMPLETE, gid, operation_id, archive):
        return False
    cursor.execute(
        f"INSERT OR REPLACE INTO archive ({_ARCHIVE_COLUMNS})"  # noqa: S608 (constant)
        " SELECT gid, operation_id, name, ?, ?, ?, ?, NULL, NULL FROM task"
        " WHERE gid = ? AND operation_id = ?",
        (archive, size, sha256, now, gid, operation_id),
    )
    return True


def _set_state(
    cursor: sqlite3.Cursor, now: float, sql: str, gid: int, operation_id: str, *values: Any
) -> bool:
    cursor.execute(sql, (*values, now, gid, operation_id))
    return cursor.rowcount == 1


def _read_snapshot(
    cursor: sqlite3.Cursor,
) -> tuple[list[TaskRow], list[DeletionRow]]:
    cursor.execute(_SELECT_TASKS)
    tasks = [_task(row) for row in cursor.fetchall()]
    cursor.execute(
        "SELECT gid, operation_id, protocol, result, reason FROM deletion"
        " WHERE result IS NOT NULL ORDER BY gid"
    )
    deletions = [DeletionRow(*row) for row in cursor.fetchall()]
    return tasks, deletions


def _get_in_flight(cursor: sqlite3.Cursor) -> PendingReport | None:
    cursor.execute("SELECT report_id, revision, body FROM in_flight_report WHERE id = 1")
    row = cursor.fetchone()
    return PendingReport.from_row(*row) if row else None


def _last_revision(cursor: sqlite3.Cursor) -> int | None:
    cursor.execute("SELECT value FROM meta WHERE key = 'revision'")
    row = cursor.fetchone()
    return int(row[0]) if row else None


def _create_report(
    cursor: sqlite3.Cursor, now: float, report_id: str, now_ms: int, queued: frozenset[int]
) -> PendingReport | None:
    existing = _get_in_flight(cursor)
    if existing is not None:
        return existing
    tasks, deletions = _read_snapshot(cursor)
    # A delete taken on a legacy link has no delete id, and a v2 report may
    # not carry an empty one (PROTOCOL.md "Bounds"): it stays held until the
    # site sends its DELETE again over v2 with the id, which replaces it.
    deletions = [d for d in deletions if d.operation_id != LEGACY_DELETE_ID]
    released = _read_released(cursor)
    if not tasks and not deletions and not released:
        return None  # nothing held: a report would tell the site nothing
    previous = _last_revision(cursor)
    revision = now_ms if previous is None else max(previous + 1, now_ms)
    # A gid held only as a deletion maps to its delete operation id, as the
    # golden vector (TaskReport r-0002) does; a held task's generation wins.
    # The site reads operationIds only for galleryTasks gids (docs/protocol.md).
    operation_ids = {d.gid: d.operation_id for d in deletions}
    operation_ids.update({t.gid: t.operation_id for t in tasks})
    # The digests of the completions in the snapshot (a completion from
    # before the archive table has none: its entry carries neither).
    cursor.execute(
        f"SELECT {_ARCHIVE_COLUMNS} FROM archive WHERE (gid, operation_id) IN"  # noqa: S608 (constant)
        " (SELECT gid, operation_id FROM task WHERE status = 4)"
    )
    held = {(a.gid, a.operation_id): a for a in map(_archive, cursor.fetchall())}
    report = PendingReport(
        report_id=report_id,
        revision=revision,
        gallery_tasks=tuple(
            snapshot_entry(t, queued, held.get((t.gid, t.operation_id))) for t in tasks
        ),
        operation_ids=operation_ids,
        deleted=tuple((d.gid, d.operation_id, d.result or "", d.reason) for d in deletions),
        released=released,
    )
    cursor.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('revision', ?)", (str(revision),)
    )
    cursor.execute(
        "INSERT INTO in_flight_report (id, report_id, revision, body, created_at)"
        " VALUES (1, ?, ?, ?, ?)",
        (report_id, revision, report.to_json(), now),
    )
    return report


def _read_released(cursor: sqlite3.Cursor) -> tuple[tuple[int, str, str], ...]:
    cursor.execute("SELECT gid, operation_id, reason FROM released ORDER BY gid, operation_id")
    return tuple((int(g), str(o), str(r)) for g, o, r in cursor.fetchall())


def _release(cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str, reason: str) -> None:
    """Record that generation ``(gid, operation_id)`` is no longer held, for
    ``reason``; the next v2 reports carry it until one of them is ACKed.  A
    later release of the same generation replaces an earlier one not yet
    reported (a CANCEL after an expiry: the site settles its CANCEL)."""
    if reason not in RELEASE_REASONS:
        raise ValueError(f"unknown release reason {reason!r}")
    cursor.execute(
        "INSERT OR REPLACE INTO released (gid, operation_id, reason, at) VALUES (?, ?, ?, ?)",
        (gid, operation_id, reason, now),
    )


def _release_archive(
    cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str, reason: str
) -> ArchiveRow | None:
    """Stop holding the archive of ``(gid, operation_id)`` (retention): its
    row goes and the release is recorded in the same transaction; the row,
    or None when it was no longer held (the caller then removes nothing).
    An archive whose completion the site has not yet ACKed is not released
    (the task row still holds it): the site would not know it completed."""
    row = _get_archive(cursor, gid, operation_id)
    if row is None:
        return None
    task = _get_task(cursor, gid)
    if task is not None and task.operation_id == operation_id:
        return None
    cursor.execute("DELETE FROM archive WHERE gid = ? AND operation_id = ?", (gid, operation_id))
    _release(cursor, now, gid, operation_id, reason)
    return row


@dataclass(frozen=True)
class Cancelled:
    """What a CANCEL did: ``held`` (the task or archive of that generation
    was there and is gone now) or not; the archive row removed, if any."""

    held: bool
    archive: ArchiveRow | None


def _cancel(cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str) -> Cancelled:
    """Forget generation ``(gid, operation_id)`` (its task row and its
    archive), never another generation of the gid, and release it
    (``CANCELLED``), held or not.  Recorded as a received CANCEL: a DOWNLOAD
    of that generation after it is a new start, not a repeat."""
    _record_command(cursor, now, gid, operation_id, "CANCEL", 2)
    archive = _get_archive(cursor, gid, operation_id)
    cursor.execute("DELETE FROM task WHERE gid = ? AND operation_id = ?", (gid, operation_id))
    held = cursor.rowcount == 1 or archive is not None
    cursor.execute("DELETE FROM archive WHERE gid = ? AND operation_id = ?", (gid, operation_id))
    _release(cursor, now, gid, operation_id, CANCELLED)
    return Cancelled(held, archive)


def snapshot_entry(
    task: TaskRow, queued: frozenset[int] = frozenset(), archive: ArchiveRow | None = None
) -> TaskEntry:
    """A task as a report shows it: ``queued`` while it waits for its first
    download slot (status 1, nothing received), ``detail`` its last error;
    a completion carries its ``archive``'s size and sha256 when held."""
    waiting = task.status == NodeCode.DOWNLOADING and task.progress == 0 and task.gid in queued
    if task.status != NodeCode.COMPLETED:
        return TaskEntry(task.gid, task.status, task.progress, waiting, report_detail(task.error))
    if archive is None or (archive.gid, archive.operation_id) != (task.gid, task.operation_id):
        return TaskEntry(task.gid, task.status, task.progress)
    return TaskEntry(task.gid, task.status, task.progress, size=archive.size, sha256=archive.sha256)


def _acknowledge(cursor: sqlite3.Cursor, now: float, report_id: str) -> bool:
    report = _get_in_flight(cursor)
    if report is None or report.report_id != report_id:
        return False
    for gid, status, *_ in report.gallery_tasks:
        if status == NodeCode.COMPLETED:
            cursor.execute(
                "DELETE FROM task WHERE gid = ? AND operation_id = ? AND status = ?",
                (gid, report.operation_ids[gid], int(NodeCode.COMPLETED)),
            )
    for gid, operation_id, result, _reason in report.deleted:
        cursor.execute(
            "DELETE FROM deletion WHERE gid = ? AND operation_id = ? AND result = ?",
            (gid, operation_id, result),
        )
        _settle(cursor, now, gid, operation_id, result)
    # A release replaced meanwhile (another reason) stays for the next report.
    cursor.executemany(
        "DELETE FROM released WHERE gid = ? AND operation_id = ? AND reason = ?",
        report.released,
    )
    cursor.execute("DELETE FROM in_flight_report WHERE id = 1")
    _prune_commands(cursor, now, COMMAND_RETENTION_DAYS * 86400.0, PRUNE_BATCH)
    return True


def _drop_reported_completions(cursor: sqlite3.Cursor, completed: list[tuple[int, str]]) -> None:
    cursor.executemany(
        "DELETE FROM task WHERE gid = ? AND operation_id = ? AND status = 4", completed
    )


def _drop_deletion(cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str) -> None:
    cursor.execute(
        "SELECT result FROM deletion WHERE gid = ? AND operation_id = ? AND result IS NOT NULL",
        (gid, operation_id),
    )
    row = cursor.fetchone()
    if row is None:
        return
    cursor.execute("DELETE FROM deletion WHERE gid = ? AND operation_id = ?", (gid, operation_id))
    _settle(cursor, now, gid, operation_id, row[0])
    _prune_commands(cursor, now, COMMAND_RETENTION_DAYS * 86400.0, PRUNE_BATCH)


def _settle(cursor: sqlite3.Cursor, now: float, gid: int, operation_id: str, result: str) -> None:
    """The site has taken this delete's result: if the gid is gone (DELETED or
    NOT_FOUND; a FAILED delete leaves the task held), its commands up to this
    DELETE may be pruned once the retention has passed."""
    if result not in (DELETED, NOT_FOUND):
        return
    cursor.execute(
        "SELECT MAX(id) FROM received_command WHERE gid = ? AND operation_id = ? AND action = ?",
        (gid, operation_id, "DELETE"),
    )
    upto = cursor.fetchone()[0]
    if upto is None:
        return
    cursor.execute(
        "INSERT INTO settled_deletion (gid, upto_id, settled_at) VALUES (?, ?, ?)"
        " ON CONFLICT (gid) DO UPDATE SET upto_id = MAX(upto_id, excluded.upto_id),"
        " settled_at = excluded.settled_at",
        (gid, upto, now),
    )


def _prune_commands(
    cursor: sqlite3.Cursor, now: float, retention_seconds: float, limit: int
) -> int:
    """Delete the commands of up to ``limit`` gids settled more than
    ``retention_seconds`` ago; return the number of command rows deleted."""
    cursor.execute(
        "SELECT gid, upto_id FROM settled_deletion WHERE settled_at <= ?"
        " ORDER BY settled_at LIMIT ?",
        (now - retention_seconds, limit),
    )
    deleted = 0
    for gid, upto in cursor.fetchall():
        cursor.execute("DELETE FROM received_command WHERE gid = ? AND id <= ?", (gid, upto))
        deleted += cursor.rowcount
        cursor.execute("DELETE FROM settled_deletion WHERE gid = ?", (gid,))
    return deleted


def _set_aside(
    cursor: sqlite3.Cursor, now: float, data: DataDir, gid: int, operation_id: str, reason: str
) -> tuple[ArchiveRow | None, str]:
    """Forget the archive, release it (``reason``: ``CORRUPT`` or
    ``MISSING``) and move its file to ``corrupt/``; the row and what became
    of the file (for the log)."""
    row = _get_archive(cursor, gid, operation_id)
    if row is None:
        return None, ""
    cursor.execute("DELETE FROM archive WHERE gid = ? AND operation_id = ?", (gid, operation_id))
    _release(cursor, now, gid, operation_id, reason)
    # The row is gone either way: whatever happens to the file, it is never
    # served again.  The move is a rename within --data (quick, in the
    # transaction's thread).
    try:
        source = data.archive_file(row)
        os.replace(source, data.corrupt / source.name)
        return row, f"moved to {data.corrupt / source.name}"
    except FileNotFoundError:
        return row, "its file was already gone"
    except (OSError, ValueError) as exc:
        return row, f"cannot move its file: {exc}"


def _query(cursor: sqlite3.Cursor, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    cursor.execute(sql, tuple(params))
    return cursor.fetchall()


def _on_connect(connection: sqlite3.Connection) -> None:
    # WAL + FULL: an ACK makes the node forget, and a completion must survive
    # a power cut once it is written.
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute("PRAGMA busy_timeout=5000")
    connection.execute("PRAGMA foreign_keys=ON")


class NodeStore:
    """The node database.  Every method returns a Deferred.

    Its ``adbapi`` pool runs on ``reactor`` and a one-thread pool from
    ``threads``; every time it writes (``updated_at``, ``received_at``, a
    settled delete's age) is ``clock.seconds()`` when the transaction is
    submitted.  All three are its caller's: the node's root
    (``NodeService``), the tests, ``bench/nodeworker.py``'s entry point.
    """

    def __init__(
        self,
        data: DataDir,
        *,
        reactor: IReactorCore,
        clock: IReactorTime,
        threads: IThreadPools,
    ) -> None:
        self.data = data
        self._clock: IReactorTime = clock
        #: Called after ``set_aside`` released an archive (the node's root
        #: hands the reporter's ``changed``: the release is reported soon).
        self.on_release: Callable[[], None] = lambda: None
        data.create()
        self._pool = ThreadedConnectionPool(
            reactor,
            threads,
            "tasknet-node-store",
            "sqlite3",
            str(data.database),
            check_same_thread=False,
            cp_min=1,
            cp_max=1,
            cp_openfun=_on_connect,
        )

    def _run(self, fn: Any, *args: Any) -> Deferred[Any]:
        return self._pool.runInteraction(fn, *args)

    def _run_at(self, fn: Any, *args: Any) -> Deferred[Any]:
        """Run ``fn(cursor, now, *args)``, ``now`` the store's clock."""
        return self._pool.runInteraction(fn, self._clock.seconds(), *args)

    def create_schema(self) -> Deferred[None]:
        def create(cursor: sqlite3.Cursor) -> None:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    cursor.execute(statement)
            for table, columns in ADDED_COLUMNS.items():
                have = {row[1] for row in cursor.execute(f"PRAGMA table_info({table})")}
                for column, definition in columns:
                    if column not in have:
                        cursor.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

        return self._run(create)

    def close(self) -> None:
        self._pool.close()

    # commands -----------------------------------------------------------
    def accept_download(
        self,
        gid: int,
        operation_id: str | None,
        name: str,
        url: str,
        protocol: int,
        legacy_operation_id: str = "",
        *,
        size: int = 0,
    ) -> Deferred[DownloadAccepted]:
        """Record a DOWNLOAD and persist the task before any work starts;
        ``size`` is the archive size the site expects (0: unknown)."""
        return self._run_at(
            _accept_download, gid, operation_id, name, url, protocol, legacy_operation_id, size
        )

    def begin_delete(self, gid: int, operation_id: str, protocol: int) -> Deferred[DeleteBegun]:
        return self._run_at(_begin_delete, gid, operation_id, protocol)

    def finish_delete(
        self, gid: int, operation_id: str, result: str, reason: str
    ) -> Deferred[None]:
        return self._run_at(_finish_delete, gid, operation_id, result, reason)

    # work ---------------------------------------------------------------
    def get_task(self, gid: int) -> Deferred[TaskRow | None]:
        return self._run(_get_task, gid)

    def set_progress(
        self, gid: int, operation_id: str, progress: float, size: int | None
    ) -> Deferred[bool]:
        return self._run_at(_set_state, _SET_PROGRESS, gid, operation_id, progress, size)

    def set_status(
        self, gid: int, operation_id: str, status: int, progress: float
    ) -> Deferred[bool]:
        return self._run_at(_set_state, _SET_STATUS, gid, operation_id, int(status), progress)

    def set_error(self, gid: int, operation_id: str, error: str | None) -> Deferred[bool]:
        return self._run_at(_set_state, _SET_ERROR, gid, operation_id, error)

    def complete(
        self, gid: int, operation_id: str, archive: str, *, size: int, sha256: str
    ) -> Deferred[bool]:
        """Mark the generation complete and hold its archive (``archive`` the
        file name under ``archives/``, ``size`` bytes hashing to ``sha256``),
        in one transaction; False when the generation is no longer current."""
        return self._run_at(_complete, gid, operation_id, archive, size, sha256)

    def tasks(self) -> Deferred[list[TaskRow]]:
        def read(cursor: sqlite3.Cursor) -> list[TaskRow]:
            return [_task(r) for r in _query(cursor, _SELECT_TASKS)]

        return self._run(read)

    def deletions(self) -> Deferred[list[DeletionRow]]:
        def read(cursor: sqlite3.Cursor) -> list[DeletionRow]:
            rows = _query(
                cursor, "SELECT gid, operation_id, protocol, result, reason FROM deletion"
            )
            return [DeletionRow(*row) for row in rows]

        return self._run(read)

    # reports ------------------------------------------------------------
    def in_flight_report(self) -> Deferred[PendingReport | None]:
        return self._run(_get_in_flight)

    def create_report(
        self, report_id: str, now_ms: int, queued: frozenset[int] = frozenset()
    ) -> Deferred[PendingReport | None]:
        """Persist a new snapshot as the in-flight report (the existing one if
        any); ``queued``: gids waiting for a download slot."""
        return self._run_at(_create_report, report_id, now_ms, frozenset(queued))

    def acknowledge(self, report_id: str) -> Deferred[bool]:
        """Forget the in-flight report and the completions/deletions it carried."""
        return self._run_at(_acknowledge, report_id)

    def last_revision(self) -> Deferred[int | None]:
        return self._run(_last_revision)

    def legacy_snapshot(self) -> Deferred[tuple[list[TaskRow], list[DeletionRow]]]:
        return self._run(_read_snapshot)

    def drop_reported_completions(self, completed: list[tuple[int, str]]) -> Deferred[None]:
        return self._run(_drop_reported_completions, completed)

    def drop_deletion(self, gid: int, operation_id: str) -> Deferred[None]:
        """Forget a reported deletion (legacy wire: once its result is sent)."""
        return self._run_at(_drop_deletion, gid, operation_id)

    # archives -----------------------------------------------------------
    def archive(self, gid: int, operation_id: str) -> Deferred[ArchiveRow | None]:
        """The archive of that generation, if the node holds it."""
        return self._run(_get_archive, gid, operation_id)

    def archives(self) -> Deferred[list[ArchiveRow]]:
        """Every archive the node holds, by gid."""

        def read(cursor: sqlite3.Cursor) -> list[ArchiveRow]:
            sql = f"SELECT {_ARCHIVE_COLUMNS} FROM archive ORDER BY gid, operation_id"  # noqa: S608 (constant)
            return [_archive(r) for r in _query(cursor, sql)]

        return self._run(read)

    def archives_to_scrub(self, limit: int) -> Deferred[list[ArchiveRow]]:
        """Up to ``limit`` archives, the one scrubbed longest ago (or, never
        scrubbed, completed longest ago) first."""

        def read(cursor: sqlite3.Cursor) -> list[ArchiveRow]:
            sql = (
                f"SELECT {_ARCHIVE_COLUMNS} FROM archive"  # noqa: S608 (constant)
                " ORDER BY COALESCE(scrubbed_at, completed_at), gid, operation_id LIMIT ?"
            )
            return [_archive(r) for r in _query(cursor, sql, (limit,))]

        return self._run(read)

    def mark_served(self, gid: int, operation_id: str) -> Deferred[None]:
        """Record that the archive was served now (retention: oldest-served first)."""

        def mark(cursor: sqlite3.Cursor, now: float) -> None:
            cursor.execute(
                "UPDATE archive SET served_at = ? WHERE gid = ? AND operation_id = ?",
                (now, gid, operation_id),
            )

        return self._run_at(mark)

    def mark_scrubbed(self, gid: int, operation_id: str, sha256: str) -> Deferred[bool]:
        """Record that the scrub found the archive whole now; False when it is
        no longer held as that digest (replaced or set aside meanwhile)."""

        def mark(cursor: sqlite3.Cursor, now: float) -> bool:
            cursor.execute(
                "UPDATE archive SET scrubbed_at = ? WHERE gid = ? AND operation_id = ?"
                " AND sha256 = ?",
                (now, gid, operation_id, sha256),
            )
            return cursor.rowcount == 1

        return self._run_at(mark)

    def set_aside(
        self, gid: int, operation_id: str, why: str, *, reason: str = CORRUPT
    ) -> Deferred[None]:
        """Stop holding the archive because of ``why`` (damaged, wrong size):
        its row goes, it is released with ``reason`` (``CORRUPT``, or
        ``MISSING`` when its file is gone) and its file moves to ``corrupt/``;
        logged.  Nothing happens when it is not held."""
        if reason not in (CORRUPT, MISSING):
            raise ValueError(f"an archive is set aside as CORRUPT or MISSING, not {reason!r}")

        def logged(result: tuple[ArchiveRow | None, str]) -> None:
            row, file = result
            if row is not None:
                log.error(
                    "gid {gid}: archive {operation_id} set aside ({why}), released {reason}:"
                    " {file}",
                    gid=gid,
                    operation_id=operation_id,
                    why=why,
                    reason=reason,
                    file=file,
                )
                self.on_release()

        d: Deferred[tuple[ArchiveRow | None, str]] = self._run_at(
            _set_aside, self.data, gid, operation_id, reason
        )
        return d.addCallback(logged)

    def release_archive(
        self, gid: int, operation_id: str, reason: str
    ) -> Deferred[ArchiveRow | None]:
        """Stop holding an archive (retention: ``EXPIRED``, ``DISK_BUDGET``)
        and release it, in one transaction; the row forgotten (its file is the
        caller's to remove), or None when it was not held or its completion
        is not yet ACKed."""
        return self._run_at(_release_archive, gid, operation_id, reason)

    def cancel(self, gid: int, operation_id: str) -> Deferred[Cancelled]:
        """Forget generation ``(gid, operation_id)`` and release it
        ``CANCELLED`` (held or not); the caller stopped its job first and
        removes its files after."""
        return self._run_at(_cancel, gid, operation_id)

    def released(self) -> Deferred[list[tuple[int, str, str]]]:
        """The releases not yet ACKed: (gid, operationId, reason)."""
        return self._run(lambda cursor: list(_read_released(cursor)))

    def eviction_candidates(self, limit: int, *, offset: int = 0) -> Deferred[list[ArchiveRow]]:
        """Up to ``limit`` archives retention may remove (after the first
        ``offset``), the one served longest ago (never served: completed
        longest ago) first; an archive whose completion the site has not
        ACKed yet is not one."""

        def read(cursor: sqlite3.Cursor) -> list[ArchiveRow]:
            sql = (
                f"SELECT {_ARCHIVE_COLUMNS} FROM archive a"  # noqa: S608 (constant)
                " WHERE NOT EXISTS (SELECT 1 FROM task t"
                "  WHERE t.gid = a.gid AND t.operation_id = a.operation_id)"
                " ORDER BY COALESCE(served_at, completed_at), gid, operation_id"
                " LIMIT ? OFFSET ?"
            )
            return [_archive(r) for r in _query(cursor, sql, (limit, offset))]

        return self._run(read)

    def inventory(self) -> Deferred[list[HeldArchive]]:
        """Every archive held, as an inventory lists it, by gid and operationId."""

        def read(cursor: sqlite3.Cursor) -> list[HeldArchive]:
            sql = "SELECT gid, operation_id, size, sha256 FROM archive ORDER BY gid, operation_id"
            return [HeldArchive(*r) for r in _query(cursor, sql)]

        return self._run(read)

    def archive_totals(self) -> Deferred[tuple[int, int]]:
        """The archives held: (count, bytes)."""

        def read(cursor: sqlite3.Cursor) -> tuple[int, int]:
            cursor.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM archive")
            count, size = cursor.fetchone()
            return int(count), int(size)

        return self._run(read)

    # housekeeping -------------------------------------------------------
    def prune_commands(
        self, retention_days: float = COMMAND_RETENTION_DAYS, limit: int = PRUNE_BATCH
    ) -> Deferred[int]:
        """Prune the commands of settled deletes older than ``retention_days``
        (at most ``limit`` gids); the number of command rows deleted.  ACKs
        already do this: call it for a prune outside of them."""
        return self._run_at(_prune_commands, retention_days * 86400.0, limit)
