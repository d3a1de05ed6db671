"""The suite's one wait for a condition: :func:`eventually`.

A test waits on the code's own Deferreds where the code offers one (a
service's ``ready``, ``idle()`` of the dispatcher, the report pipeline, the
reporter and the outbox, a protocol's ``closed``/``lost``); it polls with
:func:`eventually` only for what has no such signal (a row another thread
wrote, a socket the kernel closed, another process's output).

The check runs at once, then at steps that double from 5 ms to 20 ms: a
condition that holds soon is seen soon, and a long wait does not spin.
``timeout`` is real (monotonic) time: a test that never sees its condition
fails with ``what`` (or the check's repr) in the message, never passes.

:func:`eventually_blocking` is the same wait for code that runs off the
reactor (a browser, a child process), sleeping between checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet import reactor
from twisted.internet.task import deferLater

T = TypeVar("T")

#: How long a wait may take unless the test says (a bound on failing, not a pace).
TIMEOUT = 10.0
FIRST_STEP = 0.005
LONGEST_STEP = 0.02


def _steps() -> Any:
    step = FIRST_STEP
    while True:
        yield step
        step = min(step * 2, LONGEST_STEP)


def _timed_out(check: Callable[[], Any], timeout: float, what: str) -> AssertionError:
    return AssertionError(f"timed out after {timeout} s waiting for {what or check!r}")


async def eventually(check: Callable[[], T], timeout: float = TIMEOUT, *, what: str = "") -> T:
    """Poll ``check()`` on the reactor until it returns something truthy;
    that value.  Fails (AssertionError) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    steps = _steps()
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(check, timeout, what)
        await deferLater(reactor, next(steps), lambda: None)


def eventually_blocking(
    check: Callable[[], T], timeout: float = TIMEOUT, *, what: str = "", longest: float = 0.1
) -> T:
    """:func:`eventually` for a test that does not run the reactor: sleeps
    between checks (steps doubling up to ``longest`` seconds)."""
    deadline = time.monotonic() + timeout
    step = FIRST_STEP
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(check, timeout, what)
        time.sleep(step)
        step = min(step * 2, longest)
