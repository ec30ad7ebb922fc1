"""Equal steps on every rank when ranks hold unequal rows: the policies and their decisions.

Pure functions, shared by the driver (which checks the setting) and the TF process (which
decides how many rows its next batch may hold). A rank that runs one more step than another
waits in that step's collective for a peer that never comes: the job hangs, then dies with a
message about heartbeats or aborted collectives. So, by default, no rank yields a batch before it
knows that every rank will yield one at that step:

* during a feed, a rank takes a full batch only while every rank has been sent at least as many
  rows (the driver's *safe* count: the fewest rows assigned to any live rank so far);
* once the feed is complete, the per-rank totals decide the last steps by the policy:

  ``"drop"`` (default)
      every rank runs ``ceil(fewest / batch)`` steps; the surplus rows of the other ranks are
      dropped: at most ``batch - 1`` per rank and feed, because the shares are levelled to the
      row when the feed completes (:func:`level`: a rank with surplus rows sends its last ones,
      unread, to the ranks short of rows), whatever the partitions and hosts;
  ``"pad"``
      every rank runs ``ceil(most / batch)`` full batches; short ranks repeat a row of theirs
      with weight 0: every batch carries a ``sample_weight`` column (1 real, 0 padding), so a
      loss weighted by it is exact;
  ``"error"``
      raise :class:`~tfos.errors.UnevenDataError` on every rank at the same step, naming each
      rank's rows and steps, when the step counts would differ;
  ``None``
      no gate (each rank reads what it was sent): only for ranks that run no collective per batch.
"""

from __future__ import annotations

from tfos.errors import ConfigError, UnevenDataError

POLICIES = ("drop", "pad", "error")
#: the column a "pad" feed adds to every batch: 1.0 for a real row, 0.0 for a padding row
WEIGHT_COLUMN = "sample_weight"


def check_policy(uneven) -> str:
    """The policy as the wire carries it ("" for None), or ConfigError naming the choices."""
    if uneven is None:
        return ""
    if uneven not in POLICIES:
        raise ConfigError(f"uneven must be one of {', '.join(map(repr, POLICIES))} or None, got {uneven!r}")
    return uneven


def steps(rows: int, batch: int) -> int:
    """Batches of at most ``batch`` rows that ``rows`` rows make."""
    return -(-rows // batch)


def next_batch(policy: str, batch: int, fed: int, real: int, own: int, totals: dict[int, int]) -> tuple[int, int]:
    """Pure: ``(real rows, padding rows)`` of this rank's next batch once the feed is complete.

    ``fed``: rows this rank has yielded in this feed, padding included (whole batches of
    ``batch`` so far); ``real``: the real ones among them; ``own``: the rows it was sent;
    ``totals``: each live rank's rows (this rank's included). ``(0, 0)`` ends the feed for this
    rank. Raises UnevenDataError when the policy cannot give every rank the same steps (under
    ``"error"`` when the step counts differ, under ``"pad"`` when a rank got no row to pad with),
    at the first step that not every rank can fill: every rank raises there, none runs ahead.
    """
    if batch < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch}")
    fewest, most = min(totals.values(), default=own), max(totals.values(), default=own)
    if real + batch > fewest:  # the first step not every rank can fill: where the ranks would part
        check_totals(policy, totals, batch)
    if policy == "pad":
        if fed >= steps(most, batch) * batch:
            return 0, 0
        take = max(0, min(batch, own - real))
        return take, batch - take
    limit = min(own, steps(fewest, batch) * batch)  # "drop", and "error" with equal steps
    return max(0, min(batch, limit - real)), 0


def check_totals(policy: str, totals: dict[int, int], batch: int | None = None) -> None:
    """Raise UnevenDataError when ``policy`` cannot give every rank the same steps: ``"pad"`` with a
    rank that got no rows while another got some (nothing to repeat), ``"error"`` with unequal
    step counts (with ``batch`` None: unequal emptiness, decided before a batch size is known)."""
    if not totals:
        return
    fewest, most = min(totals.values()), max(totals.values())
    if policy == "pad" and fewest == 0 < most:
        empty = ", ".join(str(i) for i, r in sorted(totals.items()) if r == 0)
        raise UnevenDataError(f"node(s) {empty} got no rows of this feed, so uneven='pad' has no row to pad with; "
                              f"{uneven_message(batch, totals)}")
    if policy == "error" and (steps(fewest, batch) != steps(most, batch) if batch else (fewest == 0) != (most == 0)):
        raise UnevenDataError(uneven_message(batch, totals))


def level(totals: dict[int, int]) -> tuple[tuple[int, int, int], ...]:
    """Pure: the moves ``(from node, to node, rows)`` at the end of a feed that leave every node's
    rows within one of every other's, so that equal steps drop at most ``batch - 1`` rows per
    rank whatever the partitions and hosts. The nodes with the most rows keep the odd ones (fewer
    rows move); surplus goes to shortfall in node order. None when the shares already are level."""
    if len(totals) < 2 or max(totals.values()) - min(totals.values()) <= 1:
        return ()
    base, extra = divmod(sum(totals.values()), len(totals))
    order = sorted(totals, key=lambda i: (-totals[i], i))
    target = {i: base + (1 if k < extra else 0) for k, i in enumerate(order)}
    give = [[i, totals[i] - target[i]] for i in sorted(totals) if totals[i] > target[i]]
    take = [[i, target[i] - totals[i]] for i in sorted(totals) if totals[i] < target[i]]
    moves, g, t = [], 0, 0
    while g < len(give) and t < len(take):
        rows = min(give[g][1], take[t][1])
        moves.append((give[g][0], take[t][0], rows))
        give[g][1] -= rows
        take[t][1] -= rows
        g += give[g][1] == 0
        t += take[t][1] == 0
    return tuple(moves)


def after_moves(totals: dict[int, int], moves) -> dict[int, int]:
    """Pure: each node's rows once ``moves`` (:func:`level`) are done."""
    out = dict(totals)
    for src, dst, rows in moves:
        out[src] -= rows
        out[dst] += rows
    return out


def surplus(policy: str, batch: int, own: int, totals: dict[int, int]) -> int:
    """Pure: rows of this rank that ``"drop"`` leaves unread (0 for the other policies)."""
    if policy != "drop":
        return 0
    return max(0, own - steps(min(totals.values(), default=own), batch) * batch)


def uneven_message(batch: int | None, totals: dict[int, int]) -> str:
    per_rank = ", ".join(f"node {i}: {rows} rows" + (f" = {steps(rows, batch)} steps" if batch else "")
                         for i, rows in sorted(totals.items()))
    size = f", batch size {batch}" if batch else ""
    return (f"the ranks got unequal data ({per_rank}{size}) and no rank may run a step another cannot. Choose "
            "cluster.train(..., uneven='drop') to drop the surplus rows (the default), uneven='pad' to pad the short "
            "ranks with zero-weight rows, or repartition the data evenly")
