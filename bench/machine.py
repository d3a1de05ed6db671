"""What the machine under a benchmark is: the file system under a path (an
fsync's cost depends on it) and the CPU's model, for the results file."""

from __future__ import annotations

import platform
from pathlib import Path


def filesystem_of(path: Path) -> str:
    """The mount type holding ``path`` (fsync cost depends on it)."""
    best, fstype = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return fstype
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, fstype = parts[1], parts[2]
    return fstype


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
