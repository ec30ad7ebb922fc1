"""/proc helpers for the test clusters' daemons (Hadoop's, Kubernetes'): a log's last lines, a
process's state and parent, whether it lives, every descendant of a set of processes, and stopping
them all."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tfos.host.deadline import Deadline


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def stat_fields(pid: int | str) -> list[str]:
    """Fields of /proc/PID/stat after the command name: [state, ppid, ...]; [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    return stat_fields(pid)[:1] not in ([], ["Z"])


def descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and len(st := stat_fields(d.name)) > 1:
            children.setdefault(int(st[1]), []).append(int(d.name))
    out, todo = [], list(roots)
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def stop_tree(roots: list[int], grace: float, kill_wait: float = 10.0, on_kill=None) -> tuple[int, list[int]]:
    """SIGTERM ``roots`` (their process groups too) and every descendant, SIGKILL what is left after
    ``grace`` seconds (``on_kill(pids)`` is told which); a pid reused meanwhile by another process is
    left alone. ``(processes signalled, those still alive after SIGKILL)``."""
    # pid -> start time, so a pid reused by another process meanwhile is left alone
    procs = {p: st[19] for p in {*roots, *descendants(list(roots))} if len(st := stat_fields(p)) > 19}

    def living() -> list[int]:
        return [p for p, t in procs.items() if alive(p) and stat_fields(p)[19:20] == [t]]

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        for pid in living():
            for kill in (os.killpg, os.kill):  # killpg fails for non-leaders: fine
                try:
                    kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = Deadline(wait)
        while not deadline.expired() and living():
            time.sleep(0.2)
        if not living():
            break
        if sig == signal.SIGTERM and on_kill is not None:
            on_kill(living())
    return len(procs), living()
