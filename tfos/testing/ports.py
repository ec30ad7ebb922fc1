"""Free ports for test and benchmark processes that bind them later.

A port picked by binding port 0 comes from the kernel's ephemeral range, and a process that
keeps reconnecting to it before its owner listens (a TCPStore or gRPC client started first) can
be handed that very port as its own source port: it then connects to itself and the owner's bind
fails with EADDRINUSE. Ports below the ephemeral range are never handed out that way.
"""

from __future__ import annotations

import random
import socket

from tfos.errors import TFOSError
from tfos.host.claims import ephemeral_port_range


def free_ports(n: int, host: str = "127.0.0.1", taken: set[int] | None = None) -> list[int]:
    """``n`` distinct ports that bind on ``host`` now, below the ephemeral range and not in
    ``taken`` (which is updated)."""
    low = ephemeral_port_range()[0]
    taken = set() if taken is None else taken
    out: list[int] = []
    for _ in range(200 * n):
        port = random.randint(max(1024, min(15000, low - 1000)), low - 1)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        taken.add(port)
        out.append(port)
        if len(out) == n:
            return out
    raise TFOSError(f"found only {len(out)} of {n} free ports on {host} below the ephemeral range ({low})")


def free_port(host: str = "127.0.0.1", taken: set[int] | None = None) -> int:
    """One port as :func:`free_ports` picks them."""
    return free_ports(1, host, taken)[0]
