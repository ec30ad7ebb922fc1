"""Host-local helpers shared by the executor-side processes: process supervision, the
host-wide claim registry for GPUs and ports, parent-death watchdogs and log tails."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

logger = logging.getLogger(__name__)

REGISTRY_PATH = os.path.join(tempfile.gettempdir(), "tfos-host-claims.json")


# --------------------------------------------------------------------------- claims

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


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
                data[kind] = {k: v for k, v in data.get(kind, {}).items() if _alive(int(v))}
            yield data
            tmp = path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
    from tfos.cluster.decisions import port_candidates

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


# --------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGKILL this child when its parent thread exits."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


def start_pipe_watchdog(fd: int, on_parent_death) -> threading.Thread:
    """Call ``on_parent_death()`` when the write end of pipe ``fd`` (held by the parent) closes,
    which the kernel does when the parent dies, even by SIGKILL."""

    def watch():
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        on_parent_death()

    t = threading.Thread(target=watch, name="tfos-parent-watchdog", daemon=True)
    t.start()
    return t


def terminate(proc: subprocess.Popen, grace_secs: float, what: str = "process") -> int | None:
    """SIGTERM the process (group), wait ``grace_secs``, then SIGKILL. Returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    for sig, wait in ((signal.SIGTERM, grace_secs), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            logger.warning("%s %d ignored %s for %.0fs", what, proc.pid, signal.Signals(sig).name, wait)
    return proc.poll()


def jvm_ancestor(pid: int | None = None, max_depth: int = 6) -> int | None:
    """The nearest ancestor whose executable is ``java`` (the Spark executor), if any."""
    pid = pid or os.getpid()
    for _ in range(max_depth):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{ppid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            return None
        if comm == "java":
            return ppid
        if ppid <= 1:
            return None
        pid = ppid
    return None


def tail(path: str, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
