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


#: log tails in a report: of the first nodes of each distinct stack, at most this many nodes
MAX_TAILS = 16
#: a group of nodes named one by one up to this many; more are named by their indices
GROUP_LABELS = 4
#: the report is cut here (a cluster of thousands of distinct stacks): it stays under 1 MB
MAX_REPORT_CHARS = 900_000
_THREAD_ID = re.compile(r"0x[0-9a-fA-F]+")
_NODE = re.compile(r"^node (\d+) ")


def stall_message(secs: float | None, nodes: list[tuple[str, str, str]]) -> str:
    """Pure: the StallError's text (``secs`` without progress), or with ``secs`` None the report of
    ``cluster.dump_stacks()``. ``nodes``: ``(label, stack dump, log tail)`` per node, e.g.
    ``("node 1 (worker:0 on h1)", ...)``. Up to MAX_TAILS nodes: a line, stacks and log tail per
    node. More: nodes that stand at the same place share one line, identical stacks (thread ids
    aside) are shown once for all their nodes, log tails of MAX_TAILS nodes (the first of each
    distinct stack first). At most MAX_REPORT_CHARS in all."""
    lines = [f"no training rank made progress for {secs:.0f}s while every process was alive (stall_timeout; "
             "reserve(..., stall_timeout=None) turns the watchdog off). Where each rank stands:" if secs is not None
             else "Where each rank stands:"]
    small = len(nodes) <= MAX_TAILS  # a line and a stack per node, as they are
    if small:
        lines += [f"  {label}: {where(dump)}" for label, dump, _ in nodes]
    else:
        lines += [f"  {group_label(labels)}: {phrase}"
                  for phrase, labels in _grouped((where(dump), label) for label, dump, _ in nodes)]
    if secs is not None:
        lines.append("A rank waiting in a collective waits for a rank that is not there: one that stopped (a sleep, "
                     "a deadlock, a longer loop) or ran out of data. Every rank's stacks and last log lines follow.")
    stacks = [(dump.strip() or "(none)", [label]) for label, dump, _ in nodes] if small else \
        _grouped((_THREAD_ID.sub("0x...", dump.strip()) or "(none)", label) for label, dump, _ in nodes)
    tails = dict((label, tail) for label, _, tail in nodes)
    first = dict.fromkeys([labels[0] for _, labels in stacks] + [label for label, _, _ in nodes])  # ordered, once
    shown = set([label for label in first if tails[label].strip()][:MAX_TAILS])
    for dump, labels in stacks:
        lines.append(f"--- {group_label(labels)}: stacks (most recent call first) ---")
        lines.append(dump)
        for label in labels:
            if label in shown:
                lines.append(f"--- {label}: last log lines ---")
                lines.append(tails[label].rstrip())
    left = sum(1 for label, _, tail in nodes if tail.strip() and label not in shown)
    if left:
        lines.append(f"(the last log lines of {left} more node(s) are in their node logs)")
    text = "\n".join(lines)
    if len(text) > MAX_REPORT_CHARS:
        text = text[:MAX_REPORT_CHARS] + (f"\n... (the report is cut at {MAX_REPORT_CHARS} characters; "
                                          "cluster.dump_stacks() gives every node's stacks)")
    return text


def group_label(labels: list[str]) -> str:
    """Pure: how a report names a group of nodes: each label up to GROUP_LABELS of them, else the
    node indices as ranges (``nodes 0, 2-7 (7 nodes, e.g. node 0 (chief:0 on h0))``)."""
    if len(labels) <= GROUP_LABELS:
        return ", ".join(labels)
    found = [_NODE.match(label) for label in labels]
    if not all(found):
        return ", ".join(labels[:GROUP_LABELS]) + f" and {len(labels) - GROUP_LABELS} more"
    indexes = sorted(int(m.group(1)) for m in found)
    spans, start = [], indexes[0]
    for prev, cur in zip(indexes, indexes[1:] + [None]):
        if cur != prev + 1:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return f"nodes {', '.join(spans)} ({len(labels)} nodes, e.g. {labels[0]})"


def _grouped(pairs) -> list[tuple[str, list[str]]]:
    """``(key, label)`` pairs as ``[(key, [labels])]`` in the order keys first appear."""
    groups: dict[str, list[str]] = {}
    for key, label in pairs:
        groups.setdefault(key, []).append(label)
    return list(groups.items())


def _library(path: str) -> bool:
    return "site-packages" in path or "/lib/python3" in path or "/tfos/" in path or path.startswith("<")


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3."):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[-1] if marker.startswith("/lib") else path.split(marker, 1)[1]
    return path.rsplit("/", 2)[-1] if path.count("/") > 2 else path
