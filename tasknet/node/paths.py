"""Where a node keeps its files under ``--data``.

File names carry the gid and a digest of the operationId, so files of an old
generation can never be mistaken for (or appended to) the new generation's,
and every file of a gid can be found by its ``{gid}-`` prefix even after the
task row is gone (a legacy node drops finished tasks but keeps their archive).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

DATABASE_NAME = "node.sqlite"


class NamesAnArchive(Protocol):
    """What ``DataDir.archive_file`` needs of a row (``store.ArchiveRow``)."""

    @property
    def file(self) -> str: ...


def _digest(operation_id: str) -> str:
    return hashlib.sha256(operation_id.encode("utf-8")).hexdigest()[:12]


class DataDir:
    """The ``--data`` directory: database, ``archives/``, ``partial/`` and
    ``corrupt/`` (archives set aside: never served, kept for an operator)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.archives = self.root / "archives"
        self.partial = self.root / "partial"
        self.corrupt = self.root / "corrupt"
        self.database = self.root / DATABASE_NAME

    def create(self) -> None:
        for directory in (self.root, self.archives, self.partial, self.corrupt):
            directory.mkdir(parents=True, exist_ok=True)

    def part_path(self, gid: int, operation_id: str) -> Path:
        return self.partial / f"{gid}-{_digest(operation_id)}.part"

    def archive_path(self, gid: int, operation_id: str) -> Path:
        return self.archives / f"{gid}-{_digest(operation_id)}.zip"

    def archive_tmp_path(self, gid: int, operation_id: str) -> Path:
        return self.archives / f"{gid}-{_digest(operation_id)}.zip.tmp"

    def archive_file(self, row: NamesAnArchive) -> Path:
        """The file of a held archive (its ``file`` is a bare name under
        ``archives/``, written by this node; anything else is refused)."""
        name = row.file
        if not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"not an archive file name: {name!r:.80}")
        return self.archives / name

    def files_of(self, gid: int) -> list[Path]:
        """Every file this node holds for ``gid``, whatever its generation."""
        found: list[Path] = []
        for directory in (self.archives, self.partial):
            found.extend(sorted(directory.glob(f"{gid}-*")))
        return found
