"""The demo's port check: a port in TIME-WAIT (a demo stopped a moment ago)
is free for a server, a port with a listener is not."""

from __future__ import annotations

import socket

from tasknet.cli.demo import LOOPBACK, port_is_free


def _listener() -> socket.socket:
    # As Twisted's listening ports do: SO_REUSEADDR.
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((LOOPBACK, 0))
    server.listen(1)
    return server


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    server = _listener()
    port = server.getsockname()[1]
    assert not port_is_free(port)
    client = socket.create_connection((LOOPBACK, port))
    accepted, _ = server.accept()
    # The server side closes first, so its end of the connection (bound to
    # ``port``) goes to TIME-WAIT, as a stopped site's does.
    accepted.close()
    client.recv(1)
    client.close()
    server.close()
    # A plain bind() (no SO_REUSEADDR) would see the port as taken.
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        plain.bind((LOOPBACK, port))
        in_time_wait = False
    except OSError:
        in_time_wait = True
    finally:
        plain.close()
    assert in_time_wait, "the connection did not leave a TIME-WAIT behind"
    assert port_is_free(port)
