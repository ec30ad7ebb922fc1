"""The host-wide claim registry (GPUs and TF server ports claimed by tfos nodes on this host)
and the choice of TF server ports. Used by the node agent (GPUs) and the TF process (ports)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
from typing import Iterable

from tfos.host.processes import alive

REGISTRY_PATH = os.path.join(tempfile.gettempdir(), "tfos-host-claims.json")


@contextlib.contextmanager
def claims(path: str = REGISTRY_PATH):
    """Exclusive, host-wide access to the claim registry ``{"gpus": {id: pid}, "ports": {port: pid}}``.

    Entries whose owner process is gone are dropped on every access.
    """
    with open(path + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                data = {}
            for kind in ("gpus", "ports"):
                data[kind] = {k: v for k, v in data.get(kind, {}).items() if alive(int(v))}
            yield data
            tmp = path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def port_candidates(ephemeral: tuple[int, int], taken: Iterable[int], count: int = 64,
                    seed: int = 0) -> list[int]:
    """Pure: ports for TF servers, outside the kernel's ephemeral range (so no outgoing
    connection is ever auto-assigned one) and not reserved by another tfos node on this host."""
    lo, hi = ephemeral
    taken = set(taken)
    if lo > 20000:
        pool_lo, pool_hi = 20000, lo - 1
    elif hi < 65000:
        pool_lo, pool_hi = hi + 1, 65535
    else:
        pool_lo, pool_hi = 1024, max(1024, lo - 1)
    size = pool_hi - pool_lo + 1
    out = []
    i = 0
    while len(out) < count and i < size:
        port = pool_lo + (seed + i * 7919) % size
        if port not in taken and port not in out:
            out.append(port)
        i += 1
    return out


def ephemeral_port_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = f.read().split()
            return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def reserve_tf_port(owner_pid: int) -> socket.socket:
    """Bind and hold a listening socket for a TF server port.

    The port comes from outside the kernel's ephemeral range and is recorded in the host claim
    registry under ``owner_pid`` until that process exits, so neither the kernel nor another
    tfos node on this host hands it out while this node holds it or after it released it for
    its TF server. The caller closes the socket right before TF binds the port.
    """
    with claims() as reg:
        taken = {int(p) for p in reg["ports"]}
        for port in port_candidates(ephemeral_port_range(), taken, count=256, seed=os.getpid()):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("0.0.0.0", port))
                s.listen(1)
            except OSError:
                s.close()
                continue
            reg["ports"][str(port)] = owner_pid
            return s
    raise OSError("no free port for the TF server outside the ephemeral range")
