"""SQL written once, rendered for both engines when its module is imported.

Every statement of storage is a module-level constant made by :func:`sql`
(or, where the engines need two texts, :func:`per_backend` and
:func:`postgres_only`).  Each is an :class:`Sql`: a ``str`` whose value is
the SQLite text, so sqlite3 runs it as it is (the SQLite path pays
nothing), carrying its PostgreSQL text (``%s`` placeholders) and the order
in which the caller's parameters fill them.  The PostgreSQL cursor
(:mod:`tasknet.site.storage.engine.postgres`) sends that text; nothing is
rewritten while the site runs.  A statement built while it runs (a page of
the task list, a state change naming its columns) is composed of
fragments rendered at import (:func:`fragment`, ``+``, :meth:`Sql.join`),
never by rendering text.

A template is written in a spelling both engines accept: ``?`` and ``?N``
placeholders, ``"user"`` quoted (a reserved word on PostgreSQL),
``INSERT … ON CONFLICT (key) DO UPDATE SET … excluded.col`` (a column of
the existing row qualified with its table: PostgreSQL finds a bare name
ambiguous) and ``ON CONFLICT DO NOTHING`` (never ``INSERT OR IGNORE``),
``x IS NOT DISTINCT FROM ?`` (never SQLite's ``x IS ?``), ``INSERT …
RETURNING id`` (never ``lastrowid``), ``LIKE`` only where case cannot
matter (digits, names of our own).  Where the engines differ, the template
names a piece, in ``str.format`` syntax (``{name}`` or ``{name:argument}``;
a literal brace is doubled).  Both renderings of each piece are here, side
by side (:data:`_SQLITE`, :data:`_POSTGRES`):

* ``{now}``: the current time as our stored timestamp text (ISO 8601, UTC,
  milliseconds, ``Z``: :mod:`~tasknet.site.storage.engine.timestamps`), the
  same text on both engines, so timestamps compare as strings;
  ``{now_offset:?}`` the same shifted by a parameter (give it
  :func:`offset`).  "Now" is the wall clock the connection's pool was given
  (:mod:`~tasknet.site.storage.engine.sources`; the root's): on SQLite the
  connection's ``tasknet_now()`` (registered deterministic, so SQLite reads
  it once per statement for each place it appears, never once per row:
  :mod:`~tasknet.site.storage.engine.sqlite`); on PostgreSQL the session's
  ``tasknet.now`` setting when the pool was given a clock other than the
  system's (set at each transaction's start:
  :mod:`~tasknet.site.storage.engine.postgres`), else the statement's start
  (``statement_timestamp()``), as before.  The schemas' column defaults are
  the database's own clock: the site's inserts give every timestamp column
  ``{now}`` instead (only a tool's or an operator's
  row takes the default; the PostgreSQL triggers read no time);
* ``{in_array:?}``: ``column {in_array:?}``, the column's value is in one
  array parameter, whatever its size (no variable limit, one statement).
  The parameter is a Python ``list``: psycopg sends it as an array
  (``= ANY(%s)``), SQLite gets it as JSON text (the adapter of
  :mod:`~tasknet.site.storage.engine.sqlite`) and reads it with
  ``json_each``.  ``{in_array}`` alone is ``{in_array:?}``;
* ``{ilike}``: the operator of a pattern match that ignores case, the same
  on both engines: ASCII letters only (``A`` matches ``a``; ``É`` does not
  match ``é``).  SQLite's ``LIKE`` is that already; PostgreSQL's is
  ``COLLATE "C" ILIKE`` (the C collation folds A–Z only, whatever the
  database's locale: a bare ``ILIKE`` would fold every letter its locale
  knows);
* ``{greatest:a, b}``: the larger of two values that are never NULL
  (SQLite's scalar ``MAX(a, b)``, PostgreSQL's ``GREATEST``; they differ on
  NULL, which is why it takes values that are never NULL);
* ``{for_update}``, ``{for_share}``, ``{skip_locked}``: at the end of a
  ``SELECT``, lock the rows it answers until the transaction ends
  (``FOR UPDATE``, ``FOR SHARE``, ``FOR UPDATE SKIP LOCKED``), nothing on
  SQLite, whose one writer holds the whole file.

A statement only PostgreSQL has (an advisory lock, ``pg_notify``) is
:func:`postgres_only`: on SQLite a ``SELECT`` of a neutral answer that
binds the same parameters, so the code that runs it is the same on both.
A statement whose two texts have nothing in common (a transaction's
``BEGIN``, chosen by the engine alone: :mod:`~tasknet.site.storage.engine.
transactions`) is :func:`per_backend`.

Text that is not an :class:`Sql` (a tool's or a test's own statement) is
rendered by the same function when the PostgreSQL cursor first meets it
(:func:`rendered`: its placeholders only, no piece, nothing rewritten); the
storage code itself passes only :class:`Sql` (a test checks it).

The ``.sql`` schema files are the other place the engines differ:
SQLite's scripts and PostgreSQL's own (``schema_postgres.sql`` and its
upgrades).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

#: A parameter value of a statement, of either backend (a list: a JSON
#: array, read by ``json_each`` / ``jsonb_array_elements``).
SqlValue: TypeAlias = "int | float | str | bytes | None | list[int] | list[str]"
#: The parameters of one statement, in placeholder order.
SqlParameters: TypeAlias = "Sequence[SqlValue]"


class Sql(str):
    """One statement (or a fragment of one) rendered for both engines: its
    value is the SQLite text; :attr:`postgres` is the PostgreSQL text
    (``%s`` placeholders, a literal ``%`` doubled), :attr:`order` the
    positions of the caller's parameters that fill its placeholders
    (``None``: in the order given), :attr:`placeholders` how many it has,
    :attr:`arity` how many parameters it takes (``?N``: the largest N) and
    :attr:`kind` what it does to a transaction (``begin``, ``commit``,
    ``rollback``, ``rollback_to``, or ``""``).

    Fragments compose with ``+`` and :meth:`join` (both renderings at once);
    neither mixes with plain text, and an :class:`Sql` is never formatted
    into a string (``f"{statement}"`` raises): text rendered at run time is
    what this type exists to rule out."""

    postgres: str
    order: tuple[int, ...] | None
    placeholders: int
    arity: int
    numbered: bool
    kind: str

    def __new__(
        cls,
        sqlite: str,
        postgres: str,
        *,
        order: tuple[int, ...] | None = None,
        placeholders: int = 0,
        arity: int | None = None,
        numbered: bool = False,
        kind: str = "",
    ) -> Sql:
        self = super().__new__(cls, sqlite)
        self.postgres = postgres
        self.order = order
        self.placeholders = placeholders
        self.arity = placeholders if arity is None else arity
        self.numbered = numbered
        self.kind = kind
        return self

    def __add__(self, other: object) -> Sql:  # type: ignore[override]
        if not isinstance(other, Sql):
            raise TypeError(f"an Sql fragment composes only with another, not {type(other)}")
        if self.numbered or other.numbered:
            raise TypeError("fragments with numbered placeholders (?N) do not compose")
        return Sql(
            str.__add__(self, other),
            self.postgres + other.postgres,
            placeholders=self.placeholders + other.placeholders,
            kind=self.kind,
        )

    def __radd__(self, other: object) -> Sql:
        raise TypeError(f"an Sql fragment composes only with another, not {type(other)}")

    def __format__(self, spec: str) -> str:
        raise TypeError("an Sql is never formatted into text: compose fragments with + or join")

    def join(self, parts: Iterable[str]) -> Sql:  # type: ignore[override]
        """``part + self + part + …`` (each part an :class:`Sql`)."""
        joined: Sql | None = None
        for part in parts:
            if not isinstance(part, Sql):
                raise TypeError(f"an Sql fragment composes only with another, not {type(part)}")
            joined = part if joined is None else joined + self + part
        return joined if joined is not None else EMPTY

    def __repr__(self) -> str:
        return f"Sql({str.__repr__(self)})"


# -- the pieces -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """One engine's text of a piece: ``render(argument)``; ``default`` when
    the template gives no argument (``None``: one is required)."""

    render: Callable[[str], str]
    default: str | None = None

    def __format__(self, spec: str) -> str:
        argument = spec or self.default
        if argument is None:
            raise ValueError("this piece takes an argument: {name:argument}")
        return self.render(argument)


def _fixed(text: str) -> _Piece:
    return _Piece(lambda _: text, default="")


_SQLITE_TIME = "'%Y-%m-%dT%H:%M:%fZ'"
_POSTGRES_TIME = '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''

#: SQLite's "now": the connection's wall clock (``sqlite.NOW_FUNCTION``),
#: Unix seconds cut to milliseconds.
_SQLITE_NOW = "tasknet_now(), 'unixepoch'"
#: PostgreSQL's "now": the session's ``tasknet.now`` if set (a pool given a
#: clock of its own sets it), else the statement's start.  ``current_setting``
#: with ``missing_ok`` answers NULL for a setting never made, '' for one
#: reset.
_POSTGRES_NOW = (
    "COALESCE(NULLIF(current_setting('tasknet.now', true), '')::timestamptz, statement_timestamp())"
)

_SQLITE: dict[str, _Piece] = {
    "now": _fixed(f"strftime({_SQLITE_TIME}, {_SQLITE_NOW})"),
    "now_offset": _Piece(lambda p: f"strftime({_SQLITE_TIME}, {_SQLITE_NOW}, {p})", "?"),
    "in_array": _Piece(lambda p: f"IN (SELECT value FROM json_each({p}))", "?"),  # noqa: S608
    "ilike": _fixed("LIKE"),
    "greatest": _Piece(lambda ab: f"MAX({ab})"),
    # Comments: SQLite has no row locks (its one writer holds the whole file).
    "for_update": _fixed("/* FOR UPDATE */"),
    "for_share": _fixed("/* FOR SHARE */"),
    "skip_locked": _fixed("/* FOR UPDATE SKIP LOCKED */"),
}

_POSTGRES: dict[str, _Piece] = {
    "now": _fixed(f"to_char({_POSTGRES_NOW} AT TIME ZONE 'UTC', {_POSTGRES_TIME})"),
    "now_offset": _Piece(
        lambda p: (
            f"to_char(({_POSTGRES_NOW} + CAST({p} AS interval)) AT TIME ZONE 'UTC',"
            f" {_POSTGRES_TIME})"
        ),
        "?",
    ),
    "in_array": _Piece(lambda p: f"= ANY({p})", "?"),
    "ilike": _fixed('COLLATE "C" ILIKE'),
    "greatest": _Piece(lambda ab: f"GREATEST({ab})"),
    "for_update": _fixed("FOR UPDATE"),
    "for_share": _fixed("FOR SHARE"),
    "skip_locked": _fixed("FOR UPDATE SKIP LOCKED"),
}

assert _SQLITE.keys() == _POSTGRES.keys()


def offset(seconds: float) -> str:
    """The parameter of ``{now_offset}`` for ``seconds`` (negative:
    earlier); both engines read this text (PostgreSQL as an interval)."""
    return f"{seconds:+.3f} seconds"


# -- rendering ----------------------------------------------------------------------------

# What the PostgreSQL rendering looks at; everything else is copied as it is.
_TOKENS = re.compile(
    r"""
      (?P<string>'(?:[^']|'')*')
    | (?P<quoted>"(?:[^"]|"")*")
    | (?P<comment>--[^\n]*|/\*.*?\*/)
    | (?P<param>\?(?P<number>\d*))
    | (?P<percent>%)
    """,
    re.VERBOSE | re.DOTALL,
)

_KINDS = {"BEGIN": "begin", "START": "begin", "COMMIT": "commit", "END": "commit"}


def _kind(text: str) -> str:
    words = text.split(None, 2)
    head = words[0].upper().rstrip(";") if words else ""
    if head == "ROLLBACK":
        return "rollback_to" if len(words) > 1 and words[1].upper() == "TO" else "rollback"
    return _KINDS.get(head, "")


def _placeholders(text: str) -> tuple[str, list[int], bool]:
    """``text`` with psycopg's ``%s`` for each ``?``/``?N`` (outside string
    literals, quoted identifiers and comments) and every other ``%``
    doubled; the parameter position of each placeholder; whether they are
    numbered."""
    out: list[str] = []
    order: list[int] = []
    numbered = plain = False
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
                order.append(len(order))
                plain = True
            out.append("%s")
        else:
            # psycopg reads % in the whole text once it has parameters.
            out.append(token.replace("%", "%%"))
    out.append(text[position:])
    if numbered and plain:
        raise ValueError(f"a statement mixes ? and ?N placeholders: {text!r}")
    return "".join(out), order, numbered


def _arity(order: list[int], numbered: bool) -> int:
    """How many parameters a statement takes (``?N``: the largest N)."""
    return max(order) + 1 if numbered and order else len(order)


def _render(sqlite: str, postgres: str, *, kind: str | None = None) -> Sql:
    """The :class:`Sql` of ``sqlite`` and ``postgres`` (qmark texts), whose
    placeholders must ask for the same parameters."""
    pg_text, order, numbered = _placeholders(postgres)
    _, lite_order, lite_numbered = _placeholders(sqlite)
    if _arity(order, numbered) != _arity(lite_order, lite_numbered):
        raise ValueError(f"the two texts take different parameters: {sqlite!r} / {postgres!r}")
    identity = order == list(range(len(order)))
    return Sql(
        sqlite,
        pg_text,
        order=None if identity else tuple(order),
        placeholders=len(order),
        arity=_arity(order, numbered),
        numbered=numbered,
        kind=_kind(sqlite) if kind is None else kind,
    )


@dataclass(frozen=True)
class Defined:
    """A statement or fragment made at import, and the module that made it
    (what the rendering test runs on both engines)."""

    statement: Sql
    module: str
    fragment: bool


_DEFINED: list[Defined] = []


def _define(statement: Sql, *, fragment: bool = False) -> Sql:
    module = str(sys._getframe(2).f_globals.get("__name__", "?"))
    _DEFINED.append(Defined(statement, module, fragment))
    return statement


def defined() -> list[Defined]:
    """Every statement and fragment made so far by the functions below."""
    return list(_DEFINED)


def sql(template: str) -> Sql:
    """The statement ``template`` (the module doc's spelling and pieces),
    rendered for both engines."""
    return _define(_render(template.format_map(_SQLITE), template.format_map(_POSTGRES)))


def fragment(template: str) -> Sql:
    """A part of a statement (a condition, an ``ORDER BY``), rendered as
    :func:`sql` renders, to be composed with others (``+``, :meth:`Sql.join`);
    plain ``?`` placeholders only."""
    rendered_fragment = _render(
        template.format_map(_SQLITE), template.format_map(_POSTGRES), kind=""
    )
    if rendered_fragment.numbered:
        raise ValueError(f"a fragment takes plain ? placeholders: {template!r}")
    return _define(rendered_fragment, fragment=True)


def per_backend(*, sqlite: str, postgres: str) -> Sql:
    """A statement with a text of its own on each engine (no pieces), taking
    the same parameters."""
    return _define(_render(sqlite, postgres))


def postgres_only(template: str, *, sqlite_answer: str = "NULL") -> Sql:
    """A statement only PostgreSQL has (an advisory lock, a notification,
    its catalog), which has nothing to do on SQLite (one site per file, one
    writer): there it is ``SELECT sqlite_answer`` binding the same
    parameters, one row, as the PostgreSQL ``SELECT`` answers."""
    postgres = template.format_map(_POSTGRES)
    _, order, numbered = _placeholders(postgres)
    if not order:
        sqlite = f"SELECT {sqlite_answer}"
    elif numbered:
        binds = ", ".join(f"?{n + 1}" for n in range(max(order) + 1))
        sqlite = f"SELECT {sqlite_answer} FROM (SELECT {binds})"  # noqa: S608
    else:
        sqlite = f"SELECT {sqlite_answer} FROM (SELECT {', '.join('?' * len(order))})"  # noqa: S608
    return _define(_render(sqlite, postgres))


#: The empty fragment (what :meth:`Sql.join` of nothing is).
EMPTY = Sql("", "")

_RENDERED_LIMIT = 4096
_rendered: dict[str, Sql] = {}


def rendered(text: str) -> Sql:
    """``text`` as an :class:`Sql` (itself if it is one): a tool's or a
    test's statement, placeholders only, rendered once and kept.  A
    transaction's ``BEGIN`` is never plain text: it is the engine's choice
    (:mod:`~tasknet.site.storage.engine.transactions`)."""
    if isinstance(text, Sql):
        return text
    found = _rendered.get(text)
    if found is None:
        found = _render(text, text)
        if found.kind == "begin":
            raise ValueError(
                f"{text!r}: a transaction begins with the engine's BEGIN_READ or BEGIN_WRITE"
                " (tasknet.site.storage.engine.transactions), never plain text"
            )
        if len(_rendered) >= _RENDERED_LIMIT:
            _rendered.clear()  # a bound: tools and tests run few distinct texts
        _rendered[text] = found
    return found


def parameters(statement: Sql, values: SqlParameters | None) -> SqlParameters:
    """The parameters psycopg gets for ``statement`` from the caller's
    ``values`` (in placeholder order; a sequence, empty for none, so that
    psycopg reads every ``%%`` alike)."""
    if statement.order is None:
        return () if values is None else values
    given = list(values or ())
    return [given[i] for i in statement.order]
