"""The node's secret off the command line (``--secret-file``,
``TASKNET_NODE_SECRET``) and its start-up failure (a real twistd process
exits non-zero, INTERFACES.md "Bounds, failures and secrets")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python import usage

from tasknet.node.service import SECRET_ENV, NodeService, Options, makeService

TWISTD = str(Path(sys.executable).with_name("twistd"))
REPO = str(Path(__file__).resolve().parents[2])


def parse(*argv: str) -> Options:
    options = Options()
    options.parseOptions(list(argv))
    return options


def test_secret_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret"
    secret.write_text("\n  from-the-file \n\n")
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert parse("--secret-file", str(secret))["secret"] == "from-the-file"
    service = makeService(parse("--secret-file", str(secret), "--data", str(tmp_path / "d")))
    assert isinstance(service, NodeService) and service.secret == "from-the-file"
    monkeypatch.setenv(SECRET_ENV, "from-the-environment")
    assert parse()["secret"] == "from-the-environment"
    # An explicit option wins over the environment.
    assert parse("--secret", "given")["secret"] == "given"
    assert parse("--secret-file", str(secret))["secret"] == "from-the-file"


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("", "the file is empty"),
        ("  \n\n", "the file is empty"),
        ("one\ntwo\n", "expected the secret alone on one line, found 2 lines"),
        (b"\xff\xfe", "cannot read it"),
    ],
)
def test_bad_secret_files_are_refused_clearly(
    tmp_path: Path, content: str | bytes, complaint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "not used when a file is named")
    secret = tmp_path / "secret"
    if isinstance(content, bytes):
        secret.write_bytes(content)
    else:
        secret.write_text(content)
    with pytest.raises(usage.UsageError, match=complaint):
        parse("--secret-file", str(secret))


def test_secret_sources_conflict_or_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    secret = tmp_path / "secret"
    secret.write_text("x\n")
    with pytest.raises(usage.UsageError, match="not both"):
        parse("--secret", "x", "--secret-file", str(secret))
    with pytest.raises(usage.UsageError, match="cannot read it"):
        parse("--secret-file", str(tmp_path / "absent"))
    with pytest.raises(usage.UsageError, match=f"--secret is required .*{SECRET_ENV}"):
        parse()
    monkeypatch.setenv(SECRET_ENV, "")
    with pytest.raises(usage.UsageError, match="--secret is required"):
        parse()


@pytest_twisted.ensureDeferred
async def test_node_whose_database_is_refused_exits_non_zero(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "node.sqlite").write_bytes(b"this is not a database" * 100)
    log = tmp_path / "node.log"
    argv = [
        "-n",
        "--pidfile=",
        f"--logfile={log}",
        "tasknet-node",
        "--data",
        str(data),
        "--connect",
        "tcp:127.0.0.1:9",
    ]
    env = {**os.environ, "PYTHONPATH": REPO, SECRET_ENV: "s3cret"}
    # A node that started instead would run forever: bounded.
    _, err, code = await getProcessOutputAndValue(
        TWISTD, argv, env=env, path=REPO, reactor=reactor
    ).addTimeout(60, reactor)
    text = err.decode() + log.read_text()
    assert code == 1, text
    assert "tasknet-node could not start" in text and "not a database" in text
    assert "Server Shut Down" in text  # twistd's own shutdown ran first
