"""Starting the real tasknet roles as ``twistd -n`` processes on loopback."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import BenchError, Proc, twistd
from tasknet.cli import jsonhttp
from tasknet.process import free_port

LOOPBACK_URL = "http://127.0.0.1"
# What twistd logs when another process took the port we picked.
PORT_TAKEN = "Address already in use"


def http_json(method: str, url: str, body: Any = None, token: str | None = None) -> Any:
    """One JSON request (setup steps only, never measured); raises on failure."""
    reply = jsonhttp.request(method, url, body, token=token, timeout=30)
    if not reply.ok:
        raise BenchError(f"{method} {url}: {reply.brief()}")
    return reply.body


@dataclass
class Upstream:
    proc: Proc
    base_url: str


def start_upstream(directory: Path, *, timeout: float = 30.0) -> Upstream:
    """``twistd -n tasknet-upstream`` on a free loopback port."""
    for attempt in (1, 2):
        port = free_port()
        args = [f"--http=tcp:{port}:interface=127.0.0.1"]
        proc = twistd("upstream", "tasknet-upstream", args, directory)
        try:
            proc.wait_port(port, timeout)
            return Upstream(proc, f"{LOOPBACK_URL}:{port}")
        except BenchError:
            proc.stop()
            if attempt == 2 or not proc.log_has(PORT_TAKEN):
                raise
    raise AssertionError("unreachable")


@dataclass
class Site:
    proc: Proc
    http_url: str
    nodes_port: int
    started_at: float


def spawn_site(
    directory: Path,
    db: Path | str,
    *,
    upstream_url: str,
    extra_args: Sequence[str] = (),
    name: str = "site",
    http_port: int = 0,
    nodes_port: int = 0,
    nodes_backlog: int | None = None,
) -> Site:
    """``twistd -n tasknet-site`` on the database ``db`` (a SQLite file or a
    PostgreSQL URL), both ports on loopback (free ones unless given: B10
    restarts a site on the ports its nodes know), logging to
    ``directory/name.log``; returns at once (see :func:`wait_site`).
    ``nodes_backlog``: the node listener's listen backlog (default: the
    endpoint's, Twisted's 50)."""
    http_port, nodes_port = http_port or free_port(), nodes_port or free_port()
    backlog = f":backlog={nodes_backlog}" if nodes_backlog else ""
    args = [
        f"--db={db}",
        f"--http=tcp:{http_port}:interface=127.0.0.1",
        f"--nodes=tcp:{nodes_port}:interface=127.0.0.1{backlog}",
        f"--upstream={upstream_url}",
        *extra_args,
    ]
    proc = twistd(name, "tasknet-site", args, directory)
    return Site(proc, f"{LOOPBACK_URL}:{http_port}", nodes_port, proc.started_at)


def wait_site(site: Site, timeout: float = 60.0) -> None:
    """Ready means ``/healthz`` answers (HTTP is started last, after recovery
    and the node listener: invariant 10).  The site logs at critical level
    when its startup chain fails but keeps running: fail at once then."""
    try:
        site.proc.wait_until(
            lambda: _healthy(site.http_url), timeout, "/healthz", fatal="#critical]"
        )
    except BaseException:
        site.proc.stop()
        raise


def start_site(
    directory: Path,
    db: Path | str,
    *,
    upstream_url: str,
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    name: str = "site",
) -> Site:
    """:func:`spawn_site` then :func:`wait_site`; once more with fresh ports if
    another process took a port between :func:`free_port` and the bind."""
    for attempt in (1, 2):
        site = spawn_site(
            directory, db, upstream_url=upstream_url, extra_args=extra_args, name=name
        )
        try:
            wait_site(site, timeout)
            return site
        except BenchError:
            if attempt == 2 or not site.proc.log_has(PORT_TAKEN):
                raise
    raise AssertionError("unreachable")


def _healthy(http_url: str) -> bool:
    reply = jsonhttp.request("GET", f"{http_url}/healthz", timeout=30)
    return reply.ok and isinstance(reply.body, dict)


def require_dispatch(site: Site) -> None:
    """The benchmarks that need dispatch say so clearly when recovery failed."""
    health = http_json("GET", f"{site.http_url}/healthz")
    if health.get("dispatch") != "enabled":
        raise BenchError(f"site dispatch is not enabled: /healthz says {health}")
