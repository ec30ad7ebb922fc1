"""Which node takes the next chunk of fed rows (runs on the driver, in the control service).

Training feeds balance rows: each chunk goes to the live feeding node that has received the
fewest rows of this feed so far. A node that terminated its feed, or whose main_fun returned,
is skipped; a node that stopped reading without finishing is an error.
"""

from __future__ import annotations

import logging
import threading

from tfos.cluster.driver.registry import NodeRegistry, Snapshot
from tfos.wire import messages as M
from tfos.wire.schema import column_drift

logger = logging.getLogger(__name__)


def pick_node(live: list[int], counts: dict[int, int]) -> int:
    """Pure: the live node with the fewest rows so far (lowest index on ties); -1 if none."""
    return min(live, key=lambda i: (counts.get(i, 0), i)) if live else -1


class FeedScheduler:
    def __init__(self, registry: NodeRegistry, feed_ranks: list[int]):
        self.registry = registry
        self.feed_ranks = list(feed_ranks)  # node indexes that take fed data
        self.feed_rows: dict[str, dict[int, int]] = {}
        self.terminated: set[int] = set()
        self.feed_columns: dict[str, tuple[M.Column, ...]] = {}  # each feed's first columns
        self._lock = threading.Lock()  # the scheduler's own state; the registry is read by snapshot

    def new_attempt(self) -> None:
        """Forget which nodes terminated their feeds (a restart starts every node again)."""
        with self._lock:
            self.terminated.clear()

    def _finished(self, i: int, snap: Snapshot) -> bool:
        return i in self.terminated or snap.ended_ok(i)

    def finished_reading(self, i: int) -> bool:
        """Node ``i`` terminated its feed or ended successfully: data for it may be skipped."""
        with self._lock:
            return self._finished(i, self.registry.snapshot())

    def take_rows(self, feed_id: str) -> dict[int, int]:
        """Rows sent to each node by feed ``feed_id`` (forgotten afterwards)."""
        with self._lock:
            self.feed_columns.pop(feed_id, None)
            return dict(self.feed_rows.pop(feed_id, {}))

    # -- control service handlers
    def on_assign(self, msg: M.AssignChunk):
        with self._lock:
            snap = self.registry.snapshot()
            if not self.feed_ranks:
                return M.ErrorReply("no node of this cluster accepts fed data")
            if msg.columns is not None:
                drift = column_drift(self.feed_columns.setdefault(msg.feed_id, msg.columns), msg.columns)
                if drift:
                    return M.ErrorReply(f"partition {msg.partition}, row 0: {drift}")
            if msg.failed_node >= 0:
                self.registry.node(msg.failed_node)
                if not self._finished(msg.failed_node, snap):
                    return M.ErrorReply(f"node {msg.failed_node} stopped accepting data without finishing; "
                                        "see the node's log in the driver's error")
            live = [i for i in self.feed_ranks if not self._finished(i, snap)]
            counts = self.feed_rows.setdefault(msg.feed_id, {i: 0 for i in self.feed_ranks})
            target = pick_node(live, counts)
            if target >= 0:
                counts[target] += msg.rows
            return M.AssignReply(target)

    def on_terminated(self, msg: M.FeedTerminated):
        self.registry.node(msg.node_index)
        with self._lock:
            self.terminated.add(msg.node_index)
        logger.info("tfos node %d terminated its feed %r", msg.node_index, msg.qname)
        return M.Ack()
