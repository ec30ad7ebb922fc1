"""This process's memory cgroup (cgroup v1 or v2): the container's memory limit and how many
processes the kernel's OOM killer ended in it. A node agent reads both around its TF process, so
that a TF process killed for its container's memory (a Kubernetes pod's limit, a YARN container's
cgroup) is named as such, with the limit and the setting that sizes it."""

from __future__ import annotations

import os

#: a limit at or above this is "no limit" (cgroup v1 writes a page-rounded 2^63 - 1)
UNLIMITED = 1 << 62


def memory_dir(proc_cgroup: str, root: str = "/sys/fs/cgroup") -> str | None:
    """Pure but for the paths it tries: this process's memory cgroup directory from the text of
    /proc/self/cgroup, or None. A container sees its own cgroup at the mount's root."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    candidates = []
    if v1 is not None:
        candidates += [os.path.join(root, "memory", v1.lstrip("/")), os.path.join(root, "memory")]
    if v2 is not None:
        candidates += [os.path.join(root, v2.lstrip("/")), root]
    for path in candidates:
        if os.path.exists(os.path.join(path, "memory.limit_in_bytes")) or os.path.exists(
                os.path.join(path, "memory.max")):
            return path
    return None


def parse_oom_kills(text: str) -> int:
    """Pure: the ``oom_kill`` count of memory.oom_control (v1) or memory.events (v2)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def parse_limit(text: str) -> int | None:
    """Pure: a memory limit in bytes from memory.limit_in_bytes / memory.max, None for none."""
    text = text.strip()
    if not text or text == "max" or not text.isdigit() or int(text) >= UNLIMITED:
        return None
    return int(text)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def memory_state() -> tuple[int | None, int]:
    """``(limit in bytes or None, OOM kills so far)`` of this process's memory cgroup ((None, 0)
    where there is none to read)."""
    d = memory_dir(_read("/proc/self/cgroup"))
    if d is None:
        return None, 0
    limit = parse_limit(_read(os.path.join(d, "memory.limit_in_bytes")) or _read(os.path.join(d, "memory.max")))
    events = _read(os.path.join(d, "memory.oom_control")) + _read(os.path.join(d, "memory.events"))
    return limit, parse_oom_kills(events)
