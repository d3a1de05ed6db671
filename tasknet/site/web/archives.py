"""Getting an archive (DELIVERY.md, "Getting an archive (site)"): the
links the site issues for completed tasks, and what the routes of
``web/api.py`` answer with them.

A link is :class:`~tasknet.protocol.archive_links.ArchiveLink` signed with
the **link key** of the node that holds the archive (derived from that
node's secret, the one it logs in with), for the task's current generation
(its operationId), expiring ``--link-ttl`` from now, naming the user it was
issued to.  How the archive travels:

* ``via: "node"``: the node has a public URL (``archiveUrl`` in its Hello):
  the link under it is the client's (``303`` to it, or its JSON);
* ``via: "site"``: the node serves only the site (``serveUrl``): the client
  asks the site (``GET /api/tasks/{gid}/archive`` with its own credentials)
  and the site streams the link under ``serveUrl`` (``web/archive_stream.py``).

Refusals, in the order they are decided: another user's task or none:
``404 not_found`` (as ``GET /api/tasks/{gid}``); not ``COMPLETED``: ``409
archive_not_ready`` with its ``status``; its node not connected to this
site: ``503 node_offline`` with ``Retry-After``; connected but serving
nothing (a legacy node, one without ``--serve``), or a task without an
operationId (a legacy row): ``409 archive_not_served``.  Before all but
``not_found``: a task whose archive no node holds any more (``ARCHIVE_GONE``,
DELIVERY.md "Custody") is ``410 archive_gone`` with its ``reason`` and
``at``; creating it again is a new charge.

Decisions the spec leaves open:

* ``name`` (JSON, aria2's ``out=``) is the file name to save as: the task's
  name made safe for a file system (no ``/``, ``\\``, control characters or
  leading dots; at most :data:`MAX_FILE_NAME` characters; the gid when
  nothing is left) with ``.zip``.
* A ``via: "site"`` link's ``url`` is the site's own archive URL (it does
  not expire; ``expiresAt`` is that of the node link the site would sign).
* The aria2 form of a ``via: "site"`` link carries ``header=Authorization:
  Bearer ...`` only when the request itself came with a bearer token (a
  browser session's cookie is never written into a file).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from twisted.internet.interfaces import IReactorTime

from tasknet.protocol.archive_links import ArchiveLink, link_key
from tasknet.protocol.session import INodeSession
from tasknet.site import metrics
from tasknet.site.storage.archives import ArchiveTask
from tasknet.site.storage.engine.timestamps import iso
from tasknet.site.web.archive_stream import ArchiveStreams
from tasknet.site.web.errors import ApiError

__all__ = [
    "MAX_FILE_NAME",
    "MAX_LINKS",
    "NODE_OFFLINE_RETRY",
    "ArchiveDelivery",
    "IssuedLink",
    "aria2_input",
    "file_name",
]

#: ``POST /api/tasks/archive-links`` takes 1 to this many gids.
MAX_LINKS = 1000
#: The longest file name (``.zip`` included) of ``name``.
MAX_FILE_NAME = 200
#: Seconds a client is told to wait when the holding node is not connected.
NODE_OFFLINE_RETRY = 30

_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]+')


def file_name(name: str, gid: int) -> str:
    """The file an archive is saved as: ``name`` made safe, ``.zip`` added."""
    text = unicodedata.normalize("NFC", name)
    text = "".join(" " if unicodedata.category(c).startswith("C") else c for c in text)
    text = _UNSAFE.sub("_", text).strip().lstrip(".").strip()
    text = text[: MAX_FILE_NAME - 4].rstrip() or str(gid)
    return text + ".zip"


class LinkEntryJson(TypedDict):
    """One of ``POST /api/tasks/archive-links``' ``links``."""

    gid: int
    url: str
    expiresAt: str
    size: int | None
    sha256: str | None
    name: str


class LinkJson(TypedDict):
    """``GET /api/tasks/{gid}/archive``'s JSON."""

    url: str
    expiresAt: str
    size: int | None
    sha256: str | None
    name: str
    node: str
    via: str


@dataclass(frozen=True, slots=True)
class IssuedLink:
    """One archive link the site issued."""

    task: ArchiveTask
    node_id: str
    #: ``"node"`` or ``"site"``.
    via: str
    #: The signed link under the node's URL (``archiveUrl`` for ``via:
    #: node``, ``serveUrl`` for ``via: site``: what the site streams).
    node_url: str
    #: The client's URL: ``node_url`` (via node) or the site's own (via site).
    url: str
    exp: int

    @property
    def name(self) -> str:
        return file_name(self.task.name, self.task.gid)

    @property
    def expires_at(self) -> str:
        return iso(self.exp)

    def document(self) -> LinkJson:
        """``GET /api/tasks/{gid}/archive``'s JSON."""
        return {
            "url": self.url,
            "expiresAt": self.expires_at,
            "size": self.task.archive_size,
            "sha256": self.task.archive_sha256,
            "name": self.name,
            "node": self.node_id,
            "via": self.via,
        }

    def entry(self) -> LinkEntryJson:
        """One of ``POST /api/tasks/archive-links``' ``links``."""
        return {
            "gid": self.task.gid,
            "url": self.url,
            "expiresAt": self.expires_at,
            "size": self.task.archive_size,
            "sha256": self.task.archive_sha256,
            "name": self.name,
        }


class ArchiveDelivery:
    """Issues archive links: who holds the archive (``nodes``: the one
    registry of this site's connected sessions, by node id), the secret
    each node logs in with (``node_secret``), ``link_ttl`` seconds of
    validity on ``clock``, and the streams through the site (``streams``)."""

    def __init__(
        self,
        nodes: Mapping[str, INodeSession],
        node_secret: Callable[[str], str | None],
        clock: IReactorTime,
        *,
        link_ttl: float,
        streams: ArchiveStreams,
    ) -> None:
        self._nodes = nodes
        self._node_secret = node_secret
        self._clock = clock
        self.link_ttl = link_ttl
        self.streams = streams

    def issue(self, task: ArchiveTask, user_id: int, site_url: str) -> IssuedLink:
        """A link to ``task``'s archive for ``user_id`` (its owner or an
        admin: the caller checked; :meth:`count` it once answered); ``site_url``
        is the site's own archive URL of the task (``via: site``).  Raises
        :class:`ApiError` with the refusal."""
        if task.gone_reason is not None:
            raise ApiError(
                "archive_gone",
                f"task {task.gid}'s archive is held by no node any more ({task.gone_reason}):"
                " creating the task again fetches it again, at a new charge",
                status=task.status,
                reason=task.gone_reason,
                at=task.gone_at,
            )
        if not task.completed:
            raise ApiError(
                "archive_not_ready",
                f"task {task.gid} is {task.status}: only a COMPLETED task has an archive",
                status=task.status,
            )
        session = None if task.node_id is None else self._nodes.get(task.node_id)
        secret = None if task.node_id is None else self._node_secret(task.node_id)
        if task.node_id is None or session is None or secret is None:
            raise ApiError(
                "node_offline",
                f"the node holding task {task.gid}'s archive ({task.node_id}) is not "
                "connected to this site: try again later",
                retry_after=NODE_OFFLINE_RETRY,
                node=task.node_id,
            )
        archive_url, serve_url = str(session.archive_url), str(session.serve_url)
        if task.operation_id is None or not (archive_url or serve_url):
            raise ApiError(
                "archive_not_served",
                f"the node holding task {task.gid}'s archive ({task.node_id}) does not serve "
                "archives (a legacy node, or one without --serve)",
                node=task.node_id,
            )
        exp = int(self._clock.seconds() + self.link_ttl)
        link = ArchiveLink.sign(link_key(secret), task.gid, task.operation_id, exp, user_id)
        if archive_url:
            via, node_url, url = "node", link.url(archive_url), link.url(archive_url)
        else:
            via, node_url, url = "site", link.url(serve_url), site_url
        return IssuedLink(task, task.node_id, via, node_url, url, exp)

    @staticmethod
    def count(link: IssuedLink) -> None:
        """Count ``link`` as issued (``tasknet_archive_links_total``): once
        it is answered, not when a stream is refused."""
        metrics.ARCHIVE_LINKS.labels(via=link.via).inc()


def aria2_input(links: Iterable[IssuedLink], bearer_token: str | None) -> str:
    """An aria2 input file (``aria2c -i FILE``): each link's URL on a line,
    then its indented options: ``out=`` the file name, ``checksum=sha-256=``
    its digest (when known), and for a link through the site the
    ``Authorization`` header, only given ``bearer_token`` (the request's)."""
    lines: list[str] = []
    for link in links:
        lines.append(link.url)
        lines.append(f"  out={link.name}")
        if link.task.archive_sha256:
            lines.append(f"  checksum=sha-256={link.task.archive_sha256}")
        if link.via == "site" and bearer_token is not None:
            lines.append(f"  header=Authorization: Bearer {bearer_token}")
    return "".join(line + "\n" for line in lines)
