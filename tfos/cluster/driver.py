"""The public driver API: reserve a Spark cluster as a TF cluster, start it, feed it, shut it down.

Runs in the Spark driver. Owns the control service (tfos.cluster.driver_service), the barrier
job that launches one node agent per executor, and the driver-side view of every node.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
import time
import uuid

from tfos import protocol as P
from tfos.cluster import decisions
from tfos.cluster.decisions import InputMode
from tfos.cluster.driver_service import ClusterState, ControlServer, driver_host
from tfos.cluster.executor import make_bootstrap, node_dir
from tfos.errors import (ClusterStateError, ConfigError, NodeFailedError, ReservationTimeoutError,
                         TFOSError, TFOSTimeoutError)

logger = logging.getLogger(__name__)


class _Phase(enum.Enum):
    RESERVED = "reserved"
    RUNNING = "running"
    SHUT_DOWN = "shut down"
    FAILED = "failed"


def wait_for_slots(sc, num_executors: int, timeout: float) -> int:
    """Wait until Spark offers ``num_executors`` concurrent task slots; return the slot count."""
    jsc = sc._jsc.sc()
    deadline = time.monotonic() + timeout
    slots = 0
    while True:
        try:
            rp = jsc.resourceProfileManager().defaultResourceProfile()
            slots = int(jsc.maxNumConcurrentTasks(rp))
        except Exception:  # very old or unusual Spark: let the barrier stage decide
            return num_executors
        if slots >= num_executors:
            return slots
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ReservationTimeoutError(
                f"cannot reserve {num_executors} executors: Spark offers {slots} concurrent task slot(s) after "
                f"waiting {timeout:.0f}s (reservation_timeout). Add executors (--num-executors / "
                "spark.executor.instances, or more workers), lower num_executors, or raise reservation_timeout "
                "if executors are still starting.")
        time.sleep(min(0.5, remaining))


class TFCluster:
    """A TensorFlow cluster running on Spark executors.

    ``TFCluster.reserve(sc, num_executors, num_ps)`` then ``cluster.start(main_fun, args)``, or
    ``TFCluster.run(sc, main_fun, args, num_executors, num_ps, ...)`` as in TensorFlowOnSpark.
    """

    InputMode = InputMode

    def __init__(self, sc, roles, cluster_id, secret, settings: dict):
        self.sc = sc
        self.roles = roles
        self.cluster_id = cluster_id
        self._secret = secret
        self.settings = settings
        self.state = ClusterState(cluster_id, roles)
        self.server = ControlServer(self.state, secret).start()
        self.driver_host = driver_host(sc.getConf().get("spark.driver.host"))
        self.input_mode: InputMode | None = None
        self._phase = _Phase.RESERVED
        self._error: TFOSError | None = None
        self._job_thread: threading.Thread | None = None
        self._job_error: BaseException | None = None
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self._job_group = f"tfos-{cluster_id}"
        self.backend = None  # set by reserve()
        self.feed_rows_total: dict[int, int] = {}  # rows fed per node over all train() calls
        self._default_input_mode = InputMode.TENSORFLOW
        self._tensorboard = None
        self._progress = None
        self.driver_events: list = []  # timeline events of the driver (feeding jobs)
        self.timeline_path: str | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def reserve(cls, sc, num_executors: int, num_ps: int = 0, *, master_node: str | None = "chief",
                eval_node: bool = False, reservation_timeout: float = 600, num_gpus: int = 0,
                env: dict | None = None, log_dir: str | None = None, release_port: bool = True,
                heartbeat_interval: float = 1.0, heartbeat_timeout: float = 30.0,
                stop_grace_secs: float = 5.0, input_mode=None, tensorboard: bool = False,
                backend=None, transport: str = "grpc", backend_options: dict | None = None,
                progress: bool = True, timeline: str | None = None, report_interval: float = 1.0,
                tensorboard_host: str | None = None, tensorboard_port: int = 0) -> "TFCluster":
        """Reserve ``num_executors`` Spark task slots as one TF cluster node each.

        Roles: ``num_ps`` ps nodes, then the ``master_node`` ('chief', or None for workers only),
        an evaluator if ``eval_node``, then workers. Fails with ReservationTimeoutError when
        Spark cannot offer enough slots within ``reservation_timeout`` seconds.

        ``backend``: 'mwms' (ring all-reduce; default without ps), 'ps' (parameter servers; default
        with num_ps > 0), 'horovod', or a tfos.backends.Backend; ``backend_options`` go to it
        (e.g. {'communication': 'ring', 'bytes_per_pack': 4 << 20} for mwms). ``transport='rdma'``
        selects NCCL over InfiniBand/RoCE and fails here on hosts without an RDMA device.

        ``log_dir`` (default: a new temp dir on the driver; use shared storage on a real cluster)
        is ``ctx.log_dir`` on the nodes; ``tensorboard=True`` serves it from a TensorBoard child of
        the driver (``cluster.tensorboard_url``). ``progress`` shows a progress bar fed by
        ``ctx.report()`` / ``tfos.callbacks.progress``; ``timeline='trace.json'`` writes a merged
        Chrome trace of every rank (feed waits, steps) at shutdown.
        """
        decisions.validate_reserve(num_executors, num_ps, master_node, eval_node, reservation_timeout,
                                   InputMode.TENSORFLOW if input_mode is None else input_mode)
        if tensorboard:
            from tfos.cluster.tensorboard import require_tensorboard

            require_tensorboard()
        if not isinstance(num_gpus, int) or num_gpus < 0:
            raise ConfigError(f"num_gpus must be an int >= 0, got {num_gpus!r}")
        if sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
            logger.warning("spark.dynamicAllocation.enabled=true: Spark may remove executors that host TF "
                           "nodes; disable dynamic allocation for tfos jobs")
        from tfos.backends import make_backend

        backend_obj = make_backend(backend, num_ps, transport, **(backend_options or {}))
        backend_obj.validate(num_executors, num_ps, master_node)
        default_mode = InputMode.TENSORFLOW if input_mode is None else InputMode(input_mode)
        roles = decisions.assign_roles(num_executors, num_ps, master_node, eval_node)
        slots = wait_for_slots(sc, num_executors, reservation_timeout)
        logger.info("tfos: %d task slots available for %d nodes", slots, num_executors)
        try:
            hconf = sc._jsc.hadoopConfiguration()
            default_fs = hconf.get("fs.defaultFS") or "file:///"
        except Exception:
            default_fs = "file:///"
        if log_dir is None:
            import tempfile

            log_dir = tempfile.mkdtemp(prefix="tfos-logs-")
        settings = dict(reservation_timeout=float(reservation_timeout), num_gpus=num_gpus, env=dict(env or {}),
                        log_dir=log_dir, release_port=release_port, heartbeat_interval=heartbeat_interval,
                        timeline=timeline, report_interval=report_interval, progress=progress,
                        heartbeat_timeout=heartbeat_timeout, stop_grace_secs=stop_grace_secs,
                        default_fs=default_fs)
        cluster = cls(sc, roles, uuid.uuid4().hex[:12], P.new_secret(), settings)
        cluster.backend = backend_obj
        cluster._default_input_mode = default_mode
        if tensorboard:
            from tfos.cluster.tensorboard import TensorBoard

            try:
                cluster._tensorboard = TensorBoard(log_dir.replace("file://", ""),
                                                   tensorboard_host or cluster.driver_host, tensorboard_port)
            except BaseException:
                cluster.server.stop()
                raise
        return cluster

    @classmethod
    def run(cls, sc, map_fun, tf_args, num_executors, num_ps, tensorboard=False,
            input_mode=InputMode.TENSORFLOW, log_dir=None, driver_ps_nodes=False, master_node=None,
            reservation_timeout=600, queues=("input", "output", "error"), eval_node=False,
            release_port=True, **kwargs) -> "TFCluster":
        """Reserve and start in one call; TensorFlowOnSpark 2.x signature and defaults.

        ``queues`` is accepted for compatibility (tfos feeds need no queue declaration).
        Extra keyword arguments go to :meth:`reserve`.
        """
        if driver_ps_nodes:
            raise ConfigError("driver_ps_nodes=True is not supported: tfos runs ps nodes on executors; "
                              "drop the argument (ps nodes then take num_ps of the num_executors slots)")
        cluster = cls.reserve(sc, num_executors, num_ps, master_node=master_node, eval_node=eval_node,
                              reservation_timeout=reservation_timeout, log_dir=log_dir,
                              release_port=release_port, input_mode=input_mode, tensorboard=tensorboard,
                              **kwargs)
        cluster.start(map_fun, tf_args, input_mode=input_mode)
        return cluster

    # ------------------------------------------------------------------ lifecycle
    def start(self, main_fun, tf_args=None, input_mode=None) -> "TFCluster":
        """Start one TF process per node running ``main_fun(tf_args, ctx)``; returns when every node
        has registered (the cluster spec is complete). ``input_mode`` defaults to the one given to
        reserve(), else InputMode.TENSORFLOW."""
        if input_mode is None:
            input_mode = self._default_input_mode
        self._check(_Phase.RESERVED, "start")
        if not callable(main_fun):
            raise ConfigError(f"main_fun must be callable, got {main_fun!r}")
        try:
            self.input_mode = InputMode(input_mode)
        except ValueError:
            raise ConfigError(f"input_mode must be InputMode.TENSORFLOW or InputMode.SPARK, got {input_mode!r}") from None
        s = self.settings
        cfg = dict(cluster_id=self.cluster_id, secret=self._secret, driver_host=self.driver_host,
                   driver_port=self.server.port, roles=self.roles, input_mode=int(self.input_mode),
                   backend=self.backend.options(), **s)

        def backend_setup(nodes):
            config = self.backend.driver_setup(nodes)
            return dict(config, driver_host=self.driver_host, log_dir=s["log_dir"])

        with self.state.cond:
            self.state.feed_ranks = [i for i, (job, _) in enumerate(self.roles) if job in self.backend.feed_jobs]
            self.state.on_complete = backend_setup
        bootstrap = make_bootstrap(cfg, main_fun, tf_args)
        n = len(self.roles)

        def run_job():
            try:
                self.sc.setJobGroup(self._job_group, f"tfos cluster {self.cluster_id}: {n} TF nodes",
                                    interruptOnCancel=True)
                self.sc.parallelize(range(n), n).barrier().mapPartitions(bootstrap).collect()
            except BaseException as e:  # recorded; the waiting thread turns it into a TFOSError
                self._job_error = e
                with self.state.cond:
                    if not self._closing.is_set():
                        self.state.abort_reason = f"the tfos reservation job failed: {_short(e)}"
                    self.state.cond.notify_all()

        self._phase = _Phase.RUNNING
        self._job_thread = threading.Thread(target=run_job, name=f"tfos-job-{self.cluster_id}", daemon=True)
        self._job_thread.start()
        self._monitor = threading.Thread(target=self._monitor_loop, name=f"tfos-monitor-{self.cluster_id}",
                                         daemon=True)
        self._monitor.start()
        if s.get("progress"):
            from tfos.cluster.progress import ProgressMonitor

            self._progress = ProgressMonitor(self).start()
        timeout = s["reservation_timeout"]
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while not self.state.all_registered():
                if self.state.failures or self.state.abort_reason:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.state.cond.wait(min(remaining, 1.0))
            ok = self.state.all_registered() and not self.state.failures
            missing = [i for i, nd in self.state.nodes.items() if nd.info is None]
        if not ok:
            if self.state.failures:
                err: TFOSError = NodeFailedError(self.state.failures)
            elif self.state.abort_reason:
                err = TFOSError(self.state.abort_reason + _node_logs_hint(self.cluster_id))
            else:
                err = ReservationTimeoutError(
                    f"nodes {missing} of {n} did not start within {timeout:.0f}s (reservation_timeout). Spark may "
                    "lack free slots (other jobs running?) or the TF processes are slow to import; raise "
                    "reservation_timeout or free executors." + _node_logs_hint(self.cluster_id))
            self._abort(err)
            raise err
        logger.info("tfos cluster %s started: %s", self.cluster_id, json.dumps(self.cluster_spec))
        return self

    @property
    def tensorboard_url(self) -> str | None:
        """URL of the TensorBoard serving log_dir (tensorboard=True), else None."""
        return self._tensorboard.url if self._tensorboard else None

    @property
    def log_dir(self) -> str:
        return self.settings["log_dir"]

    @property
    def cluster_spec(self) -> dict:
        with self.state.cond:
            nodes = [nd.info for _, nd in sorted(self.state.nodes.items()) if nd.info]
        return decisions.cluster_spec(nodes)

    @property
    def nodes(self) -> list[dict]:
        """Registered node descriptions (node_index, job_name, task_index, host, ports, pid)."""
        with self.state.cond:
            return [dict(nd.info) for _, nd in sorted(self.state.nodes.items()) if nd.info]

    def metrics(self) -> dict[int, dict]:
        """Latest values each node sent with ``ctx.report(...)``, by node index."""
        with self.state.cond:
            return {i: dict(nd.metrics) for i, nd in self.state.nodes.items()}

    def train(self, data, num_epochs: int = 1, feed_timeout: float = 600, qname: str = "input",
              chunk_rows: int | None = None) -> int:
        """Stream ``data`` (an RDD of tuples/lists/dicts/arrays, or a DataFrame) into the training
        nodes ``num_epochs`` times (InputMode.SPARK). Every row reaches exactly one node once per
        epoch, shares balanced across nodes; then every node's feed ends. Returns the rows fed.

        Raises FeedTimeoutError if a node accepts no data for ``feed_timeout`` seconds, FeedError
        for rows that cannot be converted, NodeFailedError if a node fails meanwhile.
        """
        self._check(_Phase.RUNNING, "train")
        self._require_spark_mode("train")
        if not isinstance(num_epochs, int) or num_epochs < 1:
            raise ConfigError(f"num_epochs must be a positive int, got {num_epochs!r}")
        from tfos.feed import driver_side

        return driver_side.train(self, data, num_epochs, feed_timeout, qname, chunk_rows)

    def inference(self, data, feed_timeout: float = 600, qname: str = "input", chunk_rows: int | None = None,
                  output_column: str = "prediction", output_type: str | None = None):
        """One result per input row, in input order within each partition (InputMode.SPARK).

        RDD in -> RDD of results (lazy, like any RDD). DataFrame in -> the same DataFrame plus
        ``output_column`` of Spark SQL type ``output_type`` (e.g. 'double', 'array<float>').
        main_fun answers with ``feed.batch_results(...)``.
        """
        self._check(_Phase.RUNNING, "run inference")
        self._require_spark_mode("inference")
        from tfos.feed import driver_side

        return driver_side.inference(self, data, feed_timeout, qname, chunk_rows, output_column, output_type)

    def _require_spark_mode(self, what: str) -> None:
        if self.input_mode != InputMode.SPARK:
            raise ClusterStateError(f"cluster.{what}() feeds data from Spark: start the cluster with "
                                    "input_mode=InputMode.SPARK (in InputMode.TENSORFLOW nodes read their own files)")

    def shutdown(self, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Wait for the chief and workers to finish, stop ps/evaluator nodes, release the executors.

        Raises NodeFailedError (with each failed node's traceback and log tail) if any node failed,
        TFOSTimeoutError if the training nodes are still running after ``timeout`` seconds.
        """
        if self._phase in (_Phase.SHUT_DOWN,):
            return
        if self._phase == _Phase.FAILED:
            raise self._error
        if timeout is None or timeout < 0:  # TensorFlowOnSpark: timeout=-1 waits forever
            timeout = float("inf")
        if self._phase == _Phase.RESERVED:
            self._release()
            self._phase = _Phase.SHUT_DOWN
            return
        if self.input_mode == InputMode.SPARK:
            from tfos.feed.driver_side import close_feeds

            close_feeds(self)
        trainers = [i for i, (job, _) in enumerate(self.roles) if job in self.backend.finishing_jobs]
        others = [i for i in range(len(self.roles)) if i not in trainers]
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while self.state.unfinished(trainers) and not self.state.failures:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.state.cond.wait(min(remaining, 1.0))  # inf timeout: wakes every second
            timed_out = bool(self.state.unfinished(trainers)) and not self.state.failures
        if timed_out:
            err = TFOSTimeoutError(f"training nodes {self.state.unfinished(trainers)} still running after "
                                   f"{timeout:.0f}s; raise shutdown(timeout=...)")
            self._abort(err)
            raise err
        if others and not self.state.failures:
            with self.state.cond:
                self.state.cond.wait_for(lambda: not self.state.unfinished(others), timeout=grace_secs)
        self._stop_nodes(range(len(self.roles)))
        if self.state.failures:
            err = NodeFailedError(self.state.failures)
            self._phase = _Phase.FAILED
            self._error = err
            self._release()
            raise err
        self._release()
        self._phase = _Phase.SHUT_DOWN
        logger.info("tfos cluster %s shut down", self.cluster_id)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.shutdown()
        elif self._phase not in (_Phase.FAILED, _Phase.SHUT_DOWN):
            self._abort(TFOSError(f"aborted by {exc_type.__name__}"))

    # ------------------------------------------------------------------ internals
    def _check(self, phase: _Phase, what: str) -> None:
        if self._phase == _Phase.FAILED:
            raise self._error
        self.raise_if_failed()
        if self._phase != phase:
            raise ClusterStateError(f"cannot {what}: the cluster is {self._phase.value} (expected {phase.value})")

    def raise_if_failed(self) -> None:
        """Raise NodeFailedError if any node has failed; later calls raise it again."""
        with self.state.cond:
            failures = list(self.state.failures)
        if failures:
            if self._error is None:
                self._error = NodeFailedError(failures)
                self._abort(self._error)
            raise self._error

    def _monitor_loop(self) -> None:
        interval = max(0.2, self.settings["heartbeat_interval"])
        while not self._closing.wait(interval):
            self.state.check_heartbeats(self.settings["heartbeat_timeout"])

    def _stop_nodes(self, which, timeout: float | None = None) -> None:
        """Ask the agents of ``which`` nodes to stop and wait until they report their exits."""
        which = list(which)
        self.state.request_stop(which)
        s = self.settings
        timeout = timeout or (s["heartbeat_interval"] * 2 + s["stop_grace_secs"] + 15)
        with self.state.cond:
            started = [i for i in which if self.state.nodes[i].agent or self.state.nodes[i].info]
            done = self.state.cond.wait_for(lambda: not self.state.unfinished(started), timeout=timeout)
        if not done:
            logger.warning("tfos nodes %s did not confirm their exit within %.0fs",
                           self.state.unfinished(started), timeout)

    def _abort(self, err: TFOSError) -> None:
        if self._phase in (_Phase.SHUT_DOWN,):
            return
        self._error = err
        self._phase = _Phase.FAILED
        with self.state.cond:
            self.state.abort_reason = self.state.abort_reason or str(err).splitlines()[0]
            self.state.cond.notify_all()
        self._stop_nodes(range(len(self.roles)))
        self._release()

    def _release(self) -> None:
        self._closing.set()
        if self._job_thread is not None and self._job_thread.is_alive():
            self._job_thread.join(timeout=10)
            if self._job_thread.is_alive():
                self.sc.cancelJobGroup(self._job_group)
                self._job_thread.join(timeout=30)
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        if self.backend is not None:
            self.backend.driver_teardown()
        self._finish_reporting()
        if self._tensorboard is not None:
            self._tensorboard.stop()
            self._tensorboard = None
        self.server.stop()

    def _finish_reporting(self) -> None:
        """Close the progress bar, log the per-rank table, write the merged timeline."""
        from tfos.cluster import progress as prog

        if self._progress is not None:
            self._progress.close()
            self._progress = None
        with self.state.cond:
            if not any(n.info or n.agent for n in self.state.nodes.values()):
                return
            nodes_state = {i: {"metrics": dict(n.metrics), "host": self.state.host_of(i),
                               "exit": n.exited.exit_code if n.exited else None}
                           for i, n in self.state.nodes.items()}
            events = {i: list(n.events) for i, n in self.state.nodes.items()}
            hosts = {i: self.state.host_of(i) for i in self.state.nodes}
        logger.info("tfos cluster %s per-rank summary:\n%s", self.cluster_id,
                    prog.rank_table(self.roles, nodes_state, self.feed_rows_total))
        if self.settings.get("timeline"):
            self.timeline_path = prog.write_timeline(
                self.settings["timeline"], prog.chrome_trace(self.roles, hosts, events, self.driver_events))
            logger.info("tfos cluster timeline written to %s (open in chrome://tracing or Perfetto)",
                        self.timeline_path)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    for line in text:
        if "TFOSError" in line or "Error:" in line:
            return line.strip()[:500]
    return (text[0] if text else type(e).__name__)[:500]


def _node_logs_hint(cluster_id: str) -> str:
    return f" Node logs: {os.path.dirname(node_dir(cluster_id, 0))}/node-*/ on each executor host."
