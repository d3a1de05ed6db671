"""The node's archive endpoint (DELIVERY.md, "Serving (node)").

``--serve ENDPOINT`` answers exactly two things:

* ``GET``/``HEAD /archives/{gid}/{operationId}?exp=E&user=U&sig=S``: a
  signed, expiring link (tasknet.protocol.archive_links) to an archive the
  node holds.  The link is checked first (constant time), then its expiry
  by ``clock``; only then is the archive looked up, by gid and operationId
  in the node's store: a path is never built from the URL.  Refusals are
  ``403 link_invalid`` (bad or tampered signature, malformed parameters, a
  generation not held, a file whose size on disk is not the recorded one)
  or ``403 link_expired``; none says which part was wrong or names a file.
* ``GET /healthz``: the transfers and connections, and the node's disk
  figures (``archives``, ``archiveBytes``, ``diskFree``, ``diskBudget``;
  null when unknown or none).

Anything else is ``404 not_found`` (other methods on those two paths:
``405``), with a small JSON error that does not echo the path.

A valid link answers the archive as nginx would a static file: ``200``, or
``206`` for one satisfiable ``Range`` (several ranges: the whole file),
``416`` with ``Content-Range: bytes */SIZE`` for an unsatisfiable one;
``ETag: "sha256-HEX"`` (a legacy completion without a digest has none),
``If-None-Match`` (``304``) and ``If-Range`` (stale: the whole file);
``Content-Disposition`` with the task's name made safe (RFC 6266).  The
body is sent by :mod:`tasknet.node.sendfile` (the kernel's ``sendfile`` on
plain TCP).

Bounds: at most ``serve_max`` bodies in flight (past it ``503 busy`` with
``Retry-After: 1``); a connection that has not sent a complete request
within ``header_timeout`` seconds, that sits idle between requests for
``idle_timeout`` seconds, or that takes no byte of a body for
``idle_timeout`` seconds is closed (INTERFACES.md's bounds: 30 s and 60 s).
Every timer runs on ``clock``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IListeningPort, IReactorTime
from twisted.logger import Logger
from twisted.web import http, server
from twisted.web.iweb import IAccessLogFormatter
from twisted.web.resource import Resource
from zope.interface import provider

from tasknet.node.paths import DataDir
from tasknet.node.retention import DiskFigures
from tasknet.node.sendfile import Outcome, send_file_range
from tasknet.node.store import CORRUPT, MISSING, ArchiveRow, NodeStore
from tasknet.protocol.archive_links import link_key, verify_link
from tasknet.protocol.messages import IDENTIFIER_MAX
from tasknet.weblog import QuietSite

__all__ = [
    "DEFAULT_SERVE_MAX",
    "HEADER_TIMEOUT",
    "IDLE_TIMEOUT",
    "ArchiveServer",
    "Health",
    "LinkParams",
    "Unsatisfiable",
    "derived_serve_url",
    "download_names",
    "parse_range",
    "parse_target",
    "serve_endpoint_problem",
    "url_problem",
]

log = Logger()

DEFAULT_SERVE_MAX = 64
#: INTERFACES.md, "Slow clients": a complete request within 30 s, idle 60 s.
HEADER_TIMEOUT = 30.0
IDLE_TIMEOUT = 60.0
#: Bytes of request body accepted (GET and HEAD have none worth reading).
MAX_BODY = 16 * 1024
#: UTF-8 bytes of the task's name kept in the download's file name (file
#: systems take 255 bytes a name: room for ``.zip`` and a ``.part``).
NAME_CAP = 200

#: Seconds between two ``served_at`` marks of one archive: a commit per
#: 1 MiB range (``synchronous=FULL``, the store's one thread) cost more than
#: the range itself, and retention only needs the minute.
MARK_SERVED_EVERY = 60.0
#: Seconds a looked-up archive row is reused by the next request for it
#: (a client's ranges on a kept-alive connection): the file's size is still
#: checked against it before every body, and a set-aside archive's file is
#: gone, so a stale row is never served (module doc).
ROW_REUSE_SECONDS = 2.0
#: Archives remembered for either note (the oldest forgotten first).
NOTES_MAX = 4096

_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,18}")
_SIG = re.compile(r"[0-9a-f]{64}")
_INT63 = 2**63


# -- what a request asks for ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Health:
    """``/healthz``."""


@dataclass(frozen=True, slots=True)
class LinkParams:
    """A well-formed archive link (its signature not yet checked)."""

    gid: int
    operation_id: str
    exp: int
    user: int
    sig: str


@dataclass(frozen=True, slots=True)
class BadLink:
    """An ``/archives/{gid}/{operationId}`` whose parts are malformed."""


Target = Health | LinkParams | BadLink | None


def _decimal(raw: bytes) -> int | None:
    """A canonical decimal below 2**63 (no sign, no leading zero)."""
    if not _DECIMAL.fullmatch(raw):
        return None
    value = int(raw)
    return value if value < _INT63 else None


def parse_target(uri: bytes) -> Target:
    """What the request line's target asks for: :class:`Health`, a
    :class:`LinkParams`, a :class:`BadLink` (an archive path that is not a
    well-formed link) or None (nothing served here).  Never raises."""
    path, _, query = uri.partition(b"?")
    if path == b"/healthz":
        return Health()
    parts = path.split(b"/")
    if len(parts) != 4 or parts[0] != b"" or parts[1] != b"archives":
        return None
    gid = _decimal(parts[2])
    operation_id = _operation_id(parts[3])
    fields = _query(query)
    if gid is None or gid == 0 or operation_id is None or fields is None:
        return BadLink()
    exp = _decimal(fields["exp"].encode("ascii"))
    user = _decimal(fields["user"].encode("ascii"))
    sig = fields["sig"]
    if exp is None or user is None or not _SIG.fullmatch(sig):
        return BadLink()
    return LinkParams(gid, operation_id, exp, user, sig)


def _operation_id(raw: bytes) -> str | None:
    try:
        value = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not 1 <= len(value) <= IDENTIFIER_MAX:
        return None
    if any(unicodedata.category(ch)[0] == "C" for ch in value):
        return None
    return value


def _query(raw: bytes) -> dict[str, str] | None:
    """``exp``, ``user`` and ``sig``, each exactly once and nothing else."""
    try:
        text = raw.decode("ascii")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True, max_num_fields=3)
    except (UnicodeDecodeError, ValueError):
        return None
    fields = dict(pairs)
    if len(pairs) != 3 or set(fields) != {"exp", "user", "sig"}:
        return None
    if not all(value.isascii() for value in fields.values()):
        return None
    return fields


class Unsatisfiable(Exception):
    """A ``Range`` none of whose bytes the file has (``416``)."""


_RANGE = re.compile(rb"\s*bytes\s*=\s*([0-9]{0,19})\s*-\s*([0-9]{0,19})\s*", re.IGNORECASE)


def parse_range(value: bytes | None, size: int) -> tuple[int, int] | None:
    """The inclusive ``(first, last)`` byte of one satisfiable range of a
    ``size``-byte file, or None for the whole file (no header, several
    ranges as nginx does, or one the RFC says to ignore: not ``bytes``,
    malformed, ``a-b`` with ``b < a``).  :class:`Unsatisfiable` when the
    file has none of the bytes asked for."""
    if value is None or b"," in value:
        return None
    match = _RANGE.fullmatch(value)
    if match is None:
        return None
    first_raw, last_raw = match.groups()
    if not first_raw:
        if not last_raw:
            return None
        suffix = int(last_raw)
        if suffix == 0 or size == 0:
            raise Unsatisfiable()
        return max(0, size - suffix), size - 1
    first = int(first_raw)
    last = int(last_raw) if last_raw else size - 1
    if last_raw and last < first:
        return None
    if first >= size:
        raise Unsatisfiable()
    return first, min(last, size - 1)


_ATTR_CHAR_SAFE = "!#$&+-.^_`|~"
_UNSAFE_IN_NAME = re.compile(r'[/\\"%;:*?<>|]')


def download_names(name: str, gid: int) -> tuple[str, str]:
    """The archive's file name for ``Content-Disposition``: its ASCII
    fallback and its RFC 5987 ``UTF-8''`` value.  The task's name with no
    path separator, control character, quote or other character file
    systems refuse, at most :data:`NAME_CAP` bytes of UTF-8, ``.zip`` added;
    the gid when nothing is left."""
    text = unicodedata.normalize("NFC", name)
    text = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text)
    text = _UNSAFE_IN_NAME.sub("_", text)
    text = " ".join(text.split()).strip(". ")
    if text.lower().endswith(".zip"):
        text = text[:-4].rstrip(". ")
    text = text.encode("utf-8")[:NAME_CAP].decode("utf-8", "ignore").rstrip(". ") or str(gid)
    full = text + ".zip"
    fallback = "".join(ch if " " <= ch <= "~" else "_" for ch in full)
    return fallback, quote(full, safe=_ATTR_CHAR_SAFE)


def _etag(row: ArchiveRow) -> bytes | None:
    return f'"sha256-{row.sha256}"'.encode("ascii") if row.sha256 else None


def _matches_any(header: bytes, etag: bytes) -> bool:
    """``If-None-Match`` (weak comparison): ``*`` or one of the tags."""
    for tag in header.split(b","):
        tag = tag.strip()
        if tag == b"*" or tag.removeprefix(b"W/") == etag:
            return True
    return False


# -- options --------------------------------------------------------------------


def serve_endpoint_problem(description: str) -> str | None:
    """Why ``description`` cannot be ``--serve`` (None when it can)."""
    kind = description.partition(":")[0].lower()
    if kind not in ("tcp", "tcp6", "ssl"):
        return (
            f"--serve {description!r}: expected a tcp: or ssl: server endpoint, e.g. "
            "tcp:7300:interface=127.0.0.1 or ssl:7443:privateKey=KEY:certKey=CERT"
        )
    return None


def url_problem(option: str, url: str) -> str | None:
    """Why ``url`` cannot be the base URL of ``--option`` (None when it can)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        return f"--{option} {url!r}: not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--{option} {url!r}: expected http://HOST[:PORT]/ or https://HOST[:PORT]/"
    if parts.query or parts.fragment or parts.username or parts.password:
        return f"--{option} {url!r}: a base URL has no query, fragment or user name"
    return None


def derived_serve_url(kind: str, host: str, port: int) -> str:
    """The URL the site reaches a ``tcp:`` endpoint listening on ``host``
    ``port`` at, when that is loopback (a site on the same machine); ""
    otherwise (the node cannot know how the site reaches it: --serve-url)."""
    if kind not in ("tcp", "tcp6"):
        return ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return ""
    if not address.is_loopback:
        return ""
    if address.version == 6:
        return f"http://[{address}]:{port}/"
    return f"http://{address}:{port}/"


# -- HTTP -----------------------------------------------------------------------


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode("utf-8")


_ERRORS: dict[str, tuple[int, str]] = {
    "link_invalid": (403, "the link is not valid"),
    "link_expired": (403, "the link has expired"),
    "not_found": (404, "nothing is served here"),
    "method_not_allowed": (405, "method not allowed"),
    "busy": (503, "too many transfers at once; try again"),
    "unavailable": (503, "the archive cannot be read now; try again"),
}


def _answer_error(request: server.Request, code: str) -> bytes:
    status, message = _ERRORS[code]
    body = _error_body(code, message)
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Cache-Control", b"no-store")
    request.setHeader(b"Content-Length", b"%d" % len(body))
    if code in ("busy", "unavailable"):
        request.setHeader(b"Retry-After", b"1")
    return body


class ArchiveServer:
    """The endpoint: its resource, its site and its transfer slots.

    ``store`` and ``data`` are the node's; ``secret`` the node's secret
    (the link key is derived from it); ``clock`` says what time it is and
    runs every timer.  ``site()`` is what ``--serve`` listens with.
    """

    def __init__(
        self,
        store: NodeStore,
        data: DataDir,
        secret: str,
        *,
        clock: IReactorTime,
        serve_max: int = DEFAULT_SERVE_MAX,
        idle_timeout: float = IDLE_TIMEOUT,
        header_timeout: float = HEADER_TIMEOUT,
    ) -> None:
        if serve_max < 1:
            raise ValueError("serve_max must be at least 1")
        self.store = store
        self.data = data
        self.key = link_key(secret)
        self.clock = clock
        self.serve_max = serve_max
        self.idle_timeout = idle_timeout
        self.header_timeout = header_timeout
        #: Bodies being sent now (each holds a slot).
        self.transfers = 0
        #: The archives whose bytes are being sent now, and by how many
        #: transfers (retention leaves them alone: :meth:`serving`).
        self._sending: Counter[tuple[int, str]] = Counter()
        #: The node's disk figures for /healthz (None: not known here).
        self.disk_figures: Callable[[], DiskFigures | None] = lambda: None
        #: Transfers that sent every byte (and were marked served).
        self.completed = 0
        #: Open HTTP connections.
        self.connections = 0
        #: Body bytes handed to the transports, all transfers together.
        self.bytes_sent = 0
        self.resource = _ArchiveResource(self)
        #: When each archive was last marked served (MARK_SERVED_EVERY).
        self._marked: OrderedDict[tuple[int, str], float] = OrderedDict()
        #: Recently looked-up rows and when (ROW_REUSE_SECONDS).
        self._rows: OrderedDict[tuple[int, str], tuple[ArchiveRow, float]] = OrderedDict()

    def site(self) -> ServeSite:
        return ServeSite(self)

    # -- one request ------------------------------------------------------------

    def render(self, request: server.Request) -> bytes | int:
        target = parse_target(request.uri)
        method = request.method
        if target is None:
            return _answer_error(request, "not_found")
        if isinstance(target, Health):
            if method != b"GET":
                request.setHeader(b"Allow", b"GET")
                return _answer_error(request, "method_not_allowed")
            health: dict[str, Any] = {
                "status": "ok",
                "transfers": self.transfers,
                "serveMax": self.serve_max,
                "connections": self.connections,
            }
            figures = self.disk_figures()
            if figures is not None:
                health.update(
                    archives=figures.archives,
                    archiveBytes=figures.archive_bytes,
                    diskFree=figures.free,
                    diskBudget=figures.budget,
                )
            body = json.dumps(health).encode("ascii")
            request.setHeader(b"Content-Type", b"application/json")
            request.setHeader(b"Cache-Control", b"no-store")
            return body
        if method not in (b"GET", b"HEAD"):
            request.setHeader(b"Allow", b"GET, HEAD")
            return _answer_error(request, "method_not_allowed")
        if isinstance(target, BadLink):
            return _answer_error(request, "link_invalid")
        if not verify_link(
            self.key, target.gid, target.operation_id, target.exp, target.user, target.sig
        ):
            return _answer_error(request, "link_invalid")
        if self.clock.seconds() > target.exp:
            return _answer_error(request, "link_expired")
        body_wanted = method == b"GET"
        if body_wanted:
            if self.transfers >= self.serve_max:
                return _answer_error(request, "busy")
            # Held from the lookup on, so the bound is never passed.
            self.transfers += 1
        answered = Deferred.fromCoroutine(self._answer(request, target, body_wanted))
        answered.addErrback(self._failed, request)
        return server.NOT_DONE_YET

    def _failed(self, failure: Any, request: server.Request) -> None:
        # The store could not be read (or a bug): logged, and the client
        # told to retry, not given a 500.
        log.failure("answering an archive link failed", failure)
        if not request.startedWriting and not request.finished and not request._disconnected:
            request.write(_answer_error(request, "unavailable"))
            request.finish()

    async def _answer(self, request: server.Request, link: LinkParams, slot: bool) -> None:
        """Answer a valid link; with ``slot`` (a GET holding one) the body
        too, and the slot is freed when it is sent or abandoned."""
        try:
            sent = await self._send(request, link, send_body=slot)
        finally:
            if slot:
                self.transfers -= 1
        if sent is not None:
            self.completed += 1
            if self._due_for_mark(sent):
                await self.store.mark_served(sent.gid, sent.operation_id)

    def _due_for_mark(self, row: ArchiveRow) -> bool:
        """Whether ``served_at`` should be written now (at most once per
        :data:`MARK_SERVED_EVERY` per archive); notes the mark when it is."""
        key = (row.gid, row.operation_id)
        now = self.clock.seconds()
        last = self._marked.get(key)
        if last is not None and now - last < MARK_SERVED_EVERY:
            return False
        self._marked[key] = now
        self._marked.move_to_end(key)
        while len(self._marked) > NOTES_MAX:
            self._marked.popitem(last=False)
        return True

    async def _held(self, gid: int, operation_id: str) -> tuple[ArchiveRow | None, BinaryIO | None]:
        """The archive's row and its file opened, whole on disk; a row
        looked up in the last :data:`ROW_REUSE_SECONDS` is reused, but a
        file that does not match it sends the request to the store again
        (it may have been set aside or replaced meanwhile)."""
        key = (gid, operation_id)
        noted = self._rows.get(key)
        if noted is not None and self.clock.seconds() - noted[1] < ROW_REUSE_SECONDS:
            file = self._open_whole(noted[0])
            if file is not None:
                return noted[0], file
        self._rows.pop(key, None)
        row = await self.store.archive(gid, operation_id)
        file = None if row is None else await self._open(row)
        if row is not None and file is not None:
            self._rows[key] = (row, self.clock.seconds())
            while len(self._rows) > NOTES_MAX:
                self._rows.popitem(last=False)
        return row, file

    async def _send(
        self, request: server.Request, link: LinkParams, *, send_body: bool
    ) -> ArchiveRow | None:
        """The answer to a valid link; its archive's row when a body went out whole."""
        row, file = await self._held(link.gid, link.operation_id)
        if row is None or file is None:
            if not request._disconnected:
                request.write(_answer_error(request, "link_invalid"))
                request.finish()
            return None
        handed_over = False
        try:
            status, first, length = self._prepare(request, row)
            if request._disconnected:
                return None
            if status in (304, 416) or not send_body or length == 0:
                request.finish()
                return row if send_body and status in (200, 206) else None
            handed_over = True  # the sender closes the file
            key = (row.gid, row.operation_id)
            self._sending[key] += 1
            try:
                outcome = await send_file_range(
                    request,
                    file,
                    first,
                    length,
                    clock=self.clock,
                    idle_timeout=self.idle_timeout,
                    on_progress=self._sent,
                )
            finally:
                self._sending[key] -= 1
                if self._sending[key] <= 0:
                    del self._sending[key]
            if outcome is Outcome.SHORT:
                # Shortened on disk since it was opened: never served again.
                self._rows.pop((row.gid, row.operation_id), None)
                await self.store.set_aside(row.gid, row.operation_id, "shorter than recorded")
            return row if outcome is Outcome.SENT else None
        finally:
            if not handed_over:
                file.close()

    def serving(self) -> frozenset[tuple[int, str]]:
        """The (gid, operationId) of the archives being sent right now."""
        return frozenset(self._sending)

    def _sent(self, count: int) -> None:
        self.bytes_sent += count

    def _open_whole(self, row: ArchiveRow) -> BinaryIO | None:
        """The archive's file, opened, when its size on disk is the row's; else None."""
        try:
            file = open(self.data.archive_file(row), "rb")  # noqa: SIM115 (closed by the sender)
        except (OSError, ValueError):
            return None
        if os.fstat(file.fileno()).st_size == row.size:
            return file
        file.close()
        return None

    async def _open(self, row: ArchiveRow) -> BinaryIO | None:
        """The archive's file, opened, when it is whole on disk; otherwise
        it is set aside (never served short) and None."""
        reason = CORRUPT
        try:
            path = self.data.archive_file(row)
            file = open(path, "rb")  # noqa: SIM115 (closed by the sender)
        except (OSError, ValueError) as exc:
            why = f"cannot open its file: {exc.__class__.__name__}"
            if isinstance(exc, FileNotFoundError):
                reason = MISSING
        else:
            actual = os.fstat(file.fileno()).st_size
            if actual == row.size:
                return file
            file.close()
            why = f"{actual} bytes on disk, {row.size} recorded"
        await self.store.set_aside(row.gid, row.operation_id, why, reason=reason)
        return None

    def _prepare(self, request: server.Request, row: ArchiveRow) -> tuple[int, int, int]:
        """Set the answer's status and headers; its status, first byte and length."""
        size = row.size
        etag = _etag(row)
        fallback, encoded = download_names(row.name, row.gid)
        request.setHeader(b"Accept-Ranges", b"bytes")
        request.setHeader(b"Cache-Control", b"private")
        request.setHeader(b"X-Content-Type-Options", b"nosniff")
        if etag is not None:
            request.setHeader(b"ETag", etag)
        none_match = request.getHeader(b"If-None-Match")
        if etag is not None and none_match is not None and _matches_any(none_match, etag):
            request.setResponseCode(http.NOT_MODIFIED)
            return 304, 0, 0
        request.setHeader(b"Content-Type", b"application/zip")
        request.setHeader(
            b"Content-Disposition",
            f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}".encode("ascii"),
        )
        wanted = request.getHeader(b"Range")
        if_range = request.getHeader(b"If-Range")
        if (
            wanted is not None
            and if_range is not None
            and (etag is None or if_range.strip() != etag)
        ):
            wanted = None  # the client's copy is another file: the whole of this one
        try:
            span = parse_range(wanted, size)
        except Unsatisfiable:
            request.setResponseCode(http.REQUESTED_RANGE_NOT_SATISFIABLE)
            request.setHeader(b"Content-Range", b"bytes */%d" % size)
            request.setHeader(b"Content-Length", b"0")
            return 416, 0, 0
        if span is None:
            request.setResponseCode(http.OK)
            request.setHeader(b"Content-Length", b"%d" % size)
            return 200, 0, size
        first, last = span
        request.setResponseCode(http.PARTIAL_CONTENT)
        request.setHeader(b"Content-Range", b"bytes %d-%d/%d" % (first, last, size))
        request.setHeader(b"Content-Length", b"%d" % (last - first + 1))
        return 206, first, last - first + 1


class _ArchiveResource(Resource):
    """Every path: the server decides (no child lookup, no static files)."""

    isLeaf = True

    def __init__(self, archives: ArchiveServer) -> None:
        super().__init__()
        self.archives = archives

    def render(self, request: server.Request) -> bytes | int:  # type: ignore[override]
        return self.archives.render(request)


class ServeRequest(server.Request):
    """A request whose body (none is expected) is bounded."""

    _body_received = 0

    def handleContentChunk(self, data: bytes) -> None:
        self._body_received += len(data)
        if self._body_received > MAX_BODY:
            transport: Any = self.channel.transport if self.channel is not None else None
            if transport is not None:
                transport.abortConnection()
            return
        super().handleContentChunk(data)


class ServeChannel(http.HTTPChannel):
    """HTTP/1.1 with the header deadline (module doc); the idle timeout is
    twisted.web's own (``timeOut``) between requests."""

    site: ServeSite
    _deadline: IDelayedCall | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self.site.archives.connections += 1
        self._start_deadline()

    def dataReceived(self, data: bytes) -> None:
        if self._deadline is None and not self._handlingRequest:
            self._start_deadline()  # the first byte of the next request
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        if self.length is not None and self.length > MAX_BODY:
            self._cancel_deadline()
            transport: Any = self.transport
            transport.abortConnection()
            return
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        self._cancel_deadline()
        super().allContentReceived()

    def connectionLost(self, reason: Any = None) -> None:
        self.site.archives.connections -= 1
        self._cancel_deadline()
        super().connectionLost(reason)

    def _request_timed_out(self) -> None:
        self._deadline = None
        log.info(
            "closing {peer}: no complete request within {seconds}s",
            peer=str(self.getPeer()),
            seconds=self.site.archives.header_timeout,
        )
        transport: Any = self.transport
        transport.abortConnection()

    def _start_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.callLater(self.site.archives.header_timeout, self._request_timed_out)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None


_LINK_SIGNATURE = re.compile(r"(?i)(\bsig=)[^\s&\"]*")


@provider(IAccessLogFormatter)
def access_log_line(timestamp: str, request: Any) -> str:
    """twisted.web's combined access line, a link's signature left out (a
    link is a credential until it expires)."""
    return _LINK_SIGNATURE.sub(r"\1***", http.combinedLogFormatter(timestamp, request))


class ServeSite(QuietSite):
    """The ``--serve`` listener's factory: :class:`ServeChannel`, timers on
    the server's clock, access lines at debug (tasknet.weblog)."""

    requestFactory = ServeRequest

    def __init__(self, archives: ArchiveServer) -> None:
        super().__init__(
            archives.resource,
            timeout=archives.idle_timeout,
            reactor=archives.clock,
            logFormatter=access_log_line,
        )
        self.archives = archives

    def protocol(self) -> ServeChannel:  # type: ignore[override]
        return ServeChannel()


def listening_url(kind: str, port: IListeningPort) -> str:
    """:func:`derived_serve_url` of a port ``--serve`` listens on."""
    host: Any = port.getHost()
    return derived_serve_url(kind, str(getattr(host, "host", "")), int(getattr(host, "port", 0)))
