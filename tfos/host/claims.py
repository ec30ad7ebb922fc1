"""The claim registry (GPUs and TF server ports claimed by this user's tfos nodes on this host)
and the choice of TF server ports. Used by the node agent (GPUs) and the TF process (ports).

The registry lives in this user's private directory (``tfos.host.private``): another user can
neither plant nor lock it. Nodes of other users on the host are not in it; their GPUs are seen
as busy by nvidia-smi's memory check, and a port they hold fails to bind and is skipped."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from typing import Iterable

from tfos.errors import TFOSTimeoutError
from tfos.host.deadline import Deadline
from tfos.host.private import private_dir
from tfos.host.processes import alive

logger = logging.getLogger(__name__)

#: How long a node waits for the claim registry's lock before giving up with a clear error.
LOCK_TIMEOUT = 30.0


def registry_path() -> str:
    """This user's claim registry: ``<tmp>/tfos-<uid>/host-claims.json`` (a 0700 directory)."""
    return os.path.join(private_dir(), "host-claims.json")


def _read_registry(path: str) -> dict:
    """The registry's entries; a missing, corrupt or planted (symlink) file is repaired as empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError as e:  # ELOOP: a symlink was planted in place of the file
        logger.warning("tfos claim registry %s is unusable (%s); starting a new one", path, e.strerror)
        return {}
    try:
        with os.fdopen(fd) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        logger.warning("tfos claim registry %s is corrupt (%s); starting a new one", path, e)
        return {}
    return data if isinstance(data, dict) else {}


def _live_entries(entries) -> dict:
    """Pure apart from liveness checks: well-formed ``{str: pid}`` entries whose owner is alive."""
    if not isinstance(entries, dict):
        return {}
    return {str(k): v for k, v in entries.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 0 and alive(v)}


@contextlib.contextmanager
def claims(path: str | None = None, timeout: float = LOCK_TIMEOUT):
    """Exclusive access to this user's claim registry ``{"gpus": {id: pid}, "ports": {port: pid}}``.

    The lock wait has a deadline (TFOSTimeoutError). Entries whose owner process is gone, and
    malformed entries, are dropped on every access; the file is replaced atomically.
    """
    path = path or registry_path()
    directory = os.path.dirname(path)
    lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = Deadline(timeout)
        while True:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline.expired():
                    raise TFOSTimeoutError(f"the tfos claim registry {path} stayed locked by another process for "
                                           f"{timeout:.0f}s; find it with `fuser {path}.lock`") from None
                time.sleep(0.05)
        try:
            raw = _read_registry(path)
            data = {kind: _live_entries(raw.get(kind)) for kind in ("gpus", "ports")}
            yield data
            fd, tmp = tempfile.mkstemp(prefix=".host-claims-", dir=directory)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
    finally:
        os.close(lock_fd)


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
