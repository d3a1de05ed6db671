"""Reconciling ``UNKNOWN`` operations (LIFECYCLE.md): the list with its
stored evidence (:func:`unknown_operations`) and an operator's verdict
(:func:`resolve_unknown`), audited, metered exactly once, never a POST.

Two rules guard a verdict (docs/operations.md, "Reconcile UNKNOWN operations"):

* **The verdict wait** (SCALE.md "Fencing" 2).  An ``UNKNOWN`` that a reap
  settled carries ``task_operation.verdict_not_before``: until then the dead
  instance's late POST could still reach the upstream, so ``not_submitted``
  is refused (:class:`VerdictTooEarly`, code ``verdict_too_early``, with
  the moment).  ``submitted`` is allowed at any time.  "Now" is the
  database's clock (``{now}``, :mod:`tasknet.site.storage.engine.sql`), read
  in the transaction that decides, and the same clock tells the list how
  long is left (``verdictWaitSeconds``).
* **A verdict against the evidence needs a note.**  When the upstream's
  audit (``evidence["upstream"]``, fetched by the lifecycle) records at
  least one archive POST and the verdict is ``not_submitted``, or none and
  the verdict is ``submitted``, the verdict is refused without a non-empty
  note (code ``note_required``); with one it is taken, and the audit row's
  evidence says ``"contradicts": true`` and why.
* **No readable evidence counts as contradicting** (issue 38).  When the
  audit could not be read (the upstream answered 5xx, timed out, refused
  the connection, or answered without a usable ``submissions`` count), or
  none was fetched, a verdict needs a note, unless it is ``submitted`` and
  the POST's own answer is stored (``task_operation.archive_url``: the
  upstream answered it); the audit row says ``"evidence": "unavailable"``
  and ``"evidenceError"`` (why).  Before, such a verdict went through unchecked: a
  ``not_submitted`` while the audit answered 503 re-opened a gid the
  upstream had charged.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NotRequired, TypedDict, cast

from tasknet.json_types import JsonObject
from tasknet.site.storage import outbox
from tasknet.site.storage.engine.errors import TaskError
from tasknet.site.storage.engine.sql import sql
from tasknet.site.storage.engine.timestamps import iso, parse
from tasknet.site.storage.engine.transactions import Cursor
from tasknet.site.storage.generation import change_state, remove_generation
from tasknet.site.storage.usage import meter, week_of_timestamp
from tasknet.site.storage.views import (
    TaskView,
    gallery_row,
    gone_view,
    operation_row,
    task_view,
)
from tasknet.site.storage.write_policy import write_policy
from tasknet.status import OperationState, TaskStatus, status_words

VERDICTS = ("submitted", "not_submitted")

#: Error codes of the two rules (the API answers both ``409``).
VERDICT_TOO_EARLY = "verdict_too_early"
NOTE_REQUIRED = "note_required"


class VerdictTooEarly(TaskError):
    """``not_submitted`` before the task's ``verdict_not_before``:
    ``not_before`` (ISO 8601 UTC) and ``wait`` (seconds left, by the
    database's clock)."""

    def __init__(self, gid: int, not_before: str, wait: float) -> None:
        super().__init__(
            VERDICT_TOO_EARLY,
            f"gid {gid}: a 'not_submitted' verdict is possible from {not_before}"
            f" (in {math.ceil(wait)} s): its submission was settled by a reap, and the"
            " gone site's POST could still reach the upstream until then;"
            " 'submitted' is allowed now",
        )
        self.gid = gid
        self.not_before = not_before
        self.wait = wait

    @property
    def retry_after(self) -> int:
        """Whole seconds to wait (``Retry-After``), rounded up, at least 1."""
        return max(1, math.ceil(self.wait))


_NOW = sql("SELECT {now}")
_UNKNOWN = sql(
    "SELECT gid, operation_id, step, error, unknown_at, archive_url, verdict_not_before"
    " FROM task_operation WHERE state = ? ORDER BY gid"
)
_ONE_UNKNOWN = sql(
    "SELECT gid, operation_id, step, error, unknown_at, archive_url, verdict_not_before"
    " FROM task_operation WHERE gid = ? AND state = ?"
)
_LAST_VERDICT = sql(
    "SELECT operation_id, verdict FROM reconciliation_audit WHERE gid = ? ORDER BY id DESC LIMIT 1"
)
_AUDIT = sql(
    "INSERT INTO reconciliation_audit (gid, operation_id, verdict, actor, note, evidence, "
    "resolved_at) VALUES (?, ?, ?, ?, ?, ?, {now})"
)
_SETTLED_ROW = sql(
    "UPDATE gallery SET cost = ?, url = CASE WHEN ? <> '' THEN ? ELSE url END, "
    "updated_at = {now} WHERE gid = ?"
)


# The site's --upstream, recorded at each start in site_setting (schema v4),
# so ``tasknet-admin unknown/resolve`` read the audit where the site would:
# a default port of the tool's own once sent it to another upstream.
_UPSTREAM_SETTING = "upstream_url"
_SET_SETTING = sql(
    "INSERT INTO site_setting (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
_SETTING = sql("SELECT value FROM site_setting WHERE name = ?")


def record_upstream(cursor: Cursor, base_url: str) -> None:
    """Record the site's ``--upstream`` base URL (written at each site start)."""
    if not base_url.startswith(("http://", "https://")):
        raise TaskError("invalid_request", f"the upstream must be an http(s) URL, got {base_url!r}")
    cursor.execute(_SET_SETTING, (_UPSTREAM_SETTING, base_url))


def recorded_upstream(cursor: Cursor) -> str | None:
    """The ``--upstream`` of the site's last start (None: no site of this
    version has started on the database yet)."""
    row = cursor.execute(_SETTING, (_UPSTREAM_SETTING,)).fetchone()
    return None if row is None else str(row["value"])


def _database_now(cursor: Cursor) -> datetime:
    return parse(cursor.execute(_NOW).fetchone()[0])


def verdict_wait(
    cursor: Cursor, not_before: str | None, now: datetime | None = None
) -> tuple[str | None, float]:
    """``(notBefore, seconds left)`` of a stored ``verdict_not_before``:
    the moment as our ISO 8601 UTC text (None: no wait) and how long until
    it by the database's clock (``now``: that clock, already read), 0 once
    passed."""
    if not not_before:
        return None, 0.0
    moment = parse(not_before)
    now = _database_now(cursor) if now is None else now
    return iso(moment.timestamp()), max(0.0, (moment - now).total_seconds())


#: The audit row's ``evidence["evidence"]``: whether the upstream's audit was read.
EVIDENCE_READ = "read"
EVIDENCE_UNAVAILABLE = "unavailable"


def _readable_audit(evidence: Mapping[str, object] | None) -> Mapping[str, object] | str:
    """The upstream's audit answer in ``evidence`` if it is readable, else
    why not (:func:`unreadable`)."""
    upstream = (evidence or {}).get("upstream")
    if not isinstance(upstream, Mapping):
        return "the upstream's audit was not read"
    if upstream.get("available") is not True:
        error = upstream.get("error")
        return str(error) if isinstance(error, str) and error else "upstream audit unavailable"
    no_count = "the upstream's audit answer has no usable 'submissions' count"
    audit = upstream.get("audit")
    if not isinstance(audit, Mapping):
        return no_count
    submissions = audit.get("submissions")
    if isinstance(submissions, bool) or not isinstance(submissions, int) or submissions < 0:
        return no_count
    return audit


def unreadable(evidence: Mapping[str, object] | None) -> str | None:
    """Why ``evidence`` holds no readable upstream audit (None: it does).
    Readable means fetched, answered, and a non-negative integer
    ``submissions``: anything less confirms no verdict."""
    found = _readable_audit(evidence)
    return found if isinstance(found, str) else None


def contradiction(
    gid: int, verdict: str, evidence: Mapping[str, object] | None, posted: bool | None = None
) -> str | None:
    """What stands against ``verdict``, or None (the audit agrees): the
    upstream's audit in ``evidence``, or that it could not be read.  Then
    only the POST's own stored answer (``posted``; None: as ``evidence``'s
    ``archiveUrlSource`` says) is evidence: it confirms ``submitted``;
    anything else needs a note."""
    audit = _readable_audit(evidence)
    if isinstance(audit, str):
        why = audit
        if posted is None:
            posted = (evidence or {}).get("archiveUrlSource") == "submit"
        if posted and verdict == "submitted":
            return None
        answered = " though its POST's answer is stored" if posted else ""
        return (
            f"no readable evidence for gid {gid} ({why}){answered}: nothing confirms the"
            f" verdict {verdict!r}"
        )
    submissions = cast(int, audit["submissions"])  # _readable_audit() checked it
    if verdict == "not_submitted" and submissions > 0:
        last = _when(audit.get("lastAt"))
        when = f", the last at {last}" if last else ""
        return (
            f"the upstream's audit records {submissions} archive POST(s) for gid {gid}{when}:"
            " the verdict 'not_submitted' contradicts it"
        )
    if verdict == "submitted" and submissions == 0:
        return (
            f"the upstream's audit records no archive POST for gid {gid}:"
            " the verdict 'submitted' contradicts it"
        )
    return None


def _when(value: object) -> str | None:
    """An audit's ``lastAt`` as text: ISO 8601 as given, unix seconds (what
    our mock answers) as our ISO 8601 UTC."""
    if isinstance(value, bool) or value is None or value == "":
        return None
    if isinstance(value, int | float):
        try:
            return iso(float(value))
        except (OverflowError, OSError, ValueError):
            return str(value)
    return str(value)


def contradictions(gid: int, evidence: Mapping[str, object]) -> dict[str, str]:
    """:func:`contradiction` of each verdict that has one (the list shows
    them: such a verdict needs a note)."""
    found = {v: contradiction(gid, v, evidence) for v in VERDICTS}
    return {v: why for v, why in found.items() if why is not None}


class UpstreamAudit(TypedDict):
    """The upstream's read-only audit of a gid, as the evidence keeps it:
    its answer (a JSON object), or why there is none."""

    available: bool
    audit: NotRequired[JsonObject]
    error: NotRequired[str]


class UnknownEvidence(TypedDict):
    """What the store keeps of an ``UNKNOWN`` operation, and its verdict wait."""

    operationId: str
    step: str | None
    unknownAt: str | None
    error: str | None
    archiveUrl: str | None
    notBefore: str | None
    verdictWaitSeconds: int
    # Added by the site's lifecycle before it shows or stores them.
    upstream: NotRequired[UpstreamAudit]
    archiveUrlSource: NotRequired[str | None]
    warning: NotRequired[str]
    contradictions: NotRequired[dict[str, str]]


class UnknownTaskView(TaskView):
    """An ``UNKNOWN`` task's view with its stored evidence (the reconcile list)."""

    evidence: UnknownEvidence


#: ``task_operation.step`` of a task resolved "submitted" with no archive URL
#: known: metered, shown 已提交, never dispatched (nothing to download).
RESOLVED_WITHOUT_URL = "resolved_without_url"


def unknown_operations(cursor: Cursor) -> list[UnknownTaskView]:
    """Every ``UNKNOWN`` task view with its stored evidence (``step``,
    ``unknownAt``, ``error``, ``operationId``, ``archiveUrl``, and the
    verdict wait: ``notBefore``, None when there is none, and
    ``verdictWaitSeconds``, left by the database's clock, 0 once passed)."""
    rows = cursor.execute(_UNKNOWN, (OperationState.UNKNOWN.value,)).fetchall()
    return _with_evidence(cursor, rows)


def unknown_operation(cursor: Cursor, gid: int) -> UnknownTaskView | None:
    """:func:`unknown_operations`' view of ``gid``, read by its key
    (``None``: ``gid`` is not ``UNKNOWN``)."""
    rows = cursor.execute(_ONE_UNKNOWN, (gid, OperationState.UNKNOWN.value)).fetchall()
    views = _with_evidence(cursor, rows)
    return views[0] if views else None


def _with_evidence(cursor: Cursor, rows: list[Any]) -> list[UnknownTaskView]:
    result: list[UnknownTaskView] = []
    now = _database_now(cursor) if any(row["verdict_not_before"] for row in rows) else None
    for row in rows:
        # The same dict, given its evidence below.
        view = cast(
            UnknownTaskView, task_view(cursor, row["gid"]) or gone_view(row["gid"], "UNKNOWN")
        )
        not_before, wait = verdict_wait(cursor, row["verdict_not_before"], now)
        view["evidence"] = {
            "operationId": row["operation_id"],
            "step": row["step"],
            "unknownAt": row["unknown_at"],
            "error": row["error"],
            # Known when the POST answered but recording its result failed.
            "archiveUrl": row["archive_url"] or None,
            # A reaped submission: "not_submitted" waits until then.
            "notBefore": not_before,
            "verdictWaitSeconds": math.ceil(wait),
        }
        result.append(view)
    return result


_LAST_EVIDENCE = sql(
    "SELECT evidence FROM reconciliation_audit WHERE gid = ? ORDER BY id DESC LIMIT 1"
)


def last_evidence(cursor: Cursor, gid: int) -> JsonObject | None:
    """The evidence the last verdict on ``gid`` was taken on (None: no
    verdict, or none stored)."""
    row = cursor.execute(_LAST_EVIDENCE, (gid,)).fetchone()
    if row is None or row["evidence"] is None:
        return None
    evidence = json.loads(row["evidence"])
    return evidence if isinstance(evidence, dict) else None


def _last_verdict(cursor: Cursor, gid: int) -> sqlite3.Row | None:
    row: sqlite3.Row | None = cursor.execute(_LAST_VERDICT, (gid,)).fetchone()
    return row


@write_policy(wakes_outbox=True)
def resolve_unknown(
    cursor: Cursor,
    gid: int,
    verdict: str,
    actor: str,
    note: str,
    evidence: Mapping[str, object] | None = None,
    archive_url: str | None = None,
) -> TaskView | None:
    """Reconcile an ``UNKNOWN`` operation; never POSTs.

    ``submitted``: ``UNKNOWN -> SUBMITTED``, metered exactly once (into the
    week its create's quota check counted it against, ``quota_week``; for a
    generation from before that column, the week it was created) with the
    stored cost (the POST's answer when it
    was known), dispatchable from now on if an archive URL is known (the
    stored one, else ``archive_url`` from the upstream's audit); returns the
    task view.
    ``not_submitted``: intent and task row removed, gid free; returns None.
    Either way an audit row records actor, note and evidence.  The same
    verdict again on the generation it settled answers the same result,
    changing nothing; anything else on a task that is not ``UNKNOWN`` is a
    ``conflict``.

    Refused, changing nothing: ``not_submitted`` before the task's
    ``verdict_not_before`` (:class:`VerdictTooEarly`), and a verdict the
    upstream's audit in ``evidence`` contradicts, or with no readable audit
    (``evidence`` None included), without a note (``note_required``; see the
    module doc).  With a note, the stored evidence says ``"contradicts":
    true`` and ``"contradiction"``; it always says ``"evidence"``
    (:data:`EVIDENCE_READ` or :data:`EVIDENCE_UNAVAILABLE`, then with
    ``"evidenceError"``)."""
    if verdict not in VERDICTS:
        raise TaskError("invalid_request", f"verdict must be one of {VERDICTS}")
    op = operation_row(cursor, gid)
    if op is None or op["state"] != OperationState.UNKNOWN.value:
        _require_same_settlement(cursor, gid, verdict, op)
        return task_view(cursor, gid) if verdict == "submitted" else None
    if verdict == "not_submitted":
        not_before, wait = verdict_wait(cursor, op["verdict_not_before"])
        if not_before is not None and wait > 0:
            raise VerdictTooEarly(gid, not_before, wait)
    against = contradiction(gid, verdict, evidence, posted=bool(op["archive_url"]))
    if against is not None and not note.strip():
        raise TaskError(NOTE_REQUIRED, f"{against}; a note saying why is required")
    unavailable = unreadable(evidence)
    stored: dict[str, object] = {
        **(evidence or {}),
        "contradicts": against is not None,
        "evidence": EVIDENCE_READ if unavailable is None else EVIDENCE_UNAVAILABLE,
    }
    if unavailable is not None:
        stored["evidenceError"] = unavailable
    if against is not None:
        stored["contradiction"] = against
    _audit(cursor, gid, op["operation_id"], verdict, actor, note, stored)
    if verdict == "not_submitted":
        remove_generation(cursor, gid, op["operation_id"], OperationState.UNKNOWN)
        return None
    return _settle_submitted(cursor, gid, op, archive_url)


def _require_same_settlement(
    cursor: Cursor, gid: int, verdict: str, op: sqlite3.Row | None
) -> None:
    """Pass if ``verdict`` repeats the one that settled this generation
    (the caller answers as before); else ``not_found`` or ``conflict``."""
    last = _last_verdict(cursor, gid)
    same = last is not None and last["verdict"] == verdict
    if last is not None and same and verdict == "submitted" and op is not None:
        if op["operation_id"] == last["operation_id"]:
            return
    if same and verdict == "not_submitted" and op is None and gallery_row(cursor, gid) is None:
        return
    if op is None and gallery_row(cursor, gid) is None:
        raise TaskError("not_found", f"no task {gid}")
    # The UI's words for where the task is (not the operation's state name).
    view = task_view(cursor, gid)
    shown = status_words(view["status"] if view is not None else None)
    unknown = status_words(TaskStatus.SUBMIT_UNKNOWN)
    raise TaskError("conflict", f"gid {gid} is {shown}, not {unknown}: nothing to resolve")


def _audit(
    cursor: Cursor,
    gid: int,
    operation_id: str,
    verdict: str,
    actor: str,
    note: str,
    evidence: Mapping[str, object] | None,
) -> None:
    cursor.execute(
        _AUDIT,
        (
            gid,
            operation_id,
            verdict,
            actor,
            note,
            json.dumps(evidence, ensure_ascii=False) if evidence is not None else None,
        ),
    )


def _settle_submitted(
    cursor: Cursor, gid: int, op: sqlite3.Row, archive_url: str | None
) -> TaskView | None:
    """``UNKNOWN -> SUBMITTED``, metered once, and the task view."""
    operation_id = op["operation_id"]
    # The POST's own answer (stored by mark_unknown) is the better witness
    # than the audit's; without either the task is metered but never
    # dispatched (DISPATCHABLE_SQL needs a URL), and step says so.
    url = op["archive_url"] or archive_url or ""
    cost = int(op["cost"] or 0)
    week = op["metered_week"] or op["quota_week"] or week_of_timestamp(cursor, op["created_at"])
    metered = bool(op["metered"])
    change_state(
        cursor,
        gid,
        operation_id,
        OperationState.UNKNOWN,
        OperationState.SUBMITTED,
        metered=1,
        metered_week=week,
        step="resolved" if url else RESOLVED_WITHOUT_URL,
        archive_url=url or None,
    )
    if not metered:
        meter(cursor, op["user_id"], week, cost)
    cursor.execute(_SETTLED_ROW, (cost, url, url, gid))
    outbox.enqueue_task_change(cursor, gid)
    return task_view(cursor, gid)
