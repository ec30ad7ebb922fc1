"""The stall watchdog's decisions and its report (runs on the driver; pure functions).

A cluster stalls when its processes are alive (heartbeats arrive) but no training rank makes
progress: a rank waits in a collective for a peer that never comes, a peer sleeps or deadlocks.
TF's own failure detection (heartbeats between workers) sees only dead peers. tfos watches the
progress the nodes report (a step through the feed, ``ctx.report``, the Keras callbacks); after
``stall_timeout`` seconds without any it collects every TF process's Python stacks (each node
agent has the TF process write them with faulthandler) and fails the cluster with a
:class:`~tfos.errors.StallError` that says where each rank stands.
"""

from __future__ import annotations

import re

#: frames of these kinds tell that a thread waits in a collective operation for its peers
_COLLECTIVE_FUNC = re.compile(r"^_?(all_?reduce|all_?gather|broadcast|reduce_scatter|barrier|collective)", re.I)
_COLLECTIVE_FILE = re.compile(r"collective_ops|cross_device_ops|/gloo|torch/distributed|horovod")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def stalled(now: float, last_progress: float | None, stall_timeout: float | None) -> bool:
    """Pure: True when progress was seen once and none for more than ``stall_timeout`` seconds.
    Until a training rank reports its first progress the watchdog is not armed: a program that
    never reports (no feed, no ``ctx.report``, no Keras callback) is never judged."""
    return stall_timeout is not None and last_progress is not None and now - last_progress > stall_timeout


def threads(dump: str) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """Pure: faulthandler's all-threads dump as ``[(header, [(file, line, function), ...])]``,
    frames most recent first."""
    out: list = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            out.append((line.rstrip(":"), []))
        elif out:
            m = _FRAME.match(line)
            if m:
                out[-1][1].append((m["file"], int(m["line"]), m["func"]))
    return out


def where(dump: str) -> str:
    """Pure: where a node's main_fun stands, from its stack dump, in one phrase: the innermost frame
    of the thread that runs main_fun, the user's frame that led there, and whether it waits in a
    collective."""
    found = threads(dump)
    main = next((frames for _, frames in found if any(f[2] == "run_node" for f in frames)), None)
    if main is None:
        return "its main thread's stack was not in the dump" if found else "no stack came back"
    inner = main[0]
    user = next((f for f in main if not _library(f[0])), None)
    text = f"in {inner[2]} ({_short(inner[0])}:{inner[1]})"
    if user is not None and user != inner:
        text += f", called from {user[2]} ({_short(user[0])}:{user[1]})"
    waiting = next((f for f in main[:12] if _COLLECTIVE_FUNC.search(f[2]) or _COLLECTIVE_FILE.search(f[0])), None)
    if waiting is not None:
        text += f"; waiting in a collective ({waiting[2]}) for its peers"
    return text


def stall_message(secs: float | None, nodes: list[tuple[str, str, str]]) -> str:
    """Pure: the StallError's text (``secs`` without progress), or with ``secs`` None the report of
    ``cluster.dump_stacks()``. ``nodes``: ``(label, stack dump, log tail)`` per node, e.g.
    ``("node 1 (worker:0 on h1)", ...)``."""
    lines = [f"no training rank made progress for {secs:.0f}s while every process was alive (stall_timeout; "
             "reserve(..., stall_timeout=None) turns the watchdog off). Where each rank stands:" if secs is not None
             else "Where each rank stands:"]
    lines += [f"  {label}: {where(dump)}" for label, dump, _ in nodes]
    if secs is not None:
        lines.append("A rank waiting in a collective waits for a rank that is not there: one that stopped (a sleep, "
                     "a deadlock, a longer loop) or ran out of data. Every rank's stacks and last log lines follow.")
    for label, dump, tail in nodes:
        lines.append(f"--- {label}: stacks (most recent call first) ---")
        lines.append(dump.strip() or "(none)")
        if tail.strip():
            lines.append(f"--- {label}: last log lines ---")
            lines.append(tail.rstrip())
    return "\n".join(lines)


def _library(path: str) -> bool:
    return "site-packages" in path or "/lib/python3" in path or "/tfos/" in path or path.startswith("<")


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3."):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[-1] if marker.startswith("/lib") else path.split(marker, 1)[1]
    return path.rsplit("/", 2)[-1] if path.count("/") > 2 else path
