"""The business refusal every task transaction raises: :class:`TaskError`."""

from __future__ import annotations


class TaskError(Exception):
    """A business refusal, with the INTERFACES.md error code it answers as
    (``conflict``, ``not_found``, ``quota_exceeded``, ``upstream_rejected``,
    ``upstream_unavailable``, ``invalid_request``, ``forbidden``).  Raised
    inside a transaction it rolls the transaction back: nothing changes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
