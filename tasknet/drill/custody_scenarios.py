"""Scenarios S27–S29 (issue 34, DELIVERY.md "Custody"): what the site knows
each node holds, after a node is wiped, gone, or out of disk.

* S27: a node's data directory is wiped while the site is down; when both
  are back the node's inventory makes every task it no longer holds
  ``ARCHIVE_GONE`` (``MISSING``), the other node's tasks stay 下载完成, and
  a gone gid is fetched again only with ``confirmCharge``.
* S28: a node downloading tasks is killed for longer than the site's
  ``--reassign-after``: its tasks move to the other node with the same
  operation (one POST per generation), finish there, and the returned node
  is sent ``CANCEL`` for each, which it releases (``CANCELLED``).
* S29: a node with a ``--disk-budget`` receives more than fits: the
  downloads wait for space, the archives served longest ago are released
  (``DISK_BUDGET``) and the site shows them ``ARCHIVE_GONE`` (410
  ``archive_gone`` for a link).

Each records what the site showed before the fault and after it settled
(the task statuses, the node panel's disk figures, the custody counters of
``/metrics``) as progress lines and in the ``E`` verdict's evidence
(``Expect.figures`` when the runner has it).  Registered in
:data:`tasknet.drill.scenarios.SCENARIOS` (this module imports nothing of
that one at run time: it is imported by it).
"""

from __future__ import annotations

import random
import shutil
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tasknet.drill.cluster import Cluster
from tasknet.drill.expect import Expect
from tasknet.drill.procs import DrillError, wait_for
from tasknet.drill.proxy import TO_CLIENT
from tasknet.drill.snapshot import site_rows
from tasknet.node.paths import DataDir
from tasknet.protocol.messages import TaskCommand
from tasknet.site.node_disk import REFRESH_SECONDS
from tasknet.site.storage.engine.timestamps import iso
from tasknet.upstream.catalog import gallery

COMPLETED = "COMPLETED"
ARCHIVE_GONE = "ARCHIVE_GONE"
DOWNLOAD_TIMEOUT = 60.0
#: The custody counters a drill shows before and after (the site's /metrics).
CUSTODY_METRICS = (
    "tasknet_archives_released_total",
    "tasknet_inventories_total",
    "tasknet_inventory_missing_total",
    "tasknet_tasks_reassigned_total",
)
#: A node's --serve: the site reaches it on loopback (its serveUrl), reads
#: its disk figures there (the node panel) and streams its archives.
SERVE_LOOPBACK = "tcp:0:interface=127.0.0.1"
#: S28's --reassign-after: short, so the drill waits seconds, not minutes.
REASSIGN_AFTER = 4.0
#: How long past --reassign-after the move may take (the site's sweep
#: interval, a loaded machine).
REASSIGN_SLACK = 20.0


# -- helpers (scenarios.py's, which this module cannot import) ------------------------


def distinct_gids(rng: random.Random, n: int, *, min_size: int, max_size: int) -> list[int]:
    """``n`` distinct random gids whose archive sizes are within bounds."""
    gids: list[int] = []
    for _ in range(100_000):
        gid = rng.randint(1_000, 2**31 - 1)
        if min_size <= gallery(gid).size <= max_size and gid not in gids:
            gids.append(gid)
            if len(gids) == n:
                return gids
    raise DrillError("not enough gids with the wanted archive size")


def completed(c: Cluster, x: Expect, gid: int, timeout: float = DOWNLOAD_TIMEOUT) -> None:
    c.ledger.expect_completed.add(gid)
    x.step(f"waiting for gid {gid} to be 下载完成")
    c.wait_status(gid, COMPLETED, timeout)


# -- what the site shows ----------------------------------------------------------------


def shown(c: Cluster, gid: int) -> str:
    """One gid as the site's API shows it: ``COMPLETED on n1``,
    ``ARCHIVE_GONE (MISSING, n1)``, ``DOWNLOADING on n2`` ..."""
    task = c.task(gid)
    if task is None:
        return "absent"
    gone = task.get("archiveGone")
    if task.get("status") == ARCHIVE_GONE and isinstance(gone, dict):
        return f"{ARCHIVE_GONE} ({gone.get('reason')}, {gone.get('node')})"
    return f"{task.get('status')} on {task.get('node')}"


def custody_counters(c: Cluster) -> dict[str, float]:
    """The custody counters of the site's ``/metrics`` that are not zero."""
    reply = c.api("GET", "/metrics", timeout=5)
    if reply.status != 200:
        return {"unreadable": float(reply.status)}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if sample.name in CUSTODY_METRICS and sample.value:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def panel_disk(c: Cluster) -> dict[str, Any]:
    """Each listed node's disk figures as the node panel shows them (what
    the node said, and what its last inventory counted)."""
    listed = c.node_listing() or []
    found: dict[str, Any] = {}
    for n in listed:
        inventory = n.get("inventory") or {}
        found[str(n.get("id"))] = {
            "connected": n.get("connected"),
            "disk": n.get("disk"),
            "inventory": {k: inventory.get(k) for k in ("archives", "bytes", "missing")}
            if inventory
            else None,
        }
    return found


def fresh_disks(c: Cluster) -> None:
    """Wait (bounded) until the node panel shows every connected node's
    disk figures as read after now (the site reads them at most every
    ``node_disk.REFRESH_SECONDS``); what it shows after the bound will do."""
    since = iso(time.time())

    def fresh() -> bool:
        listed = c.node_listing() or []
        return all(
            not n.get("connected") or not n.get("disk") or str(n["disk"].get("at")) >= since
            for n in listed
        )

    try:
        wait_for(fresh, REFRESH_SECONDS + 3, "the node panel's disk figures read again")
    except DrillError:
        pass


def record(
    c: Cluster, x: Expect, moment: str, gids: list[int], *, fresh: bool = True
) -> dict[str, Any]:
    """What the site shows at ``moment`` (``before``/``after``): printed as
    progress lines and kept in the verdict's figures.  ``fresh``: first wait
    for the node panel's disk figures to be read again."""
    if fresh:
        fresh_disks(c)
    view = {
        "tasks": {str(gid): shown(c, gid) for gid in gids},
        "nodes": panel_disk(c),
        "metrics": custody_counters(c),
    }
    for key, value in view.items():
        x.step(f"site {moment}: {key} {value}")
    figures = getattr(x, "figures", None)
    if isinstance(figures, dict):
        figures[moment] = view
    return view


def wait_shown(c: Cluster, gid: int, wanted: str, timeout: float) -> str:
    """Wait until ``shown(gid)`` starts with ``wanted``; the last one seen."""
    last = [""]

    def check() -> bool:
        last[0] = shown(c, gid)
        return last[0].startswith(wanted)

    try:
        wait_for(check, timeout, f"gid {gid} shown {wanted}")
    except DrillError:
        pass
    return last[0]


def node_of(c: Cluster, gid: int) -> str | None:
    task = c.task(gid) or {}
    return task.get("node")


def operation_of(c: Cluster, gid: int) -> str | None:
    task = c.task(gid) or {}
    value = task.get("operationId")
    return str(value) if value else None


def recreate(c: Cluster, x: Expect, gid: int) -> None:
    """Create a gone gid again: refused without ``confirmCharge`` (409 with
    the last cost), a new generation and charge with it, fetched again."""
    task = c.task(gid) or {}
    cost = gallery(gid).cost
    body: dict[str, Any] = {"gid": gid, "token": "drill"}
    refused = c.api("POST", "/api/tasks", body)
    error = (refused.body or {}).get("error", {}) if isinstance(refused.body, dict) else {}
    x.equal(
        (refused.status, error.get("code"), error.get("cost")),
        (409, "charge_confirmation_required", task.get("cost", cost)),
        f"create gid {gid} again without confirmCharge",
    )
    c.ledger.generations[gid] = c.ledger.generations.get(gid, 1) + 1
    c.ledger.carried_cost += int(task.get("cost") or cost)
    x.status(c.api("POST", "/api/tasks", {**body, "confirmCharge": True}), 201, "confirmed")
    completed(c, x, gid)
    x.equal(c.posts(gid), 2, f"upstream POSTs for gid {gid} (two generations)")


# -- S27 --------------------------------------------------------------------------------


def s27_node_wiped_while_site_down(c: Cluster, x: Expect, rng: random.Random) -> None:
    gids = distinct_gids(rng, 4, min_size=20_000, max_size=400_000)
    x.step("start upstream, site, nodes n1 and n2; four tasks completed")
    c.start_upstream()
    c.start_site()
    c.start_node("n1", extra=["--serve", SERVE_LOOPBACK])
    c.start_node("n2", extra=["--serve", SERVE_LOOPBACK])
    for gid in gids:
        x.status(c.create(gid), 201, f"create {gid}")
    for gid in gids:
        completed(c, x, gid)
    placed = {gid: node_of(c, gid) for gid in gids}
    operations = {gid: operation_of(c, gid) or "" for gid in gids}
    by_node = {n: [g for g in gids if placed[g] == n] for n in ("n1", "n2")}
    wiped = max(by_node, key=lambda n: len(by_node[n]))
    kept = "n2" if wiped == "n1" else "n1"
    record(c, x, "before", gids)
    x.step(f"SIGKILL the site; SIGKILL {wiped}, wipe its --data, start it again")
    c.stop_site()
    node = c.nodes[wiped]
    node.proc.kill()
    c.ledger.wiped_at.setdefault(wiped, []).append(time.time())
    shutil.rmtree(node.data)
    node.proc.start()
    x.step("site back: the wiped node's inventory is judged")
    c.resume_site()
    c.wait_connected(wiped, kept)
    for gid in by_node[wiped]:
        now = wait_shown(c, gid, ARCHIVE_GONE, 30)
        x.equal(now, f"{ARCHIVE_GONE} (MISSING, {wiped})", f"gid {gid} (was on {wiped})")
    for gid in by_node[kept]:
        x.equal(shown(c, gid), f"{COMPLETED} on {kept}", f"gid {gid} (on {kept}, not wiped)")
    # The site's view equals the disks: shown COMPLETED exactly where held.
    for node_id in (wiped, kept):
        snapshot = c.node_snapshot(node_id)
        data = DataDir(c.nodes[node_id].data)
        held = {g for g in gids if snapshot.holds_archive(g, operations[g], data)}
        believed = {g for g in by_node[node_id] if shown(c, g).startswith(COMPLETED)}
        x.equal(believed, held, f"tasks shown 下载完成 on {node_id} = archives held there")
    after = record(c, x, "after", gids)
    missing = after["metrics"].get("tasknet_inventory_missing_total", 0)
    x.equal(missing, float(len(by_node[wiped])), "archives the inventory found missing")
    if by_node[wiped]:
        x.step("getting it again: a gone gid is created with confirmCharge")
        recreate(c, x, by_node[wiped][0])
    for gid in gids:
        if shown(c, gid).startswith(COMPLETED):
            c.ledger.expect_completed.add(gid)
        else:
            c.ledger.expect_completed.discard(gid)


# -- S28 --------------------------------------------------------------------------------


def _cancels_to(c: Cluster, node_id: str) -> list[dict[str, Any]]:
    """The CANCEL commands the site sent ``node_id`` (its proxy's frames)."""
    node = c.nodes[node_id]
    found = []
    for frame in node.call("frames", TaskCommand.TYPE, TO_CLIENT):
        payload = frame.payload if isinstance(frame.payload, dict) else {}
        if payload.get("action") == "CANCEL":
            found.append(payload)
    return found


def s28_node_gone_past_reassign_after(c: Cluster, x: Expect, rng: random.Random) -> None:
    gids = distinct_gids(rng, 4, min_size=900_000, max_size=1_500_000)
    x.step(f"start upstream (100 kB/s per response), site (--reassign-after {REASSIGN_AFTER:g}s)")
    c.start_upstream(bandwidth=100_000)
    c.start_site(extra=["--reassign-after", f"{REASSIGN_AFTER:g}s"])
    c.start_node("n1", extra=["--serve", SERVE_LOOPBACK])
    c.start_node("n2", extra=["--serve", SERVE_LOOPBACK])
    for gid in gids:
        x.status(c.create(gid), 201, f"create {gid}")
    wait_for(
        lambda: all(node_of(c, g) in ("n1", "n2") for g in gids),
        30,
        "every task on a node",
    )
    placed = {gid: node_of(c, gid) for gid in gids}
    operations = {gid: operation_of(c, gid) for gid in gids}
    gone = max(("n1", "n2"), key=lambda n: sum(1 for g in gids if placed[g] == n))
    other = "n2" if gone == "n1" else "n1"
    moved = [g for g in gids if placed[g] == gone]
    record(c, x, "before", gids, fresh=False)  # the downloads run: no waiting
    x.step(f"SIGKILL {gone} mid-download ({len(moved)} task(s)); wait past --reassign-after")
    c.nodes[gone].proc.kill()
    killed = time.monotonic()
    try:
        wait_for(
            lambda: all(node_of(c, g) == other for g in moved),
            REASSIGN_AFTER + REASSIGN_SLACK,
            f"{gone}'s tasks moved to {other}",
        )
    except DrillError as err:
        x.that(False, str(err), placed={g: node_of(c, g) for g in moved})
    waited = time.monotonic() - killed
    x.that(
        waited >= REASSIGN_AFTER - 0.5,
        f"nothing moved before --reassign-after ({waited:.1f}s after the kill)",
    )
    x.step(f"moved {waited:.1f}s after the kill; each finished on {other}")
    for gid in moved:
        x.equal(operation_of(c, gid), operations[gid], f"gid {gid}: same operation after the move")
    for gid in gids:
        completed(c, x, gid)
    x.step(f"{gone} returns: it is sent CANCEL for each moved generation")
    c.nodes[gone].proc.start()
    c.wait_connected(gone)

    def cancelled() -> bool:
        sent = {(p.get("gid"), p.get("operationId")) for p in _cancels_to(c, gone)}
        return all((g, operations[g]) in sent for g in moved)

    try:
        wait_for(cancelled, 30, f"CANCEL for each moved task sent to {gone}")
    except DrillError as err:
        x.that(False, str(err), cancels=_cancels_to(c, gone))
    owed: list[dict[str, Any]] = []

    def settled() -> bool:
        owed[:] = site_rows(c.db, "SELECT node_id, gid, operation_id FROM node_cancel")
        return not owed

    try:
        wait_for(settled, 30, f"{gone}'s CANCELLED releases settling the CANCELs owed")
    except DrillError:
        x.that(False, "CANCELs still owed after the node's releases", node_cancel=owed)
    snapshot = c.node_snapshot(gone)
    left = [p for p in snapshot.partials if any(p.startswith(f"{g}-") for g in moved)]
    x.equal(left, [], f"{gone}'s partial files of the moved tasks")
    for gid in gids:
        x.equal(c.posts(gid), 1, f"upstream POSTs for gid {gid}")
        x.equal(
            shown(c, gid), f"{COMPLETED} on {other if gid in moved else placed[gid]}", f"gid {gid}"
        )
    after = record(c, x, "after", gids)
    counted = after["metrics"].get("tasknet_tasks_reassigned_total{cause=timeout}", 0)
    x.equal(counted, float(len(moved)), "tasks reassigned after the timeout (the site's counter)")


# -- S29 --------------------------------------------------------------------------------

#: S29's archives and node budget: three fit (3 x 500 kB), four do not (4 x 400 kB).
S29_SIZE = {"min_size": 400_000, "max_size": 500_000}
S29_BUDGET = 1_550_000


def _fetch_archive(c: Cluster, gid: int) -> int:
    """``GET /api/tasks/{gid}/archive`` as the admin (the site streams it
    from the node): the answer's status; the bytes are not kept."""
    return c.api("GET", f"/api/tasks/{gid}/archive", timeout=30).status


def _gone_at(c: Cluster, gid: int) -> str:
    gone = (c.task(gid) or {}).get("archiveGone") or {}
    return str(gone.get("at") or "")


def s29_disk_budget_mid_downloads(c: Cluster, x: Expect, rng: random.Random) -> None:
    served, unserved, *more = distinct_gids(rng, 6, **S29_SIZE)
    gids = [served, unserved, *more]
    x.step(f"start upstream (300 kB/s per response), site, n1 (--disk-budget {S29_BUDGET})")
    c.start_upstream(bandwidth=300_000)
    c.start_site()
    c.start_node(
        "n1", extra=["--disk-budget", str(S29_BUDGET), "--min-free", "0", "--serve", SERVE_LOOPBACK]
    )
    for gid in (served, unserved):
        x.status(c.create(gid), 201, f"create {gid}")
        completed(c, x, gid)
    x.step(f"fetch gid {served}: gid {unserved}, never served, is now the one served longest ago")
    x.equal(_fetch_archive(c, served), 200, f"gid {served}'s archive through the site")
    record(c, x, "before", gids)
    x.step(f"create {len(more)} more at once: four downloads, room for three")
    for gid in more:
        x.status(c.create(gid), 201, f"create {gid}")
    waited: dict[int, Any] = {}
    ends: dict[int, str] = {}

    def settled() -> bool:
        for gid in more:
            task = c.task(gid) or {}
            if task.get("queued") and task.get("detail"):
                waited.setdefault(gid, task.get("detail"))
            ends[gid] = shown(c, gid)
        return all(e.startswith((COMPLETED, ARCHIVE_GONE, "FAILED")) for e in ends.values())

    try:
        wait_for(settled, DOWNLOAD_TIMEOUT * 2, "the four downloads done")
    except DrillError as err:
        x.that(False, str(err), shown=ends)
    x.step(f"downloads that waited for space: {waited or 'none seen'}")
    x.that(bool(waited), "a download waited for space (queued, with why)", shown=ends)
    failed = [g for g, e in ends.items() if e.startswith("FAILED")]
    x.equal(failed, [], "downloads failed (they wait for space instead)")
    for gid in (unserved, served):
        x.equal(shown(c, gid), f"{ARCHIVE_GONE} (DISK_BUDGET, n1)", f"gid {gid}")
    first, second = _gone_at(c, unserved), _gone_at(c, served)
    x.that(
        bool(first) and bool(second) and first <= second,
        f"the archive served longest ago went first ({unserved} at {first}, {served} at {second})",
    )
    link = c.api("GET", f"/api/tasks/{unserved}/archive", timeout=10)
    error = link.body.get("error", {}) if isinstance(link.body, dict) else {}
    x.equal((link.status, error.get("code")), (410, "archive_gone"), "a gone archive's link")
    kept = [g for g in gids if shown(c, g).startswith(COMPLETED)]
    held = sum(gallery(g).size for g in kept)
    x.that(held <= S29_BUDGET, f"archives shown 下载完成 fit the budget ({held} bytes)")
    gone = [g for g in gids if shown(c, g).startswith(ARCHIVE_GONE)]
    for gid in gids:
        x.equal(c.posts(gid), 1, f"upstream POSTs for gid {gid}")
        if gid in gone:
            c.ledger.expect_completed.discard(gid)
        else:
            c.ledger.expect_completed.add(gid)
    after = record(c, x, "after", gids)
    released = after["metrics"].get("tasknet_archives_released_total{reason=DISK_BUDGET}", 0)
    x.equal(released, float(len(gone)), "archives released DISK_BUDGET (the site's counter)")
    disk = (after["nodes"].get("n1") or {}).get("disk") or {}
    x.equal(disk.get("budget"), S29_BUDGET, "the node panel's disk budget")
