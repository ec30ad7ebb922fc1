"""/proc helpers for the test clusters' daemons (Hadoop's, Kubernetes'): a log's last lines, a
process's state and parent, whether it lives, and every descendant of a set of processes."""

from __future__ import annotations

from pathlib import Path


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
