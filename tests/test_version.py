"""``--version`` of every program prints ``PROGRAM VERSION`` and exits 0:
the three twistd plugins' options (replacing usage.Options' own, which
prints Twisted's version) and the four console tools.  The installed
release runs them too (tests/deploy/test_release.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import tasknet
from tasknet.cli import admin, demo, drill, migrate
from tasknet.node.service import Options as NodeOptions
from tasknet.site.service import Options as SiteOptions
from tasknet.upstream.service import Options as UpstreamOptions


@pytest.mark.parametrize(
    ("program", "options"),
    [
        ("tasknet-site", SiteOptions),
        ("tasknet-node", NodeOptions),
        ("tasknet-upstream", UpstreamOptions),
    ],
)
def test_plugin_options_print_the_package_version(
    program: str, options: type, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        options().parseOptions(["--version"])
    assert exited.value.code in (0, None)
    assert capsys.readouterr().out == f"{program} {tasknet.__version__}\n"
    assert "--version" in str(options())  # in --help, with its text
    assert "tasknet's" in str(options())


@pytest.mark.parametrize(
    ("program", "main"),
    [
        ("tasknet-admin", admin.main),
        ("tasknet-migrate", migrate.main),
        ("tasknet-drill", drill.main),
        ("tasknet-demo", demo.main),
    ],
)
def test_console_tools_print_the_package_version(
    program: str, main: Callable[[Any], int], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{program} {tasknet.__version__}\n"
