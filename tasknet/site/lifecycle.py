"""The task lifecycle as Deferred chains of committed transactions and
upstream calls (LIFECYCLE.md invariants 1-5, recovery of 10, reconciliation).

Each step below is one committed transaction (``tasknet.site.storage.create``,
``.delete``, ``.reconcile``) or one upstream call; the order *is* the invariant:

create:  reserve ─▶ prepare (GET) ─▶ quota + SUBMITTING ─▶ submit (POST) ─▶ persist
                       │ fail: release        │ over: release   │ refused: release
                       ▼                      ▼                 │ ambiguous: UNKNOWN
                      404/422/502            429                ▼ persist failed: UNKNOWN

The POST is fenced (SCALE.md "Fencing" 1): once its connection is up and
before its first byte, the upstream client asks :meth:`Lifecycle._post_gate`
whether this instance's lease is still fresh and its ``SUBMITTING`` commit
less than the upstream timeout old; if not, nothing is sent, the client is
told so (``503 unavailable``) and the generation is released when this site
can still write (it knows it sent nothing), else left ``SUBMITTING`` for a
reap or the next start to make ``UNKNOWN``.

One write path: every transaction runs through :meth:`Lifecycle._run`,
as the policy declared beside its function says
(:class:`~tasknet.site.storage.write_policy.WritePolicy`: whether its commit
wakes the outbox, whether it settles an outcome and keeps trying, whether it
is a step of a create's chain); no call site chooses.

Nothing here retries a POST.  What the chain does retry are its own local
writes that settle an outcome (``release``, ``begin_submit``,
``release_refused``, ``release_unsent``, ``mark_unknown``) when the
database is busy or locked (the database layer's classified
``DatabaseBusy``; the retry itself is the layer's
``Database.write_retrying``): each acts only on the expected operationId in
the expected state, so a repeat can never change another generation or
call the upstream.  They are retried with backoff for ``record_retry_for``
seconds while the client waits (so a lock held past ``busy_timeout`` still
ends in the right answer, e.g. ``202`` with ``UNKNOWN``); after that (or
after a failed write) those that keep trying go on in the background every
``settle_interval`` seconds until they land
(:class:`~tasknet.site.storage.background_writes.BackgroundWrites`).  Only a
crash (or a stop) before that leaves ``RESERVED``/``SUBMITTING`` for
:meth:`Lifecycle.recover` at the next start.

Every create is answered, and never ``500`` for an outcome it cannot record
(SCALE.md "Database failover", DRILLS.md S25): once its POST may have
reached the upstream (the POST gate let it go), a create whose ``UNKNOWN``
(or the view of it) cannot be written or read now (the database busy,
failed or gone, the lease lost) is answered ``202`` with the task as it
will be settled, ``UNKNOWN`` (``SUBMIT_UNKNOWN``): by the background retry,
a reap or the next start's recovery on the surviving database, or by the
persist if that lands after all.  Before that point nothing was sent, and a
create the site cannot carry on is answered ``503 unavailable`` (the
API adds ``Retry-After``).  When the site is fenced or stops
(:meth:`Lifecycle.answer_in_flight`) every create still under way is
answered at once by that rule, whatever it waits for (a write that hangs on
a database in failover, a POST), and no POST is sent after it: the gate
refuses; its chain goes on to its end unanswered (logged).

Several sites on one database (SCALE.md 2): the lifecycle of a site instance
holds its lease (:mod:`tasknet.site.storage.lease`).  Its reservations and
SUBMITTINGs record the instance, recovery settles only what gone instances
left (:meth:`Lifecycle.recover` at start: earlier runs and other instances
whose lease the database lets us take, through the reaper; while running,
:meth:`tasknet.site.reaper.Reaper.reap_gone` is a pass every few seconds from
:mod:`tasknet.site.instance_service`), and
once the lease is lost every write is refused
(:class:`~tasknet.site.storage.instances.LeaseLost`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NotRequired, TypeVar, TypeVarTuple, cast

from twisted.application.internet import backoffPolicy
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from tasknet.runtime import IEntropy
from tasknet.site.reaper import Reaper
from tasknet.site.storage import (
    create,
    delete,
    generation,
    reconcile,
    usage,
    views,
)
from tasknet.site.storage.background_writes import BackgroundWrites
from tasknet.site.storage.create import Recovered
from tasknet.site.storage.engine.database import Cursor, Database, Retry
from tasknet.site.storage.engine.errors import (
    CommitUnknown,
    DatabaseBusy,
    DatabaseError,
    DatabaseFailed,
    TaskError,
)
from tasknet.site.storage.instances import LeaseLost
from tasknet.site.storage.lease import Lease
from tasknet.site.storage.write_policy import WritePolicy, policy_of
from tasknet.site.upstream_client import (
    Outcome,
    PrepareOutcome,
    PrepareResult,
    SubmitResult,
    UpstreamClient,
    UpstreamError,
)
from tasknet.status import OperationState, TaskStatus

log = Logger()

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: Shown (evidence, resolve answer, log) for a task resolved "submitted"
#: without any known archive URL: it is metered but cannot be dispatched.
NO_ARCHIVE_URL = (
    "no archive URL known (neither from the POST answer nor from the upstream's "
    "audit): the task is SUBMITTED and metered but cannot be sent to a node"
)


class Unrecorded(Exception):
    """A local write settling a create's outcome could not be committed
    within ``record_retry_for``; it goes on being retried in the background."""


class Closed(LeaseLost):
    """The site is fenced or stops (:meth:`Lifecycle.answer_in_flight`):
    the creates still under way, answered already, write nothing more; a
    reap or the next start's recovery settles what they left."""


class ResolvedView(views.TaskView):
    """A resolved task's view; ``warning`` when it was resolved "submitted"
    with no archive URL known (it is metered, never dispatched)."""

    warning: NotRequired[str]


@dataclass(frozen=True)
class Created:
    """The answer of a create: ``201`` (``SUBMITTED``) or ``202`` (``UNKNOWN``)."""

    status: int
    task: views.TaskView


@dataclass(eq=False)
class _Flight:
    """A create under way, as far as answering it needs: its caller's
    ``answer`` (fired by the chain's end, or earlier by
    :meth:`Lifecycle.answer_in_flight`) and what the chain learnt so far."""

    gid: int
    name: str
    answer: Deferred[Created]
    operation_id: str | None = None
    prepared: PrepareResult | None = None
    #: The POST gate let the POST go: from here on it may have reached the
    #: upstream (before, nothing was sent, and after a fence nothing will be).
    posted: bool = False


@dataclass(frozen=True)
class DeleteOutcome:
    """``completed`` (deleted at once: ``200 {"deleted": gid}``) or pending
    (``202 {"task"}`` in ``DELETE_PENDING``)."""

    gid: int
    completed: bool
    delete_operation_id: str
    node: str | None
    task: views.TaskView | None


class Lifecycle:
    """Create, delete, recovery and reconciliation for one site.

    ``on_commit()`` is called after each commit that enqueued notifications
    (the site wires it to its outbox executor's ``wake()``);
    ``on_task_changed(gid)`` after each commit that made ``gid`` something to
    send to a node: ``SUBMITTED`` (create, resolve) or ``DELETE_PENDING``
    (the site wires it to the dispatcher's ``task_changed``).  Both default
    to doing nothing; their errors are logged, never raised.

    ``lease``: the site instance's lease (None: a lifecycle of no instance,
    alone on its database: tools and tests), and ``reaper`` its
    :class:`~tasknet.site.reaper.Reaper` (with a lease, and only then), which
    the start's recovery runs.  ``clock``: its retry and
    settling timers, from its root (the site's, the admin tool's, a test's)."""

    def __init__(
        self,
        db: Database,
        upstream: UpstreamClient,
        *,
        upstream_timeout: float,
        on_commit: Callable[[], None] | None = None,
        on_task_changed: Callable[[int], object] | None = None,
        record_retry_for: float = 30.0,
        retry_initial: float = 0.1,
        retry_max: float = 2.0,
        settle_interval: float = 5.0,
        lease: Lease | None = None,
        reaper: Reaper | None = None,
        clock: IReactorTime,
        entropy: IEntropy,
        monotonic: Callable[[], float] | None = None,
        before_post_gate: Callable[[], object] | None = None,
    ) -> None:
        if record_retry_for < 0 or retry_initial <= 0 or retry_max <= 0 or settle_interval <= 0:
            raise ValueError("retry timings must be positive")
        if (None if reaper is None else reaper.lease) is not lease:
            raise ValueError("a lifecycle with a lease recovers through a reaper of that lease")
        self.db = db
        self.upstream = upstream
        self.upstream_timeout = upstream_timeout
        self.on_commit: Callable[[], None] = on_commit or (lambda: None)
        self.on_task_changed: Callable[[int], object] = on_task_changed or (lambda _: None)
        self.record_retry_for = record_retry_for
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.settle_interval = settle_interval
        self._clock = clock
        #: Where the operationIds it chooses come from (random UUIDs).
        self._entropy = entropy
        self.lease = lease
        self._reaper = reaper
        self._instance_id = None if lease is None else lease.instance_id
        #: Outcome writes still being retried in the background.
        self._background = BackgroundWrites(db, interval=settle_interval, clock=clock)
        # The clock the POST gate measures on: the lease's own monotonic one
        # (without a lease: ``monotonic`` if given, else ``clock``'s seconds).
        self._monotonic: Callable[[], float] = (
            lease.now
            if lease is not None
            else (monotonic if monotonic is not None else clock.seconds)
        )
        # A drill's fault point (tasknet.site.fault_points), or a test's pause.
        self._before_post_gate = before_post_gate
        #: Creates under way, in the order they began.
        self._flights: dict[_Flight, None] = {}
        # Why this lifecycle sends no more POSTs (fenced, stopping), once so.
        self._closed: str | None = None

    def _woken(self) -> None:
        try:
            self.on_commit()
        except Exception:
            log.failure("outbox wake-up failed (delivery resumes on its next poll)")

    def _refuse_if_fenced(self) -> None:
        if self.lease is not None:
            self.lease.refuse_if_lost()

    def _refuse_if_closed(self) -> None:
        """Before each write of a create's chain: none once it may have
        been answered early (the answer stands; nothing contradicts it)."""
        if self._closed is not None:
            raise Closed(f"this site writes no more creates ({self._closed}); nothing was written")

    async def _run(self, step: Callable[[Cursor, *Ts], T], *args: *Ts) -> T:
        """The one write path: the storage transaction ``step(cursor,
        *args)``, run as its :class:`WritePolicy` declares.  No write once
        this site's lease is lost; none of a create's chain once the site
        is closed (:class:`Closed`).  A write that ``settles`` an outcome is
        retried by the database with backoff while it is busy
        (:class:`DatabaseBusy`), for at most ``record_retry_for`` seconds;
        then :class:`Unrecorded` is raised.  A failed write
        (:class:`DatabaseFailed`: an I/O error, a full disk) is raised at
        once.  Either way, if it ``keeps_trying``, it goes on in the
        background every ``settle_interval`` (:meth:`_keep_trying`).  The
        outbox is woken after a commit that ``wakes_outbox``."""
        policy = policy_of(step)
        self._refuse_if_fenced()
        if policy.create_step:
            self._refuse_if_closed()
        if policy.settles is None:
            result = await self.db.write(step, *args)
        else:
            result = await self._settled(policy, step, *args)
        if policy.wakes_outbox:
            self._woken()
        return result

    async def _settled(
        self, policy: WritePolicy, step: Callable[[Cursor, *Ts], T], *args: *Ts
    ) -> T:
        what = _what(policy, args)
        backoff = backoffPolicy(self.retry_initial, self.retry_max, factor=2.0, jitter=lambda: 0.0)
        try:
            return await self.db.write_retrying(
                Retry(what, self.record_retry_for, backoff), step, *args
            )
        except DatabaseBusy as e:
            log.error(
                "{what}: still failing after {seconds}s ({error}){then}",
                what=what,
                seconds=self.record_retry_for,
                error=e,
                then=f"; retrying it every {self.settle_interval}s in the background"
                if policy.keeps_trying
                else "",
            )
            if policy.keeps_trying:
                self._keep_trying(step, *args)
            raise Unrecorded(f"{what}: {e}") from e
        except LeaseLost:
            raise  # this site writes nothing more: a reap or its next start settles it
        except DatabaseFailed as e:
            if policy.keeps_trying:
                log.error(
                    "{what} failed ({error}); retrying it every {seconds}s in the background",
                    what=what,
                    error=e,
                    seconds=self.settle_interval,
                )
                self._keep_trying(step, *args)
            raise

    def _keep_trying(self, step: Callable[[Cursor, *Ts], object], *args: *Ts) -> None:
        """The settling ``step`` in the background, every ``settle_interval``
        until it lands (or the stop); the outbox woken once it has."""
        policy = policy_of(step)
        landed = self._background.keep_trying(_what(policy, args), step, *args)
        if policy.wakes_outbox:
            landed.addCallback(lambda recorded: self._woken() if recorded else None)

    @property
    def settling(self) -> int:
        """Outcome writes still being retried in the background."""
        return self._background.pending

    @property
    def closed(self) -> str | None:
        """Why this site takes no more creates (fenced, stopping), or ``None``."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Creates whose chain has not ended (answered early or not)."""
        return len(self._flights)

    def stop(self) -> None:
        """Answer the creates still under way (:meth:`answer_in_flight`) and
        stop the background retries (what they had not recorded is left
        ``RESERVED``/``SUBMITTING`` for recovery at the next start)."""
        self.answer_in_flight("this site is stopping")
        self._background.stop()

    def answer_in_flight(self, why: str) -> int:
        """This site can record no more outcomes (``why``: its lease is
        lost, it stops): from now on no POST is sent, and every create
        still under way is answered at once: ``202`` with the task as
        ``UNKNOWN`` if its POST may have reached the upstream (a reap or
        the recovery on the database settles it), else ``503 unavailable``
        (nothing was sent; try again, through another site).  Their chains
        run on to their end and write nothing more (:class:`Closed`).
        Returns how many were answered."""
        if self._closed is None:
            self._closed = why
        answered = 0
        for flight in list(self._flights):
            if flight.answer.called:
                continue
            answered += 1
            if flight.posted:
                log.warn(
                    "gid {gid}: its POST may have reached the upstream and this site can "
                    "record nothing more ({why}): answered 202 SUBMIT_UNKNOWN (提交未知); "
                    "a reap or the recovery on the database settles it",
                    gid=flight.gid,
                    why=why,
                )
                flight.answer.callback(Created(202, self._unrecorded_view(flight)))
            else:
                flight.answer.errback(_not_submitted(flight.gid, why))
        return answered

    def _changed(self, gid: int) -> None:
        try:
            self.on_task_changed(gid)
        except Exception:
            log.failure("handing gid {gid} to dispatch failed (it is retried on login)", gid=gid)

    # -- create ------------------------------------------------------------

    def create(
        self, user_id: int, gid: int, token: str, name: str = "", *, confirm_charge: bool = False
    ) -> Deferred[Created]:
        """Run the create chain; fails with :class:`TaskError` on a business
        refusal (nothing left behind), fires :class:`Created` otherwise.
        ``confirm_charge``: the caller accepts a new charge for a task whose
        archive is gone (``create.reserve``).  Answered early when the site
        is fenced or stops (:meth:`answer_in_flight`); cancelling the answer
        cancels the chain."""
        chain: Deferred[Created] | None = None

        def cancel(_: Deferred[Created]) -> None:
            if chain is not None:
                chain.cancel()

        flight = _Flight(gid, name, Deferred(cancel))
        self._flights[flight] = None
        chain = Deferred.fromCoroutine(self._create(flight, user_id, token, confirm_charge))
        chain.addBoth(self._flight_ended, flight)
        return flight.answer

    def _flight_ended(self, result: Created | Failure, flight: _Flight) -> None:
        """The chain's end: its answer, unless the create was answered already."""
        self._flights.pop(flight, None)
        if not flight.answer.called:
            if isinstance(result, Failure):
                flight.answer.errback(result)
            else:
                flight.answer.callback(result)
            return
        if isinstance(result, Failure):
            if result.check(TaskError, DatabaseError, CancelledError) is None:
                log.failure("the create chain of gid {gid} failed", result, gid=flight.gid)
                return
            ended = f"{type(result.value).__name__}: {result.getErrorMessage()}"
        else:
            ended = f"{result.status} {result.task.get('state')}"
        log.info(
            "gid {gid}: its create chain ended ({ended}) after it was answered",
            gid=flight.gid,
            ended=ended,
        )

    async def _create(
        self, flight: _Flight, user_id: int, token: str, confirm_charge: bool = False
    ) -> Created:
        gid, name = flight.gid, flight.name
        week = usage.iso_week(datetime.fromtimestamp(self._clock.seconds(), UTC))
        # 1. The intent and its placeholder row, durable before anything upstream.
        operation_id = await self._reserve(gid, user_id, name, token, week, confirm_charge)
        flight.operation_id = operation_id
        # 2. Read-only prepare: learn the cost; nothing is charged.
        prepared = await self._prepare(gid, token, operation_id)
        flight.prepared = prepared
        # 3. Quota with the known cost, then SUBMITTING, committed before the
        # POST.  The POST gate counts from before that write: a commit heard
        # late (the process paused after its COMMIT, a slow writer) leaves
        # the POST less time, never more (found by the simulator, seed 670).
        submitting_at = self._monotonic()
        await self._begin_submit(gid, operation_id, prepared, week)
        # 4. The one POST, sent only while the lease is fresh.
        submitted = await self._submit(flight, token, submitting_at)
        if submitted.outcome is Outcome.AMBIGUOUS:
            return await self._unknown(flight, "submit", submitted.error)
        # 5. Task row + weekly usage in one transaction, guarded by the generation.
        return await self._persist(flight, submitted, week)

    async def _reserve(
        self, gid: int, user_id: int, name: str, token: str, week: str, confirm_charge: bool
    ) -> str:
        """The reservation, under an operationId chosen here: should its
        COMMIT's answer be lost, the reservation that may exist is released
        in the background (nothing was sent for it)."""
        operation_id = generation.new_operation_id(self._entropy)
        reserve = create.reserve_again if confirm_charge else create.reserve
        try:
            return await self._run(
                reserve, gid, user_id, name, token, week, self._instance_id, operation_id
            )
        except CommitUnknown:
            self._keep_trying(create.release_unsent, gid, operation_id)
            raise

    async def _prepare(self, gid: int, token: str, operation_id: str) -> PrepareResult:
        """The read-only GET; on any refusal the reservation is released."""
        prepared = await self.upstream.prepare(gid, token, self.upstream_timeout)
        if prepared.outcome is not PrepareOutcome.OK:
            await self._release(gid, operation_id)
            raise _prepare_error(gid, prepared.outcome, prepared.error)
        return prepared

    async def _begin_submit(
        self, gid: int, operation_id: str, prepared: PrepareResult, week: str
    ) -> None:
        """Quota check and SUBMITTING in one transaction, committed before the POST."""
        try:
            started = await self._run(
                create.begin_submit,
                gid,
                operation_id,
                prepared.cost,
                prepared.title,
                week,
                prepared.size,
                self._instance_id,
            )
        except (Unrecorded, DatabaseFailed) as e:
            # Perhaps SUBMITTING after all (a COMMIT whose answer was lost),
            # but nothing was or will be POSTed: give it back either way.
            await self._release_unsent(gid, operation_id)
            if isinstance(e, LeaseLost):
                why = str(e)
            else:
                why = "the database " + (
                    "is busy or unreachable" if isinstance(e, Unrecorded) else "failed (logged)"
                )
            raise _not_submitted(gid, why) from e
        if not started:
            raise TaskError(
                "quota_exceeded",
                f"gid {gid} costs {prepared.cost}: that would exceed this week's quota",
                cost=prepared.cost,
            )

    def _post_gate(self, flight: _Flight, submitting_at: float) -> str | None:
        """SCALE.md "Fencing" 1, asked once the POST's connection is up and
        before its first byte: why it must not be sent, or ``None`` (and the
        create's POST may reach the upstream from here on)."""
        if self._before_post_gate is not None:
            self._before_post_gate()
        why = self._why_not_post(submitting_at)
        if why is None:
            flight.posted = True
        return why

    def _why_not_post(self, submitting_at: float) -> str | None:
        if self._closed is not None:
            # Its create may have been answered "nothing was submitted".
            return f"this site submits nothing more ({self._closed})"
        if self.lease is not None:
            if self.lease.lost is not None:
                return f"this site lost its lease ({self.lease.lost})"
            age = self.lease.stale_for()
            if age is not None:
                return (
                    f"this site last confirmed its lease {age:.1f} s ago "
                    f"(lease timeout {self.lease.timeout:g} s)"
                )
        since = self._monotonic() - submitting_at
        if since >= self.upstream_timeout:
            return (
                f"{since:.1f} s passed since SUBMITTING was committed "
                f"(upstream timeout {self.upstream_timeout:g} s)"
            )
        return None

    async def _submit(self, flight: _Flight, token: str, submitting_at: float) -> SubmitResult:
        """The one POST; a refusal releases the generation and is raised, and
        so does a POST its gate stopped (nothing sent)."""
        gid, operation_id = flight.gid, _operation_of(flight)
        submitted = await self.upstream.submit(
            gid, token, self.upstream_timeout, gate=lambda: self._post_gate(flight, submitting_at)
        )
        if submitted.outcome is Outcome.NOT_SENT:
            log.critical(
                "POST for gid {gid} NOT SENT: {why}; nothing reached the upstream",
                gid=gid,
                why=submitted.error,
            )
            await self._release_unsent(gid, operation_id)
            raise _not_submitted(gid, submitted.error)
        if submitted.outcome is Outcome.REFUSED:
            try:
                await self._run(create.release_refused, gid, operation_id)
            except (Unrecorded, DatabaseFailed):
                pass  # still true, and still answered: the release lands later
            raise TaskError(
                "upstream_rejected", f"the upstream refused gid {gid}: {submitted.error}"
            )
        return submitted

    async def _persist(self, flight: _Flight, submitted: SubmitResult, week: str) -> Created:
        """Record an accepted POST; if that fails the task is UNKNOWN, never lost."""
        gid, operation_id = flight.gid, _operation_of(flight)
        try:
            view = await self._run(
                create.persist_and_view,
                gid,
                operation_id,
                submitted.archive_url,
                submitted.cost,
                week,
            )
        except Exception as e:
            if isinstance(e, DatabaseError):
                log.error(
                    "persisting the submitted gid {gid} failed ({error}); marking it UNKNOWN",
                    gid=gid,
                    error=e,
                )
            else:
                log.failure("persisting the submitted gid {gid} failed; UNKNOWN it is", gid=gid)
            return await self._unknown(
                flight,
                "persist",
                f"the upstream accepted the POST (cost {submitted.cost}, "
                f"{submitted.archive_url}) but recording it failed: {type(e).__name__}: {e}",
                submitted.archive_url,
                submitted.cost,
            )
        return self._created(gid, view)

    async def _release_unsent(self, gid: int, operation_id: str) -> None:
        """Give back a generation this site sent nothing for (``RESERVED``
        or ``SUBMITTING``), in the background if it cannot be recorded now.
        A site that lost its lease writes nothing: a reap (or its next
        start) makes that generation ``UNKNOWN``, evidence "0 POSTs"."""
        try:
            await self._run(create.release_unsent, gid, operation_id)
        except LeaseLost as e:  # first: it is a DatabaseFailed too
            log.warn("gid {gid} left for the reaper: {e}", gid=gid, e=e)
        except (Unrecorded, DatabaseFailed):
            pass  # logged; retried in the background until it lands

    async def _release(self, gid: int, operation_id: str) -> None:
        """Release a reservation (nothing POSTed).  If that cannot be recorded
        now, the background retry does it; the caller's answer stands."""
        try:
            await self._run(create.release, gid, operation_id)
        except (Unrecorded, DatabaseFailed):
            pass  # logged; retried in the background until it lands

    async def _unknown(
        self,
        flight: _Flight,
        step: str,
        error: str,
        archive_url: str | None = None,
        cost: int | None = None,
    ) -> Created:
        """Record ``UNKNOWN`` (with what the POST answered, when it did) and
        answer ``202`` with the task.  Never a resend: the write is retried,
        the upstream never called.  Should it not be recorded (or read back)
        now, the answer is still ``202`` with the task as ``UNKNOWN``, as it
        will be once settled: by the background retry, a reap or the
        recovery at the next start (the module doc)."""
        gid = flight.gid
        settled_by = "its recovery at the next start"
        try:
            await self._run(
                create.mark_unknown,
                gid,
                _operation_of(flight),
                step,
                error,
                archive_url,
                cost,
            )
        except (Unrecorded, LeaseLost, DatabaseFailed) as e:
            settled_by = (
                "a reap or the recovery on the database"
                if isinstance(e, LeaseLost)
                else "the background retry of its UNKNOWN"
            )
        except CancelledError:
            raise
        except Exception:
            log.failure("could not record gid {gid} as UNKNOWN", gid=gid)
        else:
            try:
                return await self._answer(gid)
            except DatabaseError as e:
                log.warn("gid {gid} is UNKNOWN; reading it back failed: {e}", gid=gid, e=e)
                return Created(202, self._unrecorded_view(flight))
        log.warn(
            "gid {gid}: its outcome is unknown (the upstream may have charged it) and not "
            "recorded yet: answered 202 SUBMIT_UNKNOWN (提交未知); {settled_by} records it",
            gid=gid,
            settled_by=settled_by,
        )
        return Created(202, self._unrecorded_view(flight))

    def _unrecorded_view(self, flight: _Flight) -> views.TaskView:
        """The task object (``views.task_view``'s fields) of a create whose
        outcome is unknown and not recorded (or not readable) yet, from what
        its chain knows: ``UNKNOWN``, as every way of settling it leaves it
        (or ``SUBMITTED``, should its persist land after all); what only the
        database knows (times, owner) is ``null``."""
        prepared = flight.prepared
        size = prepared.size if prepared is not None else None
        status = TaskStatus.SUBMIT_UNKNOWN
        return {
            "gid": flight.gid,
            "name": flight.name or (prepared.title if prepared is not None else ""),
            "state": OperationState.UNKNOWN.value,
            "status": status.value,
            "statusText": status.zh,
            "progress": 0.0,
            "operationId": flight.operation_id,
            "deleteOperationId": None,
            "node": None,
            "cost": prepared.cost if prepared is not None else None,
            "createdAt": None,
            "updatedAt": None,
            "owner": None,
            "size": size,
            "bytesDone": None if size is None else 0,
            "speed": None,
            "eta": None,
            "completedAt": None,
            "archiveSize": None,
            "archiveSha256": None,
            "archiveGone": None,
            "queued": False,
            "detail": None,
            "nodeConnected": None,
            "stalledSince": None,
        }

    async def _answer(self, gid: int) -> Created:
        return self._created(gid, await self.db.read(views.task_view, gid))

    def _created(self, gid: int, view: views.TaskView | None) -> Created:
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
        started = await self._run(delete.request_delete, gid, user_id)
        view = None if started.completed else await self.db.read(views.task_view, gid)
        outcome = DeleteOutcome(
            gid, started.completed, started.delete_operation_id, started.node, view
        )
        if not started.completed:
            self._changed(gid)
        return outcome

    # -- recovery --------------------------------------------------------------

    def recover(self) -> Deferred[Recovered]:
        """Invariant 10's recovery at start: interrupted submissions become
        ``UNKNOWN``, reservations are released, of every run that is gone.

        Without a lease: everything in flight, in one transaction (a site
        alone on its database).  With one: the generations of each instance
        whose lease the database lets us take (earlier runs, gone sites;
        on SQLite the flock says every other instance is gone), each in a
        transaction of its own with its evidence, and those that no
        instance recorded; never a live instance's: that is the reaper's
        pass (:meth:`tasknet.site.reaper.Reaper.reap_gone`)."""
        return Deferred.fromCoroutine(self._recover())

    async def _recover(self) -> Recovered:
        if self._reaper is None:  # no lease: alone on its database
            recovered = await self._run(create.recover)
        else:
            reaped = await self._reaper.reap_gone(unrecorded=True)
            recovered = Recovered(
                [gid for r in reaped for gid in r.recovered.unknown],
                [gid for r in reaped for gid in r.recovered.released],
                [op for r in reaped for op in r.recovered.operations],
            )
        log.info(
            "recovery: {unknown} interrupted submission(s) now UNKNOWN {gids}, "
            "{released} reservation(s) released",
            unknown=len(recovered.unknown),
            gids=recovered.unknown,
            released=len(recovered.released),
        )
        return recovered

    # -- reconciliation ----------------------------------------------------------

    def unknown_with_evidence(self) -> Deferred[list[reconcile.UnknownTaskView]]:
        """Every ``UNKNOWN`` task with its evidence, including the upstream's
        read-only audit answer fetched now (or why it could not be), the
        verdict wait (``notBefore``, ``verdictWaitSeconds``) and, by verdict,
        what the audit says against it (``contradictions``: such a verdict
        needs a note)."""
        return Deferred.fromCoroutine(self._unknown_with_evidence())

    async def _unknown_with_evidence(self) -> list[reconcile.UnknownTaskView]:
        listed = await self.db.read(reconcile.unknown_operations)
        for view in listed:
            evidence = view["evidence"]
            evidence["upstream"] = await self._audit(view["gid"])
            _archive_url_evidence(evidence)
            evidence["contradictions"] = reconcile.contradictions(view["gid"], evidence)
        return listed

    async def _audit(self, gid: int) -> reconcile.UpstreamAudit:
        try:
            return {"available": True, "audit": await self.upstream.audit(gid)}
        except UpstreamError as e:
            return {"available": False, "error": f"upstream audit unavailable: {e}"}

    def resolve(
        self, gid: int, verdict: str, actor: str, note: str = ""
    ) -> Deferred[ResolvedView | None]:
        """Reconcile an ``UNKNOWN`` gid; never POSTs.  The evidence shown to
        the actor (stored step/error, the verdict wait and a fresh audit
        answer) goes into the audit row.  Refused (``TaskError``, nothing
        changed, nothing asked upstream): a verdict that is not one of
        :data:`~tasknet.site.storage.reconcile.VERDICTS` (``invalid_request``:
        the one check, for the API and ``tasknet-admin`` alike);
        ``not_submitted`` before the verdict wait ends
        (:class:`~tasknet.site.storage.reconcile.VerdictTooEarly`), and a
        verdict the audit contradicts without a ``note`` (``note_required``)."""
        return Deferred.fromCoroutine(self._resolve(gid, verdict, actor, note))

    async def _resolve(self, gid: int, verdict: str, actor: str, note: str) -> ResolvedView | None:
        if verdict not in reconcile.VERDICTS:
            raise TaskError(
                "invalid_request", f"'verdict' must be one of {list(reconcile.VERDICTS)}"
            )
        stored = await self.db.read(reconcile.unknown_operation, gid)
        evidence: reconcile.UnknownEvidence | None = None
        if stored is not None:
            evidence = stored["evidence"].copy()
            evidence["upstream"] = await self._audit(gid)
            _archive_url_evidence(evidence)
        # resolve_unknown prefers the URL stored from the POST's own answer.
        from_audit = evidence is not None and evidence.get("archiveUrlSource") == "audit"
        audit_url = evidence.get("archiveUrl") if evidence is not None and from_audit else None
        shown: Mapping[str, object] = evidence if evidence is not None else {}
        found = await self._run(
            reconcile.resolve_unknown, gid, verdict, actor, note, shown, audit_url
        )
        # Every view is a ResolvedView (its warning is optional).
        view = cast("ResolvedView | None", found)
        if view is not None and view.get("state") == "SUBMITTED":
            if evidence is not None and not evidence.get("archiveUrl"):
                log.warn("gid {gid} resolved submitted: {why}", gid=gid, why=NO_ARCHIVE_URL)
                view = {**view, "warning": NO_ARCHIVE_URL}
            self._changed(gid)
        return view


def _archive_url_evidence(evidence: reconcile.UnknownEvidence) -> None:
    """Where a "submitted" verdict would take the download URL from: the URL
    the POST answered (stored when its persist failed), else the upstream's
    audit ``archiveUrl`` (an extension our mock offers; not every upstream
    does), else none: the task could be metered but never dispatched."""
    upstream = evidence.get("upstream")
    audit = (upstream.get("audit") if upstream else None) or {}
    if evidence.get("archiveUrl"):
        evidence["archiveUrlSource"] = "submit"
    elif isinstance(audit_url := audit.get("archiveUrl"), str) and audit_url:
        evidence["archiveUrl"] = audit_url
        evidence["archiveUrlSource"] = "audit"
    else:
        evidence["archiveUrl"] = None
        evidence["archiveUrlSource"] = None
        evidence["warning"] = NO_ARCHIVE_URL


def _what(policy: WritePolicy, args: tuple[object, ...]) -> str:
    """The log's name of a settling write (its function takes the gid first)."""
    return f"{policy.settles} of gid {args[0]}"


def _operation_of(flight: _Flight) -> str:
    assert flight.operation_id is not None, "reserved before anything is sent"
    return flight.operation_id


def _not_submitted(gid: int, why: str) -> TaskError:
    """``503 unavailable``: nothing reached the upstream; the create may be tried again."""
    return TaskError(
        "unavailable",
        f"nothing was submitted for gid {gid}: {why}; try again "
        "(through another site if this one stays unavailable)",
    )


def _prepare_error(gid: int, outcome: PrepareOutcome, error: str) -> TaskError:
    if outcome is PrepareOutcome.MISSING:
        return TaskError("not_found", f"the upstream has no gallery {gid} ({error})")
    if outcome is PrepareOutcome.REFUSED:
        return TaskError("upstream_rejected", f"the upstream refused gid {gid}: {error}")
    return TaskError(
        "upstream_unavailable",
        f"the upstream could not be asked about gid {gid} ({error}); nothing was submitted",
    )
