"""Which node takes the next chunk of fed rows (runs on the driver, in the control service).

Training feeds balance rows: each chunk goes to the live feeding node that has received the
fewest rows of this feed so far, or is split to level the shares when they drift apart
(:func:`plan_chunk`). A node that terminated its feed, or whose main_fun returned,
is skipped; a node that stopped reading without finishing is an error.

The scheduler also answers the nodes' gates (equal steps, :mod:`tfos.data.uneven`): a node may
take rows up to the fewest rows assigned to any live node so far (the *safe* count), and, once
the feed is complete, learns every live node's total.

At thousands of nodes a decision costs O(N), not more: the live nodes and the nodes of each host
are kept until a node registers, ends or terminates its feed (``NodeRegistry.version``), the rows
assigned are a running total, and the two neediest nodes are found without sorting. A gate that
waits sits in a heap of needs: an assignment wakes only the gates its new safe count satisfies,
not every waiting node.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading

from tfos.cluster.driver.registry import NodeRegistry, Snapshot
from tfos.data import uneven
from tfos.host.deadline import Deadline
from tfos.wire import messages as M
from tfos.wire.schema import column_drift

logger = logging.getLogger(__name__)


#: pieces smaller than this are not split off a chunk (each piece is one Arrow frame to one node)
MIN_PIECE = 64
#: in a feed's last wave a chunk is placed in this many parts (:func:`plan_chunk`)
LAST_WAVE_PARTS = 4
#: shares may part by this fraction of the rows assigned so far before chunks are split to level them
SLACK_FRACTION = 1 / 256


def slack_rows(assigned: int) -> int:
    """Pure: how far apart the live nodes' shares may drift before a chunk is split to level them."""
    return max(MIN_PIECE, int(assigned * SLACK_FRACTION))


def plan_chunk(live: list[int], counts: dict[int, int], rows: int, slack: int,
               local: tuple[int, ...] = (), local_slack: int = 0, last_wave: bool = False) -> list[tuple[int, int]]:
    """Pure: the pieces ``[(node, rows)]`` of a chunk of ``rows`` rows.

    ``local``: the nodes on the host that produced the chunk. When other live nodes are elsewhere,
    the whole chunk goes to the local live node with the fewest rows while that leaves it at most
    ``max(slack, 2 * rows, local_slack)`` ahead of the node with the fewest (the chunk then crosses
    no network). Otherwise it goes to the live
    node with the fewest rows (lowest index on ties) while that leaves it at most ``slack`` rows
    ahead of the next; otherwise it is spread to level the shares (the fewest first), in pieces of
    at least MIN_PIECE rows. Shares part by at most two chunks, less once locality is not
    possible: the rows equal steps may drop at the end of a feed (:mod:`tfos.data.uneven`).

    ``last_wave`` (:func:`last_wave`): the feed's last partitions run, and their chunks level the
    shares. A chunk is then placed a quarter at a time by the same rules, so the shares end at
    most two quarter chunks apart: big chunks (fewer frames, fewer decisions) without more rows
    for equal steps to drop."""
    if not live:
        return []
    live_set = set(live) if local else ()
    near = [i for i in local if i in live_set]
    if last_wave and near and len(near) < len(live) and rows >= LAST_WAVE_PARTS * MIN_PIECE:
        placed, now = collections.Counter(), dict(counts)
        for k in range(LAST_WAVE_PARTS):
            part = rows * (k + 1) // LAST_WAVE_PARTS - rows * k // LAST_WAVE_PARTS
            for node, r in plan_chunk(live, now, part, slack, local, local_slack):
                placed[node] += r
                now[node] = now.get(node, 0) + r
        return list(placed.items())  # by first placement: the chunk's first quarter decides its first piece
    if near and len(near) < len(live):  # locality only between hosts: one host's nodes share by the rest
        mine = min(near, key=lambda i: (counts.get(i, 0), i))
        if counts.get(mine, 0) + rows <= min(counts.get(i, 0) for i in live) + max(slack, 2 * rows, local_slack):
            return [(mine, rows)]
    def need(i):
        return counts.get(i, 0), i

    two = heapq.nsmallest(2, live, key=need)  # O(N): most chunks go whole to the neediest node
    if len(two) == 1 or rows <= MIN_PIECE or counts.get(two[0], 0) + rows <= counts.get(two[1], 0) + slack:
        return [(two[0], rows)]
    order = sorted(live, key=need)
    c = [counts.get(i, 0) for i in order]
    k, level_cost = 1, 0  # fill the k lowest nodes up to the next one's count while rows last
    while k < len(c) and level_cost + k * (c[k] - c[k - 1]) <= rows:
        level_cost += k * (c[k] - c[k - 1])
        k += 1
    each, extra = divmod(rows - level_cost, k)  # the k lowest are level: share the rest evenly
    give = [c[k - 1] - c[j] + each + (1 if j < extra else 0) for j in range(k)]
    pieces = [(order[j], g) for j, g in enumerate(give) if g > 0]
    small = sum(g for _, g in pieces if g < MIN_PIECE)
    pieces = [(i, g) for i, g in pieces if g >= MIN_PIECE] or [(order[0], 0)]
    pieces[0] = (pieces[0][0], pieces[0][1] + small)  # tiny remainders go with the neediest node's piece
    return pieces


def locality_slack(assigned: int, started: int, partitions: int, live: int) -> int:
    """Pure: how far ahead a node may run on its own host's chunks while partitions are still to
    start: what the last wave can level, the rows of ``live`` partitions of the average size so
    far (rows ``assigned`` over partitions ``started``); 0 (two chunks) once the last ones
    started (``live`` of them, one per node, may still run: :func:`last_wave`, whose chunks level
    the shares, so equal steps drop little) or when the feed's partition count is unknown (0)."""
    if partitions <= 0 or started >= partitions - live:
        return 0
    return assigned * live // max(1, started)


def last_wave(started: int, partitions: int, live: int) -> bool:
    """Pure: the feed's last partitions (``live`` of them, one per node) have started, so the
    chunks still to come level the shares; False while the partition count is unknown (0)."""
    return partitions > 0 and started >= partitions - live


def safe_rows(live: list[int], counts: dict[int, int]) -> int:
    """Pure: rows every live node has been sent (the fewest assigned to one); 0 if none is live."""
    return min((counts.get(i, 0) for i in live), default=0)


def _levels(moves, nodes, timeout: float) -> dict[int, M.FeedLevel]:
    """Each moving node's part in levelling a feed (``uneven.level``'s ``moves``), with the feed
    hubs of ``nodes`` (registered NodeInfos) that it sends rows to; made once when the feed completes."""
    hubs = {n.node_index: (n.host, n.feed_port) for n in nodes}
    parts: dict[int, M.FeedLevel] = {}
    for src, dst, rows in moves:
        give = parts.get(src, M.FeedLevel(timeout=timeout))
        parts[src] = M.FeedLevel(give.give + ((dst, *hubs[dst], rows),), give.take, timeout)
        take = parts.get(dst, M.FeedLevel(timeout=timeout))
        parts[dst] = M.FeedLevel(take.give, take.take + rows, timeout)
    return parts


#: completed feeds whose totals the scheduler keeps for late gate requests
KEEP_COMPLETED = 64


class FeedScheduler:
    def __init__(self, registry: NodeRegistry, feed_ranks: list[int]):
        self.registry = registry
        self.feed_ranks = list(feed_ranks)  # node indexes that take fed data
        self.feed_rows: dict[str, dict[int, int]] = {}
        self.terminated: set[int] = set()
        self.feed_columns: dict[str, tuple[M.Column, ...]] = {}  # each feed's first columns
        self.completed: dict[str, tuple[tuple[int, int], ...]] = {}  # feed -> live nodes' final rows, levelled
        self.levels: dict[str, dict[int, M.FeedLevel]] = {}  # completed feed -> each moving node's part
        self._lock = threading.Lock()  # the scheduler's own state; the registry is read by snapshot
        self.locality = True  # prefer a node on the producing task's host (plan_chunk's ``local``)
        self.produced: collections.Counter = collections.Counter()  # rows assigned, by the producing task's host
        self.partitions: dict[str, int] = {}  # feed -> its partitions (all epochs), when the driver knows them
        self.started: dict[str, int] = {}  # feed -> partitions that sent their first chunk
        self.assigned: dict[str, int] = {}  # feed -> rows assigned so far (the sum of feed_rows[feed])
        self._gates: dict[str, list] = {}  # feed -> heap of waiting gates: (need, seq, threading.Event)
        self._seq = itertools.count()
        self._mine = 0  # changes of terminated / feed_ranks (the registry's are its version)
        self._kept: tuple | None = None  # (versions, live nodes, {host: feeding nodes}): see _live

    def _live(self) -> tuple[list[int], dict[str, tuple[int, ...]]]:
        """The live feeding nodes and the feeding nodes registered on each host, recomputed only
        after a node registered, ended or terminated its feed. Caller holds the lock."""
        versions = (self.registry.version, self._mine)  # read before the snapshot: never older than it
        if self._kept is None or self._kept[0] != versions:
            snap = self.registry.snapshot()
            live = [i for i in self.feed_ranks if not self._finished(i, snap)]
            ranks, hosts = set(self.feed_ranks), collections.defaultdict(list)
            for n in self.registry.registered():
                if n.node_index in ranks:
                    hosts[n.host].append(n.node_index)
            self._kept = (versions, live, {h: tuple(v) for h, v in hosts.items()})
        return self._kept[1], self._kept[2]

    def new_attempt(self, feed_ranks: list[int] | None = None) -> None:
        """Forget which nodes terminated their feeds (a restart starts every node again); the new
        attempt's feeding nodes are ``feed_ranks`` when its size changed."""
        with self._lock:
            self.terminated.clear()
            if feed_ranks is not None:
                self.feed_ranks = list(feed_ranks)
            self._mine += 1
            self._wake_gates()

    def _wake_gates(self, feed_id: str | None = None, safe: int | None = None) -> None:
        """Wake the waiting gates of ``feed_id`` (every feed's: None) whose need ``safe`` rows meet
        (all of them: None); they look again. Caller holds the lock."""
        for feed in ([feed_id] if feed_id is not None else list(self._gates)):
            heap = self._gates.get(feed)
            while heap and (safe is None or heap[0][0] <= safe):
                heapq.heappop(heap)[2].set()
            if not heap:
                self._gates.pop(feed, None)

    def _finished(self, i: int, snap: Snapshot) -> bool:
        return i in self.terminated or snap.ended_ok(i)

    def finished_reading(self, i: int) -> bool:
        """Node ``i`` terminated its feed or ended successfully: data for it may be skipped."""
        with self._lock:
            return self._finished(i, self.registry.snapshot())

    def take_rows(self, feed_id: str, level: bool = False, timeout: float = 600.0) -> dict[int, int]:
        """Rows sent to each node by feed ``feed_id`` (forgotten afterwards); the feed is complete:
        its live nodes' totals answer the gates from now on (:meth:`totals`). With ``level`` (a
        gated feed) the totals are levelled to the row (``uneven.level``): the nodes with surplus
        rows send their last ones to the nodes short of rows (:meth:`level_of`; ``timeout``:
        feed_timeout)."""
        with self._lock:
            self.feed_columns.pop(feed_id, None)
            self.partitions.pop(feed_id, None)
            self.started.pop(feed_id, None)
            self.assigned.pop(feed_id, None)
            rows = dict(self.feed_rows.pop(feed_id, {}))
            live = {i: rows.get(i, 0) for i in self._live()[0]}
            moves = uneven.level(live) if level else ()
            self.completed[feed_id] = tuple(uneven.after_moves(live, moves).items())
            self.levels[feed_id] = _levels(moves, self.registry.registered(), float(timeout))
            while len(self.completed) > KEEP_COMPLETED:
                self.levels.pop(next(iter(self.completed)), None)
                self.completed.pop(next(iter(self.completed)))
            self._wake_gates(feed_id)
            return rows

    def totals(self, feed_id: str) -> tuple[tuple[int, int], ...]:
        """(node, rows) of the live nodes of a completed feed, after levelling."""
        with self._lock:
            return self.completed.get(feed_id, ())

    def level_of(self, feed_id: str, node: int) -> M.FeedLevel | None:
        """Node ``node``'s part in levelling completed feed ``feed_id`` (None: it sends and receives
        nothing)."""
        with self._lock:
            return self.levels.get(feed_id, {}).get(node)

    # -- control service handlers
    def handlers(self) -> dict:
        """The control service's handlers for the feed's requests (``ControlService(..., handlers)``)."""
        return {M.AssignChunk: self.on_assign, M.FeedTerminated: self.on_terminated, M.FeedGate: self.on_gate}

    def on_assign(self, msg: M.AssignChunk):
        with self._lock:
            if not self.feed_ranks:
                return M.ErrorReply("no node of this cluster accepts fed data")
            if msg.columns is not None:
                drift = column_drift(self.feed_columns.setdefault(msg.feed_id, msg.columns), msg.columns)
                if drift:
                    return M.ErrorReply(f"partition {msg.partition}, row 0: {drift}")
            if msg.failed_node >= 0:
                self.registry.node(msg.failed_node)
                if not self._finished(msg.failed_node, self.registry.snapshot()):
                    return M.ErrorReply(f"node {msg.failed_node} stopped accepting data without finishing; "
                                        "see the node's log in the driver's error")
            live, hosts = self._live()
            counts = self.feed_rows.setdefault(msg.feed_id, {i: 0 for i in self.feed_ranks})
            local = hosts.get(msg.host, ()) if self.locality and msg.host else ()
            self.produced[msg.host] += msg.rows
            started = self.started.setdefault(msg.feed_id, 0) + (msg.partition >= 0)
            self.started[msg.feed_id] = started
            assigned = self.assigned.get(msg.feed_id, 0)
            partitions = self.partitions.get(msg.feed_id, 0)
            pieces = plan_chunk(live, counts, msg.rows, slack_rows(assigned), local,
                                locality_slack(assigned, started, partitions, len(live)),
                                last_wave(started, partitions, len(live)))
            for node, rows in pieces:
                counts[node] = counts.get(node, 0) + rows
            self.assigned[msg.feed_id] = assigned + sum(r for _, r in pieces)
            safe = safe_rows(live, counts)
            if pieces:
                self._wake_gates(msg.feed_id, safe)
            return M.AssignReply(pieces[0][0] if pieces else -1, tuple(pieces), safe)

    def on_gate(self, msg: M.FeedGate):
        """A node's gate: answered when every live node has been sent ``need`` rows of the feed, when
        the feed is complete, or after ``wait`` seconds (the node asks again)."""
        self.registry.node(msg.node_index)
        deadline = Deadline(min(max(msg.wait, 0.0), 10.0))
        woken: threading.Event | None = None
        with self._lock:
            while True:
                if msg.feed_id in self.completed:
                    totals = self.completed[msg.feed_id]
                    own = dict(totals).get(msg.node_index, -1)
                    break
                safe = safe_rows(self._live()[0], self.feed_rows.get(msg.feed_id, {}))
                if safe >= msg.need or deadline.expired():
                    return M.FeedGateReply(safe)
                if woken is None or woken.is_set():  # wait in the heap until an assignment meets the need
                    woken = threading.Event()
                    heapq.heappush(self._gates.setdefault(msg.feed_id, []), (msg.need, next(self._seq), woken))
                self._lock.release()
                try:  # and look again now and then: a node that ends changes ``live``
                    woken.wait(deadline.slice(0.5))
                finally:
                    self._lock.acquire()
        return M.FeedGateReply(min((r for _, r in totals), default=0), True, totals, own,
                               self.level_of(msg.feed_id, msg.node_index))

    def on_terminated(self, msg: M.FeedTerminated):
        self.registry.node(msg.node_index)
        with self._lock:
            self.terminated.add(msg.node_index)
            self._mine += 1
            self._wake_gates()  # the safe count may rise without this node
        logger.info("tfos node %d terminated its feed %r", msg.node_index, msg.qname)
        return M.Ack()
