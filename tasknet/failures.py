"""A network or disk failure in words (issue 36, item 9): what the site and
the node say of a failed connection in an API message or a task's
``detail``, instead of an exception's text ("ConnectionRefusedError:
Connection was refused by other side: 111: Connection refused.").

The words keep what a reader needs (what failed, and the errno as a
number); the exception's own text stays in the logs.  The web UI maps
these words to its languages (``refused``, ``timed out``, ``unreachable``,
``no space``, ``reset``/``closed``, ``DNS``).
"""

from __future__ import annotations

import errno
import re
import socket

__all__ = ["cannot_reach", "plain_words"]

_ERRNO_WORDS = {
    errno.ECONNREFUSED: "the connection was refused (nothing answers at that address)",
    errno.ECONNRESET: "the connection was reset",
    errno.ECONNABORTED: "the connection was closed",
    errno.EPIPE: "the connection was closed",
    errno.ETIMEDOUT: "the connection timed out",
    errno.EHOSTUNREACH: "the host is unreachable (no route)",
    errno.ENETUNREACH: "the network is unreachable (no route)",
    errno.ENOSPC: "no space left on the disk",
}

# Twisted's failures by class name: this leaf imports nothing of Twisted's
# internals (twisted.web._newclient is private).
_NAMED_WORDS = {
    "ConnectionRefusedError": _ERRNO_WORDS[errno.ECONNREFUSED],
    "DNSLookupError": "the host name is not known (DNS lookup failed)",
    "TimeoutError": "the connection timed out",
    "TCPTimedOutError": "the connection timed out",
    "UserTimeoutError": "the connection timed out",
    "NoRouteError": "the host is unreachable (no route)",
    "ConnectionLost": "the connection closed before an answer",
    "ConnectionDone": "the connection closed before an answer",
    "ResponseNeverReceived": "the connection closed before an answer",
    "ResponseFailed": "the connection closed before the whole answer",
}


def plain_words(error: BaseException) -> str | None:
    """``error`` in words when it is a network or disk failure; None
    otherwise (the caller keeps its own text)."""
    # urllib's URLError wraps the OSError; an error raised "from" another
    # (the node's DownloadError from treq's) says what that one says.
    for inner_error in (getattr(error, "reason", None), error.__cause__):
        if isinstance(inner_error, BaseException) and inner_error is not error:
            inner = plain_words(inner_error)
            if inner is not None:
                return inner
    if isinstance(error, socket.gaierror):
        return _NAMED_WORDS["DNSLookupError"]
    if (
        isinstance(error, socket.timeout | TimeoutError)
        and type(error).__name__ not in _NAMED_WORDS
    ):
        return "the connection timed out"
    number = getattr(error, "errno", None)
    if isinstance(error, OSError) and isinstance(number, int) and number in _ERRNO_WORDS:
        return f"{_ERRNO_WORDS[number]} (errno {number})"
    for kind in type(error).__mro__:
        if kind.__name__ in _NAMED_WORDS:
            return _NAMED_WORDS[kind.__name__]
    return None


#: What says a peer could not be reached at all (not an answer that failed,
#: not our disk): the words above, and the exception texts a node may still
#: put in a ``detail`` ("Connection was refused by other side: 111"); the
#: web UI reads the same (``app.js``, the ``reason*`` keys).
_CANNOT_REACH = re.compile(
    r"refused|timed? ?out|unreachable|no route|DNS|host name is not known|hostname",
    re.IGNORECASE,
)


def cannot_reach(text: str) -> bool:
    """Whether ``text`` (a task's ``detail``, an API message) says a peer
    could not be reached: a refused connection, a timeout, no route, an
    unknown host name."""
    return _CANNOT_REACH.search(text) is not None
