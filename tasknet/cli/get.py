"""``tasknet-get``: fetch completed tasks' archives from a site, resumable and verified.

DELIVERY.md, "Getting an archive (site)"::

    tasknet-get --site URL [--token-file F | $TASKNET_TOKEN] [-d DIR] [-j N]
                (GID... | --completed [--since DATE])

The contract this client keeps:

- It asks the site for links (``POST /api/tasks/archive-links``, at most
  1,000 gids a call).  A link is either a signed node link (it carries its
  own authority) or the site's own ``/api/tasks/{gid}/archive``; the bearer
  token is sent only to the site's own origin (scheme, host and port), never
  to a node, also not after a redirect.
- Each archive is written to ``DIR/NAME.zip.part`` and renamed to
  ``NAME.zip`` only once its size and SHA-256 match what the site recorded
  (a legacy node's completion has no SHA-256: then only the size is checked,
  and the output says so).  A ``.part`` left by an earlier run is resumed
  with ``Range: bytes=N-`` and ``If-Range: "sha256-HEX"``; a ``200`` answer
  restarts it from zero.  A resumed file that does not verify is downloaded
  once more from the start; a digest mismatch of a whole download is a
  failure and its ``.part`` is deleted (its bytes are wrong).
- An existing file is never overwritten: ``NAME.zip`` with the right digest
  is "already there"; a different one leaves the archive saved as
  ``NAME (GID).zip`` (or, when that too exists and differs, a failure).  The
  final rename is a hard link, which refuses to replace a file that appeared
  meanwhile.
- A link that expires before or during its transfer is asked for again.
  Connection errors and a busy server (``503``/``429`` with ``Retry-After``)
  are retried, resuming where the transfer stopped.
- Ctrl-C stops at once and leaves every ``.part`` for a later run.

Exit status: 0 every archive saved or already there, 1 at least one failed
(each named with why, on standard error), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import queue
import re
import ssl
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlencode, urljoin, urlsplit

from tasknet.cli.args import parse, printable
from tasknet.units import parse_duration
from tasknet.version import version_line

__all__ = [
    "ArchiveLink",
    "Downloader",
    "GetError",
    "Outcome",
    "SiteClient",
    "build_parser",
    "main",
    "plan_names",
    "safe_name",
]

PROGRAM = "tasknet-get"
MAX_GID = 2_147_483_647
#: The site's limit on one ``POST /api/tasks/archive-links``.
LINKS_PER_CALL = 1000
#: Bytes read and written at a time: large enough for the kernel to stream,
#: small enough that Ctrl-C and the progress bar answer at once.
CHUNK = 256 * 1024
#: A link this close to its expiry is asked for again before it is used.
EXPIRY_MARGIN = 5.0
#: How many fresh links one archive may need (expired, or a node that
#: refused a link) before it counts as failed.
MAX_LINK_REFRESHES = 3
#: The longest ``Retry-After`` honoured; a longer one is a failure to report.
MAX_RETRY_AFTER = 30.0
MAX_REDIRECTS = 5
#: File names stay under the usual 255-byte limit with `` (GID).zip.part``.
MAX_NAME_BYTES = 200

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: What each error code of the site and the node means to the user.
CODE_WORDS = {
    "not_found": "no such task (or not yours)",
    "archive_not_ready": "not ready: the task is not completed",
    "archive_gone": "the archive is gone",
    "node_offline": "its node is offline; try again later",
    "archive_not_served": "its node does not serve archives (a legacy node, or no --serve)",
    "too_many_streams": "too many streams through the site at once",
    "link_expired": "the link expired",
    "link_invalid": "the node refused the link",
    "unauthorized": "the site refused the token",
    "forbidden": "forbidden",
    "rate_limited": "rate limited",
    "unavailable": "the site's database is unavailable; try again later",
}


class GetError(Exception):
    """A failure to report for one archive (or for the whole run)."""


class SiteError(GetError):
    """An error answer from the site's API: ``{"error": {"code", "message"}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if message else f"{status} {code}")
        self.status = status
        self.code = code
        self.message = message


class _Interrupted(Exception):
    """Ctrl-C: stop where we are and keep the ``.part``."""


class _Transient(GetError):
    """Worth another try: the connection broke, or the server is busy."""

    def __init__(self, why: str, wait: float = 0.0, received: int = 0) -> None:
        super().__init__(why)
        self.wait = wait
        self.received = received


class _RefreshLink(GetError):
    """The link was refused (expired, or a node that does not take it): ask
    the site for a fresh one."""


# --------------------------------------------------------------------------
# Links and outcomes


@dataclass(frozen=True)
class ArchiveLink:
    """One entry of ``links`` in the archive-links answer."""

    gid: int
    url: str
    expires_at: float | None
    size: int | None
    sha256: str | None
    name: str

    @classmethod
    def from_json(cls, item: Any) -> ArchiveLink:
        """Checks the shape; a site answering something else is named as such."""
        if not isinstance(item, dict):
            raise GetError(f"the site answered a link that is not an object: {item!r:.200}")
        gid, url, size, digest, name = (
            item.get(key) for key in ("gid", "url", "size", "sha256", "name")
        )
        if not isinstance(gid, int) or isinstance(gid, bool) or not isinstance(url, str) or not url:
            raise GetError(f"the site answered a link without a gid or url: {item!r:.200}")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise GetError(f"the site answered a bad size for {gid}: {size!r}")
        if digest is not None and not (
            isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)
        ):
            raise GetError(f"the site answered a bad sha256 for {gid}: {digest!r:.80}")
        return cls(
            gid=gid,
            url=url,
            expires_at=_timestamp(item.get("expiresAt")),
            size=size,
            sha256=digest,
            name=name if isinstance(name, str) else "",
        )


def _timestamp(value: Any) -> float | None:
    """``expiresAt`` as Unix seconds: an ISO 8601 text or a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    return None


@dataclass(frozen=True)
class Outcome:
    """What became of one gid: ``saved``, ``present`` (already there) or
    ``failed``; ``message`` says what or why."""

    gid: int
    result: str
    message: str
    path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.result != "failed"


def describe_code(code: str, answer: dict[str, Any] | None = None) -> str:
    """An error code in words, with what the answer adds (status, reason)."""
    words = CODE_WORDS.get(code, code)
    if answer:
        extra = [
            f"{key} {answer[key]}"
            for key in ("status", "reason")
            if isinstance(answer.get(key), str | int) and not isinstance(answer.get(key), bool)
        ]
        if extra:
            words += f" ({', '.join(extra)})"
    return f"{words} [{code}]" if code in CODE_WORDS else words


# --------------------------------------------------------------------------
# File names

_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]')


def safe_name(name: str, gid: int) -> str:
    """The task's name as a file name (without ``.zip``): no path separator,
    control character or character Windows refuses; no leading dot (nor
    ``..``); at most :data:`MAX_NAME_BYTES` bytes of UTF-8; the gid when
    nothing is left.  The site's ``name`` is the file name with ``.zip``
    already; a name without it is taken as it is."""
    text = unicodedata.normalize("NFC", name)
    # Control, format (bidirectional overrides) and unassigned characters: a
    # space, as the site's file_name does.
    text = "".join(" " if unicodedata.category(c).startswith("C") else c for c in text)
    if text.lower().endswith(".zip"):
        text = text[: -len(".zip")]
    text = " ".join(text.split())  # runs of white space (tabs, newlines) as one space
    text = _UNSAFE.sub("_", text)
    text = text.strip(" .")
    encoded = text.encode("utf-8")[:MAX_NAME_BYTES]
    text = encoded.decode("utf-8", errors="ignore").rstrip(" .")
    return text or str(gid)


def plan_names(links: Iterable[ArchiveLink]) -> dict[int, str]:
    """A file name (without ``.zip``) for each gid: two archives of one run
    never share a file, whatever the order they are fetched in (the lowest gid
    keeps the plain name; the others get `` (GID)``); case is ignored, as
    some file systems do."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    for link in sorted(links, key=lambda item: item.gid):
        base = safe_name(link.name, link.gid)
        if base.casefold() in taken:
            base = f"{base} ({link.gid})"
        taken.add(base.casefold())
        names[link.gid] = base
    return names


def _sha256_of(path: Path, stop: threading.Event | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            if stop is not None and stop.is_set():
                raise _Interrupted()
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------
# HTTP


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


class HttpAnswer:
    """An answer whose body is read as it arrives; ``close()`` ends its connection."""

    def __init__(
        self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse, url: str
    ) -> None:
        self.connection = connection
        self.response = response
        self.url = url

    @property
    def status(self) -> int:
        return self.response.status

    def header(self, name: str) -> str | None:
        return self.response.getheader(name)

    def read(self, amount: int | None = None) -> bytes:
        return self.response.read(amount)

    def error(self) -> tuple[str, dict[str, Any]]:
        """The error envelope's code and object (``http_STATUS`` when there is none)."""
        try:
            body = json.loads(self.response.read(64 * 1024) or b"null")
        except (ValueError, OSError, http.client.HTTPException):
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"]
            code = error.get("code")
            if isinstance(code, str) and code:
                return code, error
        return f"http_{self.status}", {}

    def close(self) -> None:
        self.connection.close()


class Http:
    """Blocking HTTP with connect and read timeouts, redirects followed by
    hand so the bearer token goes to the site's own origin only."""

    def __init__(
        self,
        site_url: str,
        token: str,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.site_url = site_url
        self._site_origin = _origin(site_url)
        self._token = token
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._ssl_context = ssl_context or ssl.create_default_context()

    def is_site(self, url: str) -> bool:
        return _origin(url) == self._site_origin

    def open(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> HttpAnswer:
        """The answer to ``method url`` after redirects; the caller closes it.
        A connection that cannot be made or breaks raises :class:`_Transient`."""
        url = urljoin(self.site_url, url)
        for _ in range(MAX_REDIRECTS + 1):
            answer = self._once(method, url, headers or {}, body)
            location = answer.header("Location")
            if answer.status not in (301, 302, 303, 307, 308) or not location:
                return answer
            answer.close()
            url = urljoin(url, location)
            if answer.status == 303:
                method, body = "GET", None
        raise GetError(f"more than {MAX_REDIRECTS} redirects (last to {_public(url)})")

    def _once(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> HttpAnswer:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise GetError(f"not an http(s) URL: {_public(url)}")
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=self.connect_timeout, context=self._ssl_context
            )
        else:
            connection = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=self.connect_timeout
            )
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        sent = {"User-Agent": version_line(PROGRAM).replace(" ", "/"), **headers}
        if self.is_site(url):
            sent["Authorization"] = f"Bearer {self._token}"
        try:
            connection.connect()
            assert connection.sock is not None
            connection.sock.settimeout(self.read_timeout)
            connection.request(method, target, body=body, headers=sent)
            response = connection.getresponse()
        except ssl.SSLCertVerificationError as err:
            connection.close()
            raise GetError(
                f"{parts.hostname}: TLS certificate not trusted ({err.reason})"
            ) from None
        except (OSError, http.client.HTTPException) as err:
            connection.close()
            raise _Transient(f"{parts.hostname}:{parts.port or ''}: {_brief(err)}") from None
        return HttpAnswer(connection, response, url)


def _public(url: str) -> str:
    """A URL fit to print: a signed link's query (its signature) left out."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _brief(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}" if text != type(err).__name__ else text


# --------------------------------------------------------------------------
# The site's API


class SiteClient:
    """The few calls of the site's API this client makes."""

    def __init__(self, http_client: Http) -> None:
        self.http = http_client

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            # Relative to the site's URL, so a site under a path prefix works.
            answer = self.http.open(method, path.lstrip("/"), headers=headers, body=data)
        except _Transient as err:
            raise GetError(f"cannot reach the site: {err}") from None
        try:
            if answer.status >= 400:
                code, error = answer.error()
                message = error.get("message") if isinstance(error.get("message"), str) else ""
                raise SiteError(answer.status, code, message or "")
            try:
                return json.loads(answer.read())
            except (ValueError, OSError, http.client.HTTPException) as err:
                raise GetError(f"the site's answer to {path} is not JSON: {_brief(err)}") from None
        finally:
            answer.close()

    def links(self, gids: Sequence[int]) -> tuple[list[ArchiveLink], dict[int, str]]:
        """Links for ``gids`` (any number: asked 1,000 at a time) and, for
        the ones the site will not give, why (in words)."""
        links: list[ArchiveLink] = []
        missing: dict[int, str] = {}
        for start in range(0, len(gids), LINKS_PER_CALL):
            batch = list(gids[start : start + LINKS_PER_CALL])
            answer = self.call("POST", "/api/tasks/archive-links", {"gids": batch})
            if not isinstance(answer, dict) or not isinstance(answer.get("links"), list):
                raise GetError(f"the site's archive-links answer has no links: {answer!r:.200}")
            links.extend(ArchiveLink.from_json(item) for item in answer["links"])
            for item in answer.get("missing") or []:
                if isinstance(item, dict) and isinstance(item.get("gid"), int):
                    missing[item["gid"]] = describe_code(str(item.get("code", "missing")), item)
        asked = set(gids)
        links = [link for link in links if link.gid in asked]
        for gid in asked - {link.gid for link in links} - set(missing):
            missing[gid] = "the site answered neither a link nor why"
        return links, missing

    def link(self, gid: int) -> ArchiveLink:
        """A fresh link for one gid, or :class:`GetError` saying why not."""
        links, missing = self.links([gid])
        if links:
            return links[0]
        raise GetError(missing.get(gid, "no link"))

    def completed_gids(self, since: datetime | None, all_users: bool) -> list[int]:
        """The gids of the completed tasks (the caller's own unless
        ``all_users``: an admin's list holds everyone's), completed at or
        after ``since``: the list has no date filter, so every page is read."""
        me = self.call("GET", "/api/me")
        my_name = me.get("user", {}).get("name") if isinstance(me, dict) else None
        gids: list[int] = []
        after: Any = None
        while True:
            query = {"status": "COMPLETED", "order": "gid", "limit": "500"}
            if after is not None:
                query["after"] = str(after)
            page = self.call("GET", "/api/tasks?" + urlencode(query))
            if not isinstance(page, dict) or not isinstance(page.get("tasks"), list):
                raise GetError(f"the site's task list is not a list: {page!r:.200}")
            for task in page["tasks"]:
                if not isinstance(task, dict) or not isinstance(task.get("gid"), int):
                    continue
                if not all_users and task.get("owner") not in (None, my_name):
                    continue
                if since is not None:
                    completed = _timestamp(task.get("completedAt") or task.get("updatedAt"))
                    if completed is None or completed < since.timestamp():
                        continue
                gids.append(task["gid"])
            after = page.get("next")
            if after is None or not page["tasks"]:
                return gids


# --------------------------------------------------------------------------
# Progress


class Reporter:
    """Plain lines on standard output, one per start, finish or failure
    (what a log or a pipe wants).  Thread-safe."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def begin(self, links: Sequence[ArchiveLink]) -> None:
        pass

    def started(self, link: ArchiveLink, path: Path, offset: int) -> None:
        size = _size(link.size) if link.size is not None else "size unknown"
        resumed = f", resuming at {_size(offset)}" if offset else ""
        self._line(f"start {link.gid} {path.name} ({size}{resumed})")

    def advanced(self, gid: int, amount: int) -> None:
        pass

    def restarted(self, gid: int, why: str) -> None:
        self._line(f"note {gid}: {why}")

    def finished(self, outcome: Outcome) -> None:
        word = {"saved": "done", "present": "skip", "failed": "FAILED"}[outcome.result]
        self._line(f"{word} {outcome.gid}: {outcome.message}")

    def end(self) -> None:
        pass

    def _line(self, text: str) -> None:
        with self._lock:
            print(printable(text), file=self._out, flush=True)


class RichReporter(Reporter):
    """A bar per file being fetched and one for the total (rich), on a terminal."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        super().__init__(out)
        self._progress = Progress(
            TextColumn("{task.description}", justify="left", markup=False),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=out),
            transient=False,
        )
        self._bars: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._counted: dict[int, int] = {}
        self._total: Any = None
        self._total_bytes = 0

    def begin(self, links: Sequence[ArchiveLink]) -> None:
        self._sizes = {link.gid: link.size or 0 for link in links}
        self._total_bytes = sum(self._sizes.values())
        self._progress.start()
        self._total = self._progress.add_task(
            f"total ({len(links)})", total=self._total_bytes or None
        )

    def started(self, link: ArchiveLink, path: Path, offset: int) -> None:
        name = path.name if len(path.name) <= 40 else path.name[:37] + "..."
        with self._lock:
            self._bars[link.gid] = self._progress.add_task(name, total=link.size)
        self._count(link.gid, offset)

    def advanced(self, gid: int, amount: int) -> None:
        self._count(gid, amount)

    def restarted(self, gid: int, why: str) -> None:
        self._count(gid, -self._counted.get(gid, 0))
        self._print(f"note {gid}: {why}")

    def _count(self, gid: int, amount: int) -> None:
        with self._lock:
            self._counted[gid] = self._counted.get(gid, 0) + amount
            bar = self._bars.get(gid)
            if bar is not None:
                self._progress.advance(bar, amount)
            if self._total is not None:
                self._progress.advance(self._total, amount)

    def finished(self, outcome: Outcome) -> None:
        with self._lock:
            bar = self._bars.pop(outcome.gid, None)
            if bar is not None:
                self._progress.remove_task(bar)
            # What was not fetched (skipped, failed) leaves the total's bar.
            left = self._sizes.pop(outcome.gid, 0) - self._counted.pop(outcome.gid, 0)
            if outcome.result != "saved" and left > 0 and self._total is not None:
                self._total_bytes = max(0, self._total_bytes - left)
                self._progress.update(self._total, total=self._total_bytes)
        word = {"saved": "done", "present": "skip", "failed": "FAILED"}[outcome.result]
        failed = outcome.result == "failed"
        self._print(f"{word} {outcome.gid}: {outcome.message}", "red" if failed else None)

    def _print(self, line: str, style: str | None = None) -> None:
        # A task's name is text, never rich markup ("[Group] Title").
        self._progress.console.print(
            printable(line), markup=False, highlight=False, style=style, soft_wrap=True
        )

    def end(self) -> None:
        self._progress.stop()


def _size(amount: int) -> str:
    value = float(amount)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{amount} B"  # pragma: no cover


# --------------------------------------------------------------------------
# One archive


class Downloader:
    """Fetches one archive after another into ``directory`` (one instance is
    shared by the worker threads: it holds no state of a transfer)."""

    def __init__(
        self,
        site: SiteClient,
        directory: Path,
        reporter: Reporter,
        *,
        stop: threading.Event | None = None,
        retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.site = site
        self.http = site.http
        self.directory = directory
        self.reporter = reporter
        self.stop = stop or threading.Event()
        self.retries = retries
        self._sleep = sleep
        self._clock = clock

    def fetch(self, link: ArchiveLink, base: str) -> Outcome:
        """Fetch ``link``'s archive to ``base + ".zip"`` (or ``base (GID).zip``
        when a different file holds that name); never raises but for Ctrl-C."""
        try:
            return self._fetch(link, base)
        except _Interrupted:
            raise
        except GetError as err:
            return Outcome(link.gid, "failed", str(err))
        except OSError as err:  # the local disk: full, read-only, no permission
            return Outcome(link.gid, "failed", f"{_brief(err)}")

    def _fetch(self, link: ArchiveLink, base: str) -> Outcome:
        final = self.directory / f"{base}.zip"
        if final.exists():
            if self._same(final, link):
                return self._present(link, final)
            final = self.directory / f"{base} ({link.gid}).zip"
            if final.exists():
                if self._same(final, link):
                    return self._present(link, final)
                raise GetError(
                    f"{base}.zip and {final.name} both exist and differ from this archive; "
                    "move one away and run again"
                )
        part = final.with_name(final.name + ".part")
        return self._download(link, final, part)

    def _same(self, path: Path, link: ArchiveLink) -> bool:
        if link.size is not None and path.stat().st_size != link.size:
            return False
        if link.sha256 is not None:
            return _sha256_of(path, self.stop) == link.sha256
        return link.size is not None  # a legacy archive: the size is all there is to compare

    def _present(self, link: ArchiveLink, path: Path) -> Outcome:
        check = "SHA-256 matches" if link.sha256 else "size matches; no SHA-256 to compare"
        return Outcome(link.gid, "present", f"{path} already there ({check})", path)

    def _download(self, link: ArchiveLink, final: Path, part: Path) -> Outcome:
        refreshes = 0
        failures = 0
        resumed_check_failed = False
        first_offset: int | None = None
        while True:
            # A link that waited in the queue past its expiry is renewed once
            # before use; after that the node's clock decides (this one may
            # be off), answering link_expired.
            if (
                refreshes == 0
                and link.expires_at is not None
                and link.expires_at - EXPIRY_MARGIN <= self._clock()
            ):
                link = self._fresh(link, refreshes)
                refreshes += 1
            offset = part.stat().st_size if part.exists() else 0
            if link.size is not None and offset > link.size:
                part.unlink()  # longer than the archive: not a prefix of it
                offset = 0
            if first_offset is None:
                first_offset = offset
                self.reporter.started(link, final, offset)
            try:
                self._transfer(link, part, offset)
            except _RefreshLink as err:
                if refreshes >= MAX_LINK_REFRESHES:
                    raise GetError(f"{err} ({refreshes} fresh links did not help)") from None
                link = self._fresh(link, refreshes)
                refreshes += 1
                continue
            except _Transient as err:
                # A transfer that moved on gets its tries back: only a run of
                # failures without progress gives up.
                failures = 1 if err.received else failures + 1
                if failures > self.retries:
                    raise GetError(f"{err} (tried {failures} times)") from None
                # After progress the path works: reconnect at once.
                backoff = 0.0 if err.received else min(2.0 ** (failures - 1), MAX_RETRY_AFTER)
                self._sleep(err.wait or backoff)
                continue
            problem = self._verify(link, part)
            if problem is None:
                return self._finish(link, part, final)
            part.unlink()
            if first_offset and not resumed_check_failed:
                # The earlier run's bytes may not have been this archive's.
                resumed_check_failed = True
                self.reporter.restarted(
                    link.gid, f"the resumed file did not verify ({problem}); starting again"
                )
                continue
            raise GetError(f"{problem}; the partial file was deleted")

    def _fresh(self, link: ArchiveLink, refreshes: int) -> ArchiveLink:
        if refreshes >= MAX_LINK_REFRESHES:
            raise GetError(f"the link kept expiring ({refreshes} fresh links)")
        fresh = self.site.link(link.gid)
        # A fresh link for another generation of the gid is another archive:
        # a .part of the old one must not be resumed into it.
        if (fresh.sha256, fresh.size) != (link.sha256, link.size):
            raise GetError("the archive changed on the site while it was fetched; run again")
        return replace(fresh, name=link.name)

    def _transfer(self, link: ArchiveLink, part: Path, offset: int) -> None:
        """One request, its body written to ``part`` from ``offset`` on."""
        if offset and offset == link.size:
            return  # an earlier run got every byte: only the check is left
        headers = {"Accept": "application/zip, application/octet-stream"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            if link.sha256:
                headers["If-Range"] = f'"sha256-{link.sha256}"'
        answer = self.http.open("GET", link.url, headers=headers)
        try:
            if answer.status == 206 and offset:
                start, total = _content_range(answer.header("Content-Range"))
                if start != offset:
                    raise _Transient(f"the server resumed at {start}, not at {offset}")
                expected_total = total
            elif answer.status == 200:
                if offset:
                    self.reporter.restarted(link.gid, "the server sent the whole file; from zero")
                    part.unlink()
                    offset = 0
                length = answer.header("Content-Length")
                expected_total = int(length) if length and length.isdigit() else None
            elif answer.status == 416 and offset and offset == link.size:
                return  # the .part is complete already: verify it
            elif answer.status == 416:
                part.unlink()
                raise _Transient("the server cannot resume this file; starting again")
            else:
                self._refuse(answer)
            if expected_total is not None and link.size is not None and expected_total != link.size:
                raise GetError(
                    f"the server's archive is {expected_total} bytes; the site recorded {link.size}"
                )
            self._stream(link, answer, part, offset)
        finally:
            answer.close()

    def _stream(self, link: ArchiveLink, answer: HttpAnswer, part: Path, offset: int) -> None:
        received = 0
        # Unbuffered: what arrived is on disk at once, so a killed run leaves
        # every byte it received for the next one to resume from.
        with part.open("r+b" if offset else "wb", buffering=0) as handle:
            handle.seek(offset)
            handle.truncate()
            while True:
                if self.stop.is_set():
                    raise _Interrupted()
                try:
                    # read1: what has arrived (up to CHUNK), so the bar moves
                    # and a stalled peer leaves its bytes on disk.
                    chunk = answer.response.read1(CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise _Transient(
                        f"the transfer broke after {received} bytes: {_brief(err)}",
                        received=received,
                    ) from None
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[handle.write(view) or 0 :]
                received += len(chunk)
                self.reporter.advanced(link.gid, len(chunk))
        # read1 answers b"" when the peer closes early: a short file is a
        # broken transfer to resume, not a wrong one.
        unread = answer.response.length
        if unread or (link.size is not None and offset + received < link.size):
            raise _Transient(
                f"the connection closed after {offset + received} of "
                f"{link.size if link.size is not None else '?'} bytes",
                received=received,
            )

    def _refuse(self, answer: HttpAnswer) -> None:
        code, error = answer.error()
        retry_after = _retry_after(answer.header("Retry-After"))
        if answer.status == 403 and code in ("link_expired", "link_invalid"):
            raise _RefreshLink(describe_code(code))
        if answer.status in (429, 502, 503, 504) and code != "node_offline":
            if retry_after is not None and retry_after <= MAX_RETRY_AFTER:
                raise _Transient(describe_code(code, error), wait=max(retry_after, 0.1))
            if retry_after is None:
                raise _Transient(describe_code(code, error))
        words = describe_code(code, error)
        if code == "node_offline" and retry_after is not None:
            words += f"; the site says retry after {retry_after:.0f} s"
        if code.startswith("http_"):
            words = f"HTTP {answer.status} from {_public(answer.url)}"
        elif code not in CODE_WORDS:
            words = f"HTTP {answer.status} {words}"
        message = error.get("message")
        if isinstance(message, str) and message and code not in CODE_WORDS:
            words += f": {message}"
        raise GetError(words)

    def _verify(self, link: ArchiveLink, part: Path) -> str | None:
        """What is wrong with the finished ``part`` (None: nothing)."""
        size = part.stat().st_size
        if link.size is not None and size != link.size:
            return f"size mismatch: {size} bytes received, {link.size} expected"
        if link.sha256 is not None:
            digest = _sha256_of(part, self.stop)
            if digest != link.sha256:
                return f"SHA-256 mismatch: expected {link.sha256}, got {digest}"
        return None

    def _finish(self, link: ArchiveLink, part: Path, final: Path) -> Outcome:
        with part.open("rb") as handle:
            os.fsync(handle.fileno())
        try:
            os.link(part, final)  # refuses to replace a file that appeared meanwhile
        except FileExistsError:
            if self._same(final, link):
                part.unlink()
                return self._present(link, final)
            raise GetError(
                f"{final} appeared meanwhile and differs; the verified download is kept as {part}"
            ) from None
        except OSError:  # a file system without hard links
            if final.exists():
                raise GetError(f"{final} appeared meanwhile; kept {part}") from None
            os.replace(part, final)
        else:
            part.unlink()
        check = (
            "SHA-256 verified"
            if link.sha256
            else "size verified; no SHA-256 recorded (a legacy node), content not verified"
        )
        size = _size(final.stat().st_size)
        return Outcome(link.gid, "saved", f"{final} ({size}, {check})", final)


def _content_range(value: str | None) -> tuple[int, int | None]:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", value or "")
    if not match:
        raise _Transient(f"a 206 answer without a usable Content-Range ({value!r:.80})")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _retry_after(value: str | None) -> float | None:
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


# --------------------------------------------------------------------------
# The command


def _gid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a gid is an integer, got {text!r}") from None
    if not 1 <= value <= MAX_GID:
        raise argparse.ArgumentTypeError(f"a gid is in 1..{MAX_GID}, got {value}")
    return value


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be in 1..64, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return value


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: a date (``2026-12-01``, midnight UTC), a time
    (``2026-12-01T08:00:00Z``; no zone: UTC), or a duration ago (``7d``)."""
    now = now or datetime.now(UTC)
    try:
        return now - timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a date, a time or a duration: {text!r} (e.g. 2026-12-01, "
            "2026-12-01T08:00:00Z, 7d)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _site_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"the site is an http(s) URL, got {text!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise argparse.ArgumentTypeError("the site URL takes no query, fragment or credentials")
    return text.rstrip("/") + "/"


USAGE_NOTES = """\
Files: each archive is written to DIR/NAME.zip.part and renamed to NAME.zip
once its size and SHA-256 match what the site recorded (an archive of a
legacy node has no SHA-256: only its size is checked, and the output says so).
A .part left by an interrupted run is resumed. A file is never overwritten:
an existing NAME.zip with the same digest is skipped as already there; a
different one leaves this archive saved as "NAME (GID).zip" (and if that
exists and differs too, the archive fails: move one away). Two archives of
one run with the same name: the lowest gid gets NAME.zip, the others
"NAME (GID).zip". A digest mismatch deletes the .part and fails.

The token: --token-file F, else $TASKNET_TOKEN. It is sent to the site only,
never to a storage node (a node's link is signed and needs none).

Exit status: 0 all archives saved or already there; 1 at least one failed
(each is named with why on standard error: missing, not ready, gone, node
offline, digest mismatch, HTTP error); 2 bad usage; 130 interrupted (Ctrl-C
keeps the .part files; run again to resume).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Fetch the archives of completed tasks from a tasknet site, "
        "resuming partial files and verifying each SHA-256.",
        epilog=USAGE_NOTES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line(PROGRAM))
    parser.add_argument(
        "--site",
        metavar="URL",
        required=True,
        type=_site_url,
        help="the site's base URL (https://site.example/)",
    )
    parser.add_argument(
        "--token-file",
        metavar="F",
        type=Path,
        help="a file holding the API token (default: $TASKNET_TOKEN)",
    )
    parser.add_argument("gids", nargs="*", type=_gid, metavar="GID", help="the tasks to fetch")
    parser.add_argument(
        "--completed",
        action="store_true",
        help="fetch every completed task of yours (instead of GIDs)",
    )
    parser.add_argument(
        "--since",
        metavar="DATE",
        type=parse_since,
        help="with --completed: only tasks completed since DATE (2026-12-01, "
        "2026-12-01T08:00:00Z, or a duration ago: 7d)",
    )
    parser.add_argument(
        "--all-users",
        action="store_true",
        help="with --completed, for an admin: every user's completed tasks, not only yours",
    )
    parser.add_argument(
        "-d",
        "--directory",
        metavar="DIR",
        type=Path,
        default=Path("."),
        help="where to save (default: here)",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        metavar="N",
        type=_jobs,
        default=2,
        help="archives fetched at once (default 2)",
    )
    parser.add_argument(
        "--connect-timeout",
        metavar="SECONDS",
        type=_seconds,
        default=10.0,
        help="seconds to connect (default 10; also 10s, 1m)",
    )
    parser.add_argument(
        "--read-timeout",
        metavar="SECONDS",
        type=_seconds,
        default=60.0,
        help="seconds without a byte before a transfer is retried (default 60)",
    )
    parser.add_argument(
        "--retries",
        metavar="N",
        type=int,
        default=3,
        help="tries after a broken connection without progress (default 3)",
    )
    parser.add_argument(
        "--cacert",
        metavar="FILE",
        type=Path,
        help="trust this CA file for https (a site or node of your own)",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="plain lines even on a terminal (they are the default elsewhere)",
    )
    return parser


def _token(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            parser.error(f"cannot read --token-file {args.token_file}: {_brief(err)}")
        source = f"--token-file {args.token_file}"
    else:
        token = os.environ.get("TASKNET_TOKEN", "").strip()
        source = "$TASKNET_TOKEN"
        if not token:
            parser.error("no token: give --token-file F or set TASKNET_TOKEN")
    if not token:
        parser.error(f"{source} is empty")
    if any(ch in token for ch in "\r\n\x00") or not token.isprintable():
        parser.error(f"{source} holds a character a token cannot have")
    return token


def _run_all(
    downloader: Downloader,
    links: Sequence[ArchiveLink],
    names: dict[int, str],
    jobs: int,
) -> list[Outcome]:
    """Fetch ``links`` with ``jobs`` threads; Ctrl-C (in this thread) sets
    the stop event and is raised again once the workers have put their files
    down (they stop within one chunk or one read timeout)."""
    work: queue.Queue[ArchiveLink] = queue.Queue()
    for link in links:
        work.put(link)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def worker() -> None:
        while not downloader.stop.is_set():
            try:
                link = work.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = downloader.fetch(link, names[link.gid])
            except _Interrupted:
                return
            downloader.reporter.finished(outcome)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(jobs, len(links)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except KeyboardInterrupt:
        downloader.stop.set()
        for thread in threads:
            thread.join(5.0)
        raise
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    if bool(args.gids) == bool(args.completed):
        parser.error("give GIDs or --completed (one of them)")
    if (args.since is not None or args.all_users) and not args.completed:
        parser.error("--since and --all-users go with --completed")
    if args.retries < 0:
        parser.error("--retries must be >= 0")
    token = _token(args, parser)
    directory: Path = args.directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"-d {directory}: {_brief(err)}")
    if not directory.is_dir():
        parser.error(f"-d {directory}: not a directory")
    context = None
    if args.cacert is not None:
        try:
            context = ssl.create_default_context(cafile=str(args.cacert))
        except (OSError, ssl.SSLError) as err:
            parser.error(f"--cacert {args.cacert}: {_brief(err)}")

    http_client = Http(
        args.site,
        token,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        ssl_context=context,
    )
    site = SiteClient(http_client)
    on_terminal = sys.stderr.isatty() and not args.plain
    reporter: Reporter = RichReporter(sys.stderr) if on_terminal else Reporter(sys.stdout)
    try:
        if args.completed:
            gids = site.completed_gids(args.since, args.all_users)
            if not gids:
                print("no completed tasks to fetch", file=sys.stderr)
                return EXIT_OK
        else:
            gids = list(dict.fromkeys(args.gids))
        links, missing = site.links(gids)
    except GetError as err:
        print(printable(f"{PROGRAM}: {err}"), file=sys.stderr)
        return EXIT_FAILED

    reporter.begin(links)
    outcomes = [Outcome(gid, "failed", why) for gid, why in sorted(missing.items())]
    for outcome in outcomes:
        reporter.finished(outcome)
    downloader = Downloader(site, directory, reporter, retries=args.retries)
    try:
        outcomes += _run_all(downloader, links, plan_names(links), args.jobs)
    except KeyboardInterrupt:
        reporter.end()
        print(
            f"{PROGRAM}: interrupted; partial files (*.zip.part) are kept: run again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    reporter.end()
    return _summary(outcomes, len(gids))


def _summary(outcomes: list[Outcome], asked: int) -> int:
    failed = sorted((o for o in outcomes if not o.ok), key=lambda o: o.gid)
    saved = sum(1 for o in outcomes if o.result == "saved")
    present = sum(1 for o in outcomes if o.result == "present")
    print(
        f"{asked} archive{'s' if asked != 1 else ''}: {saved} saved, "
        f"{present} already there, {len(failed)} failed",
        file=sys.stderr,
    )
    if not failed:
        return EXIT_OK
    for outcome in failed:
        print(printable(f"  failed {outcome.gid}: {outcome.message}"), file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
