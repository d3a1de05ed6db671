"""The node's files are private (issue 38): under twistd the node runs with
umask 077 (``tasknet.startup.keep_files_private``), so what it creates is
0600 and its directories 0700.  Files an older release created keep the
mode they had (0644, 0755): :func:`tighten` takes them in once at start.

Only the node's own layout is touched (``tasknet.node.paths.DataDir``: the
data directory, its database and WAL files, ``archives/``, ``partial/`` and
``corrupt/`` and the files directly in them); symbolic links are left as
they are (their targets are not the node's to change).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from twisted.logger import Logger

from tasknet.node.paths import DataDir

__all__ = ["PRIVATE_DIRECTORY", "PRIVATE_FILE", "tighten"]

log = Logger()

PRIVATE_FILE = 0o600
PRIVATE_DIRECTORY = 0o700


def _tighten_one(path: Path) -> bool:
    """Make ``path`` unreadable to others, if it is a file or directory that
    is: True when its mode changed."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        wanted = PRIVATE_DIRECTORY
    elif stat.S_ISREG(mode):
        wanted = PRIVATE_FILE
    else:
        return False  # a link, a socket: not ours to change
    if stat.S_IMODE(mode) & 0o077 == 0:
        return False
    os.chmod(path, stat.S_IMODE(mode) & ~0o077 | (wanted & 0o700))
    return True


def tighten(data: str | os.PathLike[str]) -> int:
    """Take away others' access to what the node keeps under ``data``; the
    number of paths changed (logged once when not 0).  Nothing there yet
    is no error."""
    layout = DataDir(data)
    changed = 0
    database = layout.database
    for path in (
        layout.root,
        database,
        database.with_name(database.name + "-wal"),
        database.with_name(database.name + "-shm"),
    ):
        changed += _tighten_one(path)
    for directory in (layout.archives, layout.partial, layout.corrupt):
        changed += _tighten_one(directory)
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            changed += _tighten_one(Path(entry.path))
    if changed:
        log.warn(
            "{count} files and directories under {data} were open to other users"
            " (an older release's modes); now 0600 and 0700",
            count=changed,
            data=str(layout.root),
        )
    return changed
