"""`free_port()`: a loopback TCP port for a server a benchmark or test is about to start.

A port the kernel hands out for `bind(("127.0.0.1", 0))` lies in the ephemeral range
(`net.ipv4.ip_local_port_range`, 32768-60999 by default), where the same kernel also picks the
source ports of outgoing connections: between choosing such a port and the server's own bind, an
engine's ZMQ or HTTP client could take it ("Address already in use", seen when one benchmark
started four engines in a row). So the port is drawn below that range, where only explicit binds
land, and checked free; the ephemeral answer is the fallback when nothing below is free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LOWEST = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_START = 32768
_rng = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_START


def _binds(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, attempts: int = 64) -> int:
    """A TCP port on 127.0.0.1, below the ephemeral range, free a moment ago."""
    top = _ephemeral_start()
    if top - _LOWEST >= 1024:
        for _ in range(attempts):
            port = _rng.randrange(_LOWEST, top)
            if _binds(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
