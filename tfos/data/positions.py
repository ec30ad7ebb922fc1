"""Where a train feed stands: which rows of which epoch and partition a rank has consumed (pure).

InputMode.SPARK with restarts allowed tags every piece of fed rows with where it came from
(epoch, partition, first row offset in that partition). The TF process counts the rows it
hands to main_fun as half-open ranges per (epoch, partition); ``ctx.checkpoint_saved(step)``
sends them to the driver, which keeps them by step. When the cluster restarts (a failure, a
shrink, a grow, an eviction) the program resumes from its checkpoint and the driver feeds each
epoch without the rows every rank had consumed at that checkpoint (:func:`resume`), so every
row still reaches exactly one rank once per epoch across restarts.

A position is a dict ``{(epoch, partition): [(start, end), ...]}``: sorted, disjoint, merged
half-open row ranges. On the wire it is a tuple of ``(epoch, partition, start, end)``.
"""

from __future__ import annotations

import bisect

Ranges = list  # [(start, end)], sorted, disjoint, merged
Position = dict  # {(epoch, partition): Ranges}


def add(ranges: Ranges, start: int, end: int) -> None:
    """Pure on its argument: merge ``[start, end)`` into ``ranges`` (in place)."""
    if end <= start:
        return
    if ranges and ranges[-1][1] == start:  # the common case: the next rows of a partition
        ranges[-1] = (ranges[-1][0], end)
        return
    if not ranges or ranges[-1][1] < start:
        ranges.append((start, end))
        return
    merged = union(ranges, [(start, end)])
    ranges[:] = merged


def union(*lists: Ranges) -> Ranges:
    """Pure: the merged union of range lists."""
    spans = sorted(r for ranges in lists for r in ranges if r[1] > r[0])
    out: Ranges = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def subtract(start: int, end: int, skip: Ranges) -> Ranges:
    """Pure: the parts of ``[start, end)`` outside the (sorted, merged) ranges ``skip``."""
    out: Ranges = []
    at = start
    i = max(0, bisect.bisect_right(skip, (start, float("inf"))) - 1)
    while i < len(skip) and skip[i][0] < end:
        s, e = skip[i]
        if e > at:
            if s > at:
                out.append((at, min(s, end)))
            at = max(at, e)
        i += 1
    if at < end:
        out.append((at, end))
    return out


def count(ranges: Ranges) -> int:
    return sum(e - s for s, e in ranges)


def record(position: Position, epoch: int, partition: int, start: int, rows: int) -> None:
    """Rows ``[start, start + rows)`` of ``partition`` in ``epoch`` were consumed (in place)."""
    add(position.setdefault((epoch, partition), []), start, start + rows)


def to_wire(position: Position) -> tuple:
    return tuple((e, p, s, t) for (e, p), ranges in sorted(position.items()) for s, t in ranges)


def from_wire(items) -> Position:
    position: Position = {}
    for e, p, s, t in items:
        if t > s >= 0:
            position.setdefault((int(e), int(p)), []).append((int(s), int(t)))
    return {k: union(v) for k, v in position.items()}


def merge(*positions: Position) -> Position:
    """Pure: the rows any of ``positions`` consumed."""
    keys = {k for p in positions for k in p}
    return {k: union(*(p.get(k, []) for p in positions)) for k in sorted(keys)}


def of_epoch(position: Position, epoch: int) -> dict[int, Ranges]:
    """``{partition: ranges}`` of one epoch."""
    return {p: r for (e, p), r in position.items() if e == epoch}


def resume(trained: Position, sizes: dict[int, int], num_epochs: int) -> int:
    """Pure: the first epoch a restart feeds, given the rows the checkpoint has ``trained`` and the
    rows of each epoch whose feed completed (``sizes``): the first epoch not known to be trained
    in full (``num_epochs`` when all are)."""
    for e in range(num_epochs):
        if e not in sizes or sum(count(r) for r in of_epoch(trained, e).values()) < sizes[e]:
            return e
    return num_epochs
