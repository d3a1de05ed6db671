"""An operator's control of a node (issue 36, item 6): drain, pause, resume
and a download limit, one row of ``node_control`` per controlled node.

* ``DRAINING``: the node is given no new task; what it holds finishes (its
  DOWNLOADs are still resent at its logins), and once none of its tasks is
  open it is *drained* (the panel says so).
* ``PAUSED``: the node is given no new task until it is resumed; what it
  already holds goes on (there is no wire message that stops a node's
  download: PROTOCOL.md has none).
* ``ACTIVE`` (resume): new tasks go to it again.
* ``download_limit``: at most this many tasks not yet completed are
  assigned to it at a time by the site's dispatcher (PROTOCOL.md has no
  message for a limit, so a v2 node and a legacy one alike are simply
  dispatched less); tasks it held before the limit was set stay with it.

The dispatcher's assignment (:func:`tasknet.site.storage.dispatch.assign`)
reads these rows in its own transaction (:func:`capacities`), so a change
committed here is obeyed by the next assignment, at whichever site.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.transactions import Cursor

ACTIVE = "ACTIVE"
DRAINING = "DRAINING"
PAUSED = "PAUSED"
MODES = (ACTIVE, DRAINING, PAUSED)
#: The largest download limit accepted (a bound, not a target).
MAX_LIMIT = 100_000


class BadControl(ValueError):
    """A mode or a limit the site does not accept (nothing written)."""


class UnknownNode(LookupError):
    """The site has never heard of that node (nothing written)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"no node {node_id!r} is known to this site")
        self.node_id = node_id


class ControlJson(TypedDict):
    """A node's control as the API shows it."""

    mode: str
    downloadLimit: int | None
    actor: str
    note: str
    changedAt: str | None


@dataclass(frozen=True, slots=True)
class Control:
    """A node's control as stored; ``limit`` None: no bound."""

    node_id: str
    mode: str = ACTIVE
    limit: int | None = None
    actor: str = ""
    note: str = ""
    changed_at: str | None = None

    @property
    def takes_new_work(self) -> bool:
        return self.mode == ACTIVE

    def to_json(self) -> ControlJson:
        return {
            "mode": self.mode,
            "downloadLimit": self.limit,
            "actor": self.actor,
            "note": self.note,
            "changedAt": self.changed_at,
        }


_ONE_SQL = sql(
    "SELECT node_id, mode, download_limit, actor, note, changed_at FROM node_control"
    " WHERE node_id = ?"
)
_SOME_SQL = sql(
    "SELECT node_id, mode, download_limit, actor, note, changed_at FROM node_control"
    " WHERE node_id {in_array}"
)
_ALL_SQL = sql(
    "SELECT node_id, mode, download_limit, actor, note, changed_at FROM node_control"
    " ORDER BY node_id"
)
_UPSERT_SQL = sql(
    "INSERT INTO node_control (node_id, mode, download_limit, actor, note, changed_at)"
    " VALUES (?, ?, ?, ?, ?, {now})"
    " ON CONFLICT (node_id) DO UPDATE SET mode = excluded.mode,"
    " download_limit = excluded.download_limit, actor = excluded.actor,"
    " note = excluded.note, changed_at = excluded.changed_at"
)
# A node the site has heard of (storage/reassign.py's rule, and a control row).
_KNOWN_SQL = sql(
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM node_key WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_session WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_seen WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM gallery WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_custody_audit WHERE node_id = ?1)"
    " OR EXISTS (SELECT 1 FROM node_control WHERE node_id = ?1)"
)
_FORGET_SQL = sql("DELETE FROM node_control WHERE node_id = ?")
# The open (not completed) tasks of some nodes, from schema v9's kept counts.
_OPEN_SQL = sql(
    "SELECT node_id, SUM(n) FROM node_task_count WHERE node_id {in_array}"
    " AND status <> 4 GROUP BY node_id"
)


def _control(row: Sequence[Any]) -> Control:
    limit = row[2]
    return Control(
        str(row[0]), str(row[1]), int(limit) if limit is not None else None,
        str(row[3]), str(row[4]), str(row[5]),
    )  # fmt: skip


def control_of(cursor: Cursor, node_id: str) -> Control:
    """``node_id``'s control (``ACTIVE``, no bound, when it has no row)."""
    row = cursor.execute(_ONE_SQL, (node_id,)).fetchone()
    return _control(row) if row is not None else Control(node_id)


def controls(cursor: Cursor) -> dict[str, Control]:
    """Every controlled node's control, by node id."""
    return {row[0]: _control(row) for row in cursor.execute(_ALL_SQL).fetchall()}


def check_limit(limit: object) -> int | None:
    """``limit`` if the site accepts it (None: no bound), else
    :class:`BadControl`."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadControl(
            f"a download limit is a whole number from 1 to {MAX_LIMIT:,} (or none), got {limit!r}"
        )
    return limit


def set_control(
    cursor: Cursor,
    node_id: str,
    *,
    mode: str | None = None,
    limit: int | None | str = "keep",
    actor: str,
    note: str = "",
) -> Control:
    """A write: set ``node_id``'s ``mode`` (None: keep it) and ``limit``
    (``"keep"``: keep it; None: no bound) and return the control after it.
    A node back to ``ACTIVE`` with no bound loses its row.
    :class:`UnknownNode` or :class:`BadControl`: nothing written."""
    if cursor.execute(_KNOWN_SQL, (node_id,)).fetchone() is None:
        raise UnknownNode(node_id)
    if mode is not None and mode not in MODES:
        raise BadControl(f"a node's mode is one of {', '.join(MODES)}, got {mode!r}")
    before = control_of(cursor, node_id)
    new_limit = before.limit if limit == "keep" else check_limit(limit)
    new_mode = mode if mode is not None else before.mode
    if new_mode == ACTIVE and new_limit is None:
        cursor.execute(_FORGET_SQL, (node_id,))
    else:
        cursor.execute(_UPSERT_SQL, (node_id, new_mode, new_limit, actor, note))
    return control_of(cursor, node_id)


def capacities(cursor: Cursor, node_ids: Sequence[str]) -> dict[str, int | None]:
    """How many more tasks each of ``node_ids`` may be given now: 0 for a
    draining or paused node, the limit less its open tasks for a bounded
    one (never below 0), None for an unbounded active one."""
    found = {
        row[0]: _control(row) for row in cursor.execute(_SOME_SQL, (list(node_ids),)).fetchall()
    }
    room: dict[str, int | None] = dict.fromkeys(node_ids)
    bounded = []
    for node_id, control in found.items():
        if not control.takes_new_work:
            room[node_id] = 0
        elif control.limit is not None:
            bounded.append(node_id)
    if bounded:
        open_tasks = dict.fromkeys(bounded, 0)
        for node_id, count in cursor.execute(_OPEN_SQL, (bounded,)).fetchall():
            open_tasks[node_id] = int(count)
        for node_id in bounded:
            limit = found[node_id].limit or 0
            room[node_id] = max(0, limit - open_tasks[node_id])
    return room
