"""The feed in the TF process: a hub receiving Arrow batches from Spark tasks, and the
DataFeed API main_fun reads them with (TensorFlowOnSpark-compatible next_batch/should_stop/
batch_results/terminate, plus a fast numpy/tf.data path).

Memory is bounded: each queue holds at most ``queue_chunks`` batches; a full queue blocks the
receiving thread, which stops reading its socket, which blocks the Spark task sending (TCP
backpressure).
"""

from __future__ import annotations

import collections
import logging
import queue
import socket
import threading
import time

import numpy as np
import pyarrow as pa

from tfos import protocol as P
from tfos.errors import FeedError, ProtocolError, TFOSError
from tfos.feed import arrow_rows

logger = logging.getLogger(__name__)

SHUTDOWN_FEED = "__shutdown__"

_END = "end"  # end of one train() feed: (kind, feed_id, rows)
_PART = "part"  # end of one partition (inference): (kind, origin)
_DATA = "data"  # (kind, batch, origin)
_CLOSE = "close"  # no more feeds: cluster shutting down


class _Origin:
    """The Spark task connection a batch came from; inference results go back on it."""

    def __init__(self, ch: P.Channel, train: bool):
        self.ch = ch
        self.train = train
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.rows_answered = 0
        self.pending_results: list = []

    def add_results(self, results: list) -> None:
        with self.cond:
            self.pending_results.extend(results)
            self.rows_answered += len(results)
            self._flush_locked()
            self.cond.notify_all()

    def _flush_locked(self) -> None:
        if not self.pending_results:
            return
        batch = arrow_rows.results_to_batch(self.pending_results)
        self.pending_results = []
        self.ch.send(P.FeedResults(batch.num_rows))
        self.ch.send_data(arrow_rows.to_ipc(batch))


class FeedQueue:
    """Bounded queue of one named feed, with end-of-feed accounting."""

    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.q: queue.Queue = queue.Queue(maxsize)
        self.terminated = threading.Event()

    def put(self, item, stop: threading.Event) -> None:
        while True:
            if self.terminated.is_set() and item[0] == _DATA:
                return  # terminate(): drop data so senders finish quickly
            try:
                self.q.put(item, timeout=0.5)
                return
            except queue.Full:
                if stop.is_set():
                    raise TFOSError("feed hub closed")


class FeedHub:
    """TCP server in the TF process. Spark tasks connect with the cluster secret and stream
    ``FeedBegin``, Arrow data frames and ``FeedPartitionEnd``; the driver sends ``FeedEnd``."""

    def __init__(self, secret: str, queue_chunks: int = 4, bind_host: str = "0.0.0.0", on_terminate=None):
        self.secret = secret
        self.on_terminate = on_terminate  # called with the queue name when main_fun terminates a feed
        self.queue_chunks = max(1, int(queue_chunks))
        self.queues: dict[str, FeedQueue] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind_host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.rows_received = 0
        self.bytes_received = 0
        self.reporter = None  # set by the TF process: feed waits go on the cluster timeline

    def queue(self, name: str) -> FeedQueue:
        with self._lock:
            if name not in self.queues:
                self.queues[name] = FeedQueue(name, self.queue_chunks)
            return self.queues[name]

    def start(self) -> "FeedHub":
        threading.Thread(target=self._accept_loop, name="tfos-feed-accept", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr), name="tfos-feed-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, addr) -> None:
        ch = P.Channel(conn, f"{addr[0]}:{addr[1]}")
        try:
            ch.server_handshake(self.secret)
            ch.settimeout(None)
            first = ch.recv()
            if isinstance(first, P.FeedEnd):
                self._on_feed_end(ch, first)
            elif isinstance(first, P.FeedBegin):
                self._on_feed(ch, first)
            else:
                ch.send(P.ErrorReply(f"unexpected {type(first).__name__}"))
        except (ProtocolError, OSError, TFOSError) as e:
            if "closed" not in str(e):
                logger.warning("feed connection from %s failed: %s", ch.peer, e)
        finally:
            ch.close()

    def _on_feed_end(self, ch: P.Channel, msg: P.FeedEnd) -> None:
        if msg.feed_id == SHUTDOWN_FEED:
            for q in list(self.queues.values()) or [self.queue(msg.qname)]:
                q.put((_CLOSE,), self._stop)
        else:
            self.queue(msg.qname).put((_END, msg.feed_id, msg.rows), self._stop)
        ch.send(P.FeedAck(msg.rows))

    def _on_feed(self, ch: P.Channel, begin: P.FeedBegin) -> None:
        q = self.queue(begin.qname)
        origin = _Origin(ch, begin.train)
        rows = 0
        while True:
            kind, value = ch.recv_frame()
            if kind == P.KIND_ARROW:
                batch = arrow_rows.from_ipc(value)
                rows += batch.num_rows
                self.bytes_received += len(value)
                if batch.num_rows:
                    q.put((_DATA, batch, origin, begin.feed_id), self._stop)
                continue
            if isinstance(value, P.FeedPartitionEnd):
                if value.rows != rows:
                    raise FeedError(f"partition {begin.partition}: sender says {value.rows} rows, received {rows}")
                self.rows_received += rows
                if begin.train:
                    ch.send(P.FeedAck(rows, q.terminated.is_set()))
                else:
                    q.put((_PART, origin), self._stop)
                    with origin.cond:  # wait until main_fun answered every row of this partition
                        while origin.rows_answered < rows and not q.terminated.is_set() and not self._stop.is_set():
                            origin.cond.wait(0.5)
                        ch.send(P.FeedAck(rows, q.terminated.is_set()))
                return
            raise ProtocolError(f"unexpected {type(value).__name__} in a feed")


class DataFeed:
    """Read fed data in main_fun. Compatible with TensorFlowOnSpark's ``TFNode.DataFeed``.

    ``DataFeed(ctx.mgr, train_mode=True, qname_in='input', qname_out='output', input_mapping=None)``.
    In train mode a feed ends (``should_stop()``) when ``cluster.train`` has delivered every
    epoch; in inference mode (``train_mode=False``) a batch stops at the end of a partition (so a
    partition's last rows are answered without waiting for more data; when several partitions
    reach this node at once their chunks interleave, and results still go back to the right
    task), and the feed ends when the cluster shuts down.
    """

    def __init__(self, mgr, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output",
                 input_mapping=None):
        if mgr is None:
            raise TFOSError("this node has no data feed: start the cluster with input_mode=InputMode.SPARK")
        self.hub: FeedHub = mgr
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        if isinstance(input_mapping, (list, tuple)):
            input_mapping = {c: c for c in input_mapping}
        self.input_mapping = dict(input_mapping) if input_mapping else None
        self.queue = self.hub.queue(qname_in)
        self.done = False
        self._batch: pa.RecordBatch | None = None
        self._origin: _Origin | None = None
        self._offset = 0
        self._pending: collections.deque = collections.deque()  # [origin, rows awaiting results]
        self.rows_read = 0
        self._feed_rows: collections.Counter = collections.Counter()
        self.wait_secs = 0.0

    # -- core reader
    def _next_item(self):
        t0 = time.time()
        item = self.queue.q.get()
        t1 = time.time()
        self.wait_secs += t1 - t0
        if self.hub.reporter is not None and t1 - t0 > 0.001:
            self.hub.reporter.event("feed wait", "feed", t0, t1)
        if self.hub.reporter is not None:
            self.hub.reporter.report({"rows_read": self.rows_read, "feed_wait_secs": round(self.wait_secs, 3)})
        return item

    def _take(self, n: int) -> list[pa.RecordBatch]:
        """Up to ``n`` rows as record-batch slices; fewer at end of feed (or of a partition in
        inference mode)."""
        out, got = [], 0
        while got < n and not self.done:
            if self._batch is None:
                item = self._next_item()
                kind = item[0]
                if kind == _DATA:
                    self._batch, self._origin, self._offset = item[1], item[2], 0
                    self._feed_rows[item[3]] += item[1].num_rows
                elif kind == _END:
                    _, feed_id, rows = item
                    got_rows = self._feed_rows.pop(feed_id, 0)
                    if got_rows != rows:
                        raise FeedError(f"feed {feed_id}: the driver sent {rows} rows to this node but "
                                        f"{got_rows} arrived")
                    self.done = True
                elif kind == _CLOSE:
                    self.done = True
                elif kind == _PART and not self.train_mode and got:
                    break
                continue
            take = min(n - got, self._batch.num_rows - self._offset)
            out.append(self._batch.slice(self._offset, take))
            if not self._origin.train:
                if self._pending and self._pending[-1][0] is self._origin:
                    self._pending[-1][1] += take
                else:
                    self._pending.append([self._origin, take])
            self._offset += take
            got += take
            if self._offset >= self._batch.num_rows:
                self._batch = None
        self.rows_read += got
        return out

    def next_batch(self, batch_size: int):
        """Up to ``batch_size`` rows (list of tuples/dicts/values, or {tensor: [values]} with
        input_mapping). Returns fewer rows at the end of the feed."""
        slices = self._take(batch_size)
        if self.input_mapping:
            result = {t: [] for t in self.input_mapping.values()}
            for s in slices:
                for k, v in arrow_rows.batch_to_rows(s, self.input_mapping).items():
                    result[k].extend(v)
            return result
        rows = []
        for s in slices:
            rows.extend(arrow_rows.batch_to_rows(s))
        return rows

    def should_stop(self) -> bool:
        """True once the feed has ended (all epochs delivered, terminated, or cluster shutdown)."""
        return self.done

    def batch_results(self, results) -> None:
        """Inference: return one result per row read, in order (scalars, vectors or dicts)."""
        results = list(results) if not isinstance(results, np.ndarray) else results
        pos = 0
        total = len(results)
        while pos < total:
            if not self._pending:
                raise FeedError(f"batch_results got {total - pos} more results than rows read")
            origin, rows = self._pending[0]
            k = min(rows, total - pos)
            origin.add_results(results[pos:pos + k] if isinstance(results, list) else list(results[pos:pos + k]))
            pos += k
            if k == rows:
                self._pending.popleft()
            else:
                self._pending[0][1] -= k

    def terminate(self) -> None:
        """Stop reading: Spark skips the rest of the feed (data in flight is discarded), no error."""
        if not self.queue.terminated.is_set():
            self.queue.terminated.set()
            if self.hub.on_terminate is not None:
                try:
                    self.hub.on_terminate(self.qname_in)
                except Exception as e:  # the hub still discards data; Spark just feeds longer
                    logger.warning("could not tell the driver that the feed was terminated: %s", e)
        self.done = True
        try:
            while True:
                self.queue.q.get_nowait()
        except queue.Empty:
            pass

    # -- fast path
    def _columns(self, slices):
        if not slices:
            return None
        schema = slices[0].schema
        cols = []
        for j in range(schema.__len__()):
            parts = [arrow_rows.column_to_numpy(s.column(j), schema.field(j)) for s in slices]
            cols.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
        return schema, cols

    def batches(self, batch_size: int):
        """Yield batches as tuples of numpy arrays (dicts for dict rows or input_mapping) built
        directly from the Arrow buffers: vector columns become 2-D arrays."""
        while not self.done:
            got = self._columns(self._take(batch_size))
            if got is None:
                continue
            schema, cols = got
            kind = (schema.metadata or {}).get(arrow_rows.ROW_KIND, b"tuple").decode()
            if self.input_mapping:
                yield {t: cols[schema.names.index(c)] for c, t in self.input_mapping.items()}
            elif kind == "dict":
                yield dict(zip(schema.names, cols))
            elif kind == "scalar":
                yield cols[0]
            else:
                yield tuple(cols)

    def dataset(self, batch_size: int, output_signature=None, dtypes=None):
        """A ``tf.data.Dataset`` of ready batches from the feed (element spec inferred from the first
        batch unless ``output_signature`` is given; ``dtypes`` casts columns, e.g. {0: tf.float32}).

        Under MultiWorkerMirroredStrategy set ``AutoShardPolicy.OFF`` on this dataset (each node's
        feed is already its own shard) and iterate it to exhaustion.
        """
        import tensorflow as tf

        gen = self.batches(batch_size)
        first = next(gen, None)

        def spec_of(a):
            return tf.TensorSpec((None,) + a.shape[1:], tf.as_dtype(a.dtype) if a.dtype != object else tf.string)

        if output_signature is None:
            if first is None:
                raise FeedError("the feed ended before any data arrived; give output_signature explicitly")
            if isinstance(first, dict):
                output_signature = {k: spec_of(v) for k, v in first.items()}
            elif isinstance(first, tuple):
                output_signature = tuple(spec_of(v) for v in first)
            else:
                output_signature = spec_of(first)

        def generate():
            if first is not None:
                yield first
            yield from gen

        ds = tf.data.Dataset.from_generator(generate, output_signature=output_signature)
        if dtypes:
            def cast(*xs):
                xs = list(xs)
                for j, dt in dtypes.items():
                    xs[j] = tf.cast(xs[j], dt)
                return tuple(xs)
            ds = ds.map(cast)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(options)
