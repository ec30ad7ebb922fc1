"""``DataFeed``: how main_fun reads the data fed by ``cluster.train``/``inference`` (TF process).

TensorFlowOnSpark-compatible ``next_batch``/``should_stop``/``batch_results``/``terminate``, plus
fast numpy (``batches``) and tf.data (``dataset``) paths built straight from the Arrow buffers.

One module past 450 lines (about 500): the reader's state (the chunk at hand and its offset, the
items read ahead, the gate, the rows levelled in or out) is read and changed by the core reader,
the levelling at a feed's end (``_hand_off``, ``_end``), the feed position (``_at``) and the fast paths alike. The seam is
the fast paths (``_blocks``/``_stacked``/``dataset``, about 130 lines), which only call
``_take``; moving them out is the next split, not made here because ``_blocks`` reaches into the
chunk at hand to take whole batches without a copy.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time

import numpy as np
import pyarrow as pa

from tfos.errors import FeedError, TFOSError
from tfos.feed.node.hub import Close, Data, End, FeedHub, Origin, Part, shifted
from tfos.data import uneven
from tfos.wire import arrow
from tfos.feed.node.gate import Gate, weighted

logger = logging.getLogger(__name__)

def _concatenate(parts):
    """``np.concatenate(parts)`` into an Arrow buffer, 64-byte aligned like the channel's data frames
    (wire.channel): TensorFlow takes an aligned array as it is and copies an unaligned one (a batch
    that spans two chunks). From the system allocator, as the frames are, which the TF process's
    malloc settings keep in the heap for reuse (``agent.node_agent.memory_environment``): under
    ``dataset()`` TF frees the join on its own threads (bench/README, "Constants": receive buffers)."""
    if parts[0].dtype == object:
        return np.concatenate(parts)
    shape = (sum(len(p) for p in parts),) + parts[0].shape[1:]
    buf = pa.allocate_buffer(int(np.prod(shape)) * parts[0].dtype.itemsize, memory_pool=pa.system_memory_pool())
    return np.concatenate(parts, out=np.frombuffer(buf, parts[0].dtype).reshape(shape))


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
        self.closed = False  # the feed ended because the cluster is shutting down (no more train() calls)
        self._batch: pa.RecordBatch | None = None
        self._origin: Origin | None = None
        self._at: tuple | None = None  # where the chunk at hand comes from, in a resumable train feed
        self._feed_id = ""  # the feed of the chunk at hand
        self._offset = 0
        self._pending: collections.deque = collections.deque()  # [origin, rows awaiting results]
        # dataset() reads ahead on a tf.data thread while main_fun calls batch_results()
        self._pending_lock = threading.Lock()
        self.rows_read = 0
        self._feed_rows: collections.Counter = collections.Counter()
        self.wait_secs = 0.0
        self._gate: Gate | None = None  # this node's place in the feed's equal steps (train feeds)
        self._part_end = False  # inference: the item just read ended a partition
        # levelling a gated feed's shares at its end (uneven.level)
        self._given: collections.Counter = collections.Counter()  # feed -> rows this node sent to others
        # feed -> (its End, rows to read in all, deadline): rows other nodes send are still to come
        self._late: dict[str, tuple[End, int, float]] = {}

    # -- core reader
    def _next_item(self):
        t0 = time.time()
        item = self._levelled() if self._late else self.queue.get()
        t1 = time.time()
        self.wait_secs += t1 - t0
        if self.hub.reporter is not None and t1 - t0 > 0.001:
            self.hub.reporter.event("feed wait", "feed", t0, t1)
        if self.hub.reporter is not None:
            self.hub.reporter.report({"rows_read": self.rows_read, "feed_wait_secs": round(self.wait_secs, 3)})
        return item

    def _levelled(self):
        """The next rows another node sends to level the shares of the feed whose end marker came
        (``_late``): from the queue of levelled rows, by the deadline ``feed_timeout`` set. Nothing
        else is read meanwhile: the main queue's next items (the next feed's, a shutdown) wait."""
        feed_id, (end, expected, deadline) = next(iter(self._late.items()))
        while True:
            try:
                item = self.queue.levelled.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise FeedError(f"feed {feed_id}: {expected - self._feed_rows[feed_id]} of the {end.level.take} rows "
                                f"other nodes send to level the shares did not come within {end.level.timeout:.0f}s "
                                "(feed_timeout)") from None
            if item.feed_id == feed_id:
                return item
            logger.warning("tfos feed %s: dropped %d levelled rows of feed %s, which has ended", feed_id,
                           item.batch.num_rows, item.feed_id)

    def _accept(self, item) -> None:
        """Take one queue item into the reader's state."""
        if isinstance(item, Data):
            self._batch, self._origin, self._offset = item.batch, item.origin, 0
            self._at, self._feed_id = item.at, item.feed_id
            self._feed_rows[item.feed_id] += item.batch.num_rows
            if self._gate is None and self.train_mode and item.origin.train:
                gated = item.origin.uneven if item.origin.ranks > 1 and self.hub.gate_client is not None else ""
                self._gate = Gate(item.feed_id, gated, item.batch, self.hub.gate_client() if gated else None,
                                   self.queue)
            late = self._late.get(item.feed_id)
            if late is not None and self._feed_rows[item.feed_id] >= late[1]:  # the last rows sent to level came
                del self._late[item.feed_id]
                self.queue.unget([late[0]])  # read next: its End, now with every row in
        elif isinstance(item, End):
            self._end(item)
        elif isinstance(item, Close):
            self.done = self.closed = True
            if self._gate is not None:  # its watcher thread ends too
                self._gate.close()
        elif isinstance(item, Part) and not self.train_mode:
            self._part_end = True

    def _end(self, item: End) -> None:
        """The driver's end of a feed: every row sent to this node arrived (checked), and those that
        other nodes send to level the shares (``item.level.take``), which may come after it."""
        got_rows = self._feed_rows[item.feed_id]
        expected = item.rows - self._given.pop(item.feed_id, 0) + (item.level.take if item.level else 0)
        if got_rows < expected and item.level is not None and got_rows >= expected - item.level.take:
            # the rest comes from other nodes, in the queue of levelled rows: read on there
            self._late[item.feed_id] = (item, expected, time.monotonic() + item.level.timeout)
            return
        self._feed_rows.pop(item.feed_id, None)
        if got_rows != expected:
            raise FeedError(f"feed {item.feed_id}: the driver sent {item.rows} rows to this node"
                            + (f" and levelling moved {expected - item.rows:+d}" if expected != item.rows else "")
                            + f", but {got_rows} arrived")
        if self._gate is None and self.train_mode and len(item.totals) > 1:  # no row of this feed came here
            uneven.check_totals(item.uneven, dict(item.totals))
        self.done = True

    def _hand_off(self, g: Gate) -> None:
        """Level the shares (``uneven.level``): this node's last rows of the feed go to the nodes
        short of rows (``g.level.give``), cut off before any of them is read. The feed is complete:
        every row the driver sent here is queued already (a feeding task ends only once its rows
        are), so the reader takes them out of the queue without waiting for the feed's end marker
        (which the driver may send after another node's: waiting for it could hold the ranks), cuts
        the rows off the end, and reads the rest again afterwards. A thread of its own sends them
        (the receiving node's queue may be full until it steps on with this one)."""
        g.handed = True
        out = sum(rows for *_peer, rows in g.level.give)
        sent = g.own + out  # the rows the driver sent here (``own`` is this node's share after the levelling)
        held, have = [], self._feed_rows[g.feed_id]
        while have < sent:
            try:
                item = self.queue.get(timeout=g.level.timeout)
            except queue.Empty:
                raise FeedError(f"feed {g.feed_id}: {sent - have} of the rows sent to this node were not queued "
                                f"within {g.level.timeout:.0f}s (feed_timeout) while it levelled the shares") from None
            held.append(item)
            if isinstance(item, Data) and item.feed_id == g.feed_id:
                have += item.batch.num_rows
            elif isinstance(item, Close):
                break
        current = Data(self._batch, self._origin, g.feed_id, self._at).slice(self._offset) \
            if self._batch is not None else None
        pieces = ([("current", current)] if current is not None else []) + [
            (k, item) for k, item in enumerate(held) if isinstance(item, Data) and item.feed_id == g.feed_id]
        tail, need = [], out
        for where, piece in reversed(pieces):  # the last rows, cut off the end (each knows its origin)
            if need == 0:
                break
            rows = piece.batch.num_rows
            cut = min(need, rows)
            tail.insert(0, piece.slice(rows - cut))
            need -= cut
            keep = piece.slice(0, rows - cut)
            if where == "current":
                self._feed_rows[g.feed_id] -= cut
                self._batch, self._at, self._offset = (keep.batch, keep.at, 0) if rows > cut else (None, None, 0)
            else:
                held[where] = keep if rows > cut else None
        if need:
            raise FeedError(f"feed {g.feed_id}: this node holds {out - need} unread rows but must send {out} to "
                            "level the shares")
        self.queue.unget(item for item in held if item is not None)
        self._given[g.feed_id] += out
        self.hub.send_rows(g.feed_id, self.qname_in, g.policy, len(g.totals), g.level, tail)

    def _admit(self, n: int) -> tuple[int, int]:
        """``(rows, padding rows)`` this node may put in its next batch of ``n`` (equal steps on every
        rank, :mod:`tfos.data.uneven`): the rows every rank is known to have while the feed runs
        (asking the driver when it needs more), the policy's share once the feed is complete."""
        while not self.done:
            g = self._gate
            if g is None:  # the feed's first item says whether it is gated
                self._accept(self._next_item())
                continue
            if not g.policy:
                return n, 0
            if g.totals is None:
                if g.real + n <= g.safe:
                    return n, 0
                g.wait(g.real + n)
                continue
            if g.level is not None and g.level.give and not g.handed:
                self._hand_off(g)  # before any of the rows it sends is read
            real, pad = uneven.next_batch(g.policy, n, g.fed, g.real, g.own, g.totals)
            if real or pad:
                return real, pad
            self._finish(g, n)
        return 0, 0

    def _finish(self, g: Gate, n: int) -> None:
        """The end of a gated feed for this node: read (and drop) its rows beyond the policy's
        share, up to the feed's end marker; count and show what was dropped or padded."""
        dropped = 0
        while not self.done:
            if self._batch is not None:
                dropped += self._batch.num_rows - self._offset
                self._batch = None
                continue
            self._accept(self._next_item())
        g.dropped = dropped
        g.close()
        self.queue.forget_safe(g.feed_id)
        self.hub.rows_dropped += dropped
        self.hub.rows_padded += g.padded
        self.hub.gate_requests += g.requests
        self.hub.gate_wait_secs += g.wait_secs
        if self.hub.reporter is not None:
            self.hub.reporter.report({"rows_dropped": self.hub.rows_dropped, "rows_padded": self.hub.rows_padded,
                                      "feed_gate_requests": self.hub.gate_requests,
                                      "feed_gate_wait_secs": round(self.hub.gate_wait_secs, 3)})
        if dropped or g.padded:
            logger.warning("tfos feed %s: this node read %d of its %d rows in %d steps of %d and %s so that every node "
                           "runs the same steps (uneven=%r; rows per node: %s)", g.feed_id, g.real, g.own,
                           uneven.steps(g.fed, n), n,
                           f"dropped {dropped}" if dropped else f"padded {g.padded} rows with weight 0",
                           g.policy, g.totals)

    def _take(self, n: int, admitted: bool = False) -> list[pa.RecordBatch]:
        """Up to ``n`` rows as record-batch slices; fewer at end of feed (or of a partition in
        inference mode). In a gated feed (equal steps) the gate decides the rows first, unless
        the caller already ``admitted`` them."""
        pad = 0
        if self.train_mode and not admitted:
            n, pad = self._admit(n)
        out, got = [], 0
        self._part_end = False
        while got < n and not self.done:
            if self._batch is None:
                self._part_end = False
                self._accept(self._next_item())
                if self._part_end and got:
                    break
                continue
            take = min(n - got, self._batch.num_rows - self._offset)
            out.append(self._batch.slice(self._offset, take))
            if self._at is not None:  # a resumable train feed: where the main_fun's rows came from
                self.hub.consumed(self._feed_id, shifted(self._at, self._offset), take)
            if not self._origin.train:
                with self._pending_lock:
                    if self._pending and self._pending[-1][0] is self._origin:
                        self._pending[-1][1] += take
                    else:
                        self._pending.append([self._origin, take])
            self._offset += take
            got += take
            if self._offset >= self._batch.num_rows:
                self._batch = None
        self.rows_read += got
        g = self._gate
        if g is not None and g.policy:
            g.real += got
            g.fed += got + pad
            g.padded += pad
            if g.policy == "pad":
                out = [weighted(s, 1.0) for s in out] + ([weighted(g.padding(pad), 0.0)] if pad else [])
        return out

    def next_batch(self, batch_size: int):
        """Up to ``batch_size`` rows (list of tuples/dicts/values, or {tensor: [values]} with
        input_mapping). Returns fewer rows at the end of the feed."""
        slices = self._take(batch_size)
        if self.input_mapping:
            mapping = self._mapping(slices[0].schema if slices else None)
            result = {t: [] for t in mapping.values()}
            for s in slices:
                for k, v in arrow.batch_to_rows(s, mapping).items():
                    result[k].extend(v)
            return result
        rows = []
        for s in slices:
            rows.extend(arrow.batch_to_rows(s))
        return rows

    @property
    def done_feeding(self) -> bool:
        """TensorFlowOnSpark's name for :meth:`should_stop`."""
        return self.done

    def should_stop(self) -> bool:
        """True once the feed has ended (all epochs delivered, terminated, or cluster shutdown)."""
        return self.done

    def batch_results(self, results) -> None:
        """Inference: return one result per row read, in order (scalars, vectors or dicts)."""
        results = list(results) if not isinstance(results, np.ndarray) else results
        pos = 0
        total = len(results)
        while pos < total:
            with self._pending_lock:
                if not self._pending:
                    raise FeedError(f"batch_results got {total - pos} more results than rows read")
                origin, rows = self._pending[0]
                k = min(rows, total - pos)
                if k == rows:
                    self._pending.popleft()
                else:
                    self._pending[0][1] -= k
            origin.add_results(results[pos:pos + k] if isinstance(results, list) else list(results[pos:pos + k]))
            pos += k

    def terminate(self) -> None:
        """Stop reading: Spark skips the rest of the feed (data in flight is discarded), no error."""
        if self._gate is not None:
            self._gate.close()
        if not self.queue.terminated.is_set():
            self.queue.terminated.set()
            if self.hub.on_terminate is not None:
                try:
                    self.hub.on_terminate(self.qname_in)
                except Exception as e:  # the hub still discards data; Spark just feeds longer
                    logger.warning("could not tell the driver that the feed was terminated: %s", e)
        self.done = True
        self.queue.drain()

    def _mapping(self, schema) -> dict:
        """``input_mapping``, plus the sample_weight column of a "pad" feed."""
        if schema is not None and uneven.WEIGHT_COLUMN in schema.names and uneven.WEIGHT_COLUMN not in self.input_mapping:
            return dict(self.input_mapping, **{uneven.WEIGHT_COLUMN: uneven.WEIGHT_COLUMN})
        return self.input_mapping

    # -- fast path
    def _columns(self, slices):
        if not slices:
            return None
        schema = slices[0].schema
        cols = []
        for j in range(schema.__len__()):
            parts = [arrow.column_to_numpy(s.column(j), schema.field(j)) for s in slices]
            cols.append(parts[0] if len(parts) == 1 else _concatenate(parts))
        return schema, cols

    def batches(self, batch_size: int):
        """Yield batches as tuples of numpy arrays (dicts for dict rows or input_mapping) built
        directly from the Arrow buffers: vector columns become 2-D arrays."""
        while not self.done:
            got = self._columns(self._take(batch_size))
            if got is None:
                continue
            yield self._shaped(*got)

    def _shaped(self, schema, cols):
        """Column arrays in the shape the rows were fed as: tuple, dict, scalar, or input_mapping."""
        kind = (schema.metadata or {}).get(arrow.ROW_KIND, b"tuple").decode()
        if self.input_mapping:
            return {t: cols[schema.names.index(c)] for c, t in self._mapping(schema).items()}
        if kind == "dict":
            return dict(zip(schema.names, cols))
        if kind == "scalar":
            return cols[0]
        return tuple(cols)

    def _blocks(self, batch_size: int):
        """Like :meth:`batches`, but each item holds as many whole batches as the Arrow chunk at
        hand provides: ``(schema, parts)``, one or two parts, each a list of column arrays of shape
        ``(k, rows, ...)`` (``k`` batches of ``rows``); only the last rows of a feed (or of a
        partition, in inference mode) come as ``(1, r, ...)`` with r < batch_size. One item per
        chunk instead of per batch keeps Python out of the per-batch path of :meth:`dataset`. The
        whole batches of a chunk are views of its Arrow buffers; only a batch that spans two chunks
        is joined (copied), and comes as the first part of the next chunk's item."""
        while not self.done:
            slices = self._take(batch_size)
            got = sum(s.num_rows for s in slices)
            if got == batch_size and self._batch is not None:  # and every whole batch left in this chunk
                more = (self._batch.num_rows - self._offset) // batch_size * batch_size
                g = self._gate
                if g is not None and g.policy:  # the whole batches the gate allows now, without waiting
                    more = 0 if g.totals is not None else min(more, (g.safe - g.real) // batch_size * batch_size)
                if more:
                    chunk, start = self._batch, self._offset - batch_size
                    rest = self._take(more, admitted=True)
                    took = sum(r.num_rows for r in rest)  # ``more``, unless the feed was cut meanwhile
                    if len(slices) == 1 and start >= 0 and not (g is not None and g.policy == "pad"):
                        slices = [chunk.slice(start, batch_size + took)]  # one view: this chunk's rows in order
                        got += took
                    else:  # the first batch spans two chunks (or carries pad weights): joined, then the view
                        head = self._stacked(slices, got, batch_size)
                        body = self._stacked(rest, took, batch_size)
                        if body is not None and len(body[1]) == 1:  # whole batches: one item of two parts
                            yield head[0], head[1] + body[1]
                        else:  # the rest came short (the feed was cut meanwhile): each as it is
                            yield head
                            if body is not None:
                                yield body
                        continue
            item = self._stacked(slices, got, batch_size)
            if item is not None:
                yield item

    def _stacked(self, slices, got: int, batch_size: int):
        """``slices`` (``got`` rows) as a :meth:`_blocks` item: their whole batches stacked, then any
        short rest; one array per column, a view where the slices are one. None without rows."""
        found = self._columns(slices)
        if found is None:
            return None
        schema, cols = found
        full = got // batch_size * batch_size
        parts = [(full // batch_size, batch_size, 0, full)] if full else []
        if got > full:
            parts.append((1, got - full, full, got))
        return schema, [[c[lo:hi].reshape((k, rows) + c.shape[1:]) for c in cols] for k, rows, lo, hi in parts]

    def dataset(self, batch_size: int, output_signature=None, dtypes=None):
        """A ``tf.data.Dataset`` of ready batches from the feed (element spec inferred from the first
        batch unless ``output_signature`` is given; ``dtypes`` casts columns, by position or, for
        dict rows, by name: {0: tf.float32}).

        Batches are cut from the Arrow chunks in blocks (one Python call per chunk, not per batch;
        TF slices each block into its batches without a copy) and prefetched in the background, so
        reading the feed overlaps the training step.

        Under MultiWorkerMirroredStrategy set ``AutoShardPolicy.OFF`` on this dataset (each node's
        feed is already its own shard) and iterate it to exhaustion.
        """
        import tensorflow as tf

        blocks = self._blocks(batch_size)
        first = next(blocks, None)

        def spec_of(a):  # a batch's spec, from a block (k, rows, ...)
            return tf.TensorSpec((None,) + a.shape[2:], tf.as_dtype(a.dtype) if a.dtype != object else tf.string)

        if output_signature is None:
            if first is None:
                raise FeedError("the feed ended before any data arrived; give output_signature explicitly")
            schema, parts = first
            output_signature = tf.nest.map_structure(spec_of, self._shaped(schema, parts[0]))

        def pair(schema, parts):  # an item is two parts (the second often has no batches): one structure
            if len(parts) == 1:
                parts = parts + [[np.empty((0,) + c.shape[1:], c.dtype) for c in parts[0]]]
            return self._shaped(schema, parts[0]), self._shaped(schema, parts[1])

        def generate():
            if first is not None:
                yield pair(*first)
            for block in blocks:
                yield pair(*block)

        block_signature = tf.nest.map_structure(lambda s: tf.TensorSpec((None,) + tuple(s.shape), s.dtype),
                                                output_signature)
        ds = tf.data.Dataset.from_generator(generate, output_signature=(block_signature, block_signature))
        if dtypes:
            def cast(structure):
                if isinstance(structure, dict):
                    return {k: tf.cast(v, dtypes[k]) if k in dtypes else v for k, v in structure.items()}
                if isinstance(structure, (tuple, list)):
                    return tuple(tf.cast(v, dtypes[j]) if j in dtypes else v for j, v in enumerate(structure))
                return tf.cast(structure, dtypes[0]) if 0 in dtypes else structure
            ds = ds.map(lambda first, second: (cast(first), cast(second)))
        # an item's parts (k, rows, ...) -> their batches (rows, ...): sliced by from_tensor_slices, faster
        # than Dataset.unbatch (bench/README, "Constants": unbatching)
        ds = ds.flat_map(lambda first, second: tf.data.Dataset.from_tensor_slices(first).concatenate(
            tf.data.Dataset.from_tensor_slices(second))).prefetch(tf.data.AUTOTUNE)
        from tfos.data.datasets import no_autoshard

        return no_autoshard(ds)
