"""The SQL that differs between database engines, in one place.

Storage's SQL is written once, in SQLite's spelling with qmark placeholders
(``?``, ``?N``), from the pieces below wherever the engines differ.  SQLite
runs it as written (nothing is translated on its path); the PostgreSQL
cursor (:mod:`tasknet.site.storage.engine.postgres`) translates each statement text
once with :func:`translate` and caches the result.  Both renderings of every
piece live here, side by side (:data:`SQLITE`, :data:`POSTGRES`):

* :data:`NOW_SQL`: the current time as our stored timestamp text (ISO 8601,
  UTC, milliseconds, ``Z``), the same text on both engines, so timestamps
  compare as strings; :data:`NOW_OFFSET_SQL` with :func:`offset`, the same
  shifted by a parameter.  PostgreSQL's "now" is the statement's start
  (``statement_timestamp()``), as SQLite's is constant within a statement;
* :data:`IN_ARRAY_SQL` with :func:`array`: membership in one array
  parameter, whatever its size (no variable limit, one statement).  SQLite
  reads a JSON array with ``json_each``; PostgreSQL gets ``= ANY(%s)`` and
  the JSON text decoded into a list (an array parameter);
* :data:`FOR_UPDATE_SQL`: at the end of a ``SELECT``, lock the rows it
  answers until the transaction ends (``FOR UPDATE``; on SQLite a comment,
  its writer holds the whole file); :data:`POSTGRES_BEGIN_READ_COMMITTED`
  begins the writes that rely on such locks (``db``, "Isolation");
* :func:`greatest`: the larger of two values (SQLite's two-argument scalar
  ``MAX``, PostgreSQL's ``GREATEST``; the aggregate ``MAX(x)`` is never
  touched: only the exact texts :func:`greatest` produced are translated);
* upserts: ``INSERT … ON CONFLICT (key) DO UPDATE SET … excluded.col`` and
  ``ON CONFLICT DO NOTHING`` are the same in both engines, so they are
  written in place (:func:`insert_ignore` for the latter); never SQLite's
  ``INSERT OR IGNORE``/``OR REPLACE``.  In ``DO UPDATE SET`` a column of the
  existing row is qualified with its table (``t.used + excluded.used``):
  PostgreSQL finds a bare name ambiguous;
* ``x IS NOT DISTINCT FROM ?`` (both engines), never SQLite's ``x IS ?``;
  ``INSERT … RETURNING id``, never ``lastrowid``; the table ``user`` is
  written ``"user"`` (a reserved word on PostgreSQL).

What :func:`translate` does beyond the pieces, statement by statement (the
rules of the PostgreSQL cursor):

* ``?`` -> ``%s`` and ``?N`` -> the N-th parameter (outside string literals,
  quoted identifiers and comments); a literal ``%`` becomes ``%%``;
* ``LIKE`` -> ``ILIKE``: SQLite's ``LIKE`` ignores ASCII case, PostgreSQL's
  does not;
* a bare ``user`` (SQLite's spelling of the table) -> ``"user"``;
* ``BEGIN IMMEDIATE`` (a write) -> ``BEGIN ISOLATION LEVEL SERIALIZABLE``,
  a plain ``BEGIN`` (every read) -> ``BEGIN ISOLATION LEVEL REPEATABLE READ
  READ ONLY`` (one consistent snapshot, like SQLite's read transaction);
  any other ``BEGIN …`` (:data:`POSTGRES_BEGIN_READ_COMMITTED`) is passed
  as written;
* ``PRAGMA …`` -> nothing (the PostgreSQL session settings are made when
  the connection opens).

The ``.sql`` schema files keep SQLite's literals; PostgreSQL has its own
schema file (``schema_postgres.sql``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

#: The placeholder of one parameter.
PLACEHOLDER = "?"


@dataclass(frozen=True)
class Rendering:
    """One engine's text of each piece (``?``: its one parameter)."""

    name: str
    now_sql: str
    now_offset_sql: str
    in_array_sql: str
    not_in_array_sql: str
    for_update_sql: str


_PG_FORMAT = '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''

SQLITE = Rendering(
    name="sqlite",
    now_sql="strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    now_offset_sql="strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)",
    in_array_sql="IN (SELECT value FROM json_each(?))",
    not_in_array_sql="NOT IN (SELECT value FROM json_each(?))",
    # A comment: SQLite has no row locks (its writer holds the whole file).
    for_update_sql="/* FOR UPDATE */",
)

POSTGRES = Rendering(
    name="postgresql",
    now_sql=f"to_char(statement_timestamp() AT TIME ZONE 'UTC', {_PG_FORMAT})",
    now_offset_sql=(
        f"to_char((statement_timestamp() + CAST(? AS interval)) AT TIME ZONE 'UTC', {_PG_FORMAT})"
    ),
    # The marker before the placeholder tells the tokenizer below that this
    # parameter is an array: its JSON text is decoded into a list.
    in_array_sql="= ANY(\x01?)",
    not_in_array_sql="<> ALL(\x01?)",
    for_update_sql="FOR UPDATE",
)

#: Our stored timestamp format, "now", as a SQL expression.
NOW_SQL = SQLITE.now_sql

#: "now" shifted by one parameter (give it :func:`offset`).
NOW_OFFSET_SQL = SQLITE.now_offset_sql

#: ``column IN_ARRAY_SQL``: the column's value is in one array parameter
#: (give it :func:`array`).  ``?`` may be numbered (``?1``).
IN_ARRAY_SQL = SQLITE.in_array_sql

#: At the end of a ``SELECT``: lock the rows it answers until the
#: transaction ends (PostgreSQL's ``FOR UPDATE``; nothing on SQLite).  A
#: write at ``READ COMMITTED`` locks the rows it decides from with it
#: (``tasknet.site.storage.engine.database``, "Isolation"), in a fixed order (``ORDER BY``
#: the key) so that two such transactions never deadlock.
FOR_UPDATE_SQL = SQLITE.for_update_sql

#: The ``BEGIN`` of a write at ``READ COMMITTED`` on PostgreSQL (passed as
#: written; a write is otherwise ``BEGIN IMMEDIATE``, which is
#: ``SERIALIZABLE`` there).  Never sent to SQLite.
POSTGRES_BEGIN_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"


def offset(seconds: float) -> str:
    """The parameter of :data:`NOW_OFFSET_SQL` for ``seconds`` (negative:
    earlier); both engines read this text (PostgreSQL as an interval)."""
    return f"{seconds:+.3f} seconds"


def array(values: Iterable[Any]) -> str:
    """The parameter of :data:`IN_ARRAY_SQL` for ``values``."""
    items = list(values)
    try:
        # orjson: every report's statements take a few of these.
        return orjson.dumps(items).decode()
    except TypeError:  # an int beyond 64 bits
        return json.dumps(items)


# The exact texts greatest() produced, with their PostgreSQL rendering.
_GREATEST: dict[str, str] = {}


def greatest(a: str, b: str) -> str:
    """The SQL expression for the larger of expressions ``a`` and ``b``."""
    text = f"MAX({a}, {b})"
    _GREATEST[text] = f"GREATEST({a}, {b})"
    return text


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


# -- the PostgreSQL translation ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Translated:
    """One statement as the PostgreSQL cursor runs it.

    ``sql`` uses psycopg's ``%s`` (``None``: nothing to run, a ``PRAGMA``);
    ``order`` picks the parameters for its placeholders from the caller's
    (``None``: the caller's, as given); ``arrays`` are the positions (after
    ``order``) of array parameters, JSON text to decode into a list;
    ``count`` is the number of placeholders; ``kind`` is ``"begin"``,
    ``"commit"``, ``"rollback"`` or ``""``."""

    sql: str | None
    order: tuple[int, ...] | None = None
    arrays: tuple[int, ...] = ()
    kind: str = ""
    count: int = 0


_TRANSACTION_STATEMENTS = {
    "BEGIN": Translated("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", kind="begin"),
    "BEGIN DEFERRED": Translated("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", kind="begin"),
    "BEGIN IMMEDIATE": Translated("BEGIN ISOLATION LEVEL SERIALIZABLE", kind="begin"),
    "BEGIN EXCLUSIVE": Translated("BEGIN ISOLATION LEVEL SERIALIZABLE", kind="begin"),
    "COMMIT": Translated("COMMIT", kind="commit"),
    "END": Translated("COMMIT", kind="commit"),
    "ROLLBACK": Translated("ROLLBACK", kind="rollback"),
}

_PIECES = [
    (SQLITE.now_offset_sql, POSTGRES.now_offset_sql),
    (SQLITE.now_sql, POSTGRES.now_sql),
    (SQLITE.for_update_sql, POSTGRES.for_update_sql),
]
# json_each over one (possibly numbered) placeholder, NOT IN before IN.
_ARRAY_PIECE = re.compile(
    r"(NOT\s+)?IN\s*\(\s*SELECT\s+value\s+FROM\s+json_each\(\s*(\?\d*)\s*\)\s*\)", re.IGNORECASE
)

# Tokens the translation looks at; everything else is copied as it is.
_TOKENS = re.compile(
    r"""
      (?P<string>'(?:[^']|'')*')
    | (?P<quoted>"(?:[^"]|"")*")
    | (?P<comment>--[^\n]*|/\*.*?\*/)
    | (?P<param>\x01?\?(?P<number>\d*))
    | (?P<percent>%)
    | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
    """,
    re.VERBOSE | re.DOTALL,
)

_WORDS = {"like": "ILIKE", "user": '"user"'}


def translate(sql: str) -> Translated:
    """The PostgreSQL form of one statement written for SQLite (the rules
    in the module doc).  Pure: the caller caches it by ``sql``."""
    head = " ".join(sql.split()).rstrip(";").upper()
    special = _TRANSACTION_STATEMENTS.get(head)
    if special is not None:
        return special
    if head.startswith("BEGIN "):
        return Translated(sql, kind="begin")  # an explicit PostgreSQL BEGIN, as written
    if head.startswith("PRAGMA "):
        return Translated(None)
    text = sql
    for sqlite_text, postgres_text in _PIECES:
        text = text.replace(sqlite_text, postgres_text)
    for sqlite_text, postgres_text in list(_GREATEST.items()):
        text = text.replace(sqlite_text, postgres_text)
    text = _ARRAY_PIECE.sub(
        lambda m: (POSTGRES.not_in_array_sql if m.group(1) else POSTGRES.in_array_sql).replace(
            "?", m.group(2)
        ),
        text,
    )
    parameters = sum(1 for m in _TOKENS.finditer(text) if m.lastgroup == "param")
    out: list[str] = []
    order: list[int] = []
    arrays: list[int] = []
    numbered = False
    next_plain = 0
    position = 0
    for match in _TOKENS.finditer(text):
        out.append(text[position : match.start()])
        position = match.end()
        kind, token = match.lastgroup, match.group()
        if kind == "param":
            number = match.group("number")
            if number:
                numbered = True
                order.append(int(number) - 1)
            else:
                order.append(next_plain)
                next_plain += 1
            if token.startswith("\x01"):
                arrays.append(len(order) - 1)
            out.append("%s")
        elif kind != "word" and parameters:
            # psycopg reads % in the whole text once there are parameters.
            out.append(token.replace("%", "%%"))
        elif kind == "word":
            out.append(_WORDS.get(token.lower(), token))
        else:
            out.append(token)
    out.append(text[position:])
    if numbered and next_plain:
        raise ValueError(f"statement mixes ? and ?N placeholders: {sql!r}")
    if not order:
        return Translated("".join(out))
    identity = order == list(range(len(order)))
    return Translated(
        "".join(out), None if identity else tuple(order), tuple(arrays), count=len(order)
    )
