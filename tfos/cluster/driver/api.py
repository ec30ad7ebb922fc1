"""The public driver API: reserve a Spark cluster as a TF cluster, start it, feed it, shut it down.

Runs in the Spark driver. ``TFCluster`` composes the parts of the driver: the lifecycle
(``lifecycle``), the node registry and feed scheduler behind the control service
(``registry``, ``feed_scheduler``, ``service``), the feeding jobs (``feeding``), and the
progress bar, timeline and TensorBoard (``progress``, ``tensorboard``), the MLflow run
(``tracking``) and the checks of reserve()'s arguments (``settings``).

It stays one module of about 700 lines because it is the facade: most of its length is the
public methods' signatures and docstrings (reserve, run, run_script, start, train, inference,
shutdown); the work behind them lives in the modules above. What it does itself is the order of
things: the start of each attempt (``_launch``), the restart after a node failure
(``_recover``; the decision is ``lifecycle.restart_refusal``) and going on without a node the
backend can lose (``_tolerate_loss``; the decision is ``lifecycle.loss_tolerated``).
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import json
import logging
import os
import tempfile
import threading
import time
import uuid

from tfos import topology
from tfos.cluster.driver import spark as S
from tfos.feed.driver.scheduler import FeedScheduler
from tfos.feed.driver.jobs import FeedJobs
from tfos.cluster.driver.lifecycle import Lifecycle, NodeLoss, Phase, Restart, loss_tolerated, restart_refusal
from tfos.cluster.driver.progress import quiet_py4j
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import ControlService
from tfos.cluster.driver.settings import seconds as _seconds, validate_reserve
from tfos.errors import (ClusterStateError, ConfigError, FeedError, NodeFailedError, ReservationTimeoutError,
                         TFOSError, TFOSTimeoutError, remote_error)
from tfos.cluster.executor.bootstrap import make_bootstrap, node_dir_hint
from tfos.topology import InputMode
from tfos.wire import messages as M
from tfos.wire.channel import new_secret

logger = logging.getLogger(__name__)

class TFCluster:
    """A TensorFlow cluster running on Spark executors.

    ``TFCluster.reserve(sc, num_executors, num_ps)`` then ``cluster.start(main_fun, args)``, or
    ``TFCluster.run(sc, main_fun, args, num_executors, num_ps, ...)`` as in TensorFlowOnSpark.
    """

    InputMode = InputMode

    def __init__(self, spark, roles, backend, cluster: M.ClusterConfig, default_input_mode: InputMode,
                 timeline_path: str | None, progress: bool, address: S.ControlAddress):
        self.spark = S.spark_entry(spark)  # ClassicSpark or ConnectSpark
        self.roles = roles
        self.backend = backend
        self.cluster_id = cluster.cluster_id
        self.registry = NodeRegistry(cluster.cluster_id, roles, on_complete=self._backend_setup,
                                     max_wait=cluster.reservation_timeout)
        feed_ranks = [i for i, (job, _) in enumerate(roles) if job in backend.feed_jobs]
        self.scheduler = FeedScheduler(self.registry, feed_ranks)
        self.service = self._listen(cluster.secret, address)
        self.config = dataclasses.replace(cluster, driver_port=self.service.port)  # the port the OS picked
        self.driver_host = cluster.driver_host
        self.feeds = FeedJobs(self.spark, self.registry, self.scheduler, self.config, self._feed_check_failed,
                              self._abort)
        self.max_restarts = 0  # set by reserve()
        self.restart_backoff = 0.0
        self.restarts: list[Restart] = []  # each failure that restarted the cluster
        self.lost_nodes: list[NodeLoss] = []  # each node lost while the others went on (backend='ps' workers)
        self.registry.tolerate = self._tolerate_loss
        self._failed_before: list = []  # NodeFailures of the attempts that were restarted
        self._main = None  # (main_fun, tf_args, node_hooks), kept for restarts
        self._restart_lock = threading.RLock()  # one restart at a time (monitor thread or a waiting call)
        self._restarter: threading.Thread | None = None
        self.lifecycle = Lifecycle()
        self.input_mode: InputMode | None = None
        self._default_input_mode = default_input_mode
        self._reservation: S.SparkJob | None = None
        self._monitor: threading.Thread | None = None
        self._closing = threading.Event()
        self._tensorboard = None
        self._progress_enabled = progress
        self._progress = None
        self._timeline_request = timeline_path
        self.timeline_path: str | None = None
        self._tracker = None  # tfos.cluster.driver.tracking.MlflowTracker when mlflow=True / mlflow_run=
        self._mlflow_run_id: str | None = None

    # ------------------------------------------------------------------ construction
    def _listen(self, secret: str, address) -> ControlService:
        """The started control service, on the first free port of ``address.ports``."""
        ports = address.ports or (address.port,)
        error: OSError | None = None
        for port in ports:
            try:
                return ControlService(self.registry, self.scheduler, secret, address.bind, port).start()
            except OSError as e:
                error = e
                if e.errno not in (errno.EADDRINUSE, errno.EACCES):  # the address itself is wrong: stop here
                    break
        where = f"{address.bind}:{'-'.join(map(str, sorted({ports[0], ports[-1]})))}"
        fix = f"set {address.bind_setting} to an address of this machine"
        if ports != (0,):
            fix += " and TFOS_SERVER_PORT to a free port or range"
        raise ConfigError(f"the driver's control service cannot listen on {where}: {error}; {fix}") from None

    @classmethod
    def reserve(cls, sc, num_executors: int, num_ps: int = 0, *, master_node: str | None = "chief",
                eval_node: bool = False, reservation_timeout: float = 600, num_gpus: int = 0,
                env: dict | None = None, log_dir: str | None = None, release_port: bool = True,
                heartbeat_interval: float = 1.0, heartbeat_timeout: float = 30.0,
                stop_grace_secs: float = 5.0, input_mode=None, tensorboard: bool = False,
                backend=None, transport: str = "grpc", backend_options: dict | None = None,
                progress: bool = True, timeline: str | None = None, report_interval: float = 1.0,
                tensorboard_host: str | None = None, tensorboard_port: int = 0, mlflow: bool = False,
                mlflow_run=None, mlflow_experiment: str | None = None, max_restarts: int = 0,
                restart_backoff: float = 5.0, checkpoint_dir: str | None = None,
                preimport_tensorflow: bool = True) -> "TFCluster":
        """Reserve ``num_executors`` Spark task slots as one TF cluster node each.

        ``sc``: a SparkContext, a SparkSession, or a Spark Connect SparkSession (then the data
        to feed must be DataFrames; the control service runs in this client, see docs/design.md).

        Roles: ``num_ps`` ps nodes, then the ``master_node`` ('chief', or None for workers only),
        an evaluator if ``eval_node``, then workers. Fails with ReservationTimeoutError when
        Spark cannot offer enough slots within ``reservation_timeout`` seconds.

        ``backend``: 'mwms' (ring all-reduce; the default), 'ps' (parameter servers), 'horovod',
        an import path 'module:Class', or a tfos.backends.Backend (class or instance; its node
        hooks run on the nodes); ``backend_options`` go to it (e.g. {'communication': 'ring',
        'bytes_per_pack': 4 << 20} for mwms). ``transport='rdma'`` selects NCCL over
        InfiniBand/RoCE and fails here on hosts without an RDMA device.

        ``log_dir`` (default: a new temp dir on the driver; use shared storage on a real cluster)
        is ``ctx.log_dir`` on the nodes; ``tensorboard=True`` serves it from a TensorBoard child of
        the driver (``cluster.tensorboard_url``). ``progress`` shows a progress bar fed by
        ``ctx.report()`` / ``tfos.callbacks.progress``; ``timeline='trace.json'`` writes a merged
        Chrome trace of every rank (feed waits, steps) at shutdown.

        ``max_restarts``: after a node failure (exception, TF process or agent killed, executor or
        host lost), stop every node and start them all again from ``main_fun`` (``ctx.attempt``
        counts the restarts), up to this many times, ``restart_backoff`` seconds after the
        failure; main_fun restores its state from ``ctx.checkpoint_dir`` (``checkpoint_dir``, else
        ``<log_dir>/checkpoint``: storage every node reads, the same on every attempt). A failure
        raised as ``tfos.NonRetryable`` (or ConfigError) is never retried. See docs/design.md §5.1.

        ``preimport_tensorflow``: each TF process imports TensorFlow in a background thread once
        it has registered, while it waits for the other nodes, so main_fun starts with TF loaded.
        TF then reads its import-time environment before main_fun runs: put such settings
        (``TF_ENABLE_ONEDNN_OPTS``, ``TF_CPP_MIN_LOG_LEVEL``) in ``env``, or pass False.
        """
        validate_reserve(num_executors, num_ps, master_node, eval_node, reservation_timeout,
                         InputMode.TENSORFLOW if input_mode is None else input_mode, num_gpus, max_restarts)
        if tensorboard:
            from tfos.cluster.driver.tensorboard import require_tensorboard

            require_tensorboard()
        if (mlflow or mlflow_run is not None) and importlib.util.find_spec("mlflow") is None:
            raise ConfigError("mlflow=True / mlflow_run= need the mlflow package on the driver: pip install "
                              "tfos[mlflow] (or mlflow), or leave them out")
        quiet_py4j()
        spark = S.spark_entry(sc)
        if (spark.conf().get("spark.dynamicAllocation.enabled") or "false").lower() == "true":
            logger.warning("spark.dynamicAllocation.enabled=true: Spark may remove executors that host TF "
                           "nodes; disable dynamic allocation for tfos jobs")
        from tfos.backends import make_backend

        backend_obj = make_backend(backend, transport, **(backend_options or {}))
        backend_obj.validate(num_executors, num_ps, master_node)
        roles = topology.assign_roles(num_executors, num_ps, master_node, eval_node)
        slots = spark.wait_for_slots(num_executors, reservation_timeout)
        if slots is not None:
            logger.info("tfos: %d task slots available for %d nodes", slots, num_executors)
        address = spark.control_address(os.environ)
        log_dir = log_dir or tempfile.mkdtemp(prefix="tfos-logs-")
        config = M.ClusterConfig(
            cluster_id=uuid.uuid4().hex[:12], secret=new_secret(),
            driver_host=address.advertise, driver_port=address.port,
            roles=tuple(roles), input_mode=int(InputMode.TENSORFLOW), reservation_timeout=float(reservation_timeout),
            log_dir=log_dir, default_fs=spark.default_fs(), num_gpus=num_gpus,
            env={k: str(v) for k, v in (env or {}).items()}, release_port=bool(release_port),
            preimport_tensorflow=bool(preimport_tensorflow),
            heartbeat_interval=_seconds("heartbeat_interval", heartbeat_interval),
            heartbeat_timeout=_seconds("heartbeat_timeout", heartbeat_timeout),
            stop_grace_secs=_seconds("stop_grace_secs", stop_grace_secs, allow_zero=True),
            timeline=bool(timeline), report_interval=_seconds("report_interval", report_interval),
            metric_history=bool(mlflow or mlflow_run is not None),
            checkpoint_dir=checkpoint_dir or log_dir.rstrip("/") + "/checkpoint")
        default_mode = InputMode.TENSORFLOW if input_mode is None else InputMode(input_mode)
        cluster = cls(spark, roles, backend_obj, config, default_mode, timeline, progress, address)
        cluster.max_restarts = max_restarts
        cluster.restart_backoff = _seconds("restart_backoff", restart_backoff, allow_zero=True)
        if mlflow or mlflow_run is not None:
            cluster._open_tracker(mlflow_run, mlflow_experiment, {
                "num_executors": num_executors, "num_ps": num_ps, "master_node": master_node, "eval_node": eval_node,
                "backend": backend_obj.name, "transport": transport, "num_gpus": num_gpus,
                "reservation_timeout": reservation_timeout,
                "log_dir": log_dir, "backend_options": backend_options or {}})
        if tensorboard:
            from tfos.cluster.driver.tensorboard import TensorBoard

            try:
                cluster._tensorboard = TensorBoard(log_dir.replace("file://", ""),
                                                   tensorboard_host or cluster.driver_host, tensorboard_port)
            except BaseException:
                cluster.service.stop()
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

    @classmethod
    def run_script(cls, sc, script: str, argv=(), num_executors: int = 1, num_ps: int = 0, *,
                   master_node: str | None = "chief", timeout: float = 259200, grace_secs: float = 5,
                   **kwargs) -> None:
        """Run an unchanged TF script (one that reads ``TF_CONFIG``, as written for a plain
        multi-worker setup) on ``num_executors`` executors, the way TorchDistributor runs torchrun
        scripts; returns when every chief/worker copy exited with code 0.

        The driver reads ``script`` and sends it along, so it need not exist on the executors
        (the modules it imports must). Each node runs ``python -u script *argv`` with its role's
        ``TF_CONFIG``; the output goes into the node logs. A non-zero exit raises NodeFailedError
        naming the node, the exit code and the script's last lines. ``timeout`` bounds the wait
        for the trainers (shutdown's timeout); ``kwargs`` go to :meth:`reserve` (``num_gpus``,
        ``env``, ``eval_node``, ``reservation_timeout``, ...). InputMode.TENSORFLOW.
        """
        from tfos.cluster.node.script import Script, script_main

        try:
            with open(script, "rb") as f:
                source = f.read()
        except OSError as e:
            raise ConfigError(f"cannot read the script {script!r} on the driver: {e}") from None
        if isinstance(argv, str):
            raise ConfigError("argv must be a list of arguments, e.g. ['--epochs', '3'], not a string")
        kwargs["release_port"] = True  # the script's TF server binds the ports in TF_CONFIG
        cluster = cls.reserve(sc, num_executors, num_ps, master_node=master_node,
                              input_mode=InputMode.TENSORFLOW, **kwargs)
        with cluster:
            cluster.start(script_main, Script(os.path.basename(script), source, tuple(map(str, argv))))
            cluster.shutdown(grace_secs=grace_secs, timeout=timeout)

    # ------------------------------------------------------------------ lifecycle
    def start(self, main_fun, tf_args=None, input_mode=None) -> "TFCluster":
        """Start one TF process per node running ``main_fun(tf_args, ctx)``; returns when every node
        has registered (the cluster spec is complete). ``input_mode`` defaults to the one given to
        reserve(), else InputMode.TENSORFLOW."""
        self.lifecycle.require(Phase.RESERVED, "start")
        if not callable(main_fun):
            raise ConfigError(f"main_fun must be callable, got {main_fun!r}")
        try:
            self.input_mode = InputMode(self._default_input_mode if input_mode is None else input_mode)
        except ValueError:
            raise ConfigError(f"input_mode must be InputMode.TENSORFLOW or InputMode.SPARK, got {input_mode!r}") from None
        self.config = dataclasses.replace(self.config, input_mode=int(self.input_mode))
        self._main = (main_fun, tf_args, self.backend.node_hooks())
        if self._tracker is not None:
            from tfos.cluster.driver.tracking import args_params

            self._tracker.log_params(dict(args_params(tf_args), input_mode=self.input_mode.name))
        self.lifecycle.to(Phase.STARTING)
        try:
            self._monitor = threading.Thread(target=self._monitor_loop, name=f"tfos-monitor-{self.cluster_id}",
                                             daemon=True)
            self._monitor.start()
            if self._progress_enabled:
                from tfos.cluster.driver.progress import ProgressMonitor

                self._progress = ProgressMonitor(self).start()
            err = self._launch()
        except BaseException as e:  # interrupted (Ctrl-C) or broken: nothing may be left running
            self._abort(e if isinstance(e, TFOSError) else TFOSError(f"start() interrupted by {type(e).__name__}"))
            raise
        if err is not None:
            self._abort(err)
            raise err
        self.lifecycle.to(Phase.RUNNING)
        logger.info("tfos cluster %s started: %s", self.cluster_id, json.dumps(self.cluster_spec))
        return self

    def _launch(self) -> TFOSError | None:
        """Run this attempt's barrier stage (one task per node) and wait until every node registered;
        the error that stopped it, if any."""
        n = len(self.roles)
        attempt = self.config.attempt
        bootstrap = make_bootstrap(self.config, *self._main)

        def reservation_ended(job):
            if job.error is not None and not self._closing.is_set() and self.config.attempt == attempt:
                self.registry.abort(f"the tfos reservation job failed: {_short(job.error)}")

        cid = self.config.cluster_id
        self._reservation = S.SparkJob(self.spark, f"tfos-{cid}", f"tfos cluster {cid}: {n} TF nodes"
                                       + (f" (attempt {attempt})" if attempt else ""),
                                       self.spark.barrier_stage(n, bootstrap), on_done=reservation_ended)
        return self._wait_registered(n)

    def _wait_registered(self, n: int) -> TFOSError | None:
        timeout = self.config.reservation_timeout
        deadline = time.monotonic() + timeout
        reg = self.registry
        with reg.cond:
            while not reg.all_registered() and not reg.failures and not reg.abort_reason:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                reg.cond.wait(min(remaining, 1.0))
            if reg.failures:
                return NodeFailedError(reg.failures)
            if reg.abort_reason:
                return TFOSError(reg.abort_reason.rstrip(".") + "." + _node_logs_hint(self.config.cluster_id))
            if not reg.all_registered():
                return ReservationTimeoutError(
                    f"nodes {reg.missing()} of {n} did not start within {timeout:.0f}s (reservation_timeout). Spark "
                    "may lack free slots (other jobs running?) or the TF processes are slow to import; raise "
                    "reservation_timeout or free executors." + _node_logs_hint(self.config.cluster_id))
        return None

    def _backend_setup(self, nodes) -> dict:
        config = self.backend.setup(nodes)
        return dict(config, driver_host=self.driver_host, log_dir=self.config.log_dir)

    def _open_tracker(self, run, experiment, params: dict) -> None:
        from tfos.cluster.driver.tracking import attach

        self._tracker = attach(self.registry, self.roles, self.cluster_id, run, experiment, params)
        self._mlflow_run_id = self._tracker.run_id

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run this cluster logs to (``mlflow=True`` / ``mlflow_run=``), else None."""
        return self._mlflow_run_id

    @property
    def tensorboard_url(self) -> str | None:
        """URL of the TensorBoard serving log_dir (tensorboard=True), else None."""
        return self._tensorboard.url if self._tensorboard else None

    @property
    def log_dir(self) -> str:
        return self.config.log_dir

    @property
    def cluster_spec(self) -> dict:
        return topology.cluster_spec(self.registry.registered())

    @property
    def nodes(self) -> list[dict]:
        """Registered node descriptions (node_index, job_name, task_index, host, ports, pid)."""
        return self.registry.node_dicts()

    def metrics(self) -> dict[int, dict]:
        """Latest values each node sent with ``ctx.report(...)``, by node index."""
        return self.registry.metrics()

    @property
    def feed_rows_total(self) -> dict[int, int]:
        """Rows fed to each node over all train() calls."""
        return self.feeds.rows_total

    def train(self, data, num_epochs: int = 1, feed_timeout: float = 600, qname: str = "input",
              chunk_rows: int | None = None) -> int:
        """Stream ``data`` (an RDD of tuples/lists/dicts/arrays, or a DataFrame) into the training
        nodes ``num_epochs`` times (InputMode.SPARK). Every row reaches exactly one node once per
        epoch, shares balanced across nodes; then every node's feed ends. Returns the rows fed.

        Raises FeedTimeoutError if a node accepts no data for ``feed_timeout`` seconds, FeedError
        for rows that cannot be converted, NodeFailedError if a node fails meanwhile.

        With ``max_restarts``, each epoch is its own Spark job; when a node fails, the cluster
        restarts and the new attempt is fed the interrupted epoch again in full, then the rest
        (epochs that finished before the failure are not fed again). Returns the rows fed.
        """
        self._check_running("train")
        if not isinstance(num_epochs, int) or num_epochs < 1:
            raise ConfigError(f"num_epochs must be a positive int, got {num_epochs!r}")
        if self.max_restarts <= 0:
            return self.feeds.train(data, num_epochs, feed_timeout, qname, chunk_rows)
        fed, done = 0, 0
        while True:
            epochs_done: list[int] = []  # rows of each epoch fed completely in this attempt
            try:
                return fed + self.feeds.train(data, num_epochs - done, feed_timeout, qname, chunk_rows,
                                              epochs_done=epochs_done)
            except NodeFailedError:
                done += len(epochs_done)
                fed += sum(epochs_done)
                logger.warning("tfos: a node failed while feeding epoch %d of %d; restarting the cluster",
                               done + 1, num_epochs)
                self._recover()  # raises when no restart is allowed

    def inference(self, data, feed_timeout: float = 600, qname: str = "input", chunk_rows: int | None = None,
                  output_column: str = "prediction", output_type: str | None = None):
        """One result per input row, in input order within each partition (InputMode.SPARK).

        RDD in -> RDD of results (lazy, like any RDD). DataFrame in -> the same DataFrame plus
        ``output_column`` of Spark SQL type ``output_type`` (e.g. 'double', 'array<float>').
        main_fun answers with ``feed.batch_results(...)``.
        """
        self._check_running("run inference")
        return self.feeds.inference(data, feed_timeout, qname, chunk_rows, output_column, output_type)

    def _check_running(self, what: str) -> None:
        self.raise_if_failed()
        self.lifecycle.require(Phase.RUNNING, what)
        if self.input_mode != InputMode.SPARK:
            raise ClusterStateError(f"cluster.{what.split()[-1]}() feeds data from Spark: start the cluster with "
                                    "input_mode=InputMode.SPARK (in InputMode.TENSORFLOW nodes read their own files)")

    def shutdown(self, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Wait for the chief and workers to finish, stop ps/evaluator nodes, release the executors.

        Raises NodeFailedError (with each failed node's traceback and log tail) if any node failed,
        TFOSTimeoutError if the training nodes are still running after ``timeout`` seconds.
        """
        phase = self.lifecycle.phase
        if phase is Phase.SHUT_DOWN:
            return
        if phase is Phase.FAILED:
            raise self.lifecycle.error
        if phase is Phase.RESERVED:
            self._release()
            self.lifecycle.to(Phase.SHUT_DOWN)
            return
        self.lifecycle.to(Phase.SHUTTING_DOWN)
        try:
            self._shutdown(grace_secs, timeout)
        except BaseException as e:  # interrupted or failed: the cluster is failed, never left half-stopped
            self._abort(e if isinstance(e, TFOSError) else TFOSError(f"shutdown() interrupted by {type(e).__name__}"))
            if isinstance(e, TFOSError) and self.lifecycle.error is not None:
                raise self.lifecycle.error from None
            raise

    def _shutdown(self, grace_secs: float, timeout: float) -> None:
        if timeout is None or timeout < 0:  # TensorFlowOnSpark: timeout=-1 waits forever
            timeout = float("inf")
        if self.input_mode == InputMode.SPARK:
            unreached = self.feeds.close_feeds()
            if unreached:  # those nodes would wait for data forever
                raise FeedError("could not end the feed of " + "; ".join(f"node {i}: {e}" for i, e in unreached)
                                + ". Their TF processes cannot finish; see the nodes' logs")
        reg = self.registry
        trainers = [i for i, (job, _) in enumerate(self.roles) if job in self.backend.finishing_jobs]
        others = [i for i in range(len(self.roles)) if i not in trainers]
        with reg.cond:
            waiting = reg.unfinished(trainers)
        if waiting:
            logger.info("tfos cluster %s: waiting up to %s for training nodes %s to finish (shutdown timeout=)",
                        self.cluster_id, "ever" if timeout == float("inf") else f"{timeout:.0f}s", waiting)
        deadline = time.monotonic() + timeout
        while True:
            with reg.cond:
                while reg.unfinished(trainers) and not reg.failures:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    reg.cond.wait(min(remaining, 1.0))  # inf timeout: wakes every second
                running = [] if reg.failures else reg.unfinished(trainers)
                failures = list(reg.failures)
            # InputMode.TENSORFLOW: main_fun runs again from its checkpoint (or, with no restart left,
            # _recover raises every attempt's failures). InputMode.SPARK restarts only while train()
            # feeds: after the last feed there is no data to resume from.
            if failures and self.input_mode == InputMode.TENSORFLOW:
                self._recover()
                continue
            break
        if running:
            raise TFOSTimeoutError(f"training nodes {running} still running after {timeout:.0f}s; "
                                   "raise shutdown(timeout=...)")
        if others and not reg.failures:
            with reg.cond:
                reg.cond.wait_for(lambda: not reg.unfinished(others), timeout=grace_secs)
        self._stop_nodes(range(len(self.roles)))
        if reg.failures:
            self.lifecycle.fail(NodeFailedError(self._every_failure()))
            self._release()
            raise self.lifecycle.error
        self._release()
        self.lifecycle.to(Phase.SHUT_DOWN)
        logger.info("tfos cluster %s shut down", self.cluster_id)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.shutdown()
        elif not self.lifecycle.ended:
            self._abort(TFOSError(f"aborted by {exc_type.__name__}"))

    # ------------------------------------------------------------------ internals
    def raise_if_failed(self) -> None:
        """Raise NodeFailedError if any node has failed; later calls raise it again. With restarts
        left (``max_restarts``) the cluster is restarted instead."""
        with self.registry.cond:
            failures = list(self.registry.failures)
        if failures:
            self._recover()

    def _feed_check_failed(self) -> None:
        """For a feed in progress: raise NodeFailedError if a node failed, leaving the restart (if
        one is allowed) to train(), which knows which epoch to feed again."""
        with self.registry.cond:
            failures = list(self.registry.failures)
        if not failures:
            return
        if self._restart_refusal(failures) is None:
            raise NodeFailedError(failures)
        self._recover()

    def _restart_refusal(self, failures) -> str | None:
        if self.lifecycle.phase not in (Phase.RUNNING, Phase.SHUTTING_DOWN):
            return "the cluster is not running"
        return restart_refusal(failures, len({r.attempt for r in self.restarts}), self.max_restarts)

    def _recover(self) -> None:
        """Nodes failed: stop every node of this attempt and start the next one (``ctx.attempt`` + 1),
        or, when no restart is allowed, fail the cluster with every attempt's failures (raises)."""
        with self._restart_lock:
            self._recover_locked()

    def _recover_locked(self) -> None:
        reg = self.registry
        attempt = self.config.attempt
        with reg.cond:
            failures = [dataclasses.replace(f, attempt=attempt) for f in reg.failures]
        if not failures:  # another thread restarted the cluster meanwhile
            return
        why_not = self._restart_refusal(failures)
        if why_not is not None:
            if self.max_restarts > 0:
                logger.error("tfos cluster %s cannot restart: %s", self.cluster_id, why_not)
            self._abort(NodeFailedError(self._every_failure()))
            raise self.lifecycle.error
        now = time.time()
        logger.warning("tfos cluster %s: restarting all nodes after the failure of %s (restart %d of %d)",
                       self.cluster_id, ", ".join(f"node {f.node_index} on {f.host}: {f.reason}" for f in failures),
                       attempt + 1, self.max_restarts)
        reg.abort("the cluster is restarting after a node failure")
        self._stop_nodes(range(len(self.roles)))
        with reg.cond:  # every node that failed by itself, not only the first one the driver heard of
            failures += [dataclasses.replace(f, attempt=attempt) for f in reg.ended_on_their_own()]
        self.restarts += [Restart(now, attempt, f.node_index, f.job_name, f.task_index, f.host, f.reason)
                          for f in sorted(failures, key=lambda f: f.node_index)]
        self._failed_before += failures
        job = self._reservation
        if job is not None:
            job.cancel()
        self.backend.teardown()
        time.sleep(self.restart_backoff)
        self.config = dataclasses.replace(self.config, cluster_id=f"{self.cluster_id}-{attempt + 1}",
                                          attempt=attempt + 1)
        self.feeds.cluster = self.config
        with reg.cond:  # an _abort() from another thread fails the lifecycle first, then the registry
            if self.lifecycle.ended:
                raise self.lifecycle.error or TFOSError("the cluster ended while restarting")
            reg.new_attempt(self.config.cluster_id)
        self.scheduler.new_attempt()
        err = self._launch()
        if isinstance(err, NodeFailedError):  # the new attempt failed while starting: restart again, or stop
            self._recover()
            return
        if err is not None:  # e.g. ReservationTimeoutError: Spark did not offer the slots again
            self._abort(err)
            raise self.lifecycle.error
        logger.info("tfos cluster %s: attempt %d started: %s", self.cluster_id, attempt + 1,
                    json.dumps(self.cluster_spec))

    def _tolerate_loss(self, failure) -> bool:
        """The registry's loss policy (its condition held): True to go on without the failed node
        (``lifecycle.loss_tolerated``), recording it in ``lost_nodes``."""
        reg = self.registry
        peers = [i for i, n in reg.nodes.items()
                 if n.job_name == failure.job_name and i != failure.node_index and n.exited is None and not n.stop]
        started = reg.all_registered() and self.lifecycle.phase in (Phase.RUNNING, Phase.SHUTTING_DOWN)
        if not loss_tolerated(failure.job_name, self.backend.survivable_jobs, len(peers), started, self.max_restarts):
            return False
        self.lost_nodes.append(NodeLoss(time.time(), self.config.attempt, failure.node_index, failure.job_name,
                                        failure.task_index, failure.host, failure.reason))
        logger.warning("tfos cluster %s: %s:%d on %s lost (%s); the %d other %s node(s) go on without it",
                       self.cluster_id, failure.job_name, failure.task_index, failure.host, failure.reason,
                       len(peers), failure.job_name)
        return True

    def _every_failure(self) -> list:
        """The failures of the restarted attempts, then this attempt's."""
        with self.registry.cond:
            return self._failed_before + [dataclasses.replace(f, attempt=self.config.attempt)
                                          for f in self.registry.failures]

    @property
    def attempt(self) -> int:
        """0 on the first start, k after the k-th restart."""
        return self.config.attempt

    def _monitor_loop(self) -> None:
        interval = max(0.2, self.config.heartbeat_interval)
        while not self._closing.wait(interval):
            self.registry.check_heartbeats(self.config.heartbeat_timeout)
            self._maybe_restart_in_background()

    def _maybe_restart_in_background(self) -> None:
        """InputMode.TENSORFLOW: restart as soon as a node fails, whether or not a call is waiting.
        (InputMode.SPARK restarts in train(), which knows which epoch to feed again.)"""
        if self.input_mode != InputMode.TENSORFLOW or self.max_restarts <= 0:
            return
        if self._restarter is not None and self._restarter.is_alive():
            return
        with self.registry.cond:
            failures = list(self.registry.failures)
        if not failures or self._restart_refusal(failures) is not None:
            return  # nothing to do, or the waiting call raises the failure

        def restart():
            try:
                self._recover()
            except TFOSError as e:  # the cluster failed; the next call raises it
                logger.debug("background restart ended the cluster: %s", e)

        self._restarter = threading.Thread(target=restart, name=f"tfos-restart-{self.cluster_id}", daemon=True)
        self._restarter.start()

    def _stop_nodes(self, which) -> None:
        """Ask the agents of ``which`` nodes to stop and wait until they report their exits."""
        which = list(which)
        reg = self.registry
        reg.request_stop(which)
        c = self.config
        timeout = c.heartbeat_interval * 2 + c.stop_grace_secs + 15
        with reg.cond:
            started = reg.started(which)
            done = reg.cond.wait_for(lambda: not reg.unfinished(started), timeout=timeout)
        if not done:
            logger.warning("tfos nodes %s did not confirm their exit within %.0fs", reg.unfinished(started), timeout)

    def _abort(self, err: TFOSError) -> None:
        """Fail the cluster (once): stop every node and release everything."""
        if not self.lifecycle.fail(err):
            return
        self.registry.abort(str(err).splitlines()[0] if str(err) else type(err).__name__)
        self._stop_nodes(range(len(self.roles)))
        restarter = self._restarter
        if restarter is not None and restarter is not threading.current_thread() and restarter.is_alive():
            restarter.join(timeout=60)  # it sees the failed lifecycle and ends; then stop what it started
            self._stop_nodes(range(len(self.roles)))
        self._release()

    def _release(self) -> None:
        self._closing.set()
        job = self._reservation
        if job is not None and not job.done.is_set():
            job.thread.join(timeout=10)
            job.cancel()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        self.backend.teardown()
        self._finish_reporting()
        if self._tensorboard is not None:
            self._tensorboard.stop()
            self._tensorboard = None
        self.service.stop()

    def _finish_reporting(self) -> None:
        """Close the progress bar, log the per-rank table, write the merged timeline."""
        from tfos.cluster.driver import progress as prog

        if self._progress is not None:
            self._progress.close()
            self._progress = None
        summary = self.registry.summary()
        table, self.timeline_path = prog.end_of_run(self.config.cluster_id, self.roles, summary, self.feeds.rows_total,
                                                    self.feeds.events, self._timeline_request)
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.close_run(self, summary, table)


TFCluster.TFCluster = TFCluster  # TensorFlowOnSpark's module.class name: `TFCluster.TFCluster` after the rename


def _short(e: BaseException) -> str:
    remote = remote_error(e)
    if remote is not None:
        return str(remote)[:1000]
    text = str(e).strip().splitlines()
    for line in text:
        if "TFOSError" in line or "Error:" in line:
            return line.strip()[:500]
    return (text[0] if text else type(e).__name__)[:500]


def _node_logs_hint(cluster_id: str) -> str:
    return f" Node logs: {node_dir_hint(cluster_id)}/ on each executor host."
