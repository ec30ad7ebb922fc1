"""TensorFlowOnSpark's ``TFManager`` for local use: queues that a ``DataFeed`` reads in-process.

TensorFlowOnSpark fed each TF process through a multiprocessing manager (``TFManager.start``)
whose queues Spark tasks filled with pickled rows. tfos feeds through the authenticated Arrow
hub (``ctx.mgr``) instead, so there is no remote manager; ``start(authkey, queues, 'local')``
returns an in-process stand-in with the same ``get_queue``/``get``/``set`` calls, for unit tests
of a main_fun's feed loop and for programs that fed a DataFeed by hand: ``put(row)`` adds a row,
``put(None)`` ends the feed, and ``batch_results`` lands in the output queue (``qname_out``).
"""

from __future__ import annotations

import queue
import threading

from tfos.errors import ConfigError
from tfos.feed.node.hub import Close, Data, FeedQueue
from tfos.wire import arrow

__all__ = ["start", "connect", "LocalManager"]


class _ResultsTo:
    """The Origin of locally put rows: results go into a plain output queue."""

    train = False

    def __init__(self, out: queue.Queue):
        self.out = out

    def add_results(self, results) -> None:
        """Through the same Arrow conversion and IPC frame as on a cluster, so a main_fun tested
        here gets back what it would get from cluster.inference()."""
        if len(results):
            for r in arrow.batch_to_results(arrow.from_ipc(arrow.to_ipc(arrow.results_to_batch(results)))):
                self.out.put(r)


class _InputQueue:
    """``put(row)`` / ``put(None)`` (end of feed), as on a TensorFlowOnSpark manager queue."""

    def __init__(self, feed: FeedQueue, results: _ResultsTo):
        self._feed = feed
        self._results = results

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        if item is None:
            self._feed.q.put(Close(), block, timeout)
        else:
            self._feed.q.put(Data(arrow.rows_to_batch([item]), self._results, "local"), block, timeout)

    def qsize(self) -> int:
        return self._feed.q.qsize()


class LocalManager:
    """An in-process feed hub with TensorFlowOnSpark's manager calls (``ctx.mgr``-compatible)."""

    reporter = None
    on_terminate = None

    def __init__(self, queues, qname_out: str = "output"):
        self._lock = threading.Lock()
        self.queues: dict[str, FeedQueue] = {}
        self._outputs: dict[str, queue.Queue] = {}
        self._kv: dict = {}
        self._qname_out = qname_out
        for name in queues:
            self.queue(name)

    def queue(self, name: str) -> FeedQueue:
        with self._lock:
            if name not in self.queues:
                self.queues[name] = FeedQueue(name, 0)
            return self.queues[name]

    def _output(self, name: str) -> queue.Queue:
        with self._lock:
            return self._outputs.setdefault(name, queue.Queue())

    def get_queue(self, name: str):
        """The input side of queue ``name`` (rows in), or the results of ``qname_out`` (out)."""
        if name == self._qname_out:
            return self._output(name)
        return _InputQueue(self.queue(name), _ResultsTo(self._output(self._qname_out)))

    def get(self, key):
        return self._kv.get(key)

    def set(self, key, value) -> None:
        self._kv[key] = value


def start(authkey, queues, mode: str = "local") -> LocalManager:
    """A :class:`LocalManager` with ``queues``; ``authkey`` is not needed in-process."""
    if mode != "local":
        raise ConfigError("TFManager.start(mode='remote') does not exist in tfos: nodes are fed through the "
                          "cluster's authenticated feed hub (ctx.mgr); use mode='local' for in-process feeds")
    return LocalManager(queues)


def connect(address, authkey):
    raise ConfigError("TFManager.connect does not exist in tfos: there is no remote manager to connect to; "
                      "inside main_fun the feed is ctx.mgr (TFNode.DataFeed(ctx.mgr))")
