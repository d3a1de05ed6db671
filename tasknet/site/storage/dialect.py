"""The SQL that differs between database engines, in one place.

Storage's SQL is written in the dialect common to SQLite and PostgreSQL,
with qmark placeholders (``?``, ``?N``: a second backend translates them in
its cursor, the one place that knows its driver's paramstyle).  What the
engines write differently is here, and only here; storage modules build
their statements from these pieces:

* :data:`NOW_SQL`: the current time as our stored timestamp text (ISO 8601,
  UTC, milliseconds, ``Z``; PostgreSQL: ``to_char(now() AT TIME ZONE 'UTC', …)``);
  :data:`NOW_OFFSET_SQL` with :func:`offset`, the same shifted by a parameter;
* :data:`IN_ARRAY_SQL` with :func:`array`: membership in one array
  parameter, whatever its size (no variable limit, one statement;
  PostgreSQL: ``= ANY(?)`` with a list);
* :func:`greatest`: the larger of two values (SQLite's scalar ``MAX``;
  PostgreSQL's ``GREATEST``);
* upserts: ``INSERT … ON CONFLICT (key) DO UPDATE SET … excluded.col``
  and ``ON CONFLICT DO NOTHING`` are the same in both engines, so they are
  written in place (:func:`insert_ignore` for the latter); never SQLite's
  ``INSERT OR IGNORE``/``OR REPLACE``.

The ``.sql`` schema files keep SQLite's literals (a second backend has its
own schema files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

#: The placeholder of one parameter.
PLACEHOLDER = "?"

#: Our stored timestamp format, "now", as a SQL expression.
NOW_SQL = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"

#: "now" shifted by one parameter (give it :func:`offset`).
NOW_OFFSET_SQL = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)"

#: ``column IN_ARRAY_SQL``: the column's value is in one array parameter
#: (give it :func:`array`).
IN_ARRAY_SQL = "IN (SELECT value FROM json_each(?))"


def offset(seconds: float) -> str:
    """The parameter of :data:`NOW_OFFSET_SQL` for ``seconds`` (negative: earlier)."""
    return f"{seconds:+.3f} seconds"


def array(values: Iterable[Any]) -> str:
    """The parameter of :data:`IN_ARRAY_SQL` for ``values``."""
    return json.dumps(list(values))


def greatest(a: str, b: str) -> str:
    """The SQL expression for the larger of expressions ``a`` and ``b``."""
    return f"MAX({a}, {b})"


def placeholders(n: int) -> str:
    """``n`` placeholders, comma-separated (a VALUES list)."""
    return ", ".join([PLACEHOLDER] * n)


def insert_ignore(table: str, columns: Iterable[str]) -> str:
    """``INSERT`` of one row into ``table`` that does nothing when the row
    conflicts with an existing one (a unique key)."""
    names = list(columns)
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({placeholders(len(names))})"  # noqa: S608
        " ON CONFLICT DO NOTHING"
    )
