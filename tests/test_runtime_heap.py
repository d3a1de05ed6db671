"""``freeze_startup_heap``: what a started role keeps out of the collector's walks."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.defer import Deferred

from tasknet.runtime import freeze_startup_heap


class _Node:
    other: Any = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    gc.disable()  # no automatic collection: only the function under test's
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()  # the test process's objects go back to the collector


@pytest.mark.usefixtures("unfrozen")
def test_the_heap_is_frozen_when_the_role_is_ready_not_before() -> None:
    ready: Deferred[str] = Deferred()
    freeze_startup_heap(ready)
    assert gc.get_freeze_count() == 0
    seen: list[str] = []
    ready.addCallback(seen.append)
    ready.callback("started")
    assert gc.get_freeze_count() > 0
    assert seen == ["started"]  # the result passes through


@pytest.mark.usefixtures("unfrozen")
def test_garbage_left_by_the_start_is_collected_not_frozen() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    ready: Deferred[None] = Deferred()
    freeze_startup_heap(ready)
    ready.callback(None)
    assert gone() is None
