"""``tasknet-admin --db PATH|URL ...``: users, tokens, node keys, UNKNOWN reconciliation.

User and node-key commands are one transaction each, run with the storage
functions the HTTP API uses (:mod:`tasknet.site.storage.users`) on a plain
connection of the site's database: a SQLite file with the site's PRAGMAs,
or a ``postgresql://`` URL (several sites may share that database; the
command works beside them).  ``unknown`` and ``resolve`` go
through :class:`tasknet.site.lifecycle.Lifecycle` exactly as
``GET /api/admin/unknown`` and ``POST /api/admin/tasks/{gid}/resolve`` do:
the evidence includes the upstream's read-only audit answer, read from the
upstream the site uses (its ``--upstream``, which the site records in the
database at each start; ``--upstream`` here overrides it).  If the audit
cannot be read the evidence says so, and a verdict then needs ``--note``
(nothing confirms it; without one the command is refused, exit 1).
Neither ever POSTs upstream.  The site may keep running meanwhile (WAL,
``busy_timeout``).  This module holds no SQL.

Commands::

    user add NAME [--admin] [--quota N]     prints the new API token (stored hashed);
                                            quota: the site's --default-quota by default
    user list
    user quota NAME N
    user token NAME                         prints a new token; the old one stops working
                                            and the user's browser sessions end
    user revoke NAME                        the token stops working, no new one (until
                                            'user token'); the user's sessions end
    user disable NAME                       the user's token and sessions stop working
                                            (its sessions end); its tasks stay
    user enable NAME                        the token works again (sign in again)
    user remove NAME                        delete the user; refused while it has a live
                                            task (anything but a DELETED tombstone)
    session list [--all]                    browser sessions: ID (a prefix of the stored
                                            hash), user, created, last seen, expires
    session end ID|--user NAME              end one session, or all of a user's
    node-key add ID [SECRET]                prints the secret (generated if omitted)
    node-key list [--show-secrets]
    node-key remove ID
    node reassign ID [--yes] [--note TEXT]  move the node's unfinished tasks off it now (same
                                            operationId, nothing charged again): they wait
                                            for a node, which a running site assigns at its
                                            next pass; the node is sent CANCEL when it next
                                            logs in (audited)
    node retire ID [--yes] [--note TEXT]    the node is gone for good: reassign as above,
                                            its completed tasks become ARCHIVE_GONE
                                            (NODE_RETIRED), its key is removed (audited)
    node drain ID [--note TEXT]             no new task goes to the node; what it holds
                                            finishes (the panel says drained when done)
    node pause ID [--note TEXT]             no new task goes to the node until resumed
    node resume ID [--note TEXT]            new tasks go to it again
    node limit ID N|none [--note TEXT]      at most N of its tasks not yet completed at a
                                            time (the site assigns less: v2 and legacy
                                            nodes alike); none: no bound
    [--upstream URL] unknown [--json]       UNKNOWN operations with their evidence
    [--upstream URL] resolve GID submitted|not_submitted [--note TEXT]
                                            refused (exit 1, naming the time) while a
                                            reaped submission's verdict wait runs
                                            (not_submitted); --note is required when the
                                            verdict contradicts the upstream's audit or
                                            the audit could not be read
    force-delete GID --note TEXT            complete a stuck DELETE_PENDING whose node
                                            is gone for good (audited; a repeat on the
                                            tombstone it left prints the same result)

Exit status: 0 done, 1 refused (the message says why; nothing changed),
2 bad usage.

Listings show what others wrote (task names are the upstream's titles)
with control characters escaped (:func:`tasknet.cli.args.printable`).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from tasknet.cli.args import parse, printable, printable_json
from tasknet.runtime import RealThreadPools, SystemEntropy
from tasknet.site.lifecycle import Lifecycle
from tasknet.site.storage import delete, node_control, reassign, reconcile, sessions, users
from tasknet.site.storage.engine import database as storage_db
from tasknet.site.storage.engine import errors
from tasknet.site.storage.engine.schema import SchemaError, prepare_database
from tasknet.site.upstream_client import UpstreamClient
from tasknet.status import status_words
from tasknet.version import version_line

T = TypeVar("T")


class AdminError(Exception):
    """A refusal to report to the operator (exit status 1)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _gid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gid must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"gid must be positive, got {value}")
    return value


#: As the API's limit on a note.
MAX_NOTE = 2000


def _note(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the note must say why")
    if len(text) > MAX_NOTE:
        raise argparse.ArgumentTypeError(f"the note is limited to {MAX_NOTE} characters")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tasknet-admin", description="Administer a tasknet site database."
    )
    parser.add_argument("--version", action="version", version=version_line("tasknet-admin"))
    parser.add_argument(
        "--db",
        required=True,
        help="the site's database: a SQLite file or a postgresql:// URL (as given to "
        "tasknet-site --db)",
    )
    parser.add_argument(
        "--upstream",
        default=None,
        help="upstream base URL, asked (read-only) for audit evidence by unknown/resolve;"
        " by default the one the site was last started with (recorded in the database)",
    )
    parser.add_argument(
        "--audit-timeout",
        type=float,
        default=5.0,
        help="seconds to wait for the upstream's audit answer",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_user_commands(commands)
    _add_session_commands(commands)
    _add_node_key_commands(commands)
    _add_node_commands(commands)
    _add_reconcile_commands(commands)
    return parser


def _add_user_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    user = commands.add_parser("user", help="users, quotas and API tokens")
    user_commands = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = user_commands.add_parser("add", help="create a user; prints its API token")
    add.add_argument("name")
    add.add_argument(
        "--admin", action="store_true", help="may see every task and reconcile UNKNOWN"
    )
    add.add_argument(
        "--quota",
        type=_positive_int,
        default=None,
        help="weekly quota (cost units); default: the site's --default-quota "
        f"(as of its last start), else {users.DEFAULT_QUOTA}",
    )
    user_commands.add_parser("list", help="list users")
    quota = user_commands.add_parser("quota", help="set a user's weekly quota")
    quota.add_argument("name")
    quota.add_argument("quota", type=_positive_int)
    token = user_commands.add_parser(
        "token",
        help="issue a new API token (the old one stops working, the user's browser sessions end)",
    )
    token.add_argument("name")
    revoke = user_commands.add_parser(
        "revoke",
        help="take the API token away, no new one (the user's browser sessions end); "
        "'user token' gives a new one",
    )
    revoke.add_argument("name")
    disable = user_commands.add_parser(
        "disable",
        help="lock the user out: its token and browser sessions stop working, its tasks stay",
    )
    disable.add_argument("name")
    enable = user_commands.add_parser(
        "enable", help="let a disabled user in again (the same token; sign in again)"
    )
    enable.add_argument("name")
    remove = user_commands.add_parser(
        "remove",
        help="delete the user for good; refused while it has live tasks (delete them first)",
    )
    remove.add_argument("name")


def _add_session_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    session = commands.add_parser("session", help="browser sessions of the web UI")
    session_commands = session.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = session_commands.add_parser(
        "list", help="open sessions (ID: a prefix of the stored hash, never the cookie)"
    )
    listing.add_argument(
        "--all", action="store_true", help="also the ended and expired ones still kept"
    )
    end = session_commands.add_parser("end", help="end a session, or all of a user's")
    which = end.add_mutually_exclusive_group(required=True)
    which.add_argument("id", metavar="ID", nargs="?", help="the ID 'session list' shows")
    which.add_argument("--user", metavar="NAME", help="end every session of this user")


def _add_node_key_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    node_key = commands.add_parser("node-key", help="nodes allowed to log in")
    key_commands = node_key.add_subparsers(dest="action", required=True, metavar="ACTION")
    key_add = key_commands.add_parser("add", help="allow a node (replaces its secret)")
    key_add.add_argument("node_id", metavar="ID")
    key_add.add_argument("secret", metavar="SECRET", nargs="?", help="generated when omitted")
    key_list = key_commands.add_parser("list", help="list node ids")
    key_list.add_argument("--show-secrets", action="store_true")
    key_remove = key_commands.add_parser("remove", help="stop allowing a node")
    key_remove.add_argument("node_id", metavar="ID")


def _add_node_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``node reassign`` and ``node retire``: custody of a node that is gone."""
    node = commands.add_parser(
        "node", help="a node: drain, pause, resume, limit; reassign its tasks, retire it"
    )
    node_commands = node.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("reassign", "move the node's unfinished tasks off it now (asks first)"),
        (
            "retire",
            "retire the node for good: its tasks move, its archives are gone, its key "
            "goes (asks first)",
        ),
    ):
        sub = node_commands.add_parser(action, help=text)
        sub.add_argument("node_id", metavar="ID", type=_node_id)
        sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        sub.add_argument("--note", type=_note, default=None, help="why (kept in the audit row)")
    for action, text in (
        ("drain", "no new task goes to the node; what it holds finishes"),
        ("pause", "no new task goes to the node until it is resumed"),
        ("resume", "new tasks go to the node again"),
        ("limit", "at most N of the node's tasks not yet completed at a time (none: no bound)"),
    ):
        sub = node_commands.add_parser(action, help=text)
        sub.add_argument("node_id", metavar="ID", type=_node_id)
        if action == "limit":
            sub.add_argument("limit", metavar="N|none", type=_download_limit)
        sub.add_argument("--note", type=_note, default=None, help="why (kept with the control)")


def _download_limit(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        return node_control.check_limit(int(text, 10))
    except (ValueError, node_control.BadControl):
        raise argparse.ArgumentTypeError(
            f"a download limit is a whole number from 1 to {node_control.MAX_LIMIT:,}"
            f" or none, got {printable(text)!r}"
        ) from None


def _node_id(text: str) -> str:
    if not users.NODE_ID_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"a node id is 1 to 64 of A-Z a-z 0-9 _ . -, got {printable(text)!r}"
        )
    return text


def _add_reconcile_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """``unknown``, ``resolve`` and ``force-delete``: the operator's settling tools."""
    unknown = commands.add_parser("unknown", help="list UNKNOWN operations with their evidence")
    unknown.add_argument("--json", action="store_true", help="machine-readable output")

    resolve = commands.add_parser(
        "resolve",
        help="reconcile an UNKNOWN operation (reads the upstream's audit, never POSTs upstream)",
    )
    resolve.add_argument("gid", type=_gid)
    resolve.add_argument("verdict", choices=reconcile.VERDICTS)
    resolve.add_argument(
        "--note",
        default="",
        help="why (kept in the audit log); required when the verdict contradicts the"
        " upstream's audit or the audit could not be read",
    )

    force = commands.add_parser(
        "force-delete",
        help="complete a stuck DELETE_PENDING whose node is gone for good (audited)",
    )
    force.add_argument("gid", type=_gid)
    force.add_argument("--note", required=True, type=_note, help="why (kept in the audit log)")


def _check_database(path: str) -> None:
    if not storage_db.is_postgres(path) and not Path(path).is_file():
        raise AdminError(_not_a_database(path))
    try:
        prepare_database(path)
    except SchemaError as error:
        raise AdminError(storage_db.redact(str(error), path)) from error
    except Exception as error:
        if not isinstance(storage_db.classify(error), errors.DatabaseError):
            raise
        raise AdminError(
            f"cannot use {storage_db.describe(path)!r}: {storage_db.redact(str(error), path)}"
        ) from error


def _not_a_database(path: str) -> str:
    """What is wrong with a SQLite ``--db`` that is not a file."""
    target = Path(path)
    if target.is_dir():
        return (
            f"--db {path} is a directory, not a site database: give the database file"
            " (the path the site was started with, tasknet-site --db FILE)"
        )
    if target.exists():
        return f"--db {path} is not a regular file"
    if not target.absolute().parent.is_dir():
        return f"no database at {path!r}: there is no directory {str(target.absolute().parent)!r}"
    return f"no database at {path!r} (start tasknet-site --db {path} once to create it)"


def _write(connection: storage_db.Connection, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return storage_db.run_write(connection, lambda cursor: fn(cursor, *args, **kwargs))
    except (users.UserError, sessions.SessionError, errors.TaskError) as error:
        raise AdminError(str(error)) from error


def _read(connection: storage_db.Connection, fn: Callable[..., T], *args: Any) -> T:
    return storage_db.run_read(connection, fn, *args)


def _actor() -> str:
    try:
        return f"tasknet-admin:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "tasknet-admin"


def _mask(secret: str) -> str:
    return secret[:2] + "…" if len(secret) > 4 else "…"


def _ask_terminal(question: str) -> str:
    """The operator's answer to ``question`` on the terminal ("" at end of input)."""
    print(question, end=" ", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip()


def run(args: argparse.Namespace, out: TextIO, ask: Callable[[str], str] = _ask_terminal) -> None:
    _check_database(args.db)
    if args.command in ("unknown", "resolve"):
        _run_with_lifecycle(args, out)
        return
    connection = storage_db.connect(args.db)
    try:
        if args.command == "user":
            _user_command(connection, args, out)
        elif args.command == "session":
            _session_command(connection, args, out)
        elif args.command == "node-key":
            _node_key_command(connection, args, out)
        elif args.command == "force-delete":
            _force_delete_command(connection, args, out)
        elif args.command == "node":
            _node_command(connection, args, out, ask)
    finally:
        connection.close()


def _audit_upstream(args: argparse.Namespace) -> str:
    """The upstream to read the audit from: ``--upstream``, else the one the
    site recorded at its last start (never a default of this tool's own: a
    wrong upstream's silence looked like evidence)."""
    if args.upstream is not None:
        if not args.upstream.startswith(("http://", "https://")):
            raise AdminError(f"--upstream must be an http(s) URL, got {args.upstream!r}")
        return str(args.upstream)
    connection = storage_db.connect(args.db)
    try:
        recorded = _read(connection, reconcile.recorded_upstream)
    finally:
        connection.close()
    if recorded is None:
        raise AdminError(
            "this database records no upstream (a site records its --upstream at each start;"
            " start it once with this version), so the audit cannot be read: give --upstream URL"
        )
    return recorded


def _run_with_lifecycle(args: argparse.Namespace, out: TextIO) -> None:
    """Run ``unknown``/``resolve`` on a reactor, with the site's Lifecycle."""
    from twisted.internet import reactor as global_reactor  # an entry point: the real one

    reactor: Any = global_reactor
    base_url = _audit_upstream(args)

    async def body() -> None:
        database = storage_db.open_pool(
            args.db,
            reactor=reactor,
            threads=RealThreadPools(),
            entropy=SystemEntropy(),
            wall=reactor.seconds,
            monotonic=time.monotonic,
        )
        upstream = UpstreamClient(
            base_url, reactor=reactor, persistent=False, audit_timeout=args.audit_timeout
        )
        lifecycle = Lifecycle(
            database,
            upstream,
            upstream_timeout=args.audit_timeout,
            clock=reactor,
            entropy=SystemEntropy(),
        )
        try:
            if args.command == "unknown":
                await _unknown_command(lifecycle, args, out)
            else:
                await _resolve_command(lifecycle, args, out)
        finally:
            await upstream.close()
            database.close()

    outcome: list[object] = []

    def finished(result: object) -> None:
        outcome.append(result)
        reactor.stop()

    def start() -> None:
        Deferred.fromCoroutine(body()).addBoth(finished)

    reactor.callWhenRunning(start)
    reactor.run()
    if not outcome:
        raise AdminError("interrupted; nothing was changed unless a result was printed")
    result = outcome[0]
    if isinstance(result, Failure):
        if result.check(errors.TaskError):
            raise AdminError(str(result.value))
        result.raiseException()


def _user_command(connection: storage_db.Connection, args: argparse.Namespace, out: TextIO) -> None:
    if args.action == "add":
        quota = args.quota if args.quota is not None else _read(connection, users.default_quota)
        user, token = _write(
            connection, users.create_user, args.name, admin=args.admin, quota=quota
        )
        print(
            f"created user {user.name} (id {user.id}{', admin' if user.is_admin else ''}, "
            f"quota {user.quota})",
            file=sys.stderr,
        )
        print(token, file=out)
    elif args.action == "list":
        rows = _read(connection, users.list_users)
        print(
            f"{'ID':>4}  {'NAME':<24} {'ADMIN':<5} {'QUOTA':>8}  {'CREATED':<24}  STATE",
            file=out,
        )
        for user in rows:
            state = f"disabled since {user.disabled_at}" if user.disabled else "enabled"
            print(
                printable(
                    f"{user.id:>4}  {user.name:<24} {'yes' if user.is_admin else 'no':<5} "
                    f"{user.quota:>8}  {user.created_at:<24}  {state}"
                ),
                file=out,
            )
    elif args.action == "quota":
        user = _write(connection, users.set_quota, args.name, args.quota)
        print(f"user {user.name}: weekly quota {user.quota}", file=out)
    elif args.action == "token":
        token = _write(connection, users.rotate_token, args.name)
        print(
            f"new token for {args.name}; the old one and its browser sessions no longer work",
            file=sys.stderr,
        )
        print(token, file=out)
    elif args.action == "revoke":
        _write(connection, users.revoke_token, args.name)
        print(
            f"user {args.name}: token revoked and browser sessions ended "
            f"('user token {args.name}' gives a new token)",
            file=out,
        )
    elif args.action == "disable":
        user, ended = _write(connection, users.disable_user, args.name)
        if ended is None:
            print(f"user {user.name}: already disabled since {user.disabled_at}", file=out)
        else:
            print(
                f"user {user.name}: disabled; its token and browser sessions no longer work"
                f" ({ended} session(s) ended), its tasks stay ('user enable {user.name}'"
                " lets it in again)",
                file=out,
            )
    elif args.action == "enable":
        user, was_disabled = _write(connection, users.enable_user, args.name)
        if was_disabled:
            print(f"user {user.name}: enabled; its token works again", file=out)
        else:
            print(f"user {user.name}: already enabled; nothing changed", file=out)
    elif args.action == "remove":
        user = _write(connection, users.remove_user, args.name)
        print(f"user {user.name} (id {user.id}) removed", file=out)


def _session_command(
    connection: storage_db.Connection, args: argparse.Namespace, out: TextIO
) -> None:
    # A tool's clock: the expiries compared are the ones the sites wrote.
    now = time.time()
    if args.action == "list":
        rows = _read(
            connection,
            lambda cursor: sessions.list_sessions(cursor, now, include_unusable=args.all),
        )
        header = f"{'ID':<{sessions.PREFIX_LENGTH}}  {'USER':<16} {'CREATED':<24} "
        header += f"{'LAST SEEN':<24} {'EXPIRES':<24}"
        print(header + ("  STATE" if args.all else ""), file=out)
        for row in rows:
            line = (
                f"{row.prefix:<{sessions.PREFIX_LENGTH}}  {row.user:<16} {row.created_at:<24} "
                f"{row.last_seen_at:<24} {row.ends_at:<24}"
            )
            print(printable(line + (f"  {row.state(now)}" if args.all else "")), file=out)
    elif args.user is not None:
        count = _write(connection, sessions.end_sessions_of, args.user, f"ended by {_actor()}", now)
        print(f"user {args.user}: {count} session(s) ended", file=out)
    else:
        ended = _write(
            connection, sessions.end_session_by_prefix, args.id, f"ended by {_actor()}", now
        )
        print(printable(f"session {ended.prefix} of {ended.user} ended"), file=out)


def _node_key_command(
    connection: storage_db.Connection, args: argparse.Namespace, out: TextIO
) -> None:
    if args.action == "add":
        secret = _write(connection, users.add_node_key, args.node_id, args.secret)
        print(f"node {args.node_id} may log in (start it with --secret below)", file=sys.stderr)
        print(secret, file=out)
    elif args.action == "list":
        keys = _read(connection, users.node_keys)
        if not keys:
            print(
                "no node keys in this database (keys given to the site with --node-key or"
                " --node-key-file are not stored here)",
                file=out,
            )
        for node_id, secret in keys.items():
            shown = secret if args.show_secrets else _mask(secret)
            print(f"{printable(node_id)}\t{printable(shown)}", file=out)
    elif args.action == "remove":
        if not _write(connection, users.remove_node_key, args.node_id):
            raise AdminError(f"no node key {args.node_id!r}")
        print(f"node {args.node_id} removed", file=out)


def _node_command(
    connection: storage_db.Connection,
    args: argparse.Namespace,
    out: TextIO,
    ask: Callable[[str], str],
) -> None:
    if args.action in _CONTROL_MODES:
        _control_command(connection, args, out)
        return
    try:
        summary = _read(connection, reassign.node_summary, args.node_id)
    except reassign.UnknownNode as unknown:
        raise AdminError(f"{unknown}; nothing changed") from unknown
    where = f"connected to {summary.connected_to}" if summary.connected_to else "not connected"
    if args.action == "reassign":
        question = (
            f"Move the {summary.unfinished} unfinished task(s) of node {args.node_id} ({where})"
            " to other nodes? [y/N]"
        )
    else:
        question = (
            f"Retire node {args.node_id} ({where}): move its {summary.unfinished} unfinished"
            f" task(s), mark the archives of its {summary.completed} completed task(s) gone"
            " and remove its key? [y/N]"
        )
    if not args.yes and ask(printable(question)).lower() not in ("y", "yes"):
        raise AdminError("not confirmed; nothing changed (answer y, or give --yes)")
    if args.action == "reassign":
        moved = _write(
            connection,
            reassign.operator_reassign,
            args.node_id,
            [],
            actor=_actor(),
            note=args.note or "",
        )
        print(
            f"node {args.node_id}: {moved.tasks} unfinished task(s) moved off it, waiting for"
            f" a node; {len(moved.cancels)} CANCEL(s) owed to it at its next login; audited",
            file=out,
        )
        return
    retired = _write(
        connection, reassign.retire_node, args.node_id, [], actor=_actor(), note=args.note or ""
    )
    more = retired.archives
    while more:  # the rest of a big node's archives, a transaction per batch
        more = _write(connection, reassign.mark_retired_archives_gone, args.node_id)
        retired = dataclasses.replace(retired, archives=retired.archives + more)
    key = "its key removed" if retired.key_removed else "it had no key in the database"
    print(
        f"node {args.node_id} retired: {retired.reassigned.tasks} unfinished task(s) moved off"
        f" it, waiting for a node; {retired.archives} archive(s) marked gone (NODE_RETIRED);"
        f" {key}; audited",
        file=out,
    )
    if summary.connected_to:
        print(
            f"note: node {args.node_id} is still connected to {summary.connected_to}: its"
            " reports are no longer applied, and its next login fails once that site has"
            " re-read its keys",
            file=out,
        )


#: ``node drain|pause|resume|limit``: the mode each sets (None: kept).
_CONTROL_MODES = {
    "drain": node_control.DRAINING,
    "pause": node_control.PAUSED,
    "resume": node_control.ACTIVE,
    "limit": None,
}
_CONTROL_WORDS = {
    node_control.ACTIVE: "active (new tasks go to it)",
    node_control.DRAINING: "draining (no new task; what it holds finishes)",
    node_control.PAUSED: "paused (no new task until resumed)",
}


def _control_command(
    connection: storage_db.Connection, args: argparse.Namespace, out: TextIO
) -> None:
    """Drain, pause, resume or bound a node (``storage/node_control.py``)."""
    try:
        control = _write(
            connection,
            node_control.set_control,
            args.node_id,
            mode=_CONTROL_MODES[args.action],
            limit=args.limit if args.action == "limit" else "keep",
            actor=_actor(),
            note=args.note or "",
        )
    except node_control.UnknownNode as unknown:
        raise AdminError(f"{unknown}; nothing changed") from unknown
    limit = f"at most {control.limit:,}" if control.limit is not None else "no bound"
    print(
        f"node {args.node_id}: {_CONTROL_WORDS[control.mode]}; download limit: {limit}"
        " (a running site obeys it at its next assignment)",
        file=out,
    )


def _force_delete_command(
    connection: storage_db.Connection, args: argparse.Namespace, out: TextIO
) -> None:
    forced = _write(connection, delete.force_delete, args.gid, _actor(), args.note)
    if forced.repeated:
        print(
            printable(
                f"gid {forced.gid}: already force-deleted at {forced.forced_at} by"
                f" {forced.actor}; nothing changed"
            ),
            file=out,
        )
        return
    print(
        printable(
            f"gid {forced.gid}: DELETED (forced; node {forced.node or '(none)'} never confirmed"
            f" delete {forced.delete_operation_id}); audited as {forced.actor}"
        ),
        file=out,
    )


async def _unknown_command(lifecycle: Lifecycle, args: argparse.Namespace, out: TextIO) -> None:
    operations = await lifecycle.unknown_with_evidence()
    if args.json:
        out.write(printable_json(json.dumps({"tasks": operations}, ensure_ascii=False, indent=2)))
        out.write("\n")
        return
    if not operations:
        print("no UNKNOWN operations", file=out)
        return
    for task in operations:
        evidence = task.get("evidence") or {}
        name = printable(task.get("name") or "")
        print(f"gid {task['gid']}  {name}  cost {task.get('cost')}", file=out)
        for key, value in evidence.items():
            if isinstance(value, dict):
                value = json.dumps(value, ensure_ascii=False)
            print(printable(f"    {key}: {value}"), file=out)


async def _resolve_command(lifecycle: Lifecycle, args: argparse.Namespace, out: TextIO) -> None:
    try:
        task = await lifecycle.resolve(args.gid, args.verdict, _actor(), args.note)
    except reconcile.VerdictTooEarly as early:
        raise AdminError(
            f"refused, nothing changed: {early.message}; run it again at or after"
            f" {early.not_before}"
        ) from early
    except errors.TaskError as refused:
        if refused.code == reconcile.NOTE_REQUIRED:
            raise AdminError(
                f"refused, nothing changed: {refused.message}: give --note TEXT"
            ) from refused
        raise
    evidence = await lifecycle.db.read(reconcile.last_evidence, args.gid)
    if evidence is not None and evidence.get("evidence") == reconcile.EVIDENCE_UNAVAILABLE:
        why = printable(evidence.get("evidenceError") or "")
        print(
            f"warning: the upstream's audit could not be read ({why}): the verdict was taken"
            " on your note alone, and the audit log says so",
            file=sys.stderr,
        )
    if task is None:
        print(f"gid {args.gid}: not submitted; the task was released and the gid is free", file=out)
    else:
        print(
            f"gid {args.gid}: submitted; now {status_words(task['status'])}, "
            f"cost {task['cost']} metered",
            file=out,
        )
        if task.get("warning"):
            print(f"warning: {task['warning']}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    try:
        run(args, sys.stdout)
    except AdminError as error:
        message = printable(storage_db.redact(str(error), args.db))
        print(f"tasknet-admin: {message}", file=sys.stderr)
        return 1
    except Exception as error:
        # e.g. locked past busy_timeout: the driver's error from the tools,
        # classified from the pool; a bug still ends in a traceback.
        classified = storage_db.classify(error)
        if not isinstance(classified, errors.DatabaseError):
            raise
        if isinstance(error, sqlite3.Error) and not isinstance(error, sqlite3.OperationalError):
            raise  # as before: only "locked"/"busy"-like driver errors are refusals
        print(
            "tasknet-admin: database error, nothing changed: "
            f"{storage_db.redact(str(error), args.db)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
