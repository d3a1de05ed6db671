"""The outbox, delivering committed notifications off the commit path
(LIFECYCLE.md invariant 8), in three rooms wired by one service.

Nothing here runs inside a report or lifecycle transaction: a commit that
wrote outbox rows only wakes the executor, which reads committed rows.

* :mod:`~tasknet.site.outbox.executor`: :class:`OutboxExecutor`, the one
  ``MultiService`` the composition root wires (``wake()``, the poll, the
  prune, start and stop), which drains through the rooms below;
* the WebSocket tail and its marks: :mod:`~tasknet.site.outbox.tail`
  (:class:`LocalTail` for one site alone on its database,
  :class:`SharedTail` for several sites on PostgreSQL) and
  :mod:`~tasknet.site.outbox.marks` (the marks' state machine);
* the webhook: :mod:`~tasknet.site.outbox.webhook` (:class:`WebhookSender`;
  :class:`LocalWebhook`, or :class:`SharedWebhook`, whose claims a
  :class:`ClaimRenewer` renews on a timer of its own);
* liveness: :mod:`~tasknet.site.outbox.liveness` (:class:`LivenessWatch`,
  swept by :class:`LivenessSweep` on a timer of its own).

One site alone or one of several (*shared*: ``db.capabilities.
shared_by_sites`` and an ``instance_id``) is decided once, where the root
builds the tail and the webhook room; each module's doc gives its
delivery semantics.  The rows themselves are ``tasknet.site.storage.outbox``.
"""

from tasknet.site.outbox.executor import OutboxExecutor
from tasknet.site.outbox.liveness import LivenessSweep, LivenessWatch
from tasknet.site.outbox.marks import Marks
from tasknet.site.outbox.tail import LocalTail, Publisher, SharedTail, Tail
from tasknet.site.outbox.webhook import (
    RESULTS_RETRY,
    ClaimRenewer,
    LocalWebhook,
    SharedWebhook,
    WebhookRoom,
    WebhookSender,
)

__all__ = [
    "RESULTS_RETRY",
    "ClaimRenewer",
    "LivenessSweep",
    "LivenessWatch",
    "LocalTail",
    "LocalWebhook",
    "Marks",
    "OutboxExecutor",
    "Publisher",
    "SharedTail",
    "SharedWebhook",
    "Tail",
    "WebhookRoom",
    "WebhookSender",
]
