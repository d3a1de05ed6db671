"""Issue 38, Build 2: twistd's log file keeps a bounded number of rotated
files (``--log-max-size``, ``--log-keep``, every role; tasknet/logging.py).

Before: the file rotated at twistd's 1 MB and every rotated file was kept
(a flood left 99 of them).  Now it rotates at ``--log-max-size`` and keeps
``--log-keep`` of them, so the log takes at most (keep + 1) × max-size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.logger import Logger, LogPublisher
from twisted.python.usage import UsageError

from tasknet import logging as tlog


@pytest.fixture
def chosen(monkeypatch: pytest.MonkeyPatch) -> tlog._Chosen:
    """A fresh record of the roles' log options (the module keeps one per process)."""
    fresh = tlog._Chosen()
    monkeypatch.setattr(tlog, "_chosen", fresh)
    for name in (tlog.FORMAT_ENV, tlog.JSON_ENV, tlog.LEVEL_ENV):
        monkeypatch.delenv(name, raising=False)
    return fresh


def _twistd_options(argv: list[str]) -> Any:
    from twisted.scripts.twistd import ServerOptions

    config = ServerOptions()
    config.parseOptions(argv)
    return config


def test_the_log_file_keeps_at_most_keep_rotated_files(
    chosen: tlog._Chosen, tmp_path: Path
) -> None:
    path = tmp_path / "site.log"
    _twistd_options(
        ["--logfile", str(path), "tasknet-upstream", "--log-max-size", "10kB", "--log-keep", "2"]
    )
    assert (chosen.path, chosen.max_size, chosen.keep) == (str(path), 10_000, 2)
    log_file: Any = tlog._destination()
    try:
        log = Logger(namespace="tasknet.test", observer=LogPublisher(tlog.observer(log_file)))  # type: ignore[arg-type]
        for n in range(2000):  # about 200 kB of lines: twenty rotations' worth
            log.info("line {n} {padding}", n=n, padding="x" * 40)
    finally:
        log_file.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["site.log", "site.log.1", "site.log.2"]
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 3 * (10_000 + 200)
    # The newest lines are in the file, the oldest gone with the removed files.
    assert (
        "line 1999 " in path.read_text() and "line 0 " not in (tmp_path / "site.log.2").read_text()
    )


def test_the_defaults_bound_the_log_to_a_hundred_megabytes(chosen: tlog._Chosen) -> None:
    _twistd_options(["--logfile", "x.log", "tasknet-upstream"])
    assert (chosen.max_size, chosen.keep) == (10_000_000, 9)
    _twistd_options(["-n", "tasknet-node", "--node-id", "n1", "--secret", "s", "--log-keep", "3"])
    assert chosen.keep == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--log-max-size", "5"], "--log-max-size must be at least 10000 bytes"),
        (["--log-max-size", "lots"], "--log-max-size: a size must be a number"),
        (["--log-keep", "0"], "--log-keep must be a whole number 1..1000"),
        (["--log-keep", "many"], "--log-keep must be a whole number 1..1000"),
    ],
)
def test_bad_rotation_options_are_refused(
    chosen: tlog._Chosen, argv: list[str], message: str
) -> None:
    with pytest.raises(UsageError) as refused:
        _twistd_options(["-n", "tasknet-upstream", *argv])
    assert message in str(refused.value)
