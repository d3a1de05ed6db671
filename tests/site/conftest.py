"""Fixtures of the site's storage tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tasknet.site.storage.engine.database import connect
from tasknet.site.storage.engine.schema import prepare_database


@pytest.fixture
def conn(db_target: str) -> Iterator[Any]:
    """A driver connection to a fresh database of the test's backend with
    the site's schema (a ``sqlite3.Connection`` or its PostgreSQL twin)."""
    prepare_database(db_target)
    connection = connect(db_target)
    try:
        yield connection
    finally:
        connection.close()
