"""The systemd units of ``deploy/systemd/``.

* ``systemd-analyze verify`` accepts them, without a warning (skipped, with
  the reason, where systemd-analyze is missing).  verify also checks that
  each ``ExecStart=`` program exists, so the copies it reads run the
  checkout's twistd instead of ``/opt/tasknet/bin/twistd``;
* each has the restart policy, the sandbox and the foreground twistd
  command the docs promise, and takes its secret through
  ``LoadCredential=``;
* (slow) their ``ExecStart=`` command lines, expanded as systemd would (the
  ``Environment=`` defaults, the ports overridden as ``EnvironmentFile=``
  would, ``%i %S %d``, the credentials copied into a directory), start the
  mock upstream, a site and a node that logs in to it; SIGTERM stops each.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasknet.process import LOOPBACK, Child, free_port

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
NAMES = ("tasknet-site.service", "tasknet-node@.service", "tasknet-upstream.service")
INSTALLED_TWISTD = "/opt/tasknet/bin/twistd"
TWISTD = str(Path(sys.executable).with_name("twistd"))
READY_TIMEOUT = 60.0


def service_settings(name: str) -> list[tuple[str, str]]:
    """The ``[Service]`` section's ``(key, value)`` pairs, in order
    (continuation lines joined, comments dropped)."""
    settings: list[tuple[str, str]] = []
    section = None
    pending = ""
    for raw in (UNITS / name).read_text(encoding="utf-8").splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            settings.append((key.strip(), value.strip()))
    return settings


def setting(name: str, key: str) -> list[str]:
    return [value for k, value in service_settings(name) if k == key]


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing (Debian's systemd package)")
    for name in NAMES:
        text = (UNITS / name).read_text(encoding="utf-8")
        assert INSTALLED_TWISTD in text
        (tmp_path / name).write_text(text.replace(INSTALLED_TWISTD, TWISTD), encoding="utf-8")
    done = subprocess.run(
        [
            analyze,
            "verify",
            "--man=no",
            "tasknet-site.service",
            "tasknet-node@node-1.service",
            "tasknet-upstream.service",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and not output, output


@pytest.mark.parametrize("name", NAMES)
def test_unit_restarts_sandboxes_and_runs_twistd_in_the_foreground(name: str) -> None:
    [start] = setting(name, "ExecStart")
    assert start.startswith(f"{INSTALLED_TWISTD} -n --pidfile= ")
    assert f" {name.split('.')[0].rstrip('@')} " in f" {start} "
    for key, value in {
        "Type": "exec",
        "Restart": "on-failure",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "UMask": "0077",
        "CapabilityBoundingSet": "",
    }.items():
        assert setting(name, key) == [value], (name, key)
    assert setting(name, "WorkingDirectory"), name
    # Its own user: the site's static one (the admin tools run as it), or a
    # dynamic one.
    user = setting(name, "User") if name == "tasknet-site.service" else setting(name, "DynamicUser")
    assert user == (["tasknet"] if name == "tasknet-site.service" else ["yes"]), name


def test_secrets_come_as_credentials_never_on_the_command_line() -> None:
    [site] = setting("tasknet-site.service", "ExecStart")
    assert setting("tasknet-site.service", "LoadCredential") == ["node-keys:/etc/tasknet/node-keys"]
    assert "--node-key-file %d/node-keys" in site and "--node-key " not in site
    [node] = setting("tasknet-node@.service", "ExecStart")
    assert setting("tasknet-node@.service", "LoadCredential") == ["secret:/etc/tasknet/%i.secret"]
    assert "--secret-file %d/secret" in node and "--secret " not in node
    assert setting("tasknet-site.service", "StateDirectory") == ["tasknet"]
    assert setting("tasknet-node@.service", "StateDirectory") == ["tasknet-node/%i"]


def test_the_unit_shown_in_the_docs_is_the_units_own() -> None:
    """Each line of docs/operations.md's ``ini`` excerpt ("Running under
    systemd") is a line of tasknet-site.service, in the same order."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("\n## Running under systemd\n", 1)[1].split("\n## ", 1)[0]
    [excerpt] = re.findall(r"```ini\n(.*?)```", section, re.S)
    unit = (UNITS / "tasknet-site.service").read_text(encoding="utf-8").splitlines()
    position = 0
    for line in excerpt.splitlines():
        if line.strip():
            assert line in unit[position:], f"not in tasknet-site.service (in order): {line!r}"
            position = unit.index(line, position) + 1


class Expanded:
    """What systemd would run for one unit (instance ``node-1`` of a
    template), with ``state`` as ``%S`` and the credentials in
    ``state/credentials/UNIT`` as ``%d``."""

    def __init__(self, name: str, state: Path, overrides: dict[str, str]) -> None:
        self.name = name
        unit = name.replace("@.", "@node-1.")
        self.specifiers = {
            "%i": "node-1",
            "%S": str(state),
            "%d": str(state / "credentials" / unit),
        }
        self.env: dict[str, str] = {}
        for value in setting(name, "Environment"):
            for assignment in shlex.split(value):
                key, _, val = assignment.partition("=")
                self.env[key] = self._specified(val)
        self.env.update(overrides)  # what an EnvironmentFile= would set
        for directory in setting(name, "StateDirectory"):
            (state / self._specified(directory)).mkdir(parents=True, exist_ok=True)
        self.cwd = Path(self._specified(setting(name, "WorkingDirectory")[0]))

    def _specified(self, text: str) -> str:
        for specifier, value in self.specifiers.items():
            text = text.replace(specifier, value)
        return text

    def credentials(self, contents: dict[str, str]) -> None:
        directory = Path(self.specifiers["%d"])
        directory.mkdir(parents=True, exist_ok=True)
        for spec in setting(self.name, "LoadCredential"):
            credential, _, _ = spec.partition(":")
            path = directory / credential
            path.write_text(contents[credential], encoding="utf-8")
            path.chmod(0o400)

    def argv(self) -> list[str]:
        [start] = setting(self.name, "ExecStart")
        words: list[str] = []
        for word in shlex.split(self._specified(start)):
            whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
            if whole:  # $VAR alone: split into words (none when empty)
                words.extend(self.env.get(whole.group(1), "").split())
                continue
            words.append(
                re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: self.env[m.group(1)], word)
            )
        assert words[0] == INSTALLED_TWISTD
        return [TWISTD, *words[1:]]


def _start(unit: Expanded, ready: str, log: Path) -> Child:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(unit.env)
    child = Child(unit.name, unit.argv(), log, cwd=unit.cwd, env=env)
    child.start()
    deadline = time.monotonic() + READY_TIMEOUT
    while ready not in child.log_text():
        assert child.alive, f"{unit.name} exited {child.returncode}:\n{child.log_tail()}"
        assert time.monotonic() < deadline, f"{unit.name} not ready:\n{child.log_tail()}"
        time.sleep(0.05)
    return child


@pytest.mark.slow
def test_the_units_command_lines_start_the_three_roles(tmp_path: Path) -> None:
    state = tmp_path / "var-lib"
    upstream_port, http_port, nodes_port = free_port(), free_port(), free_port()
    upstream = Expanded(
        "tasknet-upstream.service",
        state,
        {"TASKNET_UPSTREAM_OPTIONS": f"--http tcp:{upstream_port}:interface={LOOPBACK}"},
    )
    upstream.cwd = tmp_path  # WorkingDirectory=/ (nothing written)
    site = Expanded(
        "tasknet-site.service",
        state,
        {
            "TASKNET_HTTP": f"tcp:{http_port}:interface={LOOPBACK}",
            "TASKNET_NODES": f"tcp:{nodes_port}:interface={LOOPBACK}",
            "TASKNET_UPSTREAM": f"http://{LOOPBACK}:{upstream_port}",
        },
    )
    site.credentials({"node-keys": "# the node keys\nnode-1:unit-s3cret\n"})
    node = Expanded(
        "tasknet-node@.service",
        state,
        {"TASKNET_NODE_OPTIONS": f"--connect tcp:{LOOPBACK}:{nodes_port}"},
    )
    node.credentials({"secret": "unit-s3cret\n"})
    children: list[Child] = []
    try:
        children.append(_start(upstream, "listening on", tmp_path / "upstream.log"))
        children.append(_start(site, "HTTP on", tmp_path / "site.log"))
        children.append(_start(node, "logged in to the site", tmp_path / "node.log"))
        assert (state / "tasknet" / "site.sqlite").exists()
        assert (state / "tasknet-node" / "node-1").is_dir()
        assert '"level"' in children[1].log_text()  # TASKNET_LOG_JSON=1: JSON lines
    finally:
        exits = [child.stop(30.0) for child in reversed(children)]
    # A clean stop: each ends by the SIGTERM that stopped it (twistd re-raises
    # it), which systemd counts as a clean exit.
    assert exits == [-signal.SIGTERM] * 3, exits
