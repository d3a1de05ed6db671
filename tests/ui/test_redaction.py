"""Passwords of ``--db`` URLs are redacted in every message (INTERFACES.md,
"Nothing secret in logs"): ``db.describe``/``db.redact``, the one helper,
and what ``tasknet-admin`` and ``tasknet-migrate`` print when the database
cannot be used, driver errors included (libpq repeats a bad URI's pieces)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tasknet.cli import admin, migrate
from tasknet.site.storage.engine.database import describe, redact

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "target, shown",
    [
        ("postgresql://bob:s3cret@db:5432/tasknet", "postgresql://bob:***@db:5432/tasknet"),
        ("postgres://bob:s3cret@db/tasknet", "postgres://bob:***@db/tasknet"),
        (
            "postgresql://bob@db/tasknet?password=s3cret&sslmode=require",
            "postgresql://bob@db/tasknet?password=***&sslmode=require",
        ),
        ("postgresql://bob:s3%40cret@db/tasknet", "postgresql://bob:***@db/tasknet"),
        ("postgresql://bob:s3@cret@db/tasknet", "postgresql://bob:***@db/tasknet"),
        ("postgresql://bob@db/tasknet", "postgresql://bob@db/tasknet"),
        ("/var/lib/tasknet/site.sqlite", "/var/lib/tasknet/site.sqlite"),
    ],
)
def test_describe_hides_the_password_in_both_forms(target: str, shown: str) -> None:
    assert describe(target) == shown


def test_redact_removes_the_targets_password_wherever_a_driver_repeats_it() -> None:
    target = "postgresql://bob:s3cr%et@db/tasknet"
    # psycopg/libpq's own words for that URL: the password alone, as written.
    assert redact('invalid percent-encoded token: "s3cr%et"', target) == (
        'invalid percent-encoded token: "***"'
    )
    target = "postgresql://bob@db/tasknet?password=p%40ss"
    assert "p@ss" not in redact("authentication failed for p@ss", target)
    assert "p%40ss" not in redact(f"bad URI {target!r}", target)
    # With no target, only what looks like a secret goes.
    assert redact("host=db password=pw user=bob") == "host=db password=*** user=bob"


BAD_URLS = [
    ("postgresql://tasknet:pw-userinfo@127.0.0.1:1/tasknet", "pw-userinfo"),
    ("postgresql://tasknet@127.0.0.1:1/tasknet?password=pw-query", "pw-query"),
    ("postgresql://tasknet:pw%zz-token@127.0.0.1:1/tasknet", "pw%zz-token"),
    ("postgresql://tasknet:pw-bad-uri@[::1/tasknet", "pw-bad-uri"),
    ("postgresql://tasknet@127.0.0.1:1/tasknet?password=pw-bad&foo=bar", "pw-bad"),
]


@pytest.mark.parametrize("url, password", BAD_URLS)
def test_tasknet_admin_errors_carry_no_password(
    url: str, password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = admin.main(["--db", url, "user", "list"])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert "tasknet-admin:" in captured.err
    assert password not in captured.out + captured.err
    assert password.split("%")[0] not in captured.out + captured.err


@pytest.mark.parametrize("url, password", BAD_URLS)
def test_tasknet_migrate_errors_carry_no_password(
    url: str, password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = migrate.main(["--db", url])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert "tasknet-migrate:" in captured.err
    assert password not in captured.out + captured.err
    assert password.split("%")[0] not in captured.out + captured.err


def test_the_installed_tools_say_the_same() -> None:
    url, password = BAD_URLS[0]
    for tool in ("tasknet-admin", "tasknet-migrate"):
        argv = [str(BIN / tool), "--db", url] + (
            ["user", "list"] if tool == "tasknet-admin" else []
        )
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, result
        assert "postgresql://tasknet:***@127.0.0.1:1/tasknet" in result.stderr, result.stderr
        assert password not in result.stdout + result.stderr
