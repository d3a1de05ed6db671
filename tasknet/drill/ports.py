"""Free loopback ports for drill processes.

A port is found by binding port 0 on 127.0.0.1, reading the number the kernel
chose and closing the socket.  Another process may grab it before our child
binds it; :mod:`tasknet.drill.procs` detects that (the child exits with
"Address already in use") and retries with a fresh port.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
