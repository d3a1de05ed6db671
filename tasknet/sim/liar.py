"""A node that lies within its rights (issue 39): the ``liar_node`` kind.

A real v2 node whose link also carries, from the instant the schedule
makes it a liar, frames the world writes in its name on its own
connection (after its login and the site's proof, as a node whose store or
clock misleads it could send them).  The protocol says what the site does
with each (PROTOCOL.md "Reliable reports", "Ownership"); none may change a
thing:

* ``replay``: a report the site already ACKed, sent again unchanged: the
  site answers ``DUPLICATE``;
* ``repeat``: a new report with the revision of one the site already
  ACKed (an entry at or below the stored revision is dropped);
* ``lower``: a new report with a revision below it (dropped);
* ``foreign``: a report of another node's task, at a revision above the
  stored one (dropped: ``not_owner``);
* ``wrong_delete``: as a ``DELETE`` reaches it, a confirmation of that
  delete with another delete id (it completes nothing);
* ``complete``: as a ``DOWNLOAD`` reaches it, a completion (status 4, a
  size and a sha256 it made up) of that task, whose command its code then
  never sees (:meth:`LyingNodes.rewrite`): it never downloads it.

Each lie's entries but ``complete``'s carry ``detail`` ``lie: KIND …``,
which no honest report carries: a gallery row that shows it was changed by
a lie.  Lies are told right after the site ACKs one of the node's honest
reports, so that report is committed and the lie judged against it.
:class:`LyingNodes` tells them and checks, at each lie's ACK (after its
commit), that it changed nothing: the check ``lie-applied``.

A completion is the node's to report: the site cannot tell it from a true
one and applies it (下载完成).  What must hold instead is downstream of it:
a fetch of the archive is refused, never answered with wrong bytes (the
check ``archive-served``), and the node's next inventory (on its next
connection) makes the task ``ARCHIVE_GONE`` ``MISSING`` unless the node has
downloaded it meanwhile (the custody check, which excuses the claim only
while the connection it was told on lasts: :meth:`LyingNodes.excused`).
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable, Iterable
from typing import Any

from tasknet.sim.network import SimConnection
from tasknet.sim.world import World

__all__ = ["LIES", "LyingNodes", "report_frame"]

TYPE_TASK_COMMAND = 11
TYPE_TASK_REPORT = 12
TYPE_TASK_REPORT_ACK = 13
#: A frame's header: type (1 byte), length (4).
_HEADER = 5
#: The lies, in the order a seed's generator picks among them.
LIES = ("replay", "repeat", "lower", "foreign", "wrong_delete", "complete")
#: The lies told as a command of an action reaches the node (the others
#: follow an honest report's ACK).
_COMMAND_LIES = {"DELETE": "wrong_delete", "DOWNLOAD": "complete"}
#: How often an honest report's ACK (or a command) is followed by a lie.
LIE_CHANCE = 0.8
#: How often a liar claims a task it was sent (fewer: it never downloads them).
COMPLETE_CHANCE = 0.3
#: What marks a lie's entries (``galleryTasks[].detail``).
MARK = "lie: "


def report_frame(payload: dict[str, Any]) -> bytes:
    """A ``TaskReport`` frame (PROTOCOL.md "Frame"): type, length, compact JSON."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return struct.pack(">BI", TYPE_TASK_REPORT, len(body)) + body


class LyingNodes:
    """Tells the lies of the liar nodes and judges them (see the module doc).

    ``one(sql, params)``: a row of the committed site database, or None;
    ``fail(check, detail)``: a failure of the run; ``fired(kind)``: counts
    a lie told."""

    def __init__(
        self,
        world: World,
        seed: int,
        one: Callable[[str, tuple[Any, ...]], Any],
        fail: Callable[[str, str], None],
        fired: Callable[[str], None],
    ) -> None:
        self.world = world
        self._rng = random.Random(f"lies {seed}")
        self._one = one
        self._fail = fail
        self._fired = fired
        #: node -> the lies it tells (a subset of LIES).
        self.liars: dict[str, tuple[str, ...]] = {}
        #: node -> (connection id, payload) of its honest reports ACKed.
        self._acked: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        #: node -> payloads of its honest reports sent and not ACKed yet, by id.
        self._sent: dict[str, dict[str, dict[str, Any]]] = {}
        #: The report id of every lie told (kept by no node until ACKed).
        self.report_ids: set[str] = set()
        #: lie report id -> (node, kind, what it said, gids it names), until its ACK.
        self._told: dict[str, tuple[str, str, str, list[int]]] = {}
        #: node -> gids whose right delete confirmation it sent itself.
        self._confirmed: dict[str, set[int]] = {}
        #: (gid, operation id) -> (node, connection id) of each completion
        #: claimed without a download.
        self.claimed: dict[tuple[int, str], tuple[str, int]] = {}
        #: Nodes whose commands pass through :meth:`rewrite`, from their
        #: first byte on (so frames are split right from the start).
        self._armed: set[str] = set()
        #: connection id -> bytes of a command not whole yet.
        self._partial: dict[int, bytearray] = {}
        #: (connection id, operation id) of DOWNLOADs the node is not to see.
        self._unseen: set[tuple[int, str]] = set()
        #: (connection id, operation id) -> a DOWNLOAD kept from the node until
        #: its claim is judged (given to it after all if the site dropped the claim).
        self._withheld: dict[tuple[int, str], bytes] = {}
        #: connection id -> the revision of the last completion claimed on it.
        self._claimed_revision: dict[int, int] = {}
        self._node_link: Callable[[SimConnection], bool] = lambda connection: False
        self._ids = 0

    def arm(self, node: str, node_link: Callable[[SimConnection], bool]) -> None:
        """``node`` will lie: split the commands sent to it from now on on
        the connections ``node_link`` says are to a site's node listener."""
        self._armed.add(node)
        self._node_link = node_link

    def make_liar(self, node: str, lies: tuple[str, ...] = LIES) -> None:
        self.liars[node] = lies

    def rewrite(self, connection: SimConnection, receiver: Any, data: bytes) -> bytes:
        """What an armed node's code is given of ``data`` (a
        :attr:`~tasknet.sim.network.Network.rewrites` hook): whole frames
        only, less the ``DOWNLOAD`` commands it claimed complete instead."""
        if (
            receiver is not connection.client
            or connection.client.reactor.name not in self._armed
            or not self._node_link(connection)
        ):
            return data
        pending = self._partial.setdefault(connection.id, bytearray())
        pending += data
        given = bytearray()
        while len(pending) >= _HEADER:
            end = _HEADER + struct.unpack_from(">I", pending, 1)[0]
            if len(pending) < end:
                break
            frame = bytes(pending[:end])
            del pending[:end]
            if not self._unseen or frame[0] != TYPE_TASK_COMMAND:
                given += frame
                continue
            try:
                operation_id = str(json.loads(frame[_HEADER:]).get("operationId"))
            except ValueError:
                operation_id = ""
            if (connection.id, operation_id) in self._unseen:
                self._unseen.discard((connection.id, operation_id))
                self._withheld[(connection.id, operation_id)] = frame
            else:
                given += frame
        return bytes(given)

    # -- what crosses the liars' links (the cluster's frame records) ---------------------

    def frame(self, record: dict[str, Any]) -> None:
        node = record["node"]
        if node not in self.liars:
            return
        payload = record["payload"] if isinstance(record["payload"], dict) else {}
        type_, direction = record["type"], record["direction"]
        if type_ == TYPE_TASK_REPORT and direction == "to_server":
            self._honest_report(node, payload)
        elif type_ == TYPE_TASK_REPORT_ACK and direction == "to_client":
            self._acked_now(node, record["link"], payload)
        elif type_ == TYPE_TASK_COMMAND and direction == "to_client":
            # The lies told as a command reaches the node.
            kind = _COMMAND_LIES.get(str(payload.get("action")))
            chance = COMPLETE_CHANCE if kind == "complete" else LIE_CHANCE
            if kind in self.liars[node] and self._rng.random() < chance:
                lie = getattr(self, f"_{kind}")(node, record["link"], payload)
                if lie is not None:
                    self._tell(node, record["link"], kind, lie)

    def _honest_report(self, node: str, payload: dict[str, Any]) -> None:
        report_id = str(payload.get("reportId", ""))
        if report_id in self._told:
            return  # our own lie, seen on the wire
        self._sent.setdefault(node, {})[report_id] = payload
        for deleted in payload.get("deleted") or []:
            if deleted.get("result") in ("DELETED", "NOT_FOUND"):
                self._confirmed.setdefault(node, set()).add(int(deleted.get("gid", -1)))

    def _acked_now(self, node: str, link: int, ack: dict[str, Any]) -> None:
        report_id = str(ack.get("reportId", ""))
        told = self._told.pop(report_id, None)
        if told is not None:
            self._judge(report_id, told, str(ack.get("result")))
            return
        payload = self._sent.get(node, {}).pop(report_id, None)
        if payload is None:
            return
        self._acked.setdefault(node, []).append((link, payload))
        if self._rng.random() >= LIE_CHANCE:
            return
        kinds = [k for k in self.liars[node] if k not in _COMMAND_LIES.values()]
        if not kinds:
            return
        kind = self._rng.choice(kinds)
        lie = getattr(self, f"_{kind}")(node, link, payload)
        if lie is not None:
            self._tell(node, link, kind, lie)

    # -- the lies -------------------------------------------------------------------------

    def _new_id(self) -> str:
        self._ids += 1
        return f"{self._rng.getrandbits(96):024x}{self._ids:08x}"

    def _marked(self, payload: dict[str, Any], kind: str, revision: int) -> dict[str, Any]:
        # The entries as the ACKed report had them, but for the mark (a
        # status moved backwards would be dropped for that alone).
        tasks = [
            {**t, "detail": f"{MARK}{kind} at revision {revision}"}
            for t in payload.get("galleryTasks") or []
            if isinstance(t, dict) and "gid" in t
        ]
        return {
            "reportId": self._new_id(),
            "revision": revision,
            "galleryTasks": tasks,
            "operationIds": dict(payload.get("operationIds") or {}),
            "deleted": [],
        }

    def _replay(self, node: str, link: int, payload: dict[str, Any]) -> dict[str, Any] | None:
        earlier = [p for l_, p in self._acked.get(node, []) if l_ == link]
        return dict(self._rng.choice(earlier)) if earlier else None

    def _repeat(self, node: str, link: int, payload: dict[str, Any]) -> dict[str, Any] | None:
        lie = self._marked(payload, "repeat", int(payload.get("revision", 0)))
        return lie if lie["galleryTasks"] else None

    def _lower(self, node: str, link: int, payload: dict[str, Any]) -> dict[str, Any] | None:
        lie = self._marked(payload, "lower", int(payload.get("revision", 0)) - 1)
        return lie if lie["galleryTasks"] else None

    def _foreign(self, node: str, link: int, payload: dict[str, Any]) -> dict[str, Any] | None:
        row = self._one(
            "SELECT g.gid, o.operation_id, o.last_revision, g.node_id FROM gallery g"
            " JOIN task_operation o ON o.gid = g.gid WHERE o.state = 'SUBMITTED'"
            " AND g.node_id IS NOT NULL AND g.node_id <> ? AND COALESCE(g.status, 1) < 4"
            " ORDER BY g.gid",
            (node,),
        )
        if row is None:
            return None
        gid, operation_id, stored, owner = int(row[0]), str(row[1]), row[2], row[3]
        status = self._one("SELECT status, progress FROM gallery WHERE gid = ?", (gid,))
        revision = max(int(stored or 0), int(payload.get("revision", 0))) + 1
        return {
            "reportId": self._new_id(),
            "revision": revision,
            "galleryTasks": [
                {
                    "gid": gid,
                    # Its status as the site shows it (a move backwards is dropped apart).
                    "status": int(status[0] or 1) if status else 1,
                    "progress": float(status[1] or 0) if status else 0.0,
                    "detail": f"{MARK}foreign ({owner}'s task) at revision {revision}",
                }
            ],
            "operationIds": {str(gid): operation_id},
            "deleted": [],
        }

    def _complete(self, node: str, link: int, command: dict[str, Any]) -> dict[str, Any] | None:
        operation_id = command.get("operationId")
        row = self._one(
            "SELECT o.last_revision FROM gallery g JOIN task_operation o ON o.gid = g.gid"
            " WHERE g.gid = ? AND o.operation_id = ? AND o.state = 'SUBMITTED'"
            " AND g.node_id = ? AND COALESCE(g.status, 1) < 4 AND g.archive_gone_reason IS NULL",
            (command.get("gid"), operation_id, node),
        )
        if row is None:
            return None  # done, moved or deleted meanwhile
        return {
            "reportId": self._new_id(),
            # Past what the site stored for it (_tell raises it past the link's last).
            "revision": int(row[0] or 0) + 1,
            "galleryTasks": [
                {
                    "gid": int(command["gid"]),
                    "status": 4,
                    "progress": 1.0,
                    "size": self._rng.randint(1, 1 << 20),
                    "sha256": f"{self._rng.getrandbits(256):064x}",
                }
            ],
            "operationIds": {str(command["gid"]): str(operation_id)},
            "deleted": [],
        }

    def _settle_claim(self, gids: list[int]) -> None:
        """A claim's ACK: applied, it stands (the command stays unseen);
        dropped (a revision overtaken, the task moved), the node is given
        the command after all, as if it had arrived late."""
        for key, (_node, link) in list(self.claimed.items()):
            if key[0] not in gids or (link, key[1]) not in self._withheld:
                continue
            frame = self._withheld.pop((link, key[1]))
            row = self._one(
                "SELECT g.status FROM gallery g JOIN task_operation o ON o.gid = g.gid"
                " WHERE g.gid = ? AND o.operation_id = ?",
                key,
            )
            if row is not None and row[0] == 4:
                continue
            del self.claimed[key]
            connection = self.world.network.connections.get(link)
            if connection is not None:
                connection.client.give(frame)
                self.world.note("world", f"liar's claim of gid {key[0]} dropped: command given")

    def excused(self, open_links: Iterable[int]) -> set[tuple[int, str]]:
        """The generations claimed complete without a download on a
        connection still open: the site has had no inventory of that node
        since (one is sent per connection), so it rightly shows them 下载完成."""
        still = set(open_links)
        return {key for key, (_node, link) in self.claimed.items() if link in still}

    def _wrong_delete(self, node: str, link: int, command: dict[str, Any]) -> dict[str, Any]:
        return {
            "reportId": self._new_id(),
            "revision": 0,
            "galleryTasks": [],
            "operationIds": {},
            "deleted": [
                {
                    "gid": command.get("gid"),
                    "operationId": f"{self._rng.getrandbits(128):032x}",
                    "result": "DELETED",
                    "reason": "",
                }
            ],
        }

    def _tell(self, node: str, link: int, kind: str, lie: dict[str, Any]) -> None:
        connection: SimConnection | None = self.world.network.connections.get(link)
        if connection is None or not connection.client.connected:
            return
        if kind in _COMMAND_LIES.values():
            # Only once an honest report was ACKed on this link (so the lie is
            # not the link's first report, which may start a revision epoch),
            # at that report's revision at least.
            sent = [p for l_, p in self._acked.get(node, []) if l_ == link]
            if not sent:
                return
            last = int(sent[-1].get("revision", 0))
            if kind == "complete":
                # It must pass the revision check: above every report the
                # site has had from the node (those not ACKed yet and its
                # other claims included).
                unacked = [int(p.get("revision", 0)) for p in self._sent.get(node, {}).values()]
                last = max(last, self._claimed_revision.get(link, 0), *unacked) + 1
                self._claimed_revision[link] = last
            # (A delete confirmation is not judged by its revision.)
            lie["revision"] = max(int(lie["revision"]), last)
        gids = [int(t["gid"]) for t in lie.get("galleryTasks") or []]
        gids += [int(d["gid"]) for d in lie.get("deleted") or [] if d.get("gid") is not None]
        what = f"{kind} report {lie['reportId']} at revision {lie['revision']} naming gid(s) {gids}"
        self.told(str(lie["reportId"]), node, kind, what, gids)
        self.report_ids.add(str(lie["reportId"]))
        if kind == "complete":
            for gid_text, operation_id in lie["operationIds"].items():
                self.claimed[(int(gid_text), operation_id)] = (node, link)
                self._unseen.add((link, operation_id))
        self._fired("liar_node")
        self.world.note("fault", f"{node} lies: {what}")
        connection.client.write(report_frame(lie))

    # -- the check: a lie changes nothing ---------------------------------------------------

    def told(self, report_id: str, node: str, kind: str, what: str, gids: list[int]) -> None:
        """``node`` sent lie ``report_id`` (``kind``, naming ``gids``): judged at its ACK."""
        self._told[report_id] = (node, kind, what, gids)

    def _judge(self, report_id: str, told: tuple[str, str, str, list[int]], result: str) -> None:
        node, kind, what, gids = told
        if kind == "complete":
            self._settle_claim(gids)
            return  # the site's to apply: judged downstream (module doc)
        if kind == "replay":
            if result != "DUPLICATE":
                self._fail("lie-applied", f"{node}'s {what}: ACKed {result}, not DUPLICATE")
            return
        for gid in gids:
            if kind == "wrong_delete":
                row = self._one("SELECT state FROM task_operation WHERE gid = ?", (gid,))
                if (
                    row is not None
                    and row[0] == "DELETED"
                    and gid not in self._confirmed.get(node, set())
                ):
                    self._fail(
                        "lie-applied",
                        f"{node}'s {what}: gid {gid} DELETED by a confirmation of another"
                        " delete id",
                    )
                continue
            row = self._one("SELECT detail FROM gallery WHERE gid = ?", (gid,))
            if row is not None and str(row[0] or "").startswith(MARK):
                self._fail("lie-applied", f"{node}'s {what}: gid {gid} now shows {row[0]!r}")
