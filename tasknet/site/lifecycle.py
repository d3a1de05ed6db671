"""The task lifecycle as Deferred chains of committed transactions and
upstream calls (LIFECYCLE.md invariants 1-5, recovery of 10, reconciliation).

Each step below is one committed transaction (``tasknet.site.storage.tasks``)
or one upstream call; the order *is* the invariant:

create:  reserve ─▶ prepare (GET) ─▶ quota + SUBMITTING ─▶ submit (POST) ─▶ persist
                       │ fail: release        │ over: release   │ refused: release
                       ▼                      ▼                 │ ambiguous: UNKNOWN
                      404/422/502            429                ▼ persist failed: UNKNOWN

Nothing here retries a POST.  A create whose chain is interrupted (crash,
database failure while recording ``UNKNOWN``) is left ``RESERVED`` or
``SUBMITTING`` and settled by :meth:`Lifecycle.recover` at the next start.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.site.storage import tasks
from tasknet.site.storage.db import Database
from tasknet.site.storage.tasks import TaskError
from tasknet.site.upstream_client import (
    Outcome,
    PrepareOutcome,
    UpstreamClient,
    UpstreamError,
)

log = Logger()

T = TypeVar("T")


def shield(d: Deferred[T]) -> Deferred[T]:
    """A Deferred following ``d`` whose cancellation does not reach ``d``.

    A client hanging up must not cancel a create half-way (cancelling the
    POST would turn a clean outcome into an ambiguous one): the chain runs to
    its end and only the answer is dropped."""
    follower: Deferred[T] = Deferred()

    def relay(result: Any) -> None:
        if follower.called:  # cancelled: nobody listens; errors are logged above
            if isinstance(result, Failure):
                log.failure("a shielded operation failed after its caller left", result)
            return
        if isinstance(result, Failure):
            follower.errback(result)
        else:
            follower.callback(result)

    d.addBoth(relay)
    return follower


@dataclass(frozen=True)
class Created:
    """The answer of a create: ``201`` (``SUBMITTED``) or ``202`` (``UNKNOWN``)."""

    status: int
    task: dict[str, Any]


@dataclass(frozen=True)
class DeleteOutcome:
    """``completed`` (deleted at once: ``200 {"deleted": gid}``) or pending
    (``202 {"task"}`` in ``DELETE_PENDING``)."""

    gid: int
    completed: bool
    delete_operation_id: str
    node: str | None
    task: dict[str, Any] | None


class Lifecycle:
    """Create, delete, recovery and reconciliation for one site.

    ``on_commit()`` is called after each commit that enqueued notifications
    (the site wires it to its outbox executor's ``wake()``);
    ``on_task_changed(gid)`` after each commit that made ``gid`` something to
    send to a node: ``SUBMITTED`` (create, resolve) or ``DELETE_PENDING``
    (the site wires it to the dispatcher's ``task_changed``).  Both default
    to doing nothing; their errors are logged, never raised."""

    def __init__(
        self,
        db: Database,
        upstream: UpstreamClient,
        *,
        upstream_timeout: float,
        on_commit: Callable[[], None] | None = None,
        on_task_changed: Callable[[int], object] | None = None,
    ) -> None:
        self.db = db
        self.upstream = upstream
        self.upstream_timeout = upstream_timeout
        self.on_commit: Callable[[], None] = on_commit or (lambda: None)
        self.on_task_changed: Callable[[int], object] = on_task_changed or (lambda _: None)

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        result = await self.db.write(fn, *args)
        try:
            self.on_commit()
        except Exception:
            log.failure("outbox wake-up failed (delivery resumes on its next poll)")
        return result

    def _changed(self, gid: int) -> None:
        try:
            self.on_task_changed(gid)
        except Exception:
            log.failure("handing gid {gid} to dispatch failed (it is retried on login)", gid=gid)

    # -- create ------------------------------------------------------------

    def create(self, user_id: int, gid: int, token: str, name: str = "") -> Deferred[Created]:
        """Run the create chain; fails with :class:`TaskError` on a business
        refusal (nothing left behind), fires :class:`Created` otherwise."""
        return Deferred.fromCoroutine(self._create(user_id, gid, token, name))

    async def _create(self, user_id: int, gid: int, token: str, name: str) -> Created:
        week = tasks.iso_week()
        # 1. The intent and its placeholder row, durable before anything upstream.
        operation_id = await self._write(tasks.reserve, gid, user_id, name, token, week)
        # 2. Read-only prepare: learn the cost; nothing is charged.
        prepared = await self.upstream.prepare(gid, token, self.upstream_timeout)
        if prepared.outcome is not PrepareOutcome.OK:
            await self._write(tasks.release, gid, operation_id)
            raise _prepare_error(gid, prepared.outcome, prepared.error)
        # 3. Quota with the known cost, then SUBMITTING, committed before the POST.
        if not await self._write(
            tasks.begin_submit, gid, operation_id, prepared.cost, prepared.title, week
        ):
            raise TaskError(
                "quota_exceeded",
                f"gid {gid} costs {prepared.cost}: that would exceed this week's quota",
            )
        # 4. The one POST.
        submitted = await self.upstream.submit(gid, token, self.upstream_timeout)
        if submitted.outcome is Outcome.REFUSED:
            await self._write(tasks.release_refused, gid, operation_id)
            raise TaskError(
                "upstream_rejected", f"the upstream refused gid {gid}: {submitted.error}"
            )
        if submitted.outcome is Outcome.AMBIGUOUS:
            await self._mark_unknown(gid, operation_id, "submit", submitted.error)
            return await self._answer(gid)
        # 5. Task row + weekly usage in one transaction, guarded by the generation.
        try:
            view = await self._write(
                _persist_and_view,
                gid,
                operation_id,
                submitted.archive_url,
                submitted.cost,
                week,
            )
        except Exception as e:
            log.failure("persisting the submitted gid {gid} failed; marking it UNKNOWN", gid=gid)
            await self._mark_unknown(
                gid,
                operation_id,
                "persist",
                f"the upstream accepted the POST (cost {submitted.cost}, "
                f"{submitted.archive_url}) but recording it failed: {type(e).__name__}: {e}",
            )
            return await self._answer(gid)
        return self._created(gid, view)

    async def _mark_unknown(self, gid: int, operation_id: str, step: str, error: str) -> None:
        try:
            await self._write(tasks.mark_unknown, gid, operation_id, step, error)
        except Exception:
            # Still SUBMITTING in the database: recovery at the next start
            # turns it into UNKNOWN.  Never a resend.
            log.failure(
                "could not record gid {gid} as UNKNOWN; recovery will at the next start", gid=gid
            )

    async def _answer(self, gid: int) -> Created:
        return self._created(gid, await self.db.read(tasks.task_view, gid))

    def _created(self, gid: int, view: dict[str, Any] | None) -> Created:
        if view is None or view.get("status") is None:
            raise TaskError("conflict", f"gid {gid} changed while it was being created")
        if view["state"] == "SUBMITTED":
            self._changed(gid)
            return Created(201, view)
        return Created(202, view)

    # -- delete --------------------------------------------------------------

    def delete(self, user_id: int | None, gid: int) -> Deferred[DeleteOutcome]:
        """Start or retry deleting ``gid`` (``user_id`` None: an admin)."""
        return Deferred.fromCoroutine(self._delete(user_id, gid))

    async def _delete(self, user_id: int | None, gid: int) -> DeleteOutcome:
        started = await self._write(tasks.request_delete, gid, user_id)
        view = None if started.completed else await self.db.read(tasks.task_view, gid)
        outcome = DeleteOutcome(
            gid, started.completed, started.delete_operation_id, started.node, view
        )
        if not started.completed:
            self._changed(gid)
        return outcome

    # -- recovery --------------------------------------------------------------

    def recover(self) -> Deferred[tasks.Recovered]:
        """Invariant 10's recovery, one transaction: interrupted submissions
        become ``UNKNOWN``, reservations are released."""
        return Deferred.fromCoroutine(self._recover())

    async def _recover(self) -> tasks.Recovered:
        recovered = await self._write(tasks.recover)
        log.info(
            "recovery: {unknown} interrupted submission(s) now UNKNOWN {gids}, "
            "{released} reservation(s) released",
            unknown=len(recovered.unknown),
            gids=recovered.unknown,
            released=len(recovered.released),
        )
        return recovered

    # -- reconciliation ----------------------------------------------------------

    def unknown_with_evidence(self) -> Deferred[list[dict[str, Any]]]:
        """Every ``UNKNOWN`` task with its evidence, including the upstream's
        read-only audit answer fetched now (or why it could not be)."""
        return Deferred.fromCoroutine(self._unknown_with_evidence())

    async def _unknown_with_evidence(self) -> list[dict[str, Any]]:
        listed = await self.db.read(tasks.unknown_operations)
        for view in listed:
            view["evidence"]["upstream"] = await self._audit(view["gid"])
        return listed

    async def _audit(self, gid: int) -> dict[str, Any]:
        try:
            return {"available": True, "audit": await self.upstream.audit(gid)}
        except UpstreamError as e:
            return {"available": False, "error": f"upstream audit unavailable: {e}"}

    def resolve(
        self, gid: int, verdict: str, actor: str, note: str = ""
    ) -> Deferred[dict[str, Any] | None]:
        """Reconcile an ``UNKNOWN`` gid; never POSTs.  The evidence shown to
        the actor (stored step/error and a fresh audit answer) goes into the
        audit row."""
        return Deferred.fromCoroutine(self._resolve(gid, verdict, actor, note))

    async def _resolve(
        self, gid: int, verdict: str, actor: str, note: str
    ) -> dict[str, Any] | None:
        if verdict not in tasks.VERDICTS:
            raise TaskError("invalid_request", f"verdict must be one of {list(tasks.VERDICTS)}")
        stored = [v for v in await self.db.read(tasks.unknown_operations) if v["gid"] == gid]
        evidence: dict[str, Any] = dict(stored[0]["evidence"]) if stored else {}
        archive_url = None
        if stored:
            evidence["upstream"] = await self._audit(gid)
            audit = evidence["upstream"].get("audit") or {}
            if isinstance(audit.get("archiveUrl"), str):
                archive_url = audit["archiveUrl"]
        view = await self._write(
            tasks.resolve_unknown, gid, verdict, actor, note, evidence, archive_url
        )
        if view is not None and view.get("state") == "SUBMITTED":
            self._changed(gid)
        return view


def _persist_and_view(
    cursor: sqlite3.Cursor, gid: int, operation_id: str, archive_url: str, cost: int, week: str
) -> dict[str, Any] | None:
    """:func:`tasks.persist_submitted` and the task view it leaves, in one
    transaction: the answer of a create needs no read after the commit."""
    tasks.persist_submitted(cursor, gid, operation_id, archive_url, cost, week)
    return tasks.task_view(cursor, gid)


def _prepare_error(gid: int, outcome: PrepareOutcome, error: str) -> TaskError:
    if outcome is PrepareOutcome.MISSING:
        return TaskError("not_found", f"the upstream has no gallery {gid} ({error})")
    if outcome is PrepareOutcome.REFUSED:
        return TaskError("upstream_rejected", f"the upstream refused gid {gid}: {error}")
    return TaskError(
        "upstream_unavailable",
        f"the upstream could not be asked about gid {gid} ({error}); nothing was submitted",
    )
