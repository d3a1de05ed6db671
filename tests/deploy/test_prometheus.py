"""The alert rules (``deploy/prometheus/``) and the metrics pages they read.

* ``promtool check rules`` on the rules and ``promtool test rules`` on their
  unit tests (a series that fires and one that does not, for every alert);
* every alert has a firing and a non-firing case in the unit tests and a
  runbook entry in docs/operations.md ("Alerts");
* ``promtool check metrics`` on the ``/metrics`` of a live site (with a node
  connected and a task downloaded) and of a live node; the names the rules
  use are on those pages.

promtool is Debian's ``prometheus`` package.  Without it these tests skip,
unless ``TASKNET_REQUIRE_PROMTOOL=1`` (set by ``.ci/run``) makes that a
failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool

from tasknet.upstream import catalog
from tasknet.upstream.testing import start_upstream
from tests.node.harness import SECRET, start_node
from tests.site.helpers import running_site, site_options

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "tasknet-rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tasknet-rules.test.yml"
OPERATIONS = REPO / "docs" / "operations.md"
REQUIRE = "TASKNET_REQUIRE_PROMTOOL"
GID = 4242
NODE = "node-t"  # tests.node.harness.start_node's node id
BUDGET = 10 * 1024**3
MIN_FREE = 1024**2


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is missing (apt-get install prometheus)"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {reason}")
        pytest.skip(reason)
    return found


def run(promtool: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [promtool, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES.parent,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(encoding="utf-8"), re.M)


def test_promtool_checks_the_rules(promtool: str) -> None:
    output = run(promtool, "check", "rules", RULES.name)
    assert f"SUCCESS: {len(alert_names())} rules found" in output


def test_promtool_unit_tests_of_the_rules_pass(promtool: str) -> None:
    run(promtool, "test", "rules", RULE_TESTS.name)


def test_every_alert_fires_and_stays_quiet_in_the_unit_tests() -> None:
    """Each ``alertname`` evaluation of the unit tests expects either no
    alert (``exp_alerts: []``) or some: every alert needs both."""
    cases: dict[str, set[bool]] = {}
    lines = RULE_TESTS.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        match = re.match(r"\s*alertname: (\w+)$", line)
        if match:
            expects = lines[n + 1].strip()
            assert expects.startswith("exp_alerts:"), f"line {n + 2}: {expects!r}"
            cases.setdefault(match.group(1), set()).add(expects != "exp_alerts: []")
    names = alert_names()
    assert len(names) == len(set(names)) >= 15
    for name in names:
        assert cases.get(name) == {True, False}, f"{name}: firing/quiet cases {cases.get(name)}"
    assert set(cases) <= set(names), f"tests of unknown alerts: {set(cases) - set(names)}"


def test_every_alert_has_a_runbook_entry() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
    for name in alert_names():
        assert f"**{name}**" in section, f"docs/operations.md, Alerts: no entry for {name}"
    assert "tasknet-rules.yml" in section


async def _get(url: str) -> str:
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        response = await treq.get(url, pool=pool)
        assert response.code == 200, url
        return str(await response.text())
    finally:
        await pool.closeCachedConnections()


def _samples(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def _value(page: str, name: str, **labels: str) -> float:
    return _samples(page)[(name, tuple(sorted(labels.items())))]


async def _completed(site: Any, gid: int, timeout: float = 30.0) -> None:
    waited = 0.0
    while True:
        status, body = await site.request("GET", f"/api/tasks/{gid}", token="demo")
        if status == 200 and body["task"]["status"] == "COMPLETED":
            return
        assert waited < timeout, f"task {gid} not completed within {timeout}s: {body}"
        await deferLater(reactor, 0.05, lambda: None)
        waited += 0.05


@pytest_twisted.ensureDeferred
async def test_live_site_and_node_metrics_pass_promtool(tmp_path: Path, promtool: str) -> None:
    up = await start_upstream()
    try:
        options = site_options(
            str(tmp_path / "site.sqlite"), up.base_url, "--demo", "--node-key", f"{NODE}:{SECRET}"
        )
        async with running_site(options) as site:
            nodes = f"tcp:127.0.0.1:{site.service.nodes_port.getHost().port}"
            metrics = "tcp:0:interface=127.0.0.1"
            # A disk budget: its gauge (which the near-budget alert reads) is
            # shown only when one is set.  A small --min-free, so the download
            # does not wait on a small test disk.
            node = await start_node(
                nodes,
                tmp_path / "node",
                secret=SECRET,
                metrics=metrics,
                disk_budget=BUDGET,
                min_free=MIN_FREE,
            )
            try:
                status, body = await site.request(
                    "POST", "/api/tasks", token="demo", body={"gid": GID, "token": "t"}
                )
                assert status == 201, body
                await _completed(site, GID)
                site_page = await _get(site.base_url + "/metrics")
                node_page = await _get(f"http://127.0.0.1:{node.metrics_port.getHost().port}/")
            finally:
                await node.stopService()
    finally:
        await up.stop()
    run(promtool, "check", "metrics", stdin=site_page)
    run(promtool, "check", "metrics", stdin=node_page)
    # What the rules read, as this site shows it.
    assert _value(site_page, "tasknet_database_up") == 1
    assert _value(site_page, "tasknet_dispatch_enabled") == 1
    assert _value(site_page, "tasknet_site_instances", status="open") == 1
    assert _value(site_page, "tasknet_site_instances", status="reaped") == 0
    cost = catalog.gallery(GID).cost
    assert _value(site_page, "tasknet_user_quota_used", user="demo") == cost
    assert _value(site_page, "tasknet_user_quota", user="demo") > cost
    assert _value(site_page, "tasknet_connected_nodes", protocol="2") >= 1
    assert _value(site_page, "tasknet_tasks_by_status", status="COMPLETED") == 1
    assert "tasknet_node_unfinished_tasks" in site_page  # no node holds unfinished tasks: no sample
    assert _value(node_page, "tasknet_node_connected") == 1
    assert _value(node_page, "tasknet_node_bytes_downloaded_total") > 0
    assert _value(node_page, "tasknet_node_disk_budget_bytes") == BUDGET
    assert _value(node_page, "tasknet_node_min_free_bytes") == MIN_FREE
    assert _value(site_page, "tasknet_archives_released_total", reason="DISK_BUDGET") == 0
    # Every metric the rules name is on one of the pages (as a family, or
    # a sample such as NAME_total or NAME_bucket).
    shown = {
        name
        for page in (site_page, node_page)
        for family in text_string_to_metric_families(page)
        for name in (family.name, *(s.name for s in family.samples))
    }
    rules = re.sub(r"#.*", "", RULES.read_text(encoding="utf-8"))
    named = set(re.findall(r"\b(tasknet_[a-z_]+)\{?", rules))
    assert named and named <= shown, f"not on any page: {named - shown}"
