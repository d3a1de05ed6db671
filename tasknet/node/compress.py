"""Build a task's zip archive from its downloaded file (runs in a worker thread).

The archive is written to a ``.tmp`` name and renamed into place only when
whole and synced, so a crash never leaves a truncated archive under the final
name.  The thread checks ``abort`` between blocks, so a cancelled generation
stops compressing promptly.

The archive's SHA-256 is computed from the very bytes written, in the same
pass (DELIVERY.md "Integrity"): zipfile writes through ``HashingWriter``, a
write-only stream that cannot seek, so zipfile writes strictly forward (data
descriptors instead of patching local headers) and every byte of the file
goes through the hash exactly once, in file order.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

BLOCK = 1024 * 1024
# What `zip` uses by default: the bench (BENCH.md B6) compares against it.
COMPRESS_LEVEL = 6


class CompressionAborted(Exception):
    """The generation was cancelled while its archive was being written."""


@dataclass(frozen=True)
class BuiltArchive:
    """The archive written: its size in bytes and the SHA-256 (lowercase hex) of them."""

    size: int
    sha256: str


class HashingWriter:
    """A write-only, non-seekable stream over ``file`` that hashes and counts
    every byte written through it.  ``tell()`` answers the bytes written so
    far (zipfile asks it for offsets); ``seek`` is refused, which is what
    makes zipfile write strictly forward."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("the archive is written forward only")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        # A buffered file writes all of it or raises: what is hashed is
        # exactly what the file receives.
        written = self._file.write(data)
        if written != len(data):
            raise OSError(f"short write to the archive: {written} of {len(data)} bytes")
        self._hash.update(data)
        self.size += written
        return written

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._file.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


#: The earliest time a zip entry can carry.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def zip_date_time(seconds: float) -> tuple[int, int, int, int, int, int]:
    """A zip entry's local date and time for Unix ``seconds`` (1980 at the earliest)."""
    stamp = time.localtime(seconds)[:6]
    return max(stamp, _ZIP_EPOCH)


def build_archive(
    source: Path,
    tmp: Path,
    final: Path,
    member: str,
    abort: threading.Event,
    modified: float | None = None,
) -> BuiltArchive:
    """Zip ``source`` as ``member`` into ``final``; return its size and SHA-256.

    ``modified`` (Unix seconds) dates the member, by default the source's
    mtime; the worker gives its clock's time, so the same run on the same
    clock gives the same bytes (and digest)."""
    try:
        with open(tmp, "wb") as file:
            out = HashingWriter(file)
            zip_out: Any = out  # zipfile wants a file; it only writes, tells and flushes
            with zipfile.ZipFile(
                zip_out, "w", zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL
            ) as zf:
                info = zipfile.ZipInfo.from_file(source, member)
                if modified is not None:
                    info.date_time = zip_date_time(modified)
                info.compress_type = zipfile.ZIP_DEFLATED
                with open(source, "rb") as src, zf.open(info, "w", force_zip64=True) as dst:
                    while block := src.read(BLOCK):
                        if abort.is_set():
                            raise CompressionAborted(str(final))
                        dst.write(block)
            out.flush()
            os.fsync(file.fileno())
        if abort.is_set():
            raise CompressionAborted(str(final))
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return BuiltArchive(out.size, out.hexdigest())
