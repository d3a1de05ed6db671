"""Build a task's zip archive from its downloaded file (runs in a worker thread).

The archive is written to a ``.tmp`` name and renamed into place only when
whole and synced, so a crash never leaves a truncated archive under the final
name.  The thread checks ``abort`` between blocks, so a cancelled generation
stops compressing promptly.
"""

from __future__ import annotations

import os
import threading
import zipfile
from pathlib import Path

BLOCK = 1024 * 1024
# What `zip` uses by default: the bench (BENCH.md B6) compares against it.
COMPRESS_LEVEL = 6


class CompressionAborted(Exception):
    """The generation was cancelled while its archive was being written."""


def build_archive(source: Path, tmp: Path, final: Path, member: str, abort: threading.Event) -> int:
    """Zip ``source`` as ``member`` into ``final``; return the archive size."""
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL) as zf:
            info = zipfile.ZipInfo.from_file(source, member)
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(source, "rb") as src, zf.open(info, "w", force_zip64=True) as dst:
                while block := src.read(BLOCK):
                    if abort.is_set():
                        raise CompressionAborted(str(final))
                    dst.write(block)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        if abort.is_set():
            raise CompressionAborted(str(final))
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final.stat().st_size
