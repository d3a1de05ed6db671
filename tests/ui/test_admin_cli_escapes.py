"""Issue 38, Build 3 (second finding): ``tasknet-admin`` listings escape
control characters (either backend, a real ``tasknet-admin`` process).

Before: ``tasknet-admin unknown`` printed a task's name raw, so a name (the
upstream's title) holding a newline, ``ESC[2J``, an OSC title and colour
codes cleared the operator's terminal and forged a log-looking line.  Now
they are shown as ``\\xNN`` (``\\uNNNN`` beyond Latin-1), in the text and the
``--json`` listing alike (which stays the same document to a JSON reader)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from tasknet.cli.args import printable, printable_json
from tasknet.process import free_port
from tasknet.site.storage import create, usage, users
from tasknet.site.storage.engine import database as db
from tasknet.site.storage.engine.schema import prepare_database

GID = 3801
HOSTILE = (
    "Innocent\n2026-12-07T00:00:00+0000 [tasknet.site#info] all fine"
    "\x1b[2J\x1b]0;owned\x07\x1b[31mred\x1b[0m\x9b2J\x7f\u202egnp.exe\u2028\tend"
)
#: Nothing a terminal acts on: C0 but the line ends, DEL, C1, separators, bidi.
TERMINAL_CONTROLS = set(range(0x00, 0x20)) - {0x0A} | set(range(0x7F, 0xA0))
TERMINAL_CONTROLS |= {0x2028, 0x2029, 0x202E}


@pytest.fixture
def dbpath(db_target: str) -> str:
    assert prepare_database(db_target) is True
    return db_target


def _unknown_named(dbpath: str, name: str) -> None:
    with closing(db.connect(dbpath)) as connection:
        user = db.run_write(connection, users.create_user, "alice")[0]
        week = usage.iso_week()
        op = db.run_write(connection, create.reserve, GID, user.id, "", "tok", week)
        assert db.run_write(connection, create.begin_submit, GID, op, 3, name, week)
        assert db.run_write(connection, create.mark_unknown, GID, op, "submit", "timed out")


def _admin(dbpath: str, *argv: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("tasknet-admin")
    closed = f"http://127.0.0.1:{free_port()}"  # the listing needs no audit to show a name
    return subprocess.run(
        [str(script), "--db", dbpath, "--upstream", closed, "--audit-timeout", "1", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _controls(text: str) -> set[str]:
    return {hex(ord(c)) for c in text if ord(c) in TERMINAL_CONTROLS}


def test_unknown_lists_a_hostile_name_escaped(dbpath: str) -> None:
    _unknown_named(dbpath, HOSTILE)
    result = _admin(dbpath, "unknown")
    assert result.returncode == 0, result.stderr
    assert _controls(result.stdout) == set(), result.stdout
    (first, *rest) = result.stdout.splitlines()
    # One line for the name: the forged line stays on it, escaped.
    assert first.startswith(f"gid {GID}  Innocent\\x0a2026-12-07T00:00:00+0000 [tasknet.site#info]")
    assert "\\x1b[2J\\x1b]0;owned\\x07\\x1b[31mred\\x1b[0m\\x9b2J\\x7f\\u202egnp.exe" in first
    assert first.endswith("\\u2028\\x09end  cost 3")
    assert all(line.startswith("    ") for line in rest)

    listed = _admin(dbpath, "unknown", "--json")
    assert listed.returncode == 0, listed.stderr
    assert _controls(listed.stdout) == set(), listed.stdout
    (task,) = json.loads(listed.stdout)["tasks"]
    assert task["name"] == HOSTILE  # the same document to a JSON reader


def test_printable_escapes_every_control_and_keeps_the_rest() -> None:
    assert printable("ok ünïcode 中文 \\x1b") == "ok ünïcode 中文 \\x1b"
    assert printable("\x00\x1f\x7f\x80\x9f") == "\\x00\\x1f\\x7f\\x80\\x9f"
    assert printable("\u2066\u2069\u061c\u200f") == "\\u2066\\u2069\\u061c\\u200f"
    assert printable(7) == "7"
    document = json.dumps({"n": HOSTILE}, ensure_ascii=False)
    assert json.loads(printable_json(document)) == {"n": HOSTILE}
    assert _controls(printable_json(document)) == set()
