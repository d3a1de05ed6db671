"""Seeded SQLite files kept between runs (``--cache``): B4's and B9's million tasks.

A file is named by what made it: the sizes, and a digest of the bench
modules that seeded it and of the site's schema files, so a change to
either seeds afresh.  A run gets a copy (the site changes its database);
the cached file is never opened by a site.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def schema_files() -> list[Path]:
    from tasknet.site.storage.engine import schema

    return sorted(Path(schema.__file__).parent.glob("*.sql"))


def digest(files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for path in [*files, *schema_files()]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def seeded_copy(
    cache: Path | None,
    key: str,
    target: Path,
    seed: Callable[[Path], dict[str, Any]],
    log: Callable[[str], Any] = print,
) -> tuple[dict[str, Any], bool]:
    """``target`` as ``seed(path)`` makes it (a checkpointed SQLite file) and
    what ``seed`` returned (JSON), from ``cache/key.*`` when it is there;
    the second item says whether it was."""
    _remove(target)
    stored = cache / f"{key}.sqlite" if cache is not None else None
    meta_path = cache / f"{key}.json" if cache is not None else None
    if stored is not None and meta_path is not None and stored.exists() and meta_path.exists():
        shutil.copyfile(stored, target)
        return json.loads(meta_path.read_text()), True
    meta = seed(target)
    if stored is not None and meta_path is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        tmp = stored.with_suffix(".tmp")
        shutil.copyfile(target, tmp)
        tmp.replace(stored)
        meta_path.write_text(json.dumps(meta))
        log(f"   cached the seeded database as {stored}")
    return meta, False
