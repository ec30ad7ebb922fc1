"""The reader's side of equal steps (:mod:`tfos.data.uneven`) in a TF process: :class:`Gate` holds
one node's place in a gated train feed (the safe count heard with the data or asked of the
driver, and the totals once the feed is complete), and :func:`weighted` adds the ``pad``
policy's sample weights. :class:`tfos.feed.node.datafeed.DataFeed` decides with them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa

from tfos.errors import FeedError
from tfos.data import uneven
from tfos.wire import arrow

#: how long one gate request waits on the driver for a rise of the safe count before asking again
GATE_WAIT = 5.0
#: how long a reader at the gate waits for the safe count to come with data before asking the driver
GATE_NEWS_WAIT = 0.02


class Gate:
    """This node's place in one train feed with equal steps: rows yielded (``fed``, padding
    included; ``real`` without), the driver's safe count, and once the feed is complete every
    live node's total (``totals``) and this node's (``own``).

    The safe count comes with the data: the feeding tasks send the driver's count with their
    chunks, and the hub keeps the latest (``FeedQueue.safe``). Only a reader that finds no news
    within GATE_NEWS_WAIT wakes the watcher thread, which long-polls the driver (FeedGate, on one
    authenticated connection per burst) until the count reaches what the reader needs or the feed
    is complete (how the totals arrive)."""

    def __init__(self, feed_id: str, policy: str, first: pa.RecordBatch, client=None, news=None):
        self.feed_id = feed_id
        self.policy = policy
        self._asked = 0  # the driver's answers (the news from the data is in ``_heard``)
        self._heard: dict = news.safe if news is not None else {}
        self._queue = news  # the FeedQueue: a waiting reader takes what is queued meanwhile
        self.fed = self.real = self.padded = self.dropped = 0
        self.totals: dict[int, int] | None = None
        self.own = 0
        self.level = None  # M.FeedLevel: this node's part in levelling the shares, with the totals
        self.handed = False  # its surplus rows went to the nodes short of rows
        self.error: BaseException | None = None
        self.requests = 0  # gate requests the watcher made (reported: feed_gate_requests)
        self.wait_secs = 0.0  # how long the reader waited at the gate (reported: feed_gate_wait_secs)
        self.cond = news.news if news is not None else threading.Condition()
        self._need = 0  # what the reader waits for, when it asked the watcher
        self._wanted = threading.Event()
        self._stop = threading.Event()
        # "pad" repeats a row of this node's with weight 0: keep one (a copy, not a view of the chunk)
        self._pad_row = first.take(pa.array([0])) if policy == "pad" and first.num_rows else None
        if policy and client is not None:
            threading.Thread(target=self._watch, args=(client,), name=f"tfos-gate-{feed_id}", daemon=True).start()

    @property
    def safe(self) -> int:
        """Rows every live node has been sent: the larger of the driver's answer and the data's news."""
        return max(self._asked, self._heard.get(self.feed_id, 0))

    def _watch(self, client) -> None:
        try:
            while True:
                self._wanted.wait()
                if self._stop.is_set():
                    return
                self._wanted.clear()
                if self.safe >= self._need:
                    continue
                # one connection per burst of requests: between bursts (the data may bring the count
                # for an hour) no idle connection is left for the driver or a firewall to drop
                with client.session(timeout=GATE_WAIT + 30):
                    while not self._stop.is_set() and self.safe < self._need:
                        reply = client.feed_gate(self.feed_id, self._need, GATE_WAIT)
                        self.requests += 1
                        with self.cond:
                            self._asked = max(self._asked, reply.safe)
                            if reply.complete:
                                self.totals, self.own, self.level = dict(reply.totals), reply.own, reply.level
                            self.cond.notify_all()
                        if reply.complete:
                            return
        except BaseException as e:  # the reader raises it when it next needs the gate
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def wait(self, need: int) -> None:
        """Until the safe count reaches ``need`` or the feed is complete: news with the data, or
        (after GATE_NEWS_WAIT without) the watcher's answer. Meanwhile the rows that reach this
        node's queue are taken out of it (``FeedQueue.read_ahead``): the feed completes only
        once every row sent here is queued."""
        t0 = time.monotonic()
        with self.cond:
            asked = False
            if self._queue is not None:
                self._queue.waiting = True
            try:
                while self.totals is None and self.safe < need and self.error is None and not self._stop.is_set():
                    if self._queue is not None:
                        self._queue.read_ahead()
                    waited = time.monotonic() - t0
                    if not asked and waited >= GATE_NEWS_WAIT:
                        self._need, asked = need, True
                        self._wanted.set()
                    self.cond.wait(1.0 if asked else max(0.0, GATE_NEWS_WAIT - waited))
            finally:
                if self._queue is not None:
                    self._queue.waiting = False
            self.wait_secs += time.monotonic() - t0
            if self.error is not None:
                raise FeedError(f"equal steps: the driver's gate failed: {self.error}") from self.error

    def close(self) -> None:
        self._stop.set()
        self._wanted.set()

    def padding(self, k: int) -> pa.RecordBatch:
        return self._pad_row.take(pa.array(np.zeros(k, dtype=np.int64)))


def weighted(batch: pa.RecordBatch, weight: float) -> pa.RecordBatch:
    """``batch`` with a float32 ``sample_weight`` column of ``weight`` (a "pad" feed): single values
    become (value, weight) tuples, dicts gain the key."""
    meta = dict(batch.schema.metadata or {})
    if meta.get(arrow.ROW_KIND, b"tuple") == b"scalar":
        meta[arrow.ROW_KIND] = b"tuple"
    schema = batch.schema.append(pa.field(uneven.WEIGHT_COLUMN, pa.float32())).with_metadata(meta)
    return pa.RecordBatch.from_arrays(list(batch.columns) + [pa.array(np.full(batch.num_rows, weight, np.float32))],
                                      schema=schema)
