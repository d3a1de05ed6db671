"""What a twistd entry point (``makeService``) does for the process (site
and node; imports neither).

Exit status.  twistd has no way for a service to set the process's exit
status (Twisted issues #4762 and #11335): a service whose asynchronous
start-up fails can only stop the reactor, and twistd then exits 0.
:func:`exit_after_stop` stops the reactor and, once twistd has finished its
own shutdown (the services stopped, the log written, the pid file removed)
and the interpreter is exiting, ends the process with the given status.
Only the twistd entry points ask for this; a service started in-process
(tests) just fails its ``ready`` Deferred.

Private files.  :func:`keep_files_private` makes every file the process
creates from then on ``0600`` (umask ``077``) and twistd's own log file
(``--logfile``, or ``twistd.log`` for a daemon) ``0600`` too: twistd opens
that file itself, after ``makeService`` and before the service starts, and
keeps the mode of a file that exists, so the file is created here (empty,
``0600``) or tightened to ``0600``; its rotations inherit the mode.  It
acts only when the process's command line is twistd's running that
plugin, so a test that calls ``makeService`` in-process changes nothing of
its own process.
"""

from __future__ import annotations

import atexit
import getopt
import os
import stat
import sys
import threading
from collections.abc import Sequence

from twisted.internet.interfaces import IReactorCore

__all__ = ["exit_after_stop", "keep_files_private", "twistd_log_file"]

#: Files the process creates, and twistd's log file.
PRIVATE_MODE = 0o600

_exit_status: int | None = None


def _exit_with_status() -> None:
    if _exit_status is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or redirected away
            pass
    # sys.exit in an atexit handler is ignored; os._exit is the only way left.
    os._exit(_exit_status)


def exit_after_stop(
    reactor: IReactorCore, status: int = 1, *, deadline: float | None = None
) -> threading.Timer | None:
    """Stop ``reactor`` (now, or as soon as it runs) and make the process
    exit with ``status`` when the interpreter exits.  ``deadline``: seconds
    after which the process exits with ``status`` even if the stop has not
    finished (a thread blocked on a server that answers nothing would hold
    it until its TCP timeouts); the timer (a daemon thread), for a test to
    cancel."""
    global _exit_status
    if _exit_status is None:
        atexit.register(_exit_with_status)
    _exit_status = status
    timer = None
    if deadline is not None:
        timer = threading.Timer(deadline, _exit_now, (status, deadline))
        timer.daemon = True
        timer.start()
    if reactor.running:
        reactor.stop()
    else:
        reactor.callWhenRunning(reactor.stop)
    return timer


def _exit_now(status: int, deadline: float) -> None:
    try:
        sys.stderr.write(f"the stop did not finish within {deadline:g} s: exiting {status}\n")
    except (OSError, ValueError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _twistd_options(command: str, argv: Sequence[str]) -> dict[str, str] | None:
    """twistd's own options (before the plugin's name) if ``argv`` (without
    the program name) is a twistd command line running ``command``; else None."""
    from twisted.scripts.twistd import ServerOptions

    spec = ServerOptions()
    try:
        options, rest = getopt.getopt(list(argv), spec.shortOpt, spec.longOpt)
    except getopt.GetoptError:
        return None
    if not rest or rest[0] != command:
        return None
    return {name.lstrip("-"): value for name, value in options}


def twistd_log_file(command: str, argv: Sequence[str] | None = None) -> str | None:
    """The file twistd will log to when ``argv`` (default: this process's)
    runs plugin ``command``: ``--logfile``/``-l``, or ``twistd.log`` for a
    daemon that names none; None for stdout, syslog, a ``--logger`` of its
    own, or a command line that is not twistd's."""
    args = sys.argv[1:] if argv is None else argv
    options = _twistd_options(command, args)
    if options is None or "logger" in options or "syslog" in options:
        return None
    path = options.get("logfile", options.get("l"))
    if path is None:
        nodaemon = "nodaemon" in options or "n" in options
        path = None if nodaemon else "twistd.log"
    return None if path in (None, "", "-") else path


def keep_files_private(command: str, argv: Sequence[str] | None = None) -> str | None:
    """Under ``twistd ... COMMAND``: umask ``077`` from now on, and twistd's
    log file created or tightened ``0600`` before twistd opens it.  Returns
    that file's path, or None (not under twistd: nothing was changed)."""
    args = sys.argv[1:] if argv is None else argv
    if _twistd_options(command, args) is None:
        return None
    os.umask(os.umask(0o077) | 0o077)
    path = twistd_log_file(command, args)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_MODE)
    except OSError:
        return path  # twistd will say why it cannot open it
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)
    return path
