"""The errors that leave storage: the business refusal every task transaction
raises (:class:`TaskError`) and the classified database errors
(:class:`DatabaseBusy`, :class:`DatabaseFailed`)."""

from __future__ import annotations


class TaskError(Exception):
    """A business refusal, with the INTERFACES.md error code it answers as
    (``conflict``, ``not_found``, ``quota_exceeded``, ``upstream_rejected``,
    ``upstream_unavailable``, ``invalid_request``, ``forbidden``).  Raised
    inside a transaction it rolls the transaction back: nothing changes."""

    def __init__(self, code: str, message: str, **details: int | str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: Numbers the answer carries beside the message (a refused task's ``cost``).
        self.details = details


class DatabaseError(Exception):
    """A database error as the layers above storage see it: classified, so
    they never import the database driver (``sqlite3``, ``psycopg``).  The
    driver's own error stays its ``__cause__``; inside storage,
    ``transactions.is_integrity_error`` tells a constraint or trigger violation on
    either backend."""


class DatabaseBusy(DatabaseError):
    """Busy, retry the transaction: the database's lock was not granted in
    time (another process holds it), the transaction was lost to another
    write's error, or (PostgreSQL) it kept losing serialization conflicts
    after the database layer's own reruns.  Nothing of the transaction was
    committed, and running the whole transaction again may succeed
    (``Database.write_retrying``)."""


class DatabaseUnavailable(DatabaseBusy):
    """The database cannot be reached (refused, restarted, the session ended
    on the server) even after the database layer replaced the connection
    and ran the transaction again: nothing was committed; retry later."""


class CommitUnknown(DatabaseBusy):
    """The connection was lost while the ``COMMIT`` was under way: the
    transaction may or may not have committed.  Only a transaction whose
    expected-state guards make a repeat a no-op may be run again
    (SCALE.md "Fencing" 4); the others must settle the doubt themselves."""


class DatabaseFailed(DatabaseError):
    """Failed: a constraint, an I/O error, a broken file or connection...
    Nothing of the transaction was committed, and running it again would
    not help."""


class TransactionLost(DatabaseBusy):
    """A write's changes were lost before the commit: the transaction it
    shared was rolled back as a whole (by SQLite, after another write's
    error such as a full disk, or by another write's function).  The write
    itself did not fail: running it again may succeed."""
