"""The feed hub of the TF process (InputMode.SPARK): receives Arrow batches from the feeding
Spark tasks and end-of-feed markers from the driver, into bounded per-name queues that
:class:`tfos.feed.node.datafeed.DataFeed` reads.

Memory is bounded: each queue holds at most ``queue_chunks`` batches; a full queue blocks the
receiving thread, which stops reading its socket, which blocks the Spark task sending (TCP
backpressure). Inference results go back on the connection their rows came from.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from dataclasses import dataclass

from tfos.data import positions
from tfos.errors import FeedError, ProtocolError, TFOSError
from tfos.host.deadline import Deadline
from tfos.wire import arrow
from tfos.wire import messages as M
from tfos.wire.channel import KIND_ARROW, Channel
from tfos.wire.clients import FeedClient
from tfos.wire.listener import Listener
from tfos.wire.ring import Ring, RingPool

logger = logging.getLogger(__name__)

# -- what a feed queue holds: one of four typed items


@dataclass(frozen=True)
class Data:
    """Rows of a feed: an Arrow record batch, the connection it came on, the feed it belongs to;
    ``at``: where its first row comes from, ``(epoch, partition, offset)``, in a feed that may be
    resumed (:mod:`tfos.data.positions`; None otherwise)."""

    batch: object  # pyarrow.RecordBatch
    origin: "Origin"
    feed_id: str
    at: tuple | None = None

    def slice(self, start: int, rows: int | None = None) -> "Data":
        """These rows from ``start`` (``rows`` of them, or to the end), still knowing where they came from."""
        rows = self.batch.num_rows - start if rows is None else rows
        return Data(self.batch.slice(start, rows), self.origin, self.feed_id, shifted(self.at, start))


def shifted(at: tuple | None, rows: int) -> tuple | None:
    """``at`` (epoch, partition, offset) ``rows`` rows on."""
    return None if at is None else (at[0], at[1], at[2] + rows)


@dataclass(frozen=True)
class End:
    """The driver's end of feed ``feed_id``: ``rows`` rows were sent to this node in all;
    ``totals``: (node, rows) of every node still reading the feed, after ``level``."""

    feed_id: str
    rows: int
    totals: tuple = ()
    uneven: str = ""
    level: M.FeedLevel | None = None  # this node's part in levelling the shares (``rows``: before it)


@dataclass(frozen=True)
class Part:
    """The end of one partition (inference answers partition by partition)."""

    origin: "Origin"


@dataclass(frozen=True)
class Close:
    """No more data will come (shutdown, or ``TFManager``'s ``put(None)``)."""


class Origin:
    """The Spark task connection a batch came from; inference results go back on it. ``uneven``
    and ``ranks``: the feed's policy for unequal rows and how many nodes it feeds."""

    def __init__(self, ch: Channel, train: bool, uneven: str = "", ranks: int = 1):
        self.ch = ch
        self.train = train
        self.uneven = uneven
        self.ranks = ranks
        self.cond = threading.Condition()
        self.rows_answered = 0

    def add_results(self, results: list) -> None:
        with self.cond:
            if results:
                batch = arrow.results_to_batch(results)
                self.ch.send(M.FeedResults(batch.num_rows))
                self.ch.send_data(arrow.ipc_parts(batch))
            self.rows_answered += len(results)
            self.cond.notify_all()


#: feeds whose safe counts a queue keeps (the oldest is forgotten first)
KEEP_SAFE = 16
#: train feeds whose consumed rows a hub keeps for ``ctx.checkpoint_saved`` (the oldest is forgotten first)
KEEP_POSITIONS = 4


#: FeedBegin's partition for rows another node sends to level a gated feed's shares (``send_rows``)
LEVELLING = -1


class FeedQueue:
    """Bounded queue of one named feed, with end-of-feed accounting, the schema each feed began
    with (every partition of a feed must send the same columns), and each gated feed's safe count
    as last heard from a feeding task (``safe``, changes announced on ``news``).

    Rows that other nodes send to level a feed's shares go to a queue of their own (``levelled``,
    bounded the same): the reader takes them after the feed's end marker, so it never reads past
    that marker into the next feed's items (an inference partition's rows and its end) while it
    waits for them. Items a reader took out and must read again go back in front (``unget``)."""

    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.q: queue.Queue = queue.Queue(maxsize)
        self.levelled: queue.Queue = queue.Queue(maxsize)
        self._front: collections.deque = collections.deque()  # read before ``q``: items put back or read ahead
        self.waiting = False  # a reader waits at the gate: put() wakes it (on ``news``) to take what came
        self.terminated = threading.Event()
        self._schemas: dict[str, object] = {}
        self._lock = threading.Lock()
        self.safe: dict[str, int] = {}
        self.news = threading.Condition()

    def learn_safe(self, feed_id: str, safe: int) -> None:
        """The driver's safe count of a feed, heard with data: it only rises (equal steps)."""
        with self.news:
            if safe > self.safe.get(feed_id, 0):
                self.safe[feed_id] = safe
                while len(self.safe) > KEEP_SAFE:
                    self.safe.pop(next(iter(self.safe)))
                self.news.notify_all()

    def forget_safe(self, feed_id: str) -> None:
        with self.news:
            self.safe.pop(feed_id, None)

    def check_schema(self, feed_id: str, schema, where: str) -> None:
        """FeedError naming ``where`` (partition and row) if ``schema`` drifts from the feed's first."""
        with self._lock:
            first = self._schemas.setdefault(feed_id, schema)
        drift = arrow.schema_drift(first, schema)
        if drift:
            raise FeedError(f"{where}: {drift}")

    def put(self, item, stop: threading.Event, levelled: bool = False) -> None:
        target = self.levelled if levelled else self.q
        while True:
            if self.terminated.is_set() and isinstance(item, Data):
                return  # terminate(): drop data so senders finish quickly
            try:
                target.put(item, timeout=0.5)
                if self.waiting:
                    with self.news:
                        self.news.notify_all()
                return
            except queue.Full:
                if stop.is_set():
                    raise TFOSError("feed hub closed")

    def get(self, timeout: float | None = None):
        """The next item: one put back first, else from the queue (queue.Empty after ``timeout``)."""
        with self._lock:
            if self._front:
                return self._front.popleft()
        return self.q.get(timeout=timeout)

    def read_ahead(self) -> None:
        """Take what is queued now into the front, up to the first item that is not rows (an end
        marker): a reader waiting at the gate of equal steps for the feed's end holds these rows
        so that the rest of the rows sent to this node can be queued. The feed ends only once they
        are (each feeding task waits for that), so without it a batch larger than the queue holds
        would wait forever. What it holds is bounded: the rows this node was sent beyond what it
        read, which the gate keeps below one batch plus the scheduler's lead of one node over the
        fewest (a chunk per feeding task)."""
        with self._lock:
            if any(not isinstance(item, Data) for item in self._front):
                return
            while True:
                try:
                    item = self.q.get_nowait()
                except queue.Empty:
                    return
                self._front.append(item)
                if not isinstance(item, Data):
                    return

    def unget(self, items) -> None:
        """Put ``items`` back in front of the queue, to be read next in their order."""
        with self._lock:
            self._front.extendleft(reversed(list(items)))

    def drain(self) -> None:
        """Drop every item queued (``terminate``)."""
        with self._lock:
            self._front.clear()
        for q in (self.q, self.levelled):
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass


class FeedHub:
    """TCP server in the TF process. Spark tasks connect with the cluster secret and stream
    ``FeedBegin``, Arrow data frames (in a gated train feed, ``FeedSafe`` before some) and
    ``FeedPartitionEnd``; the driver sends ``FeedEnd``."""

    def __init__(self, key: M.ChannelKey, queue_chunks: int = 4, on_terminate=None, gate_client=None):
        self.on_terminate = on_terminate  # called with the queue name when main_fun terminates a feed
        self.gate_client = gate_client  # () -> a DriverClient of this node: equal steps ask the driver (feed_gate)
        self.queue_chunks = max(1, int(queue_chunks))
        self.queues: dict[str, FeedQueue] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.rows_received = 0
        self.bytes_received = 0
        self.rows_dropped = 0  # by equal steps (uneven="drop"), over every feed of this node
        self.rows_padded = 0  # by uneven="pad"
        self.gate_requests = 0  # the equal-steps watchers' requests to the driver
        self.gate_wait_secs = 0.0  # how long readers waited at the gate for the other ranks' rows
        self.reporter = None  # set by the TF process: feed waits go on the cluster timeline
        self.key = key  # the cluster's: levelling a feed sends rows to other nodes' hubs with it
        self._senders: list[threading.Thread] = []  # levelling sends, joined at close()
        self.send_error: BaseException | None = None  # the first levelling send that failed
        # rows handed to main_fun per resumable train feed (tfos.data.positions), for ctx.checkpoint_saved
        self._consumed: collections.OrderedDict = collections.OrderedDict()
        self.rings = RingPool()  # same-host feeding tasks write their chunks into these (wire.ring)
        self._paths_logged: set[str] = set()
        self.shm_chunks = 0  # chunks received through a ring
        self.channel_chunks = 0  # chunks received as data frames on the channel
        self._listener = Listener(key, self._serve, "feed-hub")
        self.port = self._listener.port

    def queue(self, name: str) -> FeedQueue:
        with self._lock:
            if name not in self.queues:
                self.queues[name] = FeedQueue(name, self.queue_chunks)
            return self.queues[name]

    def start(self) -> "FeedHub":
        self._listener.start()
        return self

    def consumed(self, feed_id: str, at: tuple, rows: int) -> None:
        """The reader handed ``rows`` rows from ``at`` (epoch, partition, offset) of ``feed_id`` to
        main_fun: appended to the feed's log of runs in hand-out order (a run that continues the
        last one extends it)."""
        with self._lock:
            log = self._consumed.get(feed_id)
            if log is None:
                log = self._consumed[feed_id] = []
                while len(self._consumed) > KEEP_POSITIONS:
                    self._consumed.popitem(last=False)
            if log and log[-1][:2] == [at[0], at[1]] and log[-1][3] == at[2]:
                log[-1][3] += rows
            else:
                log.append([at[0], at[1], at[2], at[2] + rows])

    def position(self, rows: int | None = None) -> tuple[str, tuple] | None:
        """The newest resumable train feed's first ``rows`` rows handed to main_fun (all of them
        when None), as on the wire (``M.FeedPosition``): ``(feed_id, ranges)``; None before any."""
        with self._lock:
            if not self._consumed:
                return None
            feed_id = next(reversed(self._consumed))
            log = [list(run) for run in self._consumed[feed_id]]
        position, left = {}, float("inf") if rows is None else max(0, int(rows))
        for epoch, partition, start, end in log:
            take = min(end - start, left)
            positions.record(position, epoch, partition, start, take)
            left -= take
            if not left:
                break
        return feed_id, positions.to_wire(position)

    def send_rows(self, feed_id: str, qname: str, policy: str, ranks: int, level: M.FeedLevel, tail: list) -> None:
        """Send ``tail`` (``Data`` items, cut off the end of this node's share) to the nodes of
        ``level.give``, each its count in order, as a feeding task would (channel D, partition -1,
        each piece's origin in a resumable feed), on a thread of its own: the receiving queue may
        be full until its reader steps on."""
        def send():
            rest = list(tail)
            try:
                for node, host, port, count in level.give:
                    client = FeedClient(node, host, port, self.key, level.timeout)
                    try:
                        client.begin(feed_id, qname, LEVELLING, True, policy, ranks)
                        left = count
                        while left:
                            part = rest[0].slice(0, min(left, rest[0].batch.num_rows))
                            if part.at is not None:
                                client.send_at(*part.at)
                            client.send_batch(arrow.ipc_parts(part.batch))
                            left -= part.batch.num_rows
                            rest[0] = rest[0].slice(part.batch.num_rows)
                            if not rest[0].batch.num_rows:
                                rest.pop(0)
                        client.end_partition(count)
                        client.next_reply()
                    finally:
                        client.close()
                logger.info("tfos feed %s: sent %d rows to level the shares: %s", feed_id,
                            sum(c for *_p, c in level.give), ", ".join(f"{c} to node {n}" for n, _h, _p, c in level.give))
            except BaseException as e:  # the receiving node raises FeedError when its rows do not come
                self.send_error = self.send_error or e
                logger.error("tfos feed %s: could not send rows to level the shares: %s", feed_id, e)

        thread = threading.Thread(target=send, name=f"tfos-level-{feed_id}", daemon=True)
        self._senders.append(thread)
        thread.start()

    def close(self, timeout: float = 60.0) -> None:
        deadline = Deadline(timeout)
        for thread in self._senders:  # rows on their way to another node: let them arrive
            thread.join(deadline.remaining())
        self._stop.set()
        self._listener.close()
        self.rings.close()

    def _serve(self, ch: Channel) -> None:
        first = ch.recv()
        if isinstance(first, M.FeedEnd):
            self._on_feed_end(ch, first)
        elif isinstance(first, M.FeedBegin):
            self._on_feed(ch, first)
        else:
            ch.send(M.ErrorReply(f"unexpected {type(first).__name__}"))

    def _on_feed_end(self, ch: Channel, msg: M.FeedEnd) -> None:
        if msg.feed_id == M.SHUTDOWN_FEED:
            for q in list(self.queues.values()) or [self.queue(msg.qname)]:
                q.put(Close(), self._stop)
        else:
            self.queue(msg.qname).put(End(msg.feed_id, msg.rows, msg.totals, msg.uneven, msg.level), self._stop)
        ch.send(M.FeedAck(msg.rows))

    def _lend_ring(self, ch: Channel, begin: M.FeedBegin) -> Ring | None:
        """Answer a local sender's ``FeedBegin``: a ring of :attr:`rings`, or why none (the log says
        which path this hub's feeds take, once per path)."""
        if not begin.local:
            return None
        ring, why = self.rings.take(begin.mapped)
        try:
            ch.send(ring.offer() if ring is not None else M.FeedRing(why=why))
        except BaseException:
            if ring is not None:
                self.rings.give(ring, clean=False)
            raise
        path = "shared memory" if ring is not None else f"the channel ({why})"
        if path not in self._paths_logged:
            self._paths_logged.add(path)
            logger.info("tfos feed hub: a feeding task on this host sends its chunks through %s", path)
        return ring

    def _on_feed(self, ch: Channel, begin: M.FeedBegin) -> None:
        ring = self._lend_ring(ch, begin)
        clean = False
        try:
            self._receive(ch, begin, ring)
            clean = True
        finally:
            if ring is not None:
                self.rings.give(ring, clean)

    def _receive(self, ch: Channel, begin: M.FeedBegin, ring: Ring | None) -> None:
        q = self.queue(begin.qname)
        origin = Origin(ch, begin.train, begin.uneven, begin.ranks)
        rows, at = 0, None
        while True:
            kind, value = ch.recv_frame()
            if kind == KIND_ARROW or isinstance(value, M.FeedShm):
                if kind == KIND_ARROW:
                    batch, nbytes = arrow.from_ipc(value), len(value)
                    self.channel_chunks += 1
                elif ring is None:
                    raise ProtocolError("FeedShm on a connection that was lent no ring")
                else:
                    batch, nbytes = ring.read(value), value.length
                    self.shm_chunks += 1
                q.check_schema(begin.feed_id, batch.schema, f"partition {begin.partition}, row {rows}")
                rows += batch.num_rows
                self.bytes_received += nbytes
                if batch.num_rows:
                    q.put(Data(batch, origin, begin.feed_id, at), self._stop,
                          levelled=begin.train and begin.partition == LEVELLING)
                at = None
                continue
            if isinstance(value, M.FeedAt):
                if not begin.train or min(value.epoch, value.offset) < 0 or value.partition < 0:
                    raise ProtocolError(f"{value} in an inference feed or below 0")
                at = (value.epoch, value.partition, value.offset)
                continue
            if isinstance(value, M.FeedSafe):
                if not (begin.train and begin.uneven) or value.safe < 0:
                    raise ProtocolError(f"FeedSafe({value.safe}) in a feed without equal steps or below 0")
                q.learn_safe(begin.feed_id, value.safe)
                continue
            if not isinstance(value, M.FeedPartitionEnd):
                raise ProtocolError(f"unexpected {type(value).__name__} in a feed")
            if value.rows != rows:
                raise FeedError(f"partition {begin.partition}: sender says {value.rows} rows, received {rows}")
            self.rows_received += rows
            if begin.train:
                ch.send(M.FeedAck(rows, q.terminated.is_set()))
                return
            q.put(Part(origin), self._stop)
            with origin.cond:  # wait until main_fun answered every row of this partition
                while origin.rows_answered < rows and not q.terminated.is_set() and not self._stop.is_set():
                    origin.cond.wait(0.5)
                ch.send(M.FeedAck(rows, q.terminated.is_set()))
            return
