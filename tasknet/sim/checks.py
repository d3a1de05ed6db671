"""The simulator's cheap invariants, checked at every event (SIMULATION.md "Checks").

* **one POST per generation**: after every event, the upstream's journal
  holds no more POSTs for a gid than the workload started generations of
  it (D1, at the instant it breaks), nor more POST *attempts* (one the
  upstream failed or dropped before applying it counts too: a site never
  sends a generation's POST twice);
* **SUBMITTING before the POST**: when a POST reaches the upstream, its
  gid's generation is past ``RESERVED`` in the committed database (the
  POST goes out only after ``SUBMITTING`` commits);
* **no ACK before its commit**: when the site *writes* a ``TaskReportAck``,
  the report's receipt is already committed in the site database;
* **no DOWNLOAD for a task that is not dispatchable**: when the site writes
  a ``DOWNLOAD`` (v2 ``TaskCommand`` or legacy ``DownloadPost``), the task
  is confirmed ``SUBMITTED`` in the committed database, in that generation
  (or being deleted since: see ``_CONFIRMED``) (D5);
* **fencing** (SCALE.md "Fencing"): a site writes the first byte of a POST
  to the upstream only while its lease is fresh (rule 1), and nothing a site
  writes commits after its instance was reaped (rule 3): so when a site
  process sends a POST, or a write transaction of it commits, its own
  ``site_instance`` row is not reaped in the committed database;
* **one node at a time has a generation's DOWNLOAD** (issue 34): a second
  node is sent one only after a ``CANCEL`` to the first or once the first's
  task was moved away (:class:`~tasknet.sim.custody.OneHolder`);
* **no state outside the transition table**: the database's trigger
  refuses one; after the run every state read is one of the table's;
* **no late POST** (issue 39, :class:`~tasknet.sim.truth.LatePosts`): a
  site writes a POST's first byte at most its upstream timeout after that
  generation's ``SUBMITTING`` commit, on its own monotonic clock.

The database is read through one read-only connection of the checker's
own (SQLite: ``mode=ro``; it sees what is committed, nothing else).  A
failure is kept as ``(check, detail)`` with the event number it was seen
at; the run goes on (the D1–D10 verdicts at the end add their own).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasknet.drill.proxy import FrameSplitter
from tasknet.sim.custody import OneHolder
from tasknet.sim.network import SimConnection, SimTransport
from tasknet.sim.truth import ARCHIVE_POST, LatePosts
from tasknet.sim.world import World
from tasknet.site.storage.engine.database import is_postgres
from tasknet.status import OperationState

__all__ = ["CheapChecks"]

TYPE_DOWNLOAD_POST = 4
TYPE_TASK_COMMAND = 11
TYPE_TASK_REPORT_ACK = 13
_STATES = frozenset(state.value for state in OperationState)
#: A generation confirmed SUBMITTED, perhaps being deleted since: the site
#: decided its DOWNLOAD while it was SUBMITTED, and a delete committed by the
#: writer before the command went out follows it on the same connection
#: (seed 2843; D4 judges what the node is left holding).
_CONFIRMED = frozenset({"SUBMITTED", "DELETE_PENDING", "DELETED"})


class CheapChecks:
    """Watches one run (see the module doc).  ``journal``: a callable
    giving the upstream's journal now; ``generations``: the ledger's count
    of generations by gid; ``node_ports``: the node ports of the sites;
    ``instance_of``: the instance id a site process runs as (fencing)."""

    def __init__(
        self,
        world: World,
        db: str,
        journal: Callable[[], Any],
        generations: Any,
        node_ports: Callable[[], set[int]],
        instance_of: Callable[[str], int | None],
        *,
        upstream_timeout: float = 5.0,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.world = world
        self.upstream_timeout = upstream_timeout
        #: The sites' monotonic clock (the world's elapsed time).
        self._monotonic = monotonic or world.elapsed
        self.late_posts = LatePosts()
        self.db = db
        self._journal = journal
        self._generations = generations
        self._node_ports = node_ports
        self._instance_of = instance_of
        self._seen_entries = 0
        self._seen_attempts: dict[int, int] = {}
        self._splitters: dict[tuple[int, int], FrameSplitter] = {}
        self._reader: Any = None
        self.failures: list[tuple[str, str]] = []
        self.one_holder = OneHolder(self._moved_away)
        world.after_event.append(self._after_event)
        world.network.send_taps.append(self._sent)

    def fail(self, check: str, detail: str) -> None:
        self.failures.append((check, f"{detail} (event {self.world.events})"))

    # -- one POST per generation ------------------------------------------------------

    def _after_event(self) -> None:
        journal = self._journal()
        if journal is None:
            return
        if sum(journal.post_attempts.values()) != sum(self._seen_attempts.values()):
            self._new_attempts(journal.post_attempts)
        if len(journal.entries) == self._seen_entries:
            return
        for entry in journal.entries[self._seen_entries :]:
            gid = entry.gid
            posts = journal.posts.get(gid, 0)
            allowed = max(self._generations.get(gid, 1), 1)
            if posts > allowed:
                self.fail("D1", f"gid {gid}: {posts} POSTs for {allowed} generation(s)")
        self._seen_entries = len(journal.entries)

    def _new_attempts(self, attempts: dict[int, int]) -> None:
        for gid, n in sorted(attempts.items()):
            if n == self._seen_attempts.get(gid, 0):
                continue
            self._seen_attempts[gid] = n
            allowed = max(self._generations.get(gid, 1), 1)
            if n > allowed:
                self.fail("D1", f"gid {gid}: {n} POST attempts for {allowed} generation(s)")
            row = self._one("SELECT state FROM task_operation WHERE gid = ?", (gid,))
            if row is None or row[0] == "RESERVED":
                state = None if row is None else row[0]
                self.fail(
                    "submitting-before-post",
                    f"gid {gid}: a POST reached the upstream while {state}",
                )

    # -- no late POST --------------------------------------------------------------------

    def submitting_committed(self) -> None:
        """A write that ran ``begin_submit`` committed just now: each
        generation ``SUBMITTING`` now was committed so by now at the latest."""
        at = self._monotonic()
        for (operation_id,) in self.rows(
            "SELECT operation_id FROM task_operation WHERE state = 'SUBMITTING'"
        ):
            self.late_posts.submitting(str(operation_id), at)

    def _post_in_time(self, site: str, data: bytes) -> None:
        match = ARCHIVE_POST.match(data)
        if match is None:
            return
        gid = int(match.group(1))
        row = self._one("SELECT operation_id FROM task_operation WHERE gid = ?", (gid,))
        failure = self.late_posts.post(
            site,
            gid,
            None if row is None else str(row[0]),
            self._monotonic(),
            self.upstream_timeout,
        )
        if failure is not None:
            self.fail("late-post", failure)

    # -- what the site writes to its nodes ----------------------------------------------

    def _sent(self, connection: SimConnection, sender: SimTransport, data: bytes) -> None:
        if (
            sender is connection.client
            and connection.server.reactor.name == "upstream"
            and data.startswith(b"POST ")
        ):
            site = connection.client.reactor.name
            self.not_reaped(site, "sent a POST to the upstream")
            self._post_in_time(site, data)
            return
        if sender is not connection.server or sender.getHost().port not in self._node_ports():
            return
        key = (connection.id, id(sender))
        splitter = self._splitters.get(key)
        if splitter is None:
            splitter = self._splitters[key] = FrameSplitter()
        for type_, frame in splitter.feed(data):
            if type_ not in (TYPE_TASK_REPORT_ACK, TYPE_TASK_COMMAND, TYPE_DOWNLOAD_POST):
                continue
            try:
                payload = json.loads(frame[5:])
            except ValueError:
                continue
            if type_ == TYPE_TASK_REPORT_ACK:
                self._ack_after_commit(payload, connection)
            elif type_ == TYPE_DOWNLOAD_POST or payload.get("action") == "DOWNLOAD":
                self._download_dispatchable(payload, connection)
            elif payload.get("action") == "CANCEL":
                node = connection.client.reactor.name
                self.one_holder.cancel(node, str(payload.get("operationId")))

    def _ack_after_commit(self, payload: dict[str, Any], connection: SimConnection) -> None:
        report_id = payload.get("reportId")
        if payload.get("result") not in ("APPLIED", "DUPLICATE") or not report_id:
            return
        row = self._one("SELECT revision FROM report_receipt WHERE report_id = ?", (report_id,))
        if row is None:
            node = connection.client.reactor.name
            self.fail(
                "ack-before-commit",
                f"report {report_id} of {node} ACKed {payload.get('result')}"
                " before its receipt was committed",
            )

    def _download_dispatchable(self, payload: dict[str, Any], connection: SimConnection) -> None:
        gid = payload.get("gid")
        row = self._one("SELECT state, operation_id FROM task_operation WHERE gid = ?", (gid,))
        node = connection.client.reactor.name
        operation_id = payload.get("operationId")
        if row is None or row[0] not in _CONFIRMED:
            state = None if row is None else row[0]
            self.fail("D5", f"gid {gid}: DOWNLOAD sent to {node} while {state}")
        elif operation_id is not None and row[1] != operation_id:
            self.fail(
                "D5", f"gid {gid}: DOWNLOAD of operation {operation_id} sent while {row[1]} is"
            )
        # A legacy DownloadPost names no generation: the one it was decided for.
        generation = operation_id if operation_id is not None else (row[1] if row else None)
        if generation is not None:
            number = gid if isinstance(gid, int) else -1
            failure = self.one_holder.download(node, number, str(generation))
            if failure is not None:
                self.fail("one-holder", failure)

    def _moved_away(self, node: str, operation_id: str) -> bool:
        """Whether the committed database says the site moved ``node``'s task
        of ``operation_id`` away: a CANCEL owed to it, or its tasks reassigned
        or the node retired (schema v13)."""
        owed = self._one(
            "SELECT 1 FROM node_cancel WHERE node_id = ? AND operation_id = ?",
            (node, operation_id),
        )
        if owed is not None:
            return True
        audited = self._one(
            "SELECT 1 FROM node_custody_audit"
            " WHERE node_id = ? AND action IN ('REASSIGN', 'RETIRE')",
            (node,),
        )
        return audited is not None

    # -- fencing ----------------------------------------------------------------------------

    def not_reaped(self, site: str, what: str) -> None:
        """``site`` (a site process) did ``what`` now: its instance must
        not be reaped (SCALE.md "Fencing" rules 1 and 3)."""
        instance = self._instance_of(site)
        if instance is None:
            return
        row = self._one("SELECT reaped_at, reaped_by FROM site_instance WHERE id = ?", (instance,))
        if row is not None and row[0] is not None:
            self.fail(
                "fencing",
                f"{site} (instance {instance}) {what} after instance {row[1]} reaped it"
                f" at {row[0]}",
            )

    # -- after the run --------------------------------------------------------------------

    def states_in_table(self, operations: dict[int, dict[str, Any]]) -> None:
        for gid, op in sorted(operations.items()):
            if op["state"] not in _STATES:
                self.fail("transitions", f"gid {gid}: state {op['state']!r} is not in the table")

    # -- the reader -----------------------------------------------------------------------

    def _one(self, sql: str, params: tuple[Any, ...]) -> Any:
        reader = self._connect()
        if reader is None:
            return None
        try:
            return reader.execute(sql, params).fetchone()
        except Exception:  # noqa: BLE001 - either driver's: the table is not made yet
            return None

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Every row of ``sql`` in what is committed now (none before the
        schema is made), on the checker's read-only connection."""
        reader = self._connect()
        if reader is None:
            return []
        try:
            return list(reader.execute(sql, params).fetchall())
        except Exception:  # noqa: BLE001 - either driver's: the table is not made yet
            return []

    def _connect(self) -> Any:
        if self._reader is None:
            if is_postgres(self.db):
                import psycopg

                # Autocommit: each query sees the latest commit.
                self._reader = _PostgresReader(psycopg.connect(self.db, autocommit=True))
            elif Path(self.db).exists():
                self._reader = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
                self._reader.isolation_level = None
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class _PostgresReader:
    """The checker's PostgreSQL session, with SQLite's ``?`` placeholders."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        return self._connection.execute(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self._connection.close()
