"""The drill invariants D1–D10 (DRILLS.md), checked on read-only evidence.

Each check takes a :class:`World` (the site database, every node database,
the upstream's stats and journal, the frames the fault proxies saw, the
webhook deliveries, what each live site lists at ``/api/admin/nodes``, the
connections each proxy holds open, and the scenario's :class:`Ledger` of
what it did, including when each site process ran) and
returns a :class:`Verdict`: ``PASS``, ``FAIL`` with self-explaining evidence
(the gid, the rows, the journal entries, the frames), or ``N/A`` when the
scenario never exercised the invariant (so a green cell always means
"checked and held", never "nothing to look at").
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tasknet.drill.snapshot import NodeSnapshot, SiteSnapshot
from tasknet.node.paths import DataDir

PASS = "PASS"
FAIL = "FAIL"
NA = "N/A"

SUBMITTED_OR_LATER = ("SUBMITTED", "DELETE_PENDING", "DELETED")
NOT_DISPATCHABLE = ("RESERVED", "SUBMITTING", "UNKNOWN")
COMPLETED_CODE = 4

TYPE_DOWNLOAD_POST = 4
TYPE_DELETE_GALLERY = 5
TYPE_TASK_COMMAND = 11
TYPE_TASK_REPORT = 12
TYPE_TASK_REPORT_ACK = 13

#: SCALE.md 2: a live site reaps a dead instance within this many seconds
#: (counted from when some other site could first do it).
REAP_BOUND = 30.0
IN_FLIGHT = ("RESERVED", "SUBMITTING")


@dataclass
class Ledger:
    """What the scenario did, where the databases alone cannot tell."""

    # gid -> how many CREATE generations the scenario started (default 1):
    # the upstream may see at most this many POSTs for the gid.
    generations: Counter[int] = field(default_factory=Counter)
    # gid -> wall time the site answered the DELETE request.
    delete_answered_at: dict[int, float] = field(default_factory=dict)
    # gids the scenario saw reach the DELETED tombstone.
    deleted: set[int] = field(default_factory=set)
    # Metered cost of generations a re-create overwrote (their rows are gone).
    carried_cost: int = 0
    # gids the scenario expects shown 下载完成 at the end.
    expect_completed: set[int] = field(default_factory=set)
    # What a hostile node sent for tasks it was not assigned (S17): one dict
    # per entry, {"node", "gid", "revision", "status", "progress"} or, for a
    # delete confirmation, {"node", "gid", "revision", "delete_operation_id"}.
    forged: list[dict[str, Any]] = field(default_factory=list)
    # Every run of every site process (filled when the evidence is gathered):
    # {"site": --name, "pid", "started", "ended", "how", "fenced"}, wall-clock
    # seconds; "ended" is when the drill signalled it (or first saw it gone),
    # "fenced" when the drill ended its database lease by hand while it was
    # stopped (S23; None otherwise): for D9 and D10 a run is gone from the
    # first of the two (see _end_of).  D9 and D10 match site_instance rows to
    # these by (name, pid).
    site_runs: list[dict[str, Any]] = field(default_factory=list)
    # node id -> when its data directory was wiped (in the frames' clock):
    # a report it sent before that, committed but never ACKed, was lost
    # with the node's store, not by the site (D6).
    wiped_at: dict[str, list[float]] = field(default_factory=dict)
    # Reports written in a node's name that the node does not keep until
    # ACKed (the simulator's lying nodes): committed, one may go unACKed if
    # its connection ends first, as nothing sends it again (D6).
    unkept_reports: set[str] = field(default_factory=set)
    # [start, end] wall-clock spans when no database server took writes (a
    # primary killed until the standby was promoted, S24-S26): no site could
    # reap then, so D9's 30 s count from a span's end.
    database_down: list[list[float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "generations": {str(k): v for k, v in sorted(self.generations.items())},
            "delete_answered_at": {str(k): v for k, v in self.delete_answered_at.items()},
            "deleted": sorted(self.deleted),
            "carried_cost": self.carried_cost,
            "expect_completed": sorted(self.expect_completed),
            "forged": self.forged,
            "site_runs": self.site_runs,
            "wiped_at": self.wiped_at,
            "unkept_reports": sorted(self.unkept_reports),
            "database_down": self.database_down,
        }


@dataclass
class World:
    site: SiteSnapshot
    nodes: dict[str, NodeSnapshot]
    node_dirs: dict[str, Path]
    upstream_stats: dict[str, Any]
    journal: list[dict[str, Any]]
    frames: list[dict[str, Any]]  # proxy FrameRecord.to_json() plus "node"
    webhook: list[Any] | None  # {"id", "body"} the webhook receiver got; None: not used
    ledger: Ledger
    # site --name -> the "nodes" of its /api/admin/nodes (live sites only).
    site_listings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # node id -> site --name -> connections open through that site's proxy.
    node_links: dict[str, dict[str, int]] = field(default_factory=dict)
    # Nodes whose process runs (None: every node in ``nodes``).
    live_nodes: set[str] | None = None
    observed_at: float = field(default_factory=time.time)


@dataclass
class Verdict:
    invariant: str
    status: str
    detail: str = ""
    evidence: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "status": self.status,
            "detail": self.detail,
            "evidence": self.evidence,
        }


class _Failures:
    """Collects failures of one invariant; a verdict is FAIL iff any was added."""

    def __init__(self, invariant: str) -> None:
        self.invariant = invariant
        self.items: list[dict[str, Any]] = []
        self.checked = 0

    def fail(self, what: str, **evidence: Any) -> None:
        self.items.append({"what": what, **evidence})

    def verdict(self, passed: str, na: str = "", info: list[Any] | None = None) -> Verdict:
        """FAIL with the failures, else N/A or PASS (``info``: evidence kept
        with a PASS too, e.g. what was reaped and when)."""
        if self.items:
            first = self.items[0]["what"]
            more = f" (+{len(self.items) - 1} more)" if len(self.items) > 1 else ""
            return Verdict(self.invariant, FAIL, first + more, self.items)
        if self.checked == 0 and na:
            return Verdict(self.invariant, NA, na)
        return Verdict(self.invariant, PASS, passed.format(n=self.checked), list(info or []))


def _journal_of(world: World, gid: int) -> list[dict[str, Any]]:
    return [e for e in world.journal if int(e.get("gid", -1)) == gid]


def check_d1(world: World) -> Verdict:
    """Upstream POSTs per (gid, generation) ≤ 1."""
    f = _Failures("D1")
    posts = world.upstream_stats.get("posts", {}) or {}
    for gid_text, count in sorted(posts.items()):
        gid = int(gid_text)
        f.checked += 1
        allowed = max(world.ledger.generations.get(gid, 1), 1)
        if count > allowed:
            f.fail(
                f"gid {gid}: {count} upstream POSTs for {allowed} generation(s)",
                gid=gid,
                posts=count,
                generations=allowed,
                journal=_journal_of(world, gid),
                operation=world.site.operations.get(gid),
            )
    return f.verdict("{n} gid(s) POSTed at most once per generation", "no upstream POST")


def check_d2(world: World) -> Verdict:
    """Every SUBMITTED operation metered exactly once; weekly_usage = sum of metered costs."""
    f = _Failures("D2")
    ops = world.site.operations
    expected: Counter[tuple[int, str]] = Counter()
    for gid, op in sorted(ops.items()):
        if op.get("legacy"):
            continue
        state = op["state"]
        if state in SUBMITTED_OR_LATER:
            f.checked += 1
            if op["metered"] != 1 or op.get("cost") is None or not op.get("metered_week"):
                f.fail(f"gid {gid}: {state} but not metered", gid=gid, operation=op)
                continue
            charges = [e for e in _journal_of(world, gid)]
            if world.ledger.generations.get(gid, 1) <= 1 and not any(
                int(e.get("cost", -1)) == op["cost"] for e in charges
            ):
                f.fail(
                    f"gid {gid}: metered cost {op['cost']} matches no upstream charge",
                    gid=gid,
                    operation=op,
                    journal=charges,
                )
        elif state in NOT_DISPATCHABLE:
            f.checked += 1
            if op["metered"]:
                f.fail(f"gid {gid}: metered while {state}", gid=gid, operation=op)
        if op["metered"]:
            expected[(op["user_id"], op["metered_week"])] += int(op["cost"] or 0)
    used: Counter[tuple[int, str]] = Counter()
    for row in world.site.usage:
        used[(row["user_id"], row["week"])] += int(row["used"])
    total_used, total_expected = sum(used.values()), sum(expected.values())
    if total_used != total_expected + world.ledger.carried_cost:
        f.fail(
            f"weekly_usage total {total_used} != sum of metered costs {total_expected}"
            f" (+ carried {world.ledger.carried_cost})",
            weekly_usage=world.site.usage,
            metered={f"{u}:{w}": c for (u, w), c in expected.items()},
        )
    elif not world.ledger.carried_cost:
        for key in sorted(set(used) | set(expected), key=str):
            if used[key] != expected[key]:
                f.fail(
                    f"weekly_usage of user {key[0]} week {key[1]} is {used[key]},"
                    f" metered costs sum to {expected[key]}",
                    weekly_usage=world.site.usage,
                )
    return f.verdict("{n} operation(s) metered exactly when submitted; usage adds up", "none")


def check_d3(world: World) -> Verdict:
    """Every archive completed on a node is shown 下载完成 at the site."""
    f = _Failures("D3")
    ops, galleries = world.site.operations, world.site.galleries
    for node_id, node in sorted(world.nodes.items()):
        data = DataDir(world.node_dirs[node_id])
        done: dict[int, str] = {}  # gid -> operation id completed on this node
        for gid, op in ops.items():
            if op["state"] != "SUBMITTED":
                continue  # deleting or deleted: D4's business
            if data.archive_path(gid, op["operation_id"]).name in node.archives:
                done[gid] = op["operation_id"]
        for gid, task in node.tasks.items():
            current = ops.get(gid) or {}
            if (
                task["status"] == COMPLETED_CODE
                and current.get("state") == "SUBMITTED"
                and current.get("operation_id") == task["operation_id"]
            ):
                done[gid] = task["operation_id"]
        for gid, operation_id in sorted(done.items()):
            f.checked += 1
            gallery = galleries.get(gid)
            if gallery is None or gallery.get("status") != COMPLETED_CODE:
                f.fail(
                    f"gid {gid}: complete on {node_id} but the site shows"
                    f" status {None if gallery is None else gallery.get('status')}",
                    gid=gid,
                    node=node_id,
                    operation_id=operation_id,
                    node_task=node.tasks.get(gid),
                    node_in_flight=node.in_flight,
                    site_gallery=gallery,
                    site_operation=ops.get(gid),
                )
    for gid in sorted(world.ledger.expect_completed):
        f.checked += 1
        gallery = galleries.get(gid)
        if gallery is None or gallery.get("status") != COMPLETED_CODE:
            f.fail(
                f"gid {gid}: expected 下载完成 at the site, found"
                f" status {None if gallery is None else gallery.get('status')}",
                gid=gid,
                site_gallery=gallery,
                site_operation=ops.get(gid),
                nodes={n: s.tasks.get(gid) for n, s in world.nodes.items()},
            )
    return f.verdict("{n} completion(s) shown 下载完成 at the site", "nothing completed")


def check_d4(world: World) -> Verdict:
    """No deleted gid comes back."""
    f = _Failures("D4")
    ops = world.site.operations
    tombstones = {gid: op for gid, op in ops.items() if op["state"] == "DELETED"}
    for gid in sorted(world.ledger.deleted):
        f.checked += 1
        op = ops.get(gid)
        if op is None or op["state"] != "DELETED":
            f.fail(
                f"gid {gid}: was deleted, now {'no row' if op is None else op['state']}",
                gid=gid,
                operation=op,
                gallery=world.site.galleries.get(gid),
            )
    for gid, op in sorted(tombstones.items()):
        f.checked += 1
        if gid in world.site.galleries:
            f.fail(
                f"gid {gid}: DELETED tombstone but the gallery row is back",
                gid=gid,
                operation=op,
                gallery=world.site.galleries[gid],
            )
        favorites = [r for r in world.site.favorites if r["gid"] == gid]
        if favorites:
            f.fail(f"gid {gid}: DELETED but still a favorite", gid=gid, favorites=favorites)
        for node_id, node in world.nodes.items():
            data = DataDir(world.node_dirs[node_id])
            name = data.archive_path(gid, op["operation_id"]).name
            task = node.tasks.get(gid)
            if name in node.archives or (task and task["operation_id"] == op["operation_id"]):
                f.fail(
                    f"gid {gid}: DELETED at the site but {node_id} still holds it",
                    gid=gid,
                    node=node_id,
                    archive=name if name in node.archives else None,
                    node_task=task,
                )
    return f.verdict("{n} tombstone(s) hold", "nothing deleted")


def _downloads(world: World) -> list[dict[str, Any]]:
    """Every DOWNLOAD a node received (its database) or the site sent (proxy frames)."""
    found: list[dict[str, Any]] = []
    for node_id, node in world.nodes.items():
        for cmd in node.commands:
            if cmd["action"] == "DOWNLOAD":
                found.append({"source": f"{node_id} database", "node": node_id, **cmd})
    for frame in world.frames:
        payload = frame.get("payload") or {}
        if frame["direction"] != "to_client":
            continue
        if frame["type"] == TYPE_TASK_COMMAND and payload.get("action") == "DOWNLOAD":
            operation_id = payload.get("operationId")
        elif frame["type"] == TYPE_DOWNLOAD_POST:
            operation_id = None
        else:
            continue
        found.append(
            {
                "source": f"proxy of {frame['node']} ({frame['action']})",
                "node": frame["node"],
                "gid": payload.get("gid"),
                "operation_id": operation_id,
                "received_at": frame["at"],
            }
        )
    return found


def check_d5(world: World) -> Verdict:
    """No UNKNOWN/RESERVED/SUBMITTING/DELETE_PENDING/DELETED task was ever sent to a node."""
    f = _Failures("D5")
    ops = world.site.operations
    for cmd in _downloads(world):
        f.checked += 1
        gid = cmd["gid"]
        op = ops.get(gid)
        generations = world.ledger.generations.get(gid, 1)
        if cmd["operation_id"]:
            earlier = op is None or cmd["operation_id"] != op["operation_id"]
        else:  # a legacy DownloadPost names no operation: its time tells
            created = db_time((op or {}).get("created_at"))
            received = cmd.get("received_at")
            earlier = op is None or (
                created is not None and received is not None and received < created
            )
        if earlier and generations > 1:
            # A generation a re-create replaced: its row is gone, so the end
            # state cannot judge it (the simulator checks each DOWNLOAD as
            # it is sent, against the generation of that instant).
            continue
        if op is None:
            f.fail(f"gid {gid}: DOWNLOAD sent but the site has no operation", command=cmd)
            continue
        if earlier and cmd["operation_id"]:
            f.fail(
                f"gid {gid}: DOWNLOAD for operation {cmd['operation_id']},"
                f" the site's is {op['operation_id']}",
                command=cmd,
                operation=op,
            )
        elif op["state"] in NOT_DISPATCHABLE or (not op["metered"] and not op.get("legacy")):
            f.fail(
                f"gid {gid}: DOWNLOAD sent for an unconfirmed ({op['state']}) operation",
                command=cmd,
                operation=op,
            )
    for source, commands in _command_sequences(world).items():
        _check_no_download_after_delete(f, world, source, commands)
    return f.verdict("{n} DOWNLOAD command(s), all for confirmed submissions", "no DOWNLOAD sent")


def _command_sequences(world: World) -> dict[str, list[dict[str, Any]]]:
    """Every command stream in the order it reached a node: each node's
    database (arrival order) and each proxy's forwarded frames (wire order)."""
    streams: dict[str, list[dict[str, Any]]] = {}
    for node_id, node in world.nodes.items():
        streams[f"{node_id} database"] = [
            {"gid": c["gid"], "action": c["action"], "operation_id": c["operation_id"]}
            for c in node.commands
        ]
    # One stream per node across its proxies (one per site): the proxies run
    # on one reactor thread, so their timestamps order the frames.
    order = sorted(
        world.frames, key=lambda fr: (fr["node"], fr["at"], fr.get("site", ""), fr["seq"])
    )
    for frame in order:
        if frame["direction"] != "to_client" or frame["action"] != "forwarded":
            continue
        payload = frame.get("payload") or {}
        if frame["type"] == TYPE_TASK_COMMAND:
            action, operation_id = payload.get("action"), payload.get("operationId")
        elif frame["type"] == TYPE_DOWNLOAD_POST:
            action, operation_id = "DOWNLOAD", None
        elif frame["type"] == TYPE_DELETE_GALLERY:
            action, operation_id = "DELETE", None
        else:
            continue
        streams.setdefault(f"proxy of {frame['node']}", []).append(
            {"gid": payload.get("gid"), "action": action, "operation_id": operation_id}
        )
    return streams


def _check_no_download_after_delete(
    f: _Failures, world: World, source: str, commands: list[dict[str, Any]]
) -> None:
    """Strict, with no time margin: a DOWNLOAD never follows the DELETE of
    its generation in what a node received.  (The site decides each set of
    commands in a write transaction and sends it right after the commit, so
    a DOWNLOAD decided before a delete is on the wire before its DELETE.)
    Only a later generation (a new CREATE) may be downloaded again."""
    downloaded: dict[int, set[Any]] = defaultdict(set)  # gid -> operationIds before
    deleted: dict[int, set[Any]] = {}  # gid -> generations deleted so far
    for index, cmd in enumerate(commands):
        gid = cmd["gid"]
        if cmd["action"] == "DELETE":
            generations = deleted.setdefault(gid, set())
            generations |= downloaded[gid]
            op = world.site.operations.get(gid)
            if op is not None and op.get("delete_operation_id") == cmd["operation_id"]:
                generations.add(op["operation_id"])
            continue
        if cmd["action"] != "DOWNLOAD":
            continue
        if gid in deleted:
            # A legacy DownloadPost names no operation: after a re-create it
            # may be the new generation's (the simulator checks each DOWNLOAD
            # against the state of its instant as it is sent).
            new_generation = world.ledger.generations.get(gid, 1) > 1 and (
                cmd["operation_id"] is None or cmd["operation_id"] not in deleted[gid]
            )
            if not new_generation:
                f.fail(
                    f"gid {gid}: DOWNLOAD after its DELETE ({source}, command #{index + 1})",
                    source=source,
                    command=cmd,
                    earlier=commands[max(0, index - 5) : index],
                )
        downloaded[gid].add(cmd["operation_id"])


def check_d6(world: World) -> Verdict:
    """Every report ACKed exactly when committed; none lost; duplicates ACKed DUPLICATE."""
    f = _Failures("D6")
    receipts = world.site.receipts
    reports, acks = _reports_and_acks(world)
    for rid, sent in sorted(reports.items()):
        f.checked += 1
        _check_report(
            f,
            rid,
            sent,
            receipts.get(rid),
            acks.get(rid, []),
            world.ledger.wiped_at,
            unkept=rid in world.ledger.unkept_reports,
        )
    for rid, got in sorted(acks.items()):
        if rid not in receipts:
            f.fail(f"ACK for report {rid} without a committed receipt", acks=_brief(got))
    for node_id, node in sorted(world.nodes.items()):
        if node.in_flight is not None:
            f.checked += 1
            rid = node.in_flight["report_id"]
            f.fail(
                f"{node_id} still has report {rid} unacknowledged after settling",
                node=node_id,
                in_flight=node.in_flight,
                receipt=receipts.get(rid),
                acks=_brief(acks.get(rid, [])),
            )
    return f.verdict("{n} report(s): each committed once and ACKed after commit", "no v2 report")


def _reports_and_acks(
    world: World,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """The v2 reports sent and the ACKs answered, by report id."""
    reports: dict[str, list[dict[str, Any]]] = defaultdict(list)
    acks: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for frame in world.frames:
        payload = frame.get("payload") or {}
        rid = payload.get("reportId")
        if frame["type"] == TYPE_TASK_REPORT and frame["direction"] == "to_server" and rid:
            reports[rid].append(frame)
        elif frame["type"] == TYPE_TASK_REPORT_ACK and frame["direction"] == "to_client" and rid:
            acks[rid].append(frame)
    return reports, acks


def _brief(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: fr.get(k) for k in ("node", "site", "seq", "link", "action", "at")}
        | {"result": (fr.get("payload") or {}).get("result")}
        for fr in frames
    ]


def _check_report(
    f: _Failures,
    rid: str,
    sent: list[dict[str, Any]],
    receipt: dict[str, Any] | None,
    acks: list[dict[str, Any]],
    wiped_at: dict[str, list[float]],
    *,
    unkept: bool = False,
) -> None:
    """One report: committed, with the revision sent, ACKed APPLIED at most
    once and first.  A report whose node was wiped since it last sent it
    may be neither committed nor ACKed: the node forgot it with its store
    and will never send it again, nor wait for its ACK; an ``unkept`` one
    (a lie) likewise."""
    last_sent = max(frame.get("at") or 0.0 for frame in sent)
    forgotten = unkept or any(at >= last_sent for at in wiped_at.get(sent[0]["node"], ()))
    if receipt is None:
        if forgotten:
            return
        f.fail(
            f"report {rid} sent by {sent[0]['node']} was never committed (lost)",
            report_id=rid,
            sent=_brief(sent),
            acks=_brief(acks),
        )
        return
    revision = (sent[0].get("payload") or {}).get("revision")
    if revision is not None and receipt["revision"] != revision:
        f.fail(
            f"report {rid}: receipt revision {receipt['revision']} != sent {revision}",
            receipt=receipt,
            sent=_brief(sent),
        )
    results = [(a.get("payload") or {}).get("result") for a in acks]
    if results.count("APPLIED") > 1:
        f.fail(
            f"report {rid} ACKed APPLIED {results.count('APPLIED')} times",
            report_id=rid,
            acks=_brief(acks),
        )
    if "APPLIED" in results and results.index("APPLIED") != 0:
        f.fail(f"report {rid}: APPLIED after a DUPLICATE", report_id=rid, acks=_brief(acks))
    if not acks and not forgotten:
        f.fail(f"report {rid} committed but never ACKed", report_id=rid, sent=_brief(sent))


_VOLATILE = ("updatedAt", "createdAt")


def _task_of(row: dict[str, Any]) -> dict[str, Any]:
    try:
        task = json.loads(row["payload"]).get("task") or {}
    except (ValueError, AttributeError):
        return {}
    return task if isinstance(task, dict) else {}


def check_d7(world: World) -> Verdict:
    """No notification lost across a crash, none duplicated by a replayed report."""
    f = _Failures("D7")
    by_gid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in world.site.outbox:
        by_gid[row["gid"]].append(row)
    for gid, rows in sorted(by_gid.items()):
        _check_no_repeats(f, gid, rows)
    _check_announced(f, world, by_gid)
    if world.webhook is not None:
        _check_webhook_received(f, world, world.webhook)
    return f.verdict("{n} notification(s): none lost, none repeated", "no notification")


def _check_no_repeats(f: _Failures, gid: int, rows: list[dict[str, Any]]) -> None:
    """No notification of ``gid`` repeats the one before; one 下载完成 per generation."""
    previous_row: dict[str, Any] | None = None
    previous_task: dict[str, Any] | None = None
    completed: Counter[str] = Counter()
    for row in rows:
        f.checked += 1
        task = {k: v for k, v in _task_of(row).items() if k not in _VOLATILE}
        if previous_row is not None and task == previous_task:
            f.fail(
                f"gid {gid}: notification {row['id']} repeats {previous_row['id']}",
                gid=gid,
                first=previous_row,
                repeat=row,
            )
        previous_row, previous_task = row, task
        if task.get("status") == "COMPLETED":
            completed[str(task.get("operationId"))] += 1
    for operation_id, count in completed.items():
        if count > 1:
            f.fail(
                f"gid {gid}: {count} 下载完成 notifications for operation {operation_id}",
                gid=gid,
                rows=[r for r in rows if _task_of(r).get("status") == "COMPLETED"],
            )


def _check_announced(f: _Failures, world: World, by_gid: dict[int, list[dict[str, Any]]]) -> None:
    """Every task shown 下载完成, DELETED or UNKNOWN has a notification saying so."""

    def announced(gid: int, key: str, value: Any, operation_id: Any = None) -> bool:
        return any(
            task.get(key) == value
            and (operation_id is None or task.get("operationId") == operation_id)
            for task in map(_task_of, by_gid.get(gid, []))
        )

    for gid, gallery in sorted(world.site.galleries.items()):
        op = world.site.operations.get(gid) or {}
        if gallery.get("status") == COMPLETED_CODE:
            f.checked += 1
            if not announced(gid, "status", "COMPLETED", op.get("operation_id")):
                f.fail(
                    f"gid {gid}: shown 下载完成 but no such notification",
                    gid=gid,
                    gallery=gallery,
                    outbox=by_gid.get(gid, []),
                )
    for gid, op in sorted(world.site.operations.items()):
        if op["state"] in ("DELETED", "UNKNOWN"):
            f.checked += 1
            if not announced(gid, "state", op["state"]):
                f.fail(
                    f"gid {gid}: {op['state']} but no notification says so",
                    gid=gid,
                    operation=op,
                    outbox=by_gid.get(gid, []),
                )


def _check_webhook_received(f: _Failures, world: World, webhook: list[Any]) -> None:
    # Delivery is at least once (a crash between POST and bookkeeping
    # resends), so a repeat at the receiver is allowed; a gap is not.
    received = Counter(str(w.get("id")) for w in webhook if isinstance(w, dict))
    for row in world.site.outbox:
        if str(row["id"]) not in received:
            f.fail(
                f"notification {row['id']} (gid {row['gid']}) never reached the webhook"
                f" (outbox says {row.get('webhook_state')})",
                row=row,
                received_ids=sorted(received, key=lambda i: int(i) if i.isdigit() else -1),
            )


def check_d8(world: World) -> Verdict:
    """No task was changed by a node it was not assigned to (status,
    progress, revision, delete).

    Every task's stored revision must come from a report of its own node
    (the receipts say who sent which revision); and for every entry the
    scenario forged (``Ledger.forged``) the forged revision is nowhere, a
    forged status is shown only if the owning node holds the task in that
    status itself, and a forged delete confirmation completed nothing the
    owning node still holds."""
    f = _Failures("D8")
    _check_revisions_from_owner(f, world)
    for forged in world.ledger.forged:
        gid, node_id = int(forged["gid"]), str(forged["node"])
        op, gallery = world.site.operations.get(gid) or {}, world.site.galleries.get(gid)
        owner = (gallery or {}).get("node_id")
        f.checked += 1
        if owner == node_id:
            f.fail(f"gid {gid}: assigned to the forging node {node_id}", forged=forged)
            continue
        if op.get("last_revision") == forged["revision"]:
            f.fail(
                f"gid {gid}: stores the revision {forged['revision']} {node_id} forged",
                forged=forged,
                operation=op,
            )
        if "status" in forged and gallery is not None:
            _check_forged_status(f, world, forged, op, gallery, owner)
        if "delete_operation_id" in forged and op.get("state") == "DELETED":
            _check_forged_delete(f, world, forged, op)
    return f.verdict("{n} task(s) changed only by their own node", "no revision, no forgery")


def _check_revisions_from_owner(f: _Failures, world: World) -> None:
    """Each stored revision was sent by the task's own node (per the receipts)."""
    senders: dict[int, set[str]] = defaultdict(set)  # revision -> nodes that sent it
    for receipt in world.site.receipts.values():
        senders[int(receipt["revision"])].add(str(receipt["node_id"]))
    for gid, op in sorted(world.site.operations.items()):
        gallery = world.site.galleries.get(gid)
        revision = op.get("last_revision")
        if gallery is None or revision is None or not gallery.get("node_id"):
            continue
        f.checked += 1
        who = senders.get(int(revision), set())
        if who and gallery["node_id"] not in who:
            f.fail(
                f"gid {gid}: its revision {revision} came from {sorted(who)},"
                f" not from its node {gallery['node_id']}",
                gid=gid,
                gallery=gallery,
                operation=op,
            )


def _check_forged_status(
    f: _Failures,
    world: World,
    forged: dict[str, Any],
    op: dict[str, Any],
    gallery: dict[str, Any],
    owner: Any,
) -> None:
    """A forged status is shown only if the owning node holds the task so itself."""
    gid, node_id = int(forged["gid"]), str(forged["node"])
    owner_task = world.nodes[owner].tasks.get(gid) if owner in world.nodes else None
    shown = (gallery.get("status"), float(gallery.get("progress") or 0))
    held = (
        None
        if owner_task is None
        else (owner_task.get("status"), float(owner_task.get("progress") or 0))
    )
    if held is None and owner in world.nodes and op.get("operation_id"):
        # A completion ACKed leaves the node's queue; its archive stays.
        data = DataDir(world.node_dirs[owner])
        if world.nodes[owner].holds_archive(gid, str(op["operation_id"]), data):
            held = (COMPLETED_CODE, 1.0)
    if shown == (forged["status"], float(forged["progress"])) and shown != held:
        f.fail(
            f"gid {gid}: shows what {node_id} forged ({shown}), its node {owner} holds {held}",
            forged=forged,
            gallery=gallery,
            owner_task=owner_task,
        )


def _check_forged_delete(
    f: _Failures, world: World, forged: dict[str, Any], op: dict[str, Any]
) -> None:
    """A task DELETED after a forged confirmation is held by no node."""
    gid, node_id = int(forged["gid"]), str(forged["node"])
    for other_id, node in sorted(world.nodes.items()):
        data = DataDir(world.node_dirs[other_id])
        task = node.tasks.get(gid)
        archive = data.archive_path(gid, str(op.get("operation_id"))).name
        if archive in node.archives or (
            task and task.get("operation_id") == op.get("operation_id")
        ):
            f.fail(
                f"gid {gid}: DELETED (a delete {node_id} forged?) while {other_id} still holds it",
                forged=forged,
                node_task=task,
            )


# -- D9, D10: several sites on one database --------------------------------------------


def db_time(text: Any) -> float | None:
    """A timestamp the site database wrote (ISO 8601 UTC, as the engine's {now} writes
    it) as wall-clock seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _run_of(world: World, instance: dict[str, Any] | None) -> dict[str, Any] | None:
    """The site process run behind a ``site_instance`` row: same --name and
    pid, the latest one started before the row was (pids may be reused)."""
    if instance is None:
        return None
    started = db_time(instance.get("started_at"))
    runs = [
        r
        for r in world.ledger.site_runs
        if r.get("pid") == instance.get("pid") and r.get("site") == instance.get("name")
    ]
    if started is not None:
        runs = [r for r in runs if r["started"] <= started + 1.0] or runs
    return max(runs, key=lambda r: r["started"]) if runs else None


def _end_of(run: dict[str, Any]) -> float | None:
    """When the run was gone as far as the database can tell: its process
    ended, or, if earlier, the drill ended its lease by hand while it was
    stopped (``fenced``, S23: a site paused past its lease is gone for the
    other sites, and all it may do on waking is stop).  None while it runs."""
    ends = [t for t in (run.get("ended"), run.get("fenced")) if t is not None]
    return min(ends) if ends else None


def _alive_at(run: dict[str, Any], moment: float) -> bool:
    """Whether the run's process was alive, holding its lease, at ``moment``
    (it was until the drill signalled it or ended its lease; a row it wrote
    proves it had started)."""
    end = _end_of(run)
    return end is None or moment < end


def _reap_deadline(world: World, run: dict[str, Any]) -> float | None:
    """When a dead run's submissions must be settled by: 30 s after it
    died, or after another site process was first alive to do it (a single
    site restarted later settles them at its start).  None while it runs,
    or when no other site ever ran after it."""
    end = _end_of(run)
    if end is None:
        return None
    could: list[float] = []
    for other in world.ledger.site_runs:
        if other is run:
            continue
        other_end = _end_of(other)
        if other["started"] <= end and (other_end is None or other_end > end):
            could.append(end)
        elif other["started"] > end:
            could.append(other["started"])
    if not could:
        return None
    first = min(could)
    for start, stop in sorted(world.ledger.database_down):
        if start <= first + REAP_BOUND and stop > first:
            first = max(first, stop)  # no site could reap while no server took writes
    return first + REAP_BOUND


def _who(instance_id: Any, world: World) -> str:
    row = world.site.instances.get(instance_id)
    if row is None:
        return f"instance {instance_id}"
    return f"instance {instance_id} ({row.get('name')}, pid {row.get('pid')})"


def check_d9(world: World) -> Verdict:
    """No live site's SUBMITTING/RESERVED was settled by another site; a
    dead site's were, within 30 s.

    Evidence: ``instance_reap`` (one row per generation settled for a gone
    instance: whose, by whom, when, from which state), ``site_instance``
    (which instance is which process; reaped or ended), the in-flight
    operations' ``instance_id``, and the drill's record of when each site
    process ran (:attr:`Ledger.site_runs`).  A site whose lease the drill
    ended by hand while it was stopped (S23) counts as dead from then on:
    reaping it is what must happen, whatever it does when it resumes."""
    f = _Failures("D9")
    if "site_instance" not in world.site.tables:
        return Verdict("D9", NA, "no instance records (schema before v4)")
    instances = world.site.instances
    settled: list[dict[str, Any]] = []
    for reap in world.site.reaps:
        gone = reap.get("instance_id")
        if gone is None:
            continue  # a generation written before v4: no instance to judge
        f.checked += 1
        settled.append(_settled_entry(world, reap))
        run = _run_of(world, instances.get(gone))
        reaped_at = db_time(reap.get("reaped_at"))
        what = f"gid {reap['gid']}: {reap['from_state']} of {_who(gone, world)}"
        if run is None or reaped_at is None:
            f.fail(f"{what} settled, but that instance is no site run of the drill", reap=reap)
            continue
        if _alive_at(run, reaped_at):
            f.fail(
                f"{what} settled by {_who(reap['reaped_by'], world)} while its site was alive",
                reap=reap,
                run=run,
                instance=instances.get(gone),
            )
        deadline, died = _reap_deadline(world, run), _end_of(run)
        if deadline is not None and died is not None and reaped_at > deadline:
            f.fail(
                f"{what} settled {reaped_at - died:.1f} s after its site died"
                f" (bound: {REAP_BOUND:.0f} s once a site could)",
                reap=reap,
                run=run,
            )
    _check_dead_instances_settled(f, world)
    f.checked += _recoveries_beside_live_instances(world)
    return f.verdict(
        "{n} check(s): only dead instances' submissions settled, each in time",
        "no site instance died or started beside another",
        settled,
    )


def _recoveries_beside_live_instances(world: World) -> int:
    """How many times an instance started (and ran its recovery) while
    another was alive: each a chance to settle a live site's generations,
    which the reap rows above would show."""
    starts = {key: db_time(row.get("started_at")) for key, row in world.site.instances.items()}
    count = 0
    for key, row in world.site.instances.items():
        run = _run_of(world, row)
        if run is None:
            continue
        # Another instance (by its row: two may start within one millisecond).
        count += sum(
            1
            for other, start in starts.items()
            if other != key
            and start is not None
            and start > run["started"]
            and _alive_at(run, start)
        )
    return count


def _settled_entry(world: World, reap: dict[str, Any]) -> dict[str, Any]:
    """One line of D9's evidence: what was settled, whose, by whom, when."""
    gone = world.site.instances.get(reap["instance_id"]) or {}
    by = world.site.instances.get(reap["reaped_by"]) or {}
    run = _run_of(world, gone or None)
    reaped_at = db_time(reap.get("reaped_at"))
    died = _end_of(run) if run else None
    return {
        "what": "settled",
        "gid": reap.get("gid"),
        "operation_id": reap.get("operation_id"),
        "from_state": reap.get("from_state"),
        "outcome": reap.get("outcome"),
        "instance": reap.get("instance_id"),
        "instance_site": gone.get("name"),
        "reaped_by": reap.get("reaped_by"),
        "reaped_by_site": by.get("name"),
        "reaped_at": reap.get("reaped_at"),
        "seconds_after_death": (
            round(reaped_at - died, 3) if reaped_at is not None and died is not None else None
        ),
    }


def _check_dead_instances_settled(f: _Failures, world: World) -> None:
    """Every instance whose process died: once reaped (or ended), none of
    its generations in flight; past its deadline, reaped (or ended)."""
    in_flight: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for op in world.site.operations.values():
        if op.get("state") in IN_FLIGHT and op.get("instance_id") is not None:
            in_flight[op["instance_id"]].append(op)
    for instance_id, row in sorted(world.site.instances.items()):
        run = _run_of(world, row)
        died = None if run is None else _end_of(run)
        if run is None or died is None:
            continue
        closed = row.get("ended_at") is not None or row.get("reaped_at") is not None
        deadline = _reap_deadline(world, run)
        due = deadline is not None and world.observed_at >= deadline
        if not closed and not due:
            continue  # nobody could settle it yet, or not yet due
        f.checked += 1
        left = in_flight.get(instance_id, [])
        if left:
            f.fail(
                f"{_who(instance_id, world)} died at {died:.3f}; {len(left)}"
                f" generation(s) still {sorted({o['state'] for o in left})}"
                + (" after it was reaped" if closed else " past the bound"),
                instance=row,
                run=run,
                operations=left,
            )
        if not closed:
            f.fail(
                f"{_who(instance_id, world)} died at {died:.3f} and was not reaped"
                f" within {REAP_BOUND:.0f} s",
                instance=row,
                run=run,
            )


def check_d10(world: World) -> Verdict:
    """At rest every connected node is held by exactly one site, and no
    task is assigned to two nodes.

    Evidence: ``node_session`` (the holder of each node), each live site's
    ``/api/admin/nodes`` (every node once, with its holder), the connections
    each node's proxies hold open, the holder's instance, and every node's
    tasks and received DOWNLOADs against the site's assignment."""
    f = _Failures("D10")
    for site, listed in sorted(world.site_listings.items()):
        counts = Counter(str(n.get("id")) for n in listed)
        for node_id, count in sorted(counts.items()):
            if count > 1:
                f.fail(f"{site} lists {node_id} {count} times", site=site, nodes=listed)
    live = world.live_nodes if world.live_nodes is not None else set(world.nodes)
    for node_id in sorted(live):
        f.checked += 1
        _check_held_once(f, world, node_id)
    _check_one_node_per_task(f, world)
    return f.verdict(
        "{n} check(s): each node held by one site, each task on one node", "no node, no task"
    )


def _check_held_once(f: _Failures, world: World, node_id: str) -> None:
    session = world.site.node_sessions.get(node_id)
    holder = session.get("site_name") if session and session.get("connected_at") else None
    evidence: dict[str, Any] = {
        "node": node_id,
        "node_session": session,
        "listings": {
            site: [n for n in listed if str(n.get("id")) == node_id]
            for site, listed in world.site_listings.items()
        },
        "open_links": world.node_links.get(node_id),
    }
    if "node_session" in world.site.tables and holder is None:
        f.fail(f"{node_id} runs, but no site holds it (node_session)", **evidence)
    for site, entries in sorted(evidence["listings"].items()):
        shown = [n.get("site") for n in entries if n.get("connected")]
        if len(shown) != 1 or (holder is not None and shown[0] != holder):
            f.fail(
                f"{site} shows {node_id} held by {shown or 'no site'}, node_session says {holder}",
                **evidence,
            )
    links = {s: k for s, k in (world.node_links.get(node_id) or {}).items() if k}
    if node_id in world.node_links and (
        sum(links.values()) != 1 or (holder is not None and holder not in links)
    ):
        f.fail(
            f"{node_id} has {sum(links.values())} open connection(s) ({links}),"
            f" held by {holder}: expected one, to its holder",
            **evidence,
        )
    if session and holder is not None and session.get("instance_id") is not None:
        instance = world.site.instances.get(session["instance_id"])
        run = _run_of(world, instance)
        if instance is not None and (run is None or not _alive_at(run, world.observed_at)):
            f.fail(
                f"{node_id} held by {_who(session['instance_id'], world)}, which is not running",
                run=run,
                **evidence,
            )


def _check_one_node_per_task(f: _Failures, world: World) -> None:
    """Each current generation is on (was sent to) one node: the one it is
    assigned to.  A node that was sent a ``CANCEL`` of the generation after
    its ``DOWNLOAD`` (its task moved to another node: DELIVERY.md "A node
    that is gone") no longer counts, unless it still holds the task."""
    held: dict[tuple[int, str], set[str]] = defaultdict(set)
    for node_id, node in world.nodes.items():
        for gid, task in node.tasks.items():
            if task.get("operation_id"):
                held[(gid, str(task["operation_id"]))].add(node_id)
        sent: set[tuple[int, str]] = set()
        for cmd in node.commands:  # in the order received
            if not cmd.get("operation_id"):
                continue
            key = (int(cmd["gid"]), str(cmd["operation_id"]))
            if cmd.get("action") == "DOWNLOAD":
                sent.add(key)
            elif cmd.get("action") == "CANCEL":
                sent.discard(key)
        for gid, operation_id in sent:
            held[(gid, operation_id)].add(node_id)
    for gid, op in sorted(world.site.operations.items()):
        if op.get("state") not in ("SUBMITTED", "DELETE_PENDING"):
            continue
        nodes = held.get((gid, str(op.get("operation_id"))), set())
        if not nodes:
            continue
        f.checked += 1
        assigned = (world.site.galleries.get(gid) or {}).get("node_id")
        if len(nodes) > 1:
            f.fail(
                f"gid {gid}: operation {op['operation_id']} on {len(nodes)} nodes"
                f" ({', '.join(sorted(nodes))})",
                gid=gid,
                operation=op,
                assigned=assigned,
            )
        elif assigned is not None and assigned not in nodes:
            f.fail(
                f"gid {gid}: on {', '.join(sorted(nodes))} but assigned to {assigned}",
                gid=gid,
                operation=op,
            )


CHECKS: dict[str, Callable[[World], Verdict]] = {
    "D1": check_d1,
    "D2": check_d2,
    "D3": check_d3,
    "D4": check_d4,
    "D5": check_d5,
    "D6": check_d6,
    "D7": check_d7,
    "D8": check_d8,
    "D9": check_d9,
    "D10": check_d10,
}
INVARIANTS = tuple(CHECKS)


def check_all(world: World) -> list[Verdict]:
    """Every invariant; a check that crashes is a FAIL that says so."""
    verdicts = []
    for name, check in CHECKS.items():
        try:
            verdicts.append(check(world))
        except Exception as err:  # noqa: BLE001 - a broken check must show, not abort the run
            verdicts.append(Verdict(name, FAIL, f"check crashed: {type(err).__name__}: {err}"))
    return verdicts
