"""The driver side of InputMode.SPARK: the Spark jobs that feed data, the end of each feed, and
the end of all feeds at shutdown (runs on the driver).

:class:`FeedJobs` gets what it needs explicitly: the Spark entry point (``driver.spark``), the node registry, feed
scheduler and the ranks' feed positions (:mod:`resume`), the cluster configuration, and two callbacks of the cluster (``check_failed``
raises the nodes' error if any node failed; ``abort`` fails the cluster).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
import uuid

from tfos.feed.driver.resume import FeedPositions, FeedResume
from tfos.feed.driver.scheduler import FeedScheduler
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.spark import SparkJob, raise_no_rdd
from tfos.errors import FeedError, NodeFailedError, Resizing, TFOSError, remote_error
from tfos.wire import messages as M
from tfos.wire.clients import end_feed

logger = logging.getLogger(__name__)


#: nodes told at once that a feed ended (each call waits for its hub, which may wait for room in
#: a full queue: one at a time, a slow node held up the rest, and 512 nodes took 512 round trips)
END_FEED_PARALLEL = 64


def is_dataframe(data) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema")


def for_each_node(fn, nodes) -> list:
    """``fn(node)`` for every node, END_FEED_PARALLEL at a time; what each returned, in order. The
    first exception (in node order) is raised once every call ended (each has its own deadline)."""
    nodes = list(nodes)
    if len(nodes) <= 1:
        return [fn(n) for n in nodes]
    with concurrent.futures.ThreadPoolExecutor(min(END_FEED_PARALLEL, len(nodes)),
                                               thread_name_prefix="tfos-end-feed") as pool:
        futures = [pool.submit(fn, n) for n in nodes]
        concurrent.futures.wait(futures)
    for f in futures:
        if f.exception() is not None:
            raise f.exception()
    return [f.result() for f in futures]


class FeedJobs:
    def __init__(self, spark, registry: NodeRegistry, scheduler: FeedScheduler, positions: FeedPositions,
                 cluster: M.ClusterConfig, check_failed, abort):
        self.spark = spark  # driver.spark.ClassicSpark or ConnectSpark
        self.registry = registry
        self.scheduler = scheduler
        self.cluster = cluster
        self.check_failed = check_failed
        self.abort = abort
        self.rows_total: dict[int, int] = {}  # rows fed per node over all train() calls
        self.positions = positions  # each rank's consumed rows at its checkpoints (resumable feeds)
        self.resuming: FeedResume | None = None  # the resumable feed running or last run
        self.events: list = []  # timeline events of the feeding jobs

    def feed_config(self, qname: str, feed_timeout: float, chunk_rows, uneven: str = "",
                    shared_memory: bool = True) -> M.FeedConfig:
        nodes = {n.node_index: n for n in self.registry.registered()}
        ranks = tuple(self.scheduler.feed_ranks)
        c = self.cluster
        return M.FeedConfig(c.cluster_id, c.key, c.driver_host, c.driver_port, uuid.uuid4().hex[:12], qname,
                            float(feed_timeout), ranks,
                            tuple((i, nodes[i].host, nodes[i].feed_port) for i in ranks), chunk_rows, uneven,
                            bool(shared_memory))

    def run(self, description: str, action):
        """Run ``action()`` (a Spark action) in its own job group; fail fast if a node fails meanwhile."""
        reg = self.registry
        job = SparkJob(self.spark, f"tfos-feed-{uuid.uuid4().hex[:8]}", description, action,
                       on_done=lambda _job: reg.notify(), secret=self.cluster.key.secret)
        # no deadline of its own: every chunk the job sends is bounded by feed_timeout on the executor
        while True:
            reg.wait_until(lambda snap: job.done.is_set() or bool(snap.failures) or bool(snap.abort_reason), None,
                           poll=0.5)
            if job.done.is_set():
                break
            try:
                self.check_failed()  # waits for the supervisor's decision: returns when it lost the node only
            except BaseException:
                job.cancel()
                raise
            if reg.snapshot().abort_reason:
                job.cancel()
                self.check_failed()
                break
            # the supervisor went on without a lost node (another may have failed meanwhile): wait on
        job.thread.join()
        if job.error is not None:
            self._await_node_verdict()
            self.check_failed()
            err = remote_error(job.error) or TFOSError(f"the feeding Spark job failed: {_first_line(job.error)}")
            self.abort(err)  # a broken feed leaves nodes waiting for data: stop them; later calls re-raise
            raise err from None
        return job.result

    def _await_node_verdict(self) -> None:
        """A dead or unreachable node usually explains a failed feed (and Spark's retry of a feeding
        task then fails with a retry refusal that says less). Give a dead node's exit report a
        moment; while some node is silent (a cut network, a lost host) wait for the heartbeat
        monitor's verdict on it, up to heartbeat_timeout."""
        reg, c = self.registry, self.cluster
        if reg.wait_until(lambda snap: bool(snap.failures), 3.0):
            return
        quiet = 3 * c.heartbeat_interval
        reg.wait_until(lambda snap: bool(snap.failures) or not reg.silent(quiet),
                       c.heartbeat_timeout + 2 * c.heartbeat_interval, poll=0.2)

    def train(self, data, num_epochs: int, feed_timeout: float, qname: str, chunk_rows=None,
              resume: FeedResume | None = None, uneven: str = "drop", shared_memory: bool = True) -> int:
        """One feed of ``num_epochs`` epochs. With ``resume`` (restarts allowed) every epoch is its
        own Spark job, from ``resume.first``, each without the rows the checkpoint has trained on
        and with every piece's origin (:mod:`tfos.feed.driver.resume`); else one job feeds all
        epochs. ``uneven``: the policy for unequal rows per node (:mod:`tfos.data.uneven`, checked
        by the caller); ``shared_memory``: same-host chunks through the hubs' rings (wire.ring)."""
        from tfos.feed.executor.producer import make_train_feeder  # pyarrow: loaded when data is fed, not at import

        if not is_dataframe(data) and self.spark.connect:
            raise_no_rdd("train() with an RDD")
        cfg = self.feed_config(qname, feed_timeout, chunk_rows, uneven, shared_memory)
        epochs = range(resume.first if resume is not None else 0, num_epochs)
        partitions = _partitions(data, self.spark.connect)  # per epoch (0: unknown)
        self.scheduler.partitions[cfg.feed_id] = len(epochs) * partitions

        def action(times, epoch=-1):  # (rows sent, rows in the epoch or -1)
            skip = resume.skip(epoch) if resume is not None else None
            feeder = make_train_feeder(cfg, is_dataframe(data), epoch, skip)
            if is_dataframe(data):
                union = functools.reduce(lambda a, b: a.unionAll(b), [data] * times)
                parts = [(r[0], r[1]) for r in union.mapInArrow(feeder, "rows long, size long").collect()]
            else:
                parts = self.spark.repeat(data, times).mapPartitionsWithIndex(feeder).collect()
            size = -1 if any(n < 0 for _sent, n in parts) else sum(n for _sent, n in parts)
            return sum(sent for sent, _n in parts), size
        t0 = time.monotonic()
        wall0 = time.time()
        if resume is None:
            total = self.run(f"tfos feed {cfg.feed_id} ({num_epochs} epochs)", lambda: action(num_epochs))[0]
        else:
            resume.begin(cfg.feed_id, cfg.feed_nodes)
            self.resuming = resume
            total = 0
            for k, e in enumerate(epochs):
                # each epoch's job must end before the next starts: its own last partitions level
                # the shares (a node run ahead on its host's chunks would wait at the gate for rows
                # that only the next job could send elsewhere, and hold this job's last task)
                self.scheduler.partitions[cfg.feed_id] = (k + 1) * partitions
                sent, size = self.run(f"tfos feed {cfg.feed_id} (epoch {e + 1} of {num_epochs})",
                                      lambda: action(1, e))
                resume.epoch_fed(e, sent, size)
                total += sent
        # the feed is complete: gates learn the totals, levelled to the row in a gated feed
        per_node = self.scheduler.take_rows(cfg.feed_id, level=bool(cfg.uneven), timeout=feed_timeout)
        totals = self.scheduler.totals(cfg.feed_id)
        levelled = dict(totals)
        for node, rows in per_node.items():  # what each node reads: after the levelling's moves
            self.rows_total[node] = self.rows_total.get(node, 0) + levelled.get(node, rows)
        self.events.append({"name": f"feed job {cfg.feed_id}", "cat": "feed", "ph": "X", "ts": int(wall0 * 1e6),
                            "dur": int((time.time() - wall0) * 1e6),
                            "args": {"rows": total, "epochs": num_epochs, "per_node": str(per_node)}})
        for_each_node(lambda node: self._end_feed(cfg, node, per_node.get(node, 0), totals,
                                                  self.scheduler.level_of(cfg.feed_id, node)), cfg.feed_nodes)
        secs = time.monotonic() - t0
        logger.info("tfos fed %d rows in %.1fs (%.0f rows/s); per node: %s", total, secs, total / max(secs, 1e-9),
                    per_node)
        return total

    def resume(self, num_epochs: int) -> FeedResume:
        """A new train() call's state across restarts."""
        return FeedResume(num_epochs, self.positions)

    def ready_to_restart(self, step: int) -> bool:
        """A planned restart from the checkpoint at ``step`` may go: the running resumable feed (if
        any) has every rank's position there, or its program reports none."""
        resume = self.resuming
        return resume is None or resume.ready(step)

    def _end_feed(self, cfg: M.FeedConfig, node: int, rows: int, totals=(), level: M.FeedLevel | None = None) -> None:
        if self.scheduler.finished_reading(node):
            return
        host, port = cfg.address(node)
        try:
            end_feed(host, port, cfg.key, node, cfg.feed_id, cfg.qname, rows, cfg.feed_timeout,
                     while_waiting=self.check_failed, totals=totals, uneven=cfg.uneven, level=level)
        except (NodeFailedError, Resizing):
            raise  # the cluster already knows the first cause, or restarts at another size
        except (TFOSError, OSError):
            self.registry.wait_until(lambda snap: snap.exited[node] is not None, 5)
            if self.scheduler.finished_reading(node):
                return
            self.check_failed()
            err = TFOSError(f"could not end the feed on node {node}")
            self.abort(err)
            raise

    def inference(self, data, feed_timeout: float, qname: str, chunk_rows=None, output_column="prediction",
                  output_type=None, shared_memory: bool = True):
        from tfos.feed.executor.producer import make_inference_feeder

        if not is_dataframe(data) and self.spark.connect:
            raise_no_rdd("inference() with an RDD")
        cfg = self.feed_config(qname, feed_timeout, chunk_rows, shared_memory=shared_memory)
        self.spark.lend_secret(cfg.key.secret)  # the caller's thread runs the lazy result's jobs
        if not is_dataframe(data):
            return data.mapPartitionsWithIndex(make_inference_feeder(cfg, arrow_input=False))
        if output_type is None:
            raise FeedError("DataFrame inference needs output_type, the Spark SQL type of one result "
                            "(e.g. 'double', 'array<float>')")
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructField, StructType

        result_type = self.spark.parse_type(output_type)
        schema = StructType(list(data.schema.fields) + [StructField(output_column, result_type)])
        return data.mapInArrow(make_inference_feeder(cfg, True, output_column, to_arrow_type(result_type)), schema)

    def close_feeds(self, timeout: float = 30.0) -> list[tuple[int, str]]:
        """Tell every feeding node that no more data will come (their feeds end). Returns the live
        nodes that could not be told, with why (a node that exited meanwhile is not one of them)."""
        c = self.cluster
        snap, ranks = self.registry.snapshot(), set(self.scheduler.feed_ranks)

        def close(n: M.NodeInfo) -> tuple[int, str] | None:
            try:
                end_feed(n.host, n.feed_port, c.key, n.node_index, M.SHUTDOWN_FEED, "input", 0, timeout)
            except (TFOSError, OSError) as e:  # it may just have finished: its exit report is on the way
                i = n.node_index
                if not self.registry.wait_until(lambda s: s.exited[i] is not None, 5):
                    logger.error("could not end the feed of node %d: %s", i, e)
                    return i, str(e)
            return None

        running = [n for n in self.registry.registered()
                   if n.node_index in ranks and n.feed_port and snap.exited[n.node_index] is None]
        return [r for r in for_each_node(close, running) if r is not None]


def _partitions(data, connect: bool) -> int:
    """The partitions one epoch of ``data`` has, when Spark tells without running a job (0: unknown;
    a Spark Connect client cannot ask)."""
    try:
        if is_dataframe(data):
            return 0 if connect else data.rdd.getNumPartitions()
        return data.getNumPartitions()
    except Exception as e:  # the feed is right without it; only its locality is plainer
        logger.debug("could not count the partitions of the data to feed: %s", e)
        return 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)
