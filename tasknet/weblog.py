"""HTTP servers whose access lines stay out of the main log.

twisted.web writes one access line per request into the main log at info
level (``log.logfile``): on a busy site most of its log.  :class:`QuietSite`
is ``twisted.web.server.Site`` that

* writes its access lines to ``logPath`` when it has one (the site's
  ``--access-log PATH``: the combined log format, one request a line);
* else makes each line a **debug** event (namespace ``tasknet.access``,
  field ``access_line``), shown only with ``--log-level debug``;
* logs no "Starting factory" / "Stopping factory" lines (``noisy = False``:
  the roles log their own "HTTP on ..." line);
* keeps no timer: twisted.web formats the access lines' date once a second
  on a timer that wakes every server (and is most of a quiet simulated
  world's events); it is formatted here when a line is written.

The site's HTTP server (``tasknet.site.web.http.BoundedSite``), the node's
metrics page and the mock upstream are QuietSites.
"""

from __future__ import annotations

from twisted.logger import Logger
from twisted.web import http, server

__all__ = ["ACCESS_NAMESPACE", "DebugAccessLog", "QuietSite"]

ACCESS_NAMESPACE = "tasknet.access"


class DebugAccessLog:
    """A twisted.web access log "file": each line written becomes a debug
    event (the line is a field, never a format string: a URI may hold
    braces)."""

    def __init__(self, namespace: str = ACCESS_NAMESPACE) -> None:
        self._log = Logger(namespace=namespace)

    def write(self, line: str) -> None:
        self._log.debug("{access_line}", access_line=line.rstrip("\n"))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class QuietSite(server.Site):
    """``server.Site`` with its access lines at debug (or in ``logPath``)
    and no factory start/stop lines (the module doc)."""

    noisy = False

    def startFactory(self) -> None:
        super().startFactory()
        if not self.logPath:
            self.logFile = DebugAccessLog()

    def _updateLogDateTime(self) -> None:
        # twisted.web's once-a-second refresh, started by startFactory: none.
        pass

    def log(self, request: http.Request) -> None:
        self._logDateTime = http.datetimeToLogString(self.reactor.seconds())
        super().log(request)
