"""The composition root (``tasknet.site.root``): one function builds the
whole site, every part complete and on the site's clock, with its timed
parts as services under the site's MultiService.  Built over a real SQLite
file; nothing is started on the real reactor (the site runs on a
``task.Clock``), so nothing listens and no time passes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.application.internet import TimerService
from twisted.application.service import IServiceCollection, MultiService
from twisted.internet import reactor as global_reactor
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads, IReactorTCP
from twisted.internet.task import Clock
from zope.interface import implementer

from tasknet.site.dispatcher import Dispatcher
from tasknet.site.housekeeping import Housekeeping
from tasknet.site.outbox import (
    ClaimRenewer,
    LivenessSweep,
    LocalTail,
    LocalWebhook,
    OutboxExecutor,
    SharedTail,
    SharedWebhook,
)
from tasknet.site.root import Tuning, build_site
from tasknet.site.service import SiteService
from tests.site.helpers import site_options


@implementer(IReactorCore, IReactorFromThreads, IReactorTCP)
class _Clock(Clock):
    """The site's clock, a ``task.Clock``; everything else a reactor does
    (the database pools' start and stop, their threads' results) the
    global reactor's, as before the pools took the root's reactor."""

    def __getattr__(self, name: str) -> Any:
        return getattr(global_reactor, name)


def _tree(service: Any) -> Iterator[Any]:
    """``service`` and every service under it."""
    yield service
    if IServiceCollection.providedBy(service):
        for child in service:
            yield from _tree(child)


def _build(target: str, clock: Clock, *extra: str, tuning: Tuning = Tuning()) -> SiteService:
    options = site_options(target, "http://127.0.0.1:9", *extra)
    return build_site(options, clock, tuning=tuning)


@pytest_twisted.ensureDeferred
async def test_every_part_and_every_timer_runs_on_the_sites_clock(db_target: str) -> None:
    clock = _Clock()
    site = _build(db_target, clock, "--create-rate", "5", "--webhook", "http://127.0.0.1:9/hook")
    try:
        parts = site.parts
        side = parts.node_side
        clocks = {
            "lifecycle": parts.lifecycle._clock,
            "database": parts.db._clock,
            "reports": side.reports._clock,
            "dispatcher": side.dispatcher._clock,
            "outbox": side.outbox._clock,
            "node listener": side.listener.clock,
            "housekeeping": parts.housekeeping._clock,
            "web": parts.web.clock,
            "events": parts.web.events.factory.clock,  # type: ignore[attr-defined]
            "create limiter": parts.web.create_limiter._clock,  # type: ignore[union-attr]
            "instance": parts.instance._clock,
        }
        assert {name: c for name, c in clocks.items() if c is not clock} == {}
        timers = [s for s in _tree(site) if isinstance(s, TimerService)]
        # node keys; the dispatcher's poll and reassignment check; the outbox's
        # poll, prune and liveness sweep (each on a timer of its own), and on
        # PostgreSQL its webhook claims' renewer; housekeeping.
        shared = [t for t in timers if t.parent in (parts.instance, side.ownership)]
        others = [t for t in timers if t not in shared]
        assert len(others) == (8 if parts.instance.lease.shared else 7)
        renewers = [t for t in others if isinstance(t, ClaimRenewer)]
        assert len(renewers) == (1 if parts.instance.lease.shared else 0)
        # On PostgreSQL the instance's lease check, heartbeat and reaping, and the
        # ownership's check that this site's nodes are still its own; none on SQLite.
        assert len(shared) == (2 if parts.instance.lease.shared else 0)
        assert [t for t in timers if t.clock is not clock] == []
    finally:
        await site.stopService()  # never started: stops cleanly all the same
    assert clock.getDelayedCalls() == []


@pytest_twisted.ensureDeferred
async def test_the_timed_parts_are_named_children_of_the_site(db_target: str) -> None:
    tuning = Tuning(dispatch_poll_interval=2.0, outbox_poll_interval=3.0, node_keys_refresh=4.0)
    site = _build(db_target, _Clock(), tuning=tuning)
    try:
        side = site.parts.node_side
        named = {name: site.getServiceNamed(name) for name in site.namedServices}
        assert named == {
            "instance": site.parts.instance,
            "node-keys": named["node-keys"],
            "housekeeping": site.parts.housekeeping,
            "outbox": side.outbox,
            "node-ownership": side.ownership,
            "dispatch": side.dispatcher,
        }
        assert isinstance(named["node-keys"], TimerService) and named["node-keys"].step == 4.0
        for part in (side.dispatcher, side.outbox, site.parts.housekeeping, side.ownership):
            assert isinstance(part, MultiService)
        assert isinstance(side.dispatcher, Dispatcher)
        # Its poll, and the check for nodes gone past --reassign-after (15m: every 30 s).
        assert [t.step for t in side.dispatcher] == [2.0, 30.0]
        assert isinstance(side.outbox, OutboxExecutor)
        # The poll, the liveness sweep (its own timer at the poll interval), the prune.
        assert sorted(t.step for t in side.outbox) == [3.0, 3.0, 3600.0]
        assert len([t for t in side.outbox if isinstance(t, LivenessSweep)]) == 1
        assert isinstance(site.parts.housekeeping, Housekeeping)
        assert [t.step for t in site.parts.housekeeping] == [3600.0]
        # One registry of connected nodes, shared by the listener and the dispatcher.
        assert side.listener.nodes is side.nodes and side.dispatcher._nodes is side.nodes
        assert not site.running and not any(s.running for s in _tree(site))
    finally:
        await site.stopService()


@pytest_twisted.ensureDeferred
async def test_the_outbox_rooms_are_chosen_here_alone_or_shared(db_target: str) -> None:
    # One site alone (SQLite): the local tail and webhook, and the liveness
    # watch reads the session rows only when the registry says they changed.
    # Shared (PostgreSQL, an instance): the shared tail, claimed webhook rows,
    # and a watch without the registry (other sites change the rows unseen).
    site = _build(db_target, _Clock(), "--webhook", "http://127.0.0.1:9/hook")
    try:
        side = site.parts.node_side
        shared = site.parts.instance.lease.shared
        outbox = side.outbox
        assert isinstance(outbox.tail, SharedTail if shared else LocalTail)
        assert isinstance(outbox._webhook, SharedWebhook if shared else LocalWebhook)
        assert outbox.liveness is not None
        assert outbox.liveness._nodes is (None if shared else side.nodes)
    finally:
        await site.stopService()


@pytest_twisted.ensureDeferred
async def test_no_poll_interval_means_no_timer(db_target: str) -> None:
    tuning = Tuning(dispatch_poll_interval=None, outbox_poll_interval=None)
    site = _build(db_target, _Clock(), "--reassign-after", "0", tuning=tuning)
    try:
        assert list(site.parts.node_side.dispatcher) == []
        assert [t.step for t in site.parts.node_side.outbox] == [3600.0]  # the prune only
    finally:
        await site.stopService()


@pytest_twisted.ensureDeferred
async def test_a_second_build_on_the_same_database_is_refused_until_the_first_stops(
    tmp_path: Path,
) -> None:
    # SQLite only: one site per SQLite file (the flock on PATH.lock); on
    # PostgreSQL several sites share a database by design (SCALE.md).
    from tasknet.site.storage.engine.file_lock import DatabaseInUse

    path = str(tmp_path / "site.sqlite")
    first = _build(path, _Clock())
    try:
        try:
            _build(path, _Clock())
        except DatabaseInUse:
            pass
        else:
            raise AssertionError("a second site was built on a database in use")
    finally:
        await first.stopService()
    await _build(path, _Clock()).stopService()  # the lock went with the first
