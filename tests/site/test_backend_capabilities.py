"""The backend stays in storage (issue 37, item 4): the site above
``tasknet/site/storage/`` asks the engine what its database can do
(``db.capabilities``), never which product it is, so a new backend changes
nothing above the engine (docs/architecture.md, "A backend").  This reads
the site's source: a comparison with a backend's name outside storage fails
here."""

from __future__ import annotations

import ast
from pathlib import Path

import tasknet.site as site_package
from tasknet.site.storage.engine.database import open_pool
from tasknet.site.storage.engine.schema import prepare_database
from tests.runtime import site_runtime

#: The names a backend goes by (``engine/targets.py``'s values and constants).
_BACKEND_NAMES = {"sqlite", "postgresql", "SQLITE", "POSTGRESQL"}


def _names_a_backend(node: ast.expr) -> bool:
    """``x.backend``, a variable ``backend``, or a backend's name (a literal
    or its constant)."""
    if isinstance(node, ast.Attribute):
        return node.attr in {"backend"} | _BACKEND_NAMES
    if isinstance(node, ast.Name):
        return node.id in {"backend"} | _BACKEND_NAMES
    return isinstance(node, ast.Constant) and node.value in _BACKEND_NAMES


def backend_decisions(source: str) -> list[int]:
    """The lines of ``source`` that compare (or ``match``) a backend's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            _names_a_backend(operand) for operand in (node.left, *node.comparators)
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _names_a_backend(node.subject):
            lines.append(node.lineno)
    return lines


def test_nothing_above_storage_decides_on_the_backend_name() -> None:
    root = Path(site_package.__file__).parent
    storage = root / "storage"
    offenders = [
        f"{path.relative_to(root).as_posix()}:{line}"
        for path in sorted(root.rglob("*.py"))
        if not path.is_relative_to(storage)
        for line in backend_decisions(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"ask db.capabilities instead: {offenders}"


def test_the_check_finds_the_spellings_it_replaced() -> None:
    # The three decisions issue 37 removed, and the other ways to write one.
    assert backend_decisions('shared = db.backend == "postgresql"') == [1]
    assert backend_decisions('ok = "postgresql" != self._db.backend and x') == [1]
    assert backend_decisions("if backend in (SQLITE, POSTGRESQL):\n    pass") == [1]
    assert backend_decisions("if engine.POSTGRESQL == kind:\n    pass") == [1]
    assert backend_decisions("match db.backend:\n    case _:\n        pass") == [1]
    # Naming it is no decision: the health answer reports it, the API lists it.
    assert backend_decisions("health = Health(backend=db.backend)") == []
    assert backend_decisions('schema = {"backend": ["sqlite", "postgresql"]}') == []
    assert backend_decisions("shared = db.capabilities.shared_by_sites") == []


def test_only_a_database_sites_can_share_says_so(db_target: str) -> None:
    prepare_database(db_target)
    db = open_pool(db_target, **site_runtime())
    try:
        # PostgreSQL's sites share it; a SQLite file has one (its flock).
        assert db.capabilities.shared_by_sites is (db.backend != "sqlite")
    finally:
        db.close()
