"""The node's archive inventory (PROTOCOL.md "Archives (v2)", types 16 and 17).

On every v2 link, once it is up (logged in and, with ``site-proof``, the
site proven: the link is handed over only then), the node sends every archive
row it holds as ``ArchiveInventory`` parts under a fresh ``inventoryId``: at
most :data:`INVENTORY_PART_MAX` archives a part, in (gid, operationId) order,
and always at least one part (an empty inventory is one part with none), so
the site can compare what it believes the node holds with what is on disk and
judge a wiped, restored or swapped data directory (DELIVERY.md "Custody").
The parts go out at once, one after another: the site judges the inventory
only once all of them arrived on one connection, and a connection lost
halfway changes nothing there (the next connection sends a new one).  The
site's ``ArchiveInventoryAck`` per part is logged at debug; nothing waits on
it.  A legacy link never carries either type.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from tasknet.node.store import NodeStore
from tasknet.protocol.messages import (
    INVENTORY_PART_MAX,
    ArchiveInventory,
    ArchiveInventoryAck,
    HeldArchive,
)
from tasknet.protocol.session import ISiteLink
from tasknet.runtime import IEntropy

log = Logger()


def inventory_parts(
    inventory_id: str, archives: list[HeldArchive], part_max: int = INVENTORY_PART_MAX
) -> list[ArchiveInventory]:
    """``archives`` cut into parts of at most ``part_max``, numbered from 1;
    one empty part when there is nothing."""
    if not 1 <= part_max <= INVENTORY_PART_MAX:
        raise ValueError(f"part_max must be 1..{INVENTORY_PART_MAX}, got {part_max}")
    chunks = [archives[i : i + part_max] for i in range(0, len(archives), part_max)] or [[]]
    return [
        ArchiveInventory(inventory_id, number, len(chunks), tuple(chunk))
        for number, chunk in enumerate(chunks, start=1)
    ]


class InventorySender:
    """Sends the inventory on each v2 link the node brings up.  ``store``:
    where the archive rows are read; ``entropy``: the inventory ids."""

    def __init__(
        self, store: NodeStore, *, entropy: IEntropy, part_max: int = INVENTORY_PART_MAX
    ) -> None:
        self.store = store
        self.entropy: IEntropy = entropy
        self.part_max = part_max
        self._link: ISiteLink | None = None
        #: Inventories sent since the start, and the last one's id (tests, logs).
        self.sent = 0
        self.last_id = ""

    def link_up(self, link: ISiteLink) -> Deferred[None]:
        """Send the inventory on ``link`` if it is a v2 one; fires once sent
        (or given up: the link went down meanwhile)."""
        self._link = link
        if link.protocol_version < 2:
            return Deferred.fromCoroutine(_nothing())
        d = Deferred.fromCoroutine(self._send(link))
        return d.addErrback(lambda f: log.failure("sending the archive inventory failed", f))

    def link_down(self, link: ISiteLink) -> None:
        if self._link is link:
            self._link = None

    def ack_received(self, ack: ArchiveInventoryAck) -> None:
        log.debug(
            "inventory {inventory_id} part {part} acknowledged",
            inventory_id=ack.inventory_id,
            part=ack.part,
        )

    async def _send(self, link: ISiteLink) -> None:
        archives = await self.store.inventory()
        if self._link is not link:
            return  # lost while reading: the next link sends a fresh one
        inventory_id = self.entropy.uuid4().hex
        parts = inventory_parts(inventory_id, archives, self.part_max)
        for part in parts:
            link.send(part)
        self.sent += 1
        self.last_id = inventory_id
        log.info(
            "inventory {inventory_id} sent: {count} archives in {parts} parts",
            inventory_id=inventory_id,
            count=len(archives),
            parts=len(parts),
        )


async def _nothing() -> None:
    return None
