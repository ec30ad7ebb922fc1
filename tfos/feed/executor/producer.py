"""Feeding code that runs in Spark tasks (Python workers). Never imports TensorFlow.

Each task converts its partition to Arrow record batches and streams them over authenticated
TCP channels to the TF processes' feed hubs. In training, the driver assigns each chunk to the
node that has received the fewest rows so far (balanced shares whatever the partition sizes);
in inference a partition goes to one node and its results come back in order on the same
channel. :mod:`tfos.feed.executor.sender` holds a partition's connections (and, for a node on this
host, its shared-memory ring).
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import threading

import pyarrow as pa

from tfos.data import positions
from tfos.errors import FeedError, FeedTimeoutError, ProtocolError, RequestRefused, TFOSError
from tfos.wire import arrow
from tfos.wire import messages as M
from tfos.feed.executor.credentials import closure_config, task_config
from tfos.feed.executor.sender import SendFailed, Sender
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)

#: A chunk (one data frame, one scheduling decision, one tf.data element of dataset()) holds about
#: this many bytes: every chunk costs a driver assignment, a frame and a Python call into tf.data
#: (bench/README, "Constants": chunk size). The hub's queue holds 4 chunks per rank.
TARGET_CHUNK_BYTES = 16 * 1024 * 1024
#: chunks hold a multiple of this many rows: every column of 4-byte or wider values is then a
#: multiple of 64 bytes long, so each column after the first starts 64-byte aligned in the data
#: frame too (the receiver aligns the first; TensorFlow takes aligned arrays without a copy)
ROW_MULTIPLE = 16


def _row_bytes(batch: pa.RecordBatch) -> int:
    return max(1, batch.nbytes // max(1, batch.num_rows))


class RowGroups:
    """A partition's Python rows in groups for one chunk each: ``chunk_rows``, else about
    TARGET_CHUNK_BYTES as the last converted chunk measured (:meth:`converted`)."""

    def __init__(self, iterator, chunk_rows: int | None):
        self.it = iter(iterator)
        self.chunk_rows = chunk_rows
        self.size = chunk_rows or 256

    def __iter__(self):
        while True:
            rows = list(itertools.islice(self.it, self.size))
            if not rows:
                return
            yield rows

    def converted(self, batch: pa.RecordBatch) -> None:
        if self.chunk_rows is None:
            self.size = max(64, min(65536, TARGET_CHUNK_BYTES // _row_bytes(batch))) // ROW_MULTIPLE * ROW_MULTIPLE


def rows_to_chunks(iterator, partition: int, chunk_rows: int | None):
    """Group Python rows into record batches of about TARGET_CHUNK_BYTES (or ``chunk_rows``)."""
    groups = RowGroups(iterator, chunk_rows)
    index = 0
    for rows in groups:
        batch = arrow.rows_to_batch(rows, partition, index)
        index += len(rows)
        groups.converted(batch)
        yield batch


def arrow_to_chunks(batches, chunk_rows: int | None):
    for b in batches:
        if b.num_rows == 0:
            continue
        step = chunk_rows or max(64, TARGET_CHUNK_BYTES // _row_bytes(b)) // ROW_MULTIPLE * ROW_MULTIPLE
        for off in range(0, b.num_rows, step):
            yield b.slice(off, step)


class Positioned:
    """Iterates ``(offset, batch)`` for every chunk of a partition (``offset``: its first row's in
    the partition), leaving out the rows of ``skip`` (sorted, merged ranges: rows a checkpoint has
    already trained on, :mod:`tfos.data.positions`); a chunk that spans a skipped range comes as
    its parts, so every piece is one run of the partition's rows. ``rows``: the rows read so far."""

    def __init__(self, chunks, skip=()):
        self.chunks = chunks
        self.skip = list(skip)
        self.rows = 0

    def __iter__(self):
        for batch in self.chunks:
            at, self.rows = self.rows, self.rows + batch.num_rows
            if not self.skip:
                yield at, batch
                continue
            for start, end in positions.subtract(at, self.rows, self.skip):
                yield start, batch.slice(start - at, end - start)


def placed_batches(chunks, place, sender: Sender):
    """``(offset, batch, pieces, safe)`` for each ``(offset, batch)`` of ``chunks``: the driver's
    placement of it, made once it is converted (the partition's first chunk with its columns)."""
    for offset, batch in chunks:
        yield (offset, batch, *place(batch.num_rows, batch if sender.schema is None else None))


class PlacedRows:
    """A partition's Python rows as ``(offset, batch, pieces, safe)``: every chunk after the first
    is placed before its rows are converted, and each of its pieces is converted on its own, for
    its node: into a slot of the ring that node lent this task, if it did (the piece's first column
    of ndarrays is then written once, where the TF process reads it). ``rows``: the rows read so
    far."""

    def __init__(self, iterator, partition: int, chunk_rows: int | None, place, sender: Sender):
        self.groups = RowGroups(iterator, chunk_rows)
        self.partition, self.place, self.sender = partition, place, sender
        self.rows = 0

    def __iter__(self):
        for rows in self.groups:
            at, self.rows = self.rows, self.rows + len(rows)
            first = self.sender.schema is None  # placed once converted: the driver checks its columns
            pieces, safe = ([], 0) if first else self.place(len(rows))
            if first or not pieces or any(n <= 0 for _, n in pieces):  # whole, as the driver said
                batch = arrow.rows_to_batch(rows, self.partition, at)
                if first:
                    pieces, safe = self.place(batch.num_rows, batch)
                self.groups.converted(batch)
                yield at, batch, pieces, safe
                continue
            start = 0
            for node, n in pieces:
                batch = arrow.rows_to_batch(rows[start:start + n], self.partition, at + start,
                                            self.sender.staging(node))
                yield at + start, batch, [(node, n)], safe
                start += n
            self.groups.converted(batch)


def _guard_retry(what: str) -> None:
    """A feeding task runs once: rows an attempt sent before it failed would be fed twice by a retry.
    Spark's job error then holds only this retry's error, so it says where the first one is."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is not None and tc.attemptNumber() > 0:
        raise FeedError(f"{what}: attempt {tc.attemptNumber()} of this feeding task refused to run: an earlier "
                        "attempt failed, and the rows it may have sent would be fed twice. Its error, the first "
                        f"cause, is Spark's 'Lost task {tc.partitionId()}.0 in stage {tc.stageId()}' warning in the "
                        "driver's log, and in the stderr of the executor that ran it (Spark's UI links it)")


def _send_pieces(sender: Sender, driver: DriverClient, feed_id: str, batch: pa.RecordBatch, pieces,
                 safe: int = 0, at: tuple | None = None) -> bool:
    """Send a chunk in the pieces the driver chose, in order (with the feed's ``safe`` count as of
    that assignment, and where the chunk's rows come from: ``at``); a piece whose node finished
    reading meanwhile is placed again (the driver says why if the node failed instead). False
    when no node reads any more."""
    pieces, offset = list(pieces), 0
    while pieces:
        node, rows = pieces.pop(0)
        try:
            sender.send(node, batch if rows == batch.num_rows else batch.slice(offset, rows), safe,
                        None if at is None else (at[0], at[1], at[2] + offset))
        except SendFailed as e:  # fine if that node ended its feed; else the driver says why
            sender.drop(e.node)
            try:
                again, safe = driver.place_chunk(feed_id, rows, e.node)
            except TFOSError:  # the driver refused (the node failed) or is gone
                raise e from None
            if not again:
                return False
            pieces = again + pieces
            continue
        offset += rows
    sender.announce(safe)
    return True


def _partition_id() -> int:
    from pyspark import TaskContext

    return TaskContext.get().partitionId()


def make_train_feeder(cfg: M.FeedConfig, arrow_input: bool, epoch: int = -1, skip: dict | None = None):
    """mapPartitionsWithIndex function (RDD rows) or mapInArrow function (DataFrames); each task
    gives (rows sent, rows in its partition or -1 when it stopped early). With ``epoch`` >= 0 (a
    feed that may be resumed) every piece says where its rows come from, and the rows of
    ``skip`` (``{partition: ranges}``) are left out: a checkpoint has them already."""
    sealed = closure_config(cfg)  # the function below must never see the caller's cfg

    def feed(partition: int, iterator) -> tuple[int, int]:
        _guard_retry(f"feeding partition {partition}")
        cfg = task_config(sealed)
        sender = Sender(cfg, partition, train=True)
        driver = DriverClient.for_feed(cfg)
        stopped = False

        def place(rows: int, first: pa.RecordBatch | None = None):
            if first is None:
                return driver.place_chunk(cfg.feed_id, rows)
            try:  # the partition's first chunk: the driver checks its columns against other partitions'
                return driver.place_chunk(cfg.feed_id, rows, partition=partition, columns=arrow.columns(first.schema))
            except RequestRefused as e:
                raise FeedError(str(e)) from None

        ranges = (skip or {}).get(partition, ())
        if arrow_input or ranges:
            chunks = Positioned(arrow_to_chunks(iterator, cfg.chunk_rows) if arrow_input else
                                rows_to_chunks(iterator, partition, cfg.chunk_rows), ranges)
            placed = placed_batches(chunks, place, sender)
        else:
            placed = chunks = PlacedRows(iterator, partition, cfg.chunk_rows, place, sender)

        def finished_reading(node):
            try:
                driver.assign_chunk(cfg.feed_id, 0, node)
                return True
            except TFOSError:  # refused, or the driver connection is gone
                return False

        total = 0
        try:
            with driver.session(timeout=60.0):
                for offset, batch, pieces, safe in placed:
                    if not _send_pieces(sender, driver, cfg.feed_id, batch, pieces, safe,
                                        (epoch, partition, offset) if epoch >= 0 else None):
                        stopped = True
                        break  # every node terminated its feed: skip the rest of this partition
                    total += batch.num_rows
                if sender.schema is None and not stopped:
                    # nothing to send (an empty partition, or every row trained on already): the
                    # driver counts it as started, so the feed's last wave still comes and levels
                    # the shares (a local node run far ahead would wait at the gate for rows that
                    # only this partition could have sent elsewhere)
                    driver.place_chunk(cfg.feed_id, 0, partition=partition)
                sender.finish(finished_reading)
        finally:
            sender.close()
        return total, -1 if stopped else chunks.rows

    if arrow_input:
        def feed_arrow(batches):
            total, size = feed(_partition_id(), batches)
            yield pa.RecordBatch.from_arrays([pa.array([total], pa.int64()), pa.array([size], pa.int64())],
                                             names=["rows", "size"])
        return feed_arrow

    def feed_rows(partition, iterator):
        yield feed(partition, iterator)
    return feed_rows


def _node_failure(cfg: M.FeedConfig, node: int) -> str:
    """The node's own error from the driver (the agent reports it within seconds), for the task's
    error: a streaming query or an inference action then stops with it."""
    try:
        text = DriverClient.for_feed(cfg).node_failure(node, wait=8.0)
    except (TFOSError, OSError) as e:
        return f"The driver could not say why ({e})."
    return ("The node's failure: " + text) if text else "Its TF process may have died; the driver reports its log."


def _inference_retry_check(cfg: M.FeedConfig, partition: int, node: int) -> None:
    """Spark retries a failed inference task: Spark keeps only the output of the attempt that
    succeeds, so answering the partition again is exact once its node is alive. A failed node
    cannot answer it: say so with the node's own error, which Spark then reports for the job."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None or tc.attemptNumber() == 0:
        return
    try:
        text = DriverClient.for_feed(cfg).node_failure(node, wait=2.0)
    except (TFOSError, OSError) as e:
        raise FeedError(f"inference on partition {partition}: a retry cannot reach the driver ({e})") from None
    if text:
        raise FeedError(f"inference on partition {partition}: node {node} failed, so the partition cannot be "
                        f"answered (run inference again after the cluster restarts). The node's failure: {text}")
    logger.info("inference on partition %d: retry %d answers the partition again", partition, tc.attemptNumber())


def _infer(cfg: M.FeedConfig, partition: int, chunks):
    """Stream one partition to its node and yield the result batches, in input order."""
    node = cfg.feed_nodes[partition % len(cfg.feed_nodes)]
    _inference_retry_check(cfg, partition, node)
    sender = Sender(cfg, partition, train=False)
    try:
        client = sender.client(node)
    except SendFailed as e:
        raise FeedError(f"{e}. " + _node_failure(cfg, node)) from None
    errors: list[BaseException] = []

    def send_all():
        try:
            for batch in chunks:
                sender.send(node, batch)
            client.end_partition(sender.rows[node])
        except BaseException as e:  # re-raised in the task's main thread below
            errors.append(e)
            client.shutdown_io()

    t = threading.Thread(target=send_all, name="tfos-infer-send", daemon=True)
    t.start()
    answered = 0
    try:
        while True:
            try:
                reply = client.next_reply()
            except RequestRefused as e:  # the hub refused this partition (malformed or drifting rows)
                raise FeedError(str(e)) from None
            except socket.timeout:
                raise FeedTimeoutError(f"node {node} returned no inference results for {cfg.feed_timeout:.0f}s on "
                                       f"partition {partition} (raise feed_timeout, or check that main_fun calls "
                                       "batch_results)") from None
            except (OSError, ProtocolError) as e:
                t.join(5)
                if errors and not isinstance(errors[0], (OSError, ProtocolError)):
                    raise errors[0]
                raise FeedError(f"node {node} dropped inference of partition {partition}: {e}. "
                                + _node_failure(cfg, node)) from None
            if isinstance(reply, M.FeedAck):
                break
            if not isinstance(reply, tuple):
                raise FeedError(f"unexpected {type(reply).__name__} from node {node}")
            batch = arrow.from_ipc(reply[1])
            answered += batch.num_rows
            yield batch
        t.join(30)
        if errors:
            raise errors[0]
        if answered != sender.rows[node]:
            raise FeedError(f"partition {partition}: {sender.rows[node]} rows sent, {answered} results returned"
                            + (" (the node terminated its feed)" if reply.terminated else ""))
    finally:
        sender.close()


def make_inference_feeder(cfg: M.FeedConfig, arrow_input: bool, result_column: str = "prediction",
                          result_arrow_type=None):
    """mapPartitionsWithIndex function yielding one result per row (RDDs), or mapInArrow function
    yielding the input rows plus ``result_column`` of ``result_arrow_type`` (DataFrames)."""
    sealed = closure_config(cfg)  # the functions below must never see the caller's cfg

    if arrow_input:
        def infer_arrow(batches):
            """Stream: each results batch is joined with the input rows it answers, so memory holds
            only the rows in flight, not the whole partition."""
            cfg = task_config(sealed)
            inputs: collections.deque = collections.deque()  # sent, not yet answered (sender thread appends)
            offset = 0

            def tee():
                for b in arrow_to_chunks(batches, cfg.chunk_rows):
                    inputs.append(b)
                    yield b

            def take(k):
                nonlocal offset
                parts = []
                while k > 0:
                    b = inputs[0]
                    n = min(k, b.num_rows - offset)
                    parts.append(b.slice(offset, n))
                    offset += n
                    k -= n
                    if offset == b.num_rows:
                        inputs.popleft()
                        offset = 0
                return pa.Table.from_batches(parts).combine_chunks()

            for res in _infer(cfg, _partition_id(), tee()):
                src = take(res.num_rows)
                out = src.append_column(result_column, res.column(0).cast(result_arrow_type))
                yield from out.to_batches()
        return infer_arrow

    def infer_rows(partition, iterator):
        cfg = task_config(sealed)
        for batch in _infer(cfg, partition, rows_to_chunks(iterator, partition, cfg.chunk_rows)):
            yield from arrow.batch_to_results(batch)
    return infer_rows
