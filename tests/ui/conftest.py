"""What the browser tests share: Debian's Chromium, the skip/fail rule when
it is missing, a deterministic choice of gids by archive size, and where
screenshots go."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tasknet.cli.demo import DemoStack
from tasknet.upstream.catalog import gallery

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_browser() -> Any:
    """Playwright's sync API, or a skip (a failure under TASKNET_REQUIRE_BROWSER=1)."""
    required = os.environ.get("TASKNET_REQUIRE_BROWSER") == "1"
    reason = None
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        from playwright import sync_api
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[test]')"
    if reason is not None:
        if required:
            pytest.fail(f"TASKNET_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    return sync_api


@contextmanager
def demo_running(demo: DemoStack) -> Iterator[DemoStack]:
    """``demo`` started, then stopped; a child that did not stop cleanly has
    its log tail printed."""
    demo.start()
    try:
        yield demo
    finally:
        demo.stop()
        for child in demo.children:
            # twistd re-raises the SIGTERM it shut down on: -SIGTERM is a clean stop.
            if child.popen is not None and child.popen.returncode not in (0, -signal.SIGTERM, None):
                print(
                    f"{child.name} exited {child.popen.returncode}; log tail:\n{child.log_tail()}"
                )


def gid_with_size(low: int, high: int, start: int) -> int:
    """A gid whose archive size is in [low, high] bytes (the catalog is deterministic)."""
    gid = start
    while not low <= gallery(gid).size <= high:
        gid += 1
    return gid


def screenshot_dir() -> Path:
    # Outside pytest's tmp dirs, which are rotated away after a few runs.
    chosen = os.environ.get("TASKNET_SCREENSHOTS")
    target = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="tasknet-screenshots-"))
    target.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {target}")
    return target


@pytest.fixture
def screenshots() -> Path:
    return screenshot_dir()


def seed_submitted(database: str, gids: range, node: str, owner: str = "demo") -> None:
    """``gids`` as SUBMITTED tasks of ``owner``, each claimed by ``node``,
    written straight into a running site's SQLite ``database`` with the
    site's own storage functions (no upstream call, no node download)."""
    from tasknet.site.storage import create, dispatch, usage, users
    from tasknet.site.storage.engine.database import connect, run_write

    connection = connect(database)
    try:
        user = run_write(connection, lambda c: users.set_quota(c, owner, 10 * len(gids) + 5000))
        week = usage.iso_week()

        def write(cursor: Any, part: range) -> None:
            for gid in part:
                op = create.reserve(cursor, gid, user.id, f"seeded {gid}", "upstream-token", week)
                assert create.begin_submit(cursor, gid, op, 1, f"gallery {gid}", week)
                create.persist_submitted(cursor, gid, op, f"http://127.0.0.1:9/{gid}.bin", 1, week)
                dispatch.claim_task(cursor, gid, [node])

        for start in range(gids.start, gids.stop, 500):
            run_write(connection, write, range(start, min(start + 500, gids.stop)))
    finally:
        connection.close()
