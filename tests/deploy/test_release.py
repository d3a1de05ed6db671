"""A release stands alone: ``python -m build`` makes an sdist and a wheel; the
wheel, installed into a fresh virtualenv outside the checkout (its
dependencies from the package index), runs the mock upstream, a site and a
node with that virtualenv's ``twistd``, from a directory outside the
checkout, and they download a task created over the HTTP API; its console
tools run; every program answers ``--version`` with the package's version.

One build and one virtualenv for the module (about 40 s, most of it pip);
real processes: marked ``slow``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest

import tasknet
from tasknet.cli.jsonhttp import request
from tasknet.process import LOOPBACK, Child, free_port

# Building the sdist and the wheel and installing it into a fresh virtualenv
# takes about two minutes on a quiet machine: more than the suite's 180 s per
# test on a busy one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
VERSION = tasknet.__version__
#: What never goes into the copy the release is built from (.gitignore's).
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "*.egg-info",
    "build",
    "dist",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "dropin.cache",
    "*.sqlite",
    "*.sqlite-*",
)
PLUGINS = ("tasknet-site", "tasknet-node", "tasknet-upstream")
TOOLS = ("tasknet-admin", "tasknet-migrate", "tasknet-drill", "tasknet-demo", "tasknet-get")
READY_TIMEOUT = 60.0
SECRET = "release-s3cret"
GID = 31337


@dataclass
class Release:
    wheel: Path
    sdist: Path
    venv: Path
    workdir: Path  # outside the checkout: where the processes run

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    @property
    def env(self) -> dict[str, str]:
        """The environment of the release's programs: nothing of the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        return env

    def run(self, *argv: str, expect: int = 0) -> str:
        done = subprocess.run(
            [self.bin(argv[0]), *argv[1:]],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        output = done.stdout + done.stderr
        assert done.returncode == expect, f"{' '.join(argv)}: exit {done.returncode}\n{output}"
        return output


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    base = tmp_path_factory.mktemp("release")
    assert not base.is_relative_to(REPO)
    source = base / "source"
    shutil.copytree(REPO, source, ignore=IGNORED)
    dist = base / "dist"
    # sdist first, then the wheel built from the unpacked sdist: a file the
    # sdist forgot is missing from the wheel too.
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = dist.glob("tasknet-*.whl")
    [sdist] = dist.glob("tasknet-*.tar.gz")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=base,
    )
    workdir = base / "run"
    workdir.mkdir()
    return Release(wheel, sdist, venv, workdir)


def test_the_wheel_holds_the_package_data_and_the_plugin(release: Release) -> None:
    names = set(zipfile.ZipFile(release.wheel).namelist())
    static = REPO / "tasknet" / "site" / "web" / "static"
    storage = REPO / "tasknet" / "site" / "storage" / "engine"
    expected = {
        "twisted/plugins/tasknet_plugins.py",
        "tasknet/py.typed",
        *(f"tasknet/site/web/static/{p.name}" for p in static.iterdir() if p.is_file()),
        *(f"tasknet/site/storage/engine/{p.name}" for p in storage.glob("*.sql")),
    }
    assert len(expected) > 10
    assert expected <= names, expected - names
    # Twisted's own packages stay Twisted's: no __init__ of ours there.
    assert not names & {"twisted/__init__.py", "twisted/plugins/__init__.py"}
    assert not [n for n in names if n.startswith("tests/")]
    assert f"tasknet-{VERSION}.dist-info/METADATA" in names


def test_the_wheel_metadata_names_its_dependencies_with_lower_bounds(release: Release) -> None:
    with zipfile.ZipFile(release.wheel) as wheel:
        metadata = Parser().parsestr(wheel.read(f"tasknet-{VERSION}.dist-info/METADATA").decode())
        entry_points = wheel.read(f"tasknet-{VERSION}.dist-info/entry_points.txt").decode()
    assert metadata["Version"] == VERSION
    assert metadata["Requires-Python"] == ">=3.11"
    runtime = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    names = {r.split("[")[0].split("<")[0].split(">")[0].strip().lower() for r in runtime}
    needed = {"twisted", "treq", "klein", "autobahn", "prometheus-client", "orjson", "psycopg"}
    needed |= {"rich"}  # tasknet-get's progress bars
    assert needed | {"werkzeug", "hyperlink", "zope.interface"} <= names, runtime
    for requirement in runtime:
        assert ">=" in requirement, f"no lower bound: {requirement}"
    for tool in TOOLS:
        assert f"{tool} = tasknet.cli." in entry_points


def test_the_sdist_holds_the_sources_docs_and_deploy_files(release: Release) -> None:
    with tarfile.open(release.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for path in (
        "setup.cfg",
        "README.md",
        "twisted/plugins/tasknet_plugins.py",
        "tasknet/site/storage/engine/schema_postgres.sql",
        "tasknet/site/web/static/index.html",
        "docs/operations.md",
        "deploy/prometheus/tasknet-rules.yml",
        "deploy/systemd/tasknet-site.service",
        "deploy/systemd/tasknet-node@.service",
    ):
        assert path in names, path


def test_the_release_imports_from_its_own_virtualenv(release: Release) -> None:
    where = release.run(
        "python",
        "-c",
        "import tasknet, twisted.plugins.tasknet_plugins as p;"
        "print(tasknet.__file__); print(p.__file__)",
    )
    for line in where.split():
        assert Path(line).is_relative_to(release.venv), where


def test_every_program_prints_the_package_version(release: Release) -> None:
    for tool in TOOLS:
        assert release.run(tool, "--version").strip() == f"{tool} {VERSION}"
    for plugin in PLUGINS:
        assert release.run("twistd", plugin, "--version").strip() == f"{plugin} {VERSION}"


class Roles:
    """The mock upstream, a site and a v2 node, from the release's twistd."""

    def __init__(self, release: Release) -> None:
        self.release = release
        self.upstream_port = free_port()
        self.http_port = free_port()
        self.nodes_port = free_port()
        self.children: list[Child] = []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def start(self, name: str, ready: str, *args: str) -> Child:
        argv = [self.release.bin("twistd"), "-n", f"--pidfile={name}.pid", *args]
        log = self.release.workdir / f"{name}.log"
        child = Child(name, argv, log, cwd=self.release.workdir, env=self.release.env)
        self.children.append(child)
        child.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while ready not in child.log_text():
            assert child.alive, f"{name} exited {child.returncode}:\n{child.log_tail()}"
            assert time.monotonic() < deadline, f"{name} not ready:\n{child.log_tail()}"
            time.sleep(0.05)
        return child

    def stop(self) -> dict[str, int | None]:
        return {child.name: child.stop(30.0) for child in reversed(self.children)}


@pytest.fixture
def roles(release: Release) -> Iterator[Roles]:
    running = Roles(release)
    try:
        yield running
    finally:
        running.stop()


def test_the_installed_roles_download_a_task_and_the_tools_run(
    release: Release, roles: Roles
) -> None:
    upstream = f"http://{LOOPBACK}:{roles.upstream_port}"
    roles.start(
        "upstream",
        "tasknet-upstream listening on",
        "tasknet-upstream",
        "--http",
        f"tcp:{roles.upstream_port}:interface={LOOPBACK}",
    )
    roles.start(
        "site",
        "HTTP on ",
        "tasknet-site",
        "--db",
        "site.sqlite",
        "--http",
        f"tcp:{roles.http_port}:interface={LOOPBACK}",
        "--nodes",
        f"tcp:{roles.nodes_port}:interface={LOOPBACK}",
        "--upstream",
        upstream,
        "--demo",
        "--node-key",
        f"node-1:{SECRET}",
    )
    roles.start(
        "node-1",
        "logged in to the site",
        "tasknet-node",
        "--connect",
        f"tcp:{LOOPBACK}:{roles.nodes_port}",
        "--node-id",
        "node-1",
        "--secret",
        SECRET,
        "--data",
        "node-1-data",
    )
    # The web UI's files come from the installed package.
    page = request("GET", roles.url + "/", timeout=5)
    assert page.status == 200
    created = request("POST", roles.url + "/api/tasks", {"gid": GID, "token": "t"}, token="demo")
    assert created.status == 201, created.body
    deadline = time.monotonic() + 30
    while True:
        task = request("GET", f"{roles.url}/api/tasks/{GID}", token="demo").body["task"]
        if task["status"] == "COMPLETED":
            break
        assert time.monotonic() < deadline, task
        time.sleep(0.1)
    assert task["node"] == "node-1"
    assert (release.workdir / "node-1-data").is_dir()
    # The admin tool beside the running site; then, the site stopped, migrate.
    users = release.run("tasknet-admin", "--db", "site.sqlite", "user", "list")
    assert "demo" in users
    assert release.run("tasknet-admin", "--db", "site.sqlite", "unknown").strip()
    # A clean stop on SIGTERM: twistd ends by the signal that stopped it.
    exits = roles.stop()
    assert exits == dict.fromkeys(("node-1", "site", "upstream"), -signal.SIGTERM), exits
    release.run("tasknet-migrate", "--db", "site.sqlite")
    assert "--quick" in release.run("tasknet-drill", "--help")
