"""The public driver API: reserve a Spark cluster as a TF cluster, start it, feed it, shut it down.

Runs in the Spark driver. ``TFCluster`` is the facade: the public methods' signatures and
docstrings (reserve, run, run_script, start, train, inference, shutdown) and the order of things
at reserve time. The work lives behind it: the control loop (``controller``, the one actor:
attempts, restarts, resizes, the end) and the API's waits on it (``supervisor``), the node
registry and feed scheduler behind the control service (``registry``,
``tfos.feed.driver.scheduler``, ``service``), the feeding jobs
(``tfos.feed.driver.jobs``), and the progress bar, timeline and TensorBoard (``progress``,
``tensorboard``), the MLflow run (``tracking``), reserve()'s settings in groups and their one
table of checks (``options``) and the checks that need several settings (``settings``).

Past 450 lines only by reserve()'s argument list and its docstring (the public API's reference);
the work behind each method lives in the modules named above.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import tempfile

from tfos import topology
from tfos.cluster.driver import options, security as sec
from tfos.cluster.driver.options import (DistributionConfig, FailureConfig, RunConfig, ScalingConfig,
                                         SecurityConfig)
from tfos.cluster.driver import spark as S
from tfos.cluster.driver.lifecycle import Phase
from tfos.cluster.driver.progress import quiet_py4j
from tfos.cluster.driver.registry import NodeRegistry
from tfos.cluster.driver.service import listen
from tfos.cluster.driver.settings import (ClusterShape, RestartSettings, Supervision, check_picklable,
                                          cluster_config, gpus_with_reducers, require_mlflow, seconds as _seconds,
                                          size_range, validate_reserve)
from tfos.cluster.driver.supervisor import Supervisor
from tfos.errors import ClusterStateError, ConfigError, NodeFailedError, TFOSError
from tfos.feed.driver.jobs import FeedJobs
from tfos.feed.driver.resume import FeedPositions, feed_across_restarts
from tfos.feed.driver.scheduler import FeedScheduler
from tfos.data.uneven import check_policy
from tfos.topology import InputMode
from tfos.wire import messages as M

logger = logging.getLogger(__name__)
_SAID: set = set()  # warnings said once per process (what Spark's RPC leaves open)


class TFCluster:
    """A TensorFlow cluster running on Spark executors.

    ``TFCluster.reserve(sc, num_executors, num_ps)`` then ``cluster.start(main_fun, args)``, or
    ``TFCluster.run(sc, main_fun, args, num_executors, num_ps, ...)`` as in TensorFlowOnSpark.
    """

    InputMode = InputMode

    def __init__(self, spark, shape: ClusterShape, backend, cluster: M.ClusterConfig, default_input_mode: InputMode,
                 timeline_path: str | None, progress: bool, address: S.ControlAddress, *,
                 restarts: RestartSettings, supervision: Supervision):
        self.spark = S.spark_entry(spark)  # ClassicSpark or ConnectSpark
        roles = list(cluster.roles)
        self.backend = backend
        self.cluster_id = cluster.cluster_id
        self.registry = NodeRegistry(cluster.cluster_id, roles, max_wait=cluster.reservation_timeout)
        feed_ranks = [i for i, (job, _) in enumerate(roles) if job in backend.feed_jobs]
        self.scheduler = FeedScheduler(self.registry, feed_ranks)
        positions = FeedPositions(self.registry)  # each rank's consumed rows at its checkpoints (resumable feeds)
        self.service = listen(self.registry, {**self.scheduler.handlers(), **positions.handlers()}, cluster.key,
                              address)
        config = dataclasses.replace(cluster, driver_port=self.service.port)  # the port the OS picked
        self.driver_host = cluster.driver_host
        self.supervisor = Supervisor(self.spark, shape, backend, config, self.registry, self.scheduler,
                                     restarts=restarts, supervision=supervision, on_attempt=self._on_attempt,
                                     on_release=self._on_release, close_feeds=lambda: self.feeds.close_feeds(),
                                     at_safe_point=lambda step: self.feeds.ready_to_restart(step))
        self.feeds = FeedJobs(self.spark, self.registry, self.scheduler, positions, config,
                              self.supervisor.feed_check_failed,
                              self._abort)
        self.lifecycle = self.supervisor.lifecycle
        self._default_input_mode = default_input_mode
        self._tensorboard = None
        self._progress_enabled = progress
        self._progress = None
        self._timeline_request = timeline_path
        self.timeline_path: str | None = None
        self._tracker = None  # tfos.cluster.driver.tracking.MlflowTracker when mlflow=True / mlflow_run=
        self._mlflow_run_id: str | None = None

    # what the supervisor holds, as the cluster's attributes
    config = property(lambda self: self.supervisor.config, doc="this attempt's ClusterConfig")
    roles = property(lambda self: self.supervisor.roles,
                     doc="this attempt's roles by node index (fewer after a restart at a smaller size)")
    input_mode = property(lambda self: self.supervisor.input_mode, doc="set by start()")
    restarts = property(lambda self: self.supervisor.restarts, doc="each failure that restarted the cluster")
    resizes = property(lambda self: self.supervisor.resizes,
                       doc="each planned restart at another size (the cluster grew back: docs/elastic.md)")
    evictions = property(lambda self: self.supervisor.evictions,
                         doc="each save before nodes went, after which the cluster went on without them")
    lost_nodes = property(lambda self: self.supervisor.lost_nodes,
                          doc="each node lost while the others went on (backend='ps' workers)")
    max_restarts = property(lambda self: self.supervisor.max_restarts)

    @property
    def attempt(self) -> int:
        """0 on the first start, k after the k-th restart."""
        return self.supervisor.config.attempt

    @classmethod
    def reserve(cls, sc, num_executors=None, num_ps: int = 0, *, scaling: ScalingConfig | None = None,
                failures: FailureConfig | None = None, security: SecurityConfig | None = None,
                distribution: DistributionConfig | None = None, run: RunConfig | None = None,
                min_executors: int | None = None,
                size_wait: float = 15.0, grow_interval: float | None = 60.0, eviction_grace: float = 30.0,
                master_node: str | None = "chief",
                eval_node: bool = False, reservation_timeout: float = 600, num_gpus: int = 0,
                env: dict | None = None, log_dir: str | None = None, release_port: bool = True,
                heartbeat_interval: float = 1.0, heartbeat_timeout: float = 30.0,
                stop_grace_secs: float = 5.0, input_mode=None, tensorboard: bool = False,
                backend=None, transport: str = "grpc", backend_options: dict | None = None,
                progress: bool = True, timeline: str | None = None, report_interval: float = 1.0,
                tensorboard_host: str | None = None, tensorboard_port: int = 0, mlflow: bool = False,
                mlflow_run=None, mlflow_experiment: str | None = None, max_restarts: int = 0,
                restart_backoff: float = 5.0, checkpoint_dir: str | None = None,
                preimport_tensorflow: bool = True, stall_timeout: float | None = 300,
                node_output: str | None = "chief", encrypt: bool | None = None,
                allow_unprotected: bool = False, gpus_per_node=None, num_reducers: int = 0) -> "TFCluster":
        """Reserve ``num_executors`` Spark task slots as one TF cluster node each.

        ``sc``: a SparkContext, a SparkSession, or a Spark Connect SparkSession (then the data
        to feed must be DataFrames; the control service runs in this client, see docs/design.md).

        ``num_executors`` may be a range: ``min_executors=M`` (or ``num_executors=(M, N)``) starts
        with as many nodes as Spark offers within ``size_wait`` seconds (at least M, at most N),
        and a restart after a failure (``max_restarts``) runs on the slots Spark offers once
        ``restart_backoff`` passed, at least M, instead of waiting for the lost ones
        (docs/elastic.md). Only the last workers come and go; every other node keeps its role.
        A cluster running smaller asks Spark every ``grow_interval`` seconds (None: never) whether
        it offers more slots, and grows back at rank 0's next ``ctx.checkpoint_saved()`` by a
        planned restart from that checkpoint (``cluster.resizes``; no ``max_restarts`` used).
        A node told to go (a termination signal to its agent, its executor ending) gives the
        training ranks up to ``eviction_grace`` seconds to checkpoint at one step when their
        program asks ``ctx.should_checkpoint(step)``; the cluster then goes on without it from that
        checkpoint, no step lost (``cluster.evictions``; 0: never wait).

        Roles: ``num_ps`` ps nodes, then the ``master_node`` ('chief', or None for workers only),
        an evaluator if ``eval_node``, then workers. Fails with ReservationTimeoutError when
        Spark cannot offer enough slots within ``reservation_timeout`` seconds.

        ``num_reducers``: R more nodes (R more task slots in the same barrier stage, role
        'reducer', on hosts without training nodes where Spark's placement allows it) that run no
        ``main_fun`` and no TF server, only the reduction server: the workers' all-reduces
        (``implementation='reduction_server'``, the default 'auto' when there are reducers) go
        through them, moving half a ring's bytes per worker (docs/reduction_server.md). They use
        no GPU, and stop with the cluster. Backend 'mwms' only.

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

        ``stall_timeout``: no training rank's progress (feed reads, ``ctx.report``, Keras callbacks) for
        this long while every node lives fails the cluster with StallError and every rank's stacks.
        ``node_output``: whose prints show here as they come ('chief': rank 0, 'all', None); every
        node's whole log is kept on its host (the paths are logged at the end).

        ``encrypt`` (default: on): every tfos channel (control, heartbeats, feeds, inference) is
        encrypted with keys of its own, and TensorFlow's gRPC and Gloo listen only in each node's
        private network, carried between hosts by an encrypting node tunnel (docs/security.md).
        ``encrypt=False`` turns all of it off. With encryption on, a backend whose traffic tfos cannot
        protect (Horovod, NCCL, RDMA) is refused unless ``allow_unprotected=True``, which also silences
        the warning about hosts that give no private network namespace.
        ``tensorboard_host`` (default 127.0.0.1): where TensorBoard listens; name an address of the
        driver to show it to other machines. It has no authentication: every user of the driver's
        host can read it even on loopback (docs/security.md says how to keep it to yourself).

        ``gpus_per_node``: how many of the GPUs Spark assigned its task each node uses (a count for
        all, or one per node; 0 hides them, None uses all; reducers use none and take no place in
        the list). Spark's GPU addresses are read through the executor's own ``CUDA_VISIBLE_DEVICES``
        when it sets one.

        ``preimport_tensorflow``: each TF process imports TensorFlow in a background thread once
        it has registered, while it waits for the other nodes, so main_fun starts with TF loaded.
        TF then reads its import-time environment before main_fun runs: put such settings
        (``TF_ENABLE_ONEDNN_OPTS``, ``TF_CPP_MIN_LOG_LEVEL``) in ``env``, or pass False.

        The same settings in groups: ``scaling=ScalingConfig(...)``, ``failures=FailureConfig(...)``,
        ``security=SecurityConfig(...)``, ``distribution=DistributionConfig(...)``,
        ``run=RunConfig(...)`` (tfos.cluster.driver.options; each field is the keyword of its name).
        """
        groups = {"scaling": scaling, "failures": failures, "security": security, "distribution": distribution,
                  "run": run}
        given = {k: v for k, v in locals().items() if k in _RESERVE_DEFAULTS}
        if any(g is not None for g in groups.values()):
            return cls.reserve(sc, **options.keywords(groups, given, _RESERVE_DEFAULTS))
        options.check(given)
        min_nodes, num_executors = size_range(num_executors, min_executors)
        validate_reserve(num_executors, num_ps, master_node, eval_node, reservation_timeout,
                         InputMode.TENSORFLOW if input_mode is None else input_mode, num_gpus, max_restarts,
                         num_reducers)
        # the reducers are nodes too: from here on the counts include them
        num_executors, min_nodes = num_executors + num_reducers, min_nodes + num_reducers
        gpus_per_node = gpus_with_reducers(gpus_per_node, num_ps, num_reducers)
        shape = ClusterShape(num_ps, master_node, eval_node, num_reducers)
        if min_nodes < shape.smallest:
            raise ConfigError(f"min_executors={min_nodes} leaves no node to train after {num_ps} ps node(s)"
                              f"{' and 1 evaluator' if eval_node else ''}; raise min_executors")
        restarts = RestartSettings(max_restarts, _seconds("restart_backoff", restart_backoff, allow_zero=True),
                                   min_nodes, num_executors, _seconds("size_wait", size_wait, allow_zero=True),
                                   None if grow_interval is None else _seconds("grow_interval", grow_interval))
        supervision = Supervision(None if stall_timeout is None else _seconds("stall_timeout", stall_timeout),
                                  bool(allow_unprotected))
        if tensorboard:
            from tfos.cluster.driver.tensorboard import require_tensorboard

            require_tensorboard()
        if mlflow or mlflow_run is not None:
            require_mlflow()
        quiet_py4j()
        spark = S.spark_entry(sc)
        if restarts.elastic and spark.slots_offered() is None:
            raise ConfigError("min_executors needs a Spark that says how many task slots it offers (a classic "
                              "SparkContext/SparkSession); a Spark Connect client cannot ask: leave min_executors out")
        if (spark.conf().get("spark.dynamicAllocation.enabled") or "false").lower() == "true":
            # measured on Spark 4.3 (Kubernetes, shuffle tracking): the reservation's barrier stage fails
            # late with BarrierJobRunWithDynamicAllocationException; say it before any job starts
            raise ConfigError("spark.dynamicAllocation.enabled=true: Spark runs no barrier stage under dynamic "
                              "allocation (SPARK-24942), and tfos reserves its nodes with one. Set "
                              "spark.dynamicAllocation.enabled=false for the tfos job and a fixed "
                              "spark.executor.instances; min_executors (with grow_interval) lets the cluster "
                              "shrink and grow with the executors Spark has instead")
        from tfos.backends import make_backend

        backend_obj = make_backend(backend, transport, **(backend_options or {}))
        backend_obj.validate(num_executors - num_reducers, num_ps, master_node)
        if num_reducers and not backend_obj.takes_reducers:
            raise ConfigError(f"num_reducers needs backend='mwms' (keras_dist or MWMS all-reducing through the "
                              f"reducers); backend {backend_obj.name!r} does not all-reduce through them: set "
                              "num_reducers=0")
        spark_conf = spark.conf()
        encrypted, note = sec.encryption(encrypt, spark_conf)
        if note:
            logger.warning("tfos: %s", note)
        exposure = sec.spark_rpc_exposure(spark_conf, encrypted)
        if exposure:  # once per process: a notebook starting cluster after cluster hears it once
            (logger.info if exposure in _SAID else logger.warning)("tfos: %s", exposure)
            _SAID.add(exposure)
        refused, accepted = sec.refusal(backend_obj.unprotected(num_gpus), encrypted, bool(allow_unprotected))
        if refused:
            raise ConfigError(refused)
        if accepted:
            logger.warning("tfos: %s", accepted)
        if restarts.elastic:
            size = S.wait_for_size(spark.slots_offered, min_nodes, num_executors, reservation_timeout, size_wait)
            logger.info("tfos: starting %d of %d nodes (min_executors=%d)", size, num_executors, min_nodes)
        else:
            size = num_executors
            slots = spark.wait_for_slots(num_executors, reservation_timeout)
            if slots is not None:
                logger.info("tfos: %d task slots available for %d nodes", slots, num_executors)
        roles = shape.roles(size)
        address = spark.control_address(os.environ)
        log_dir = log_dir or tempfile.mkdtemp(prefix="tfos-logs-")
        config = cluster_config(address, shape.roles(num_executors), reservation_timeout=reservation_timeout,
                                log_dir=log_dir, default_fs=spark.default_fs(), num_gpus=num_gpus, env=env,
                                release_port=release_port, preimport_tensorflow=preimport_tensorflow,
                                heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout,
                                stop_grace_secs=stop_grace_secs, timeline=timeline, report_interval=report_interval,
                                metric_history=mlflow or mlflow_run is not None, checkpoint_dir=checkpoint_dir,
                                node_output=node_output, encrypt=encrypted, gpus_per_node=gpus_per_node,
                                eviction_grace=eviction_grace)
        config = dataclasses.replace(config, roles=tuple(roles))  # gpus_per_node was sized for num_executors
        default_mode = InputMode.TENSORFLOW if input_mode is None else InputMode(input_mode)
        cluster = cls(spark, shape, backend_obj, config, default_mode, timeline, progress, address,
                      restarts=restarts, supervision=supervision)
        if mlflow or mlflow_run is not None:
            cluster._open_tracker(mlflow_run, mlflow_experiment, {
                "num_executors": num_executors - num_reducers, "num_ps": num_ps, "num_reducers": num_reducers,
                "master_node": master_node, "eval_node": eval_node,
                "backend": backend_obj.name, "transport": transport, "num_gpus": num_gpus,
                "reservation_timeout": reservation_timeout,
                "log_dir": log_dir, "backend_options": backend_options or {}})
        if tensorboard:
            from tfos.cluster.driver.tensorboard import TensorBoard

            try:
                cluster._tensorboard = TensorBoard(log_dir.replace("file://", ""),
                                                   tensorboard_host or "127.0.0.1", tensorboard_port)
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
                   master_node: str | None = None, timeout: float = 259200, grace_secs: float = 5,
                   **kwargs) -> None:
        """Run an unchanged TF script (one that reads ``TF_CONFIG``, as written for a plain
        multi-worker setup) on ``num_executors`` executors, the way TorchDistributor runs torchrun
        scripts; returns when every chief/worker copy exited with code 0.

        The driver reads ``script`` and the ``.py`` modules beside it and sends them along, so
        they need not exist on the executors (installed packages must). Each node runs ``python -u
        script *argv`` from a copy of that folder with its role's ``TF_CONFIG``; the output goes
        into the node logs. The layout is workers only (``master_node=None``), what TensorFlow's
        multi-worker tutorials expect: they size the global batch by ``len(cluster['worker'])``;
        ``master_node='chief'`` adds a chief. A non-zero exit raises NodeFailedError
        naming the node, the exit code and the script's last lines. ``timeout`` bounds the wait
        for the trainers (shutdown's timeout); ``kwargs`` go to :meth:`reserve` (``num_gpus``,
        ``env``, ``eval_node``, ``reservation_timeout``, ...). InputMode.TENSORFLOW.
        """
        from tfos.cluster.driver.script_job import run_script

        run_script(cls, sc, script, argv, num_executors, num_ps, master_node, timeout, grace_secs, kwargs)

    # ------------------------------------------------------------------ lifecycle
    def start(self, main_fun, tf_args=None, input_mode=None) -> "TFCluster":
        """Start one TF process per node running ``main_fun(tf_args, ctx)``; returns when every node
        has registered (the cluster spec is complete). ``input_mode`` defaults to the one given to
        reserve(), else InputMode.TENSORFLOW."""
        self.lifecycle.require(Phase.RESERVED, "start")
        if not callable(main_fun):
            raise ConfigError(f"main_fun must be callable, got {main_fun!r}")
        check_picklable(main_fun, tf_args)
        try:
            input_mode = InputMode(self._default_input_mode if input_mode is None else input_mode)
        except ValueError:
            raise ConfigError(f"input_mode must be InputMode.TENSORFLOW or InputMode.SPARK, got {input_mode!r}") from None
        if self._tracker is not None:
            from tfos.cluster.driver.tracking import args_params

            self._tracker.log_params(dict(args_params(tf_args), input_mode=input_mode.name))

        from tfos.cluster.driver.progress import NodeOutput, ProgressMonitor

        def show_progress():
            if self._progress_enabled:
                self._progress = ProgressMonitor(self).start()

        self.registry.on_output = NodeOutput(self)
        self.supervisor.start((main_fun, tf_args, self.backend.node_hooks()), input_mode, show_progress)
        self.feeds.cluster = self.config
        return self

    def _on_attempt(self, config: M.ClusterConfig) -> None:
        """The supervisor started a new attempt (a restart): the feeds address its nodes."""
        self.feeds.cluster = config

    def _open_tracker(self, run, experiment, params: dict) -> None:
        from tfos.cluster.driver.tracking import attach

        self._tracker = attach(self.registry, self.roles, self.cluster_id, run, experiment, params)
        self._mlflow_run_id = self._tracker.run_id
        import mlflow

        uri = mlflow.get_tracking_uri()
        if self.config.key.encrypt and sec.plain_http_elsewhere(uri):
            logger.warning("tfos: the MLflow tracking server %s is reached over plain HTTP: the run's parameters, "
                           "metrics and model travel in clear although the cluster is encrypted; use https://", uri)

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
        return self.supervisor.cluster_spec

    @property
    def nodes(self) -> list[dict]:
        """Registered node descriptions (node_index, job_name, task_index, host, ports, pid)."""
        return self.registry.node_dicts()

    @property
    def results(self) -> dict[int, object]:
        """What nodes handed over with ``ctx.send_result(value)`` in the current attempt, by node index."""
        with self.registry.cond:
            return dict(self.registry.results)

    def metrics(self) -> dict[int, dict]:
        """Latest values each node sent with ``ctx.report(...)``, by node index."""
        return self.registry.metrics()

    def dump_stacks(self, timeout: float = 10.0) -> str:
        """Every running node's Python stacks (every thread of its TF process) and last log lines,
        with where each rank stands: what the stall watchdog reports, on demand (e.g. from a notebook
        while training seems stuck). Nodes that do not answer within ``timeout`` are named."""
        return self.supervisor.stall_report(None, timeout)

    @property
    def feed_rows_total(self) -> dict[int, int]:
        """Rows fed to each node over all train() calls."""
        return self.feeds.rows_total

    def train(self, data, num_epochs: int = 1, feed_timeout: float = 600, qname: str = "input",
              chunk_rows: int | None = None, uneven: str | None = "drop", shared_memory: bool = True) -> int:
        """Stream ``data`` (an RDD of tuples/lists/dicts/arrays, or a DataFrame) into the training
        nodes ``num_epochs`` times (InputMode.SPARK). Every row reaches exactly one node once per
        epoch, shares balanced across nodes; then every node's feed ends. Returns the rows fed.

        Every node reads the same number of batches (``next_batch``/``batches``/``dataset``), so no
        rank waits in a collective for a rank whose data ran out. ``uneven`` says what happens to
        rows that would break that: ``"drop"`` (the surplus: the shares part by ~0.4% at most),
        ``"pad"`` (short nodes repeat a row with weight 0; batches get a ``sample_weight`` column),
        ``"error"`` (UnevenDataError on every node, with each node's rows) or None (no gate; only
        for nodes that run no collective per batch). Dropped and padded rows are logged and in
        ``cluster.metrics()`` (``rows_dropped``, ``rows_padded``).

        A feeding task on a TF process's host writes its chunks into shared memory the TF process
        reads without a copy (``shared_memory=False``: over the channel, like other hosts' tasks;
        docs/design.md, "The feed through shared memory").

        Raises FeedTimeoutError if a node accepts no data for ``feed_timeout`` seconds, FeedError
        for rows that cannot be converted, NodeFailedError if a node fails meanwhile.

        With ``max_restarts`` or a size range (``min_executors``), each epoch is its own Spark job;
        when the cluster restarts (a node failed, it shrinks, grows or saves before an eviction) the program resumes from its
        checkpoint and the feed resumes where that checkpoint is: if every rank calls
        ``ctx.checkpoint_saved(step)`` after each save, the new attempt is fed the rest of the
        interrupted epoch (without the rows the checkpoint has trained on), then the later epochs,
        so every row reaches one rank once per epoch (docs/elastic.md); otherwise the interrupted
        epoch again in full. Returns the rows sent by the epoch jobs that completed, over every
        attempt (a job cut short by a restart is not counted: its epoch, or its rest, is fed again).
        """
        self._check_running("train")
        if not isinstance(num_epochs, int) or num_epochs < 1:
            raise ConfigError(f"num_epochs must be a positive int, got {num_epochs!r}")
        uneven = check_policy(uneven)
        restarts = self.supervisor.settings  # a failure, or a resize of a size range, restarts the cluster
        resume = self.feeds.resume(num_epochs) if restarts.max_restarts > 0 or restarts.elastic else None
        try:
            return feed_across_restarts(self.supervisor, lambda resume: self.feeds.train(
                data, num_epochs, feed_timeout, qname, chunk_rows, resume=resume, uneven=uneven,
                shared_memory=shared_memory), resume)
        finally:
            self.feeds.resuming = None

    def inference(self, data, feed_timeout: float = 600, qname: str = "input", chunk_rows: int | None = None,
                  output_column: str = "prediction", output_type: str | None = None, shared_memory: bool = True):
        """One result per input row, in input order within each partition (InputMode.SPARK).

        RDD in -> RDD of results (lazy, like any RDD). DataFrame in -> the same DataFrame plus
        ``output_column`` of Spark SQL type ``output_type`` (e.g. 'double', 'array<float>').
        main_fun answers with ``feed.batch_results(...)``. ``shared_memory``: as in :meth:`train`.
        """
        self._check_running("run inference")
        return self.feeds.inference(data, feed_timeout, qname, chunk_rows, output_column, output_type, shared_memory)

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
            self.supervisor.release_unstarted()
            self.lifecycle.to(Phase.SHUT_DOWN)
            return
        self.lifecycle.to(Phase.SHUTTING_DOWN)
        try:
            self.supervisor.shutdown(grace_secs, timeout)
        except BaseException as e:  # interrupted or failed: the cluster is failed, never left half-stopped
            self._abort(e if isinstance(e, TFOSError) else TFOSError(f"shutdown() interrupted by {type(e).__name__}"))
            if isinstance(e, TFOSError) and self.lifecycle.error is not None:
                raise self.lifecycle.error from None
            raise

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
        self.supervisor.raise_if_failed()

    def _abort(self, err: TFOSError) -> None:
        """Fail the cluster (once): stop every node and release everything."""
        self.supervisor.abort(err)

    def _on_release(self) -> None:
        from tfos.cluster.driver.progress import finish_reporting

        finish_reporting(self)
        if self._tensorboard is not None:
            self._tensorboard.stop()
            self._tensorboard = None
        self.service.stop()

TFCluster.TFCluster = TFCluster  # TensorFlowOnSpark's module.class name: `TFCluster.TFCluster` after the rename

#: reserve()'s settings and their defaults: the groups' fields map onto them (options.keywords)
_RESERVE_DEFAULTS = {name: p.default for name, p in inspect.signature(TFCluster.reserve).parameters.items()
                     if name != "sc" and name not in options.GROUPS}
