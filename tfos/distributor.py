"""The shapes Spark users already know, on tfos clusters (driver).

* :class:`TFDistributor`: PySpark's ``TorchDistributor(num_processes, local_mode, use_gpu).run(
  train_object, *args)`` for TensorFlow: a function run on every rank (rank 0's return value comes
  back) or the path of an unchanged TF script (``*args`` its argv).
* :class:`MirroredStrategyRunner`: spark-tensorflow-distributor's runner (``num_slots`` GPUs or CPU
  tasks, an MWMS scope around ``train_fn`` unless ``use_custom_strategy``), as its documentation
  and integration tests describe it, with tfos's encryption in place of its refusal of TLS clusters.

Underneath both is a :class:`~tfos.api.TFCluster` in InputMode.TENSORFLOW, workers
only (the layout a TF script expects: rank 0 is worker 0), so restarts (``max_restarts``), the
stall watchdog, node output and errors with each node's last lines work as they do there. Extra
keyword arguments go to ``TFCluster.reserve``. The decisions (how many nodes, which GPUs each) are
pure functions below, tested from tables.
"""

from __future__ import annotations

import logging
import math
import os

from tfos.errors import ConfigError

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- decisions (pure)

def conf_of(entry, key: str) -> str | None:
    """One Spark setting of a session entry: a Connect session answers single keys only."""
    get = getattr(entry, "get", None)
    return get(key) if callable(get) else entry.conf().get(key)


def task_gpu_amount(conf: dict, resource: str = "gpu") -> float | None:
    """``spark.task.resource.<resource>.amount`` as a number, None when unset."""
    value = conf.get(f"spark.task.resource.{resource}.amount")
    if value is None or str(value).strip() == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"spark.task.resource.{resource}.amount={value!r} is not a number") from None


def distributor_nodes(num_processes: int, use_gpu: bool, gpus_per_task: float | None) -> int:
    """TFDistributor's node count: one per process on CPU; with GPUs a process is a GPU, and a node
    (a Spark task) holds ``spark.task.resource.gpu.amount`` of them (its TF process drives them all)."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ConfigError(f"num_processes must be a positive int, got {num_processes!r}")
    if not use_gpu:
        return num_processes
    if gpus_per_task is None or gpus_per_task < 1:
        raise ConfigError("use_gpu=True takes the GPUs from Spark's task resources, but spark.task.resource.gpu.amount "
                          "is unset (or below 1): set it (with spark.executor.resource.gpu.amount and a discovery "
                          "script), or use_gpu=False")
    per_task = int(gpus_per_task)
    if num_processes % per_task:
        raise ConfigError(f"num_processes={num_processes} GPUs cannot be split into tasks of "
                          f"spark.task.resource.gpu.amount={per_task}: use a multiple of {per_task}")
    return num_processes // per_task


def runner_tasks(num_slots: int, use_gpu: bool, gpus_per_task: float | None, resource: str = "gpu") -> list[int]:
    """MirroredStrategyRunner's tasks: the GPUs each uses (``[0] * num_slots`` on CPU). With GPUs,
    ``ceil(num_slots / gpus per task)`` tasks share the slots as evenly as possible, the first ones
    taking one more (slots 6 on tasks of 4 GPUs -> [3, 3]; 5 -> [3, 2]). ValueError for no slots."""
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
        raise ValueError(f"num_slots is set to {num_slots!r} but must be a positive int")
    if not use_gpu:
        return [0] * num_slots
    if gpus_per_task is None:
        raise ConfigError(f"use_gpu=True takes the GPUs from Spark's task resources, but "
                          f"spark.task.resource.{resource}.amount is unset: enable GPU scheduling "
                          f"(spark.executor.resource.{resource}.amount, spark.task.resource.{resource}.amount and a "
                          "discovery script), or use_gpu=False")
    if gpus_per_task < 1:
        raise ConfigError(f"spark.task.resource.{resource}.amount={gpus_per_task:g}: MirroredStrategyRunner needs "
                          "at least one whole GPU per task")
    tasks = math.ceil(num_slots / int(gpus_per_task))
    return [num_slots // tasks + (1 if i < num_slots % tasks else 0) for i in range(tasks)]


def local_gpus(addresses, count: int, per_node: int, inherited: str | None) -> list[tuple[str, ...]]:
    """Local mode: ``count`` nodes of ``per_node`` GPUs each, from the driver's GPU ``addresses``
    (its Spark resources), in order; ConfigError when it has too few."""
    from tfos.host.gpus import visible_devices

    need = count * per_node
    if len(addresses) < need:
        raise ConfigError(f"local mode needs {need} GPU(s) on the driver ({count} x {per_node}) and Spark gave it "
                          f"{len(addresses)} (spark.driver.resource.gpu.amount): ask for fewer, or use_gpu=False")
    ids = visible_devices(list(addresses)[:need], None, inherited)
    return [tuple(ids[i * per_node:(i + 1) * per_node]) for i in range(count)]


# --------------------------------------------------------------------------- the session

def _task_conf(entry, resource: str) -> dict:
    key = f"spark.task.resource.{resource}.amount"
    value = conf_of(entry, key)
    return {} if value is None else {key: value}


def _session(spark):
    """The session to run on: the given one, else this thread's active session, else the default
    one (the first made in this process), classic or Spark Connect: as ``SparkSession.active()``
    finds it, so a notebook's background thread runs on the notebook's session."""
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    found = SparkSession.getActiveSession() or getattr(SparkSession, "_instantiatedSession", None)
    if found is None:
        try:
            from pyspark.sql.connect.session import SparkSession as ConnectSession
        except ImportError:  # pyspark without the connect extra
            ConnectSession = None
        if ConnectSession is not None:
            found = ConnectSession.getActiveSession() or ConnectSession._get_default_session()
    if found is None:
        raise ConfigError("no SparkSession: create one first (SparkSession.builder...getOrCreate()), or pass "
                          "spark=...")
    return found


def _driver_gpus(entry, resource: str) -> list[str]:
    sc = getattr(entry, "sc", None)
    if sc is None:
        raise ConfigError("local mode with GPUs reads the driver's GPUs from its SparkContext resources, which a Spark "
                          "Connect client does not have: run the notebook on the driver, or use_gpu=False")
    res = sc.resources
    if resource not in res or not res[resource].addresses:
        raise ConfigError(f"no GPU was found on the driver: set spark.driver.resource.{resource}.amount and "
                          f"spark.driver.resource.{resource}.discoveryScript, or use_gpu=False")
    return list(res[resource].addresses)


def _run(spark, train_object, args, kwargs, num_nodes: int, local_mode: bool, node_gpus, gpus_per_node,
         strategy_scope: bool, reserve_options: dict):
    """Run ``train_object`` on a fresh cluster of ``num_nodes``; rank 0's return value (None for a script)."""
    from tfos.api import TFCluster
    from tfos.cluster.driver.local import LocalHost
    from tfos.cluster.driver.spark import spark_entry
    from tfos.cluster.node.function import RankFunction
    from tfos.topology import InputMode

    entry = spark_entry(_session(spark))
    target = LocalHost(entry, node_gpus) if local_mode else entry
    options = {"master_node": None, **reserve_options}
    if gpus_per_node is not None:
        options.setdefault("gpus_per_node", gpus_per_node)
    if isinstance(train_object, str):
        if kwargs:
            raise ConfigError("a script takes its arguments as *args (its argv), not keyword arguments")
        TFCluster.run_script(target, train_object, [str(a) for a in args], num_nodes, **options)
        return None
    if not callable(train_object):
        raise ConfigError(f"train_object must be a function or the path of a TF script, got {train_object!r}")
    options["input_mode"] = InputMode.TENSORFLOW
    cluster = TFCluster.reserve(target, num_nodes, **options)
    with cluster:
        cluster.start(RankFunction(train_object, tuple(args), dict(kwargs), strategy_scope))
        cluster.shutdown()
    results = cluster.results
    return results.get(_rank0(cluster.roles))


def _rank0(roles) -> int:
    from tfos import topology

    return next(i for i, (job, index) in enumerate(roles) if topology.training_rank(job, index, roles) == 0)


# --------------------------------------------------------------------------- the API

class TFDistributor:
    """Distributed TensorFlow training on Spark, in TorchDistributor's shape.

    ``TFDistributor(num_processes=2).run(train_fn, *args)`` runs ``train_fn(*args)`` once per process,
    each in a TF process of its own with its ``TF_CONFIG`` (workers only: rank 0 is worker 0), and
    returns rank 0's return value. ``run("train.py", "--epochs", "3")`` runs an unchanged TF script on
    every process instead (returns None; a non-zero exit raises NodeFailedError with its last lines).

    ``local_mode=True`` runs the processes on this machine (a notebook whose driver has the GPUs),
    without Spark tasks; otherwise each is a Spark task of one barrier stage. ``use_gpu=True`` takes
    the GPUs from Spark's task resources (``spark.task.resource.gpu.amount`` per task; a process is a
    GPU, so ``num_processes`` is the GPU count and a task's TF process drives its GPUs together) or,
    in local mode, from the driver's (``spark.driver.resource.gpu.amount``); ``use_gpu=False`` hides
    every GPU. The session is the active one (classic or Spark Connect) unless ``spark=`` names one;
    other keyword arguments go to :meth:`TFCluster.reserve` (``max_restarts``, ``env``, ...).

    The return value travels without pickle (tfos's channels never unpickle): numbers, strings,
    bytes, numpy arrays and lists/tuples/dicts of them. Save a model and return its path.
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = False, use_gpu: bool = False, *, spark=None,
                 **reserve_options):
        distributor_nodes(num_processes, False, None)  # checks the count before any session is touched
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.spark = spark
        self.reserve_options = reserve_options

    def run(self, train_object, *args, **kwargs):
        from tfos.cluster.driver.spark import spark_entry

        entry = spark_entry(_session(self.spark))
        node_gpus = None
        if self.local_mode:
            nodes = self.num_processes
            if self.use_gpu:
                # Spark's own addresses: each node's agent inherits this environment and reads them through
                # CUDA_VISIBLE_DEVICES itself (host/gpus.visible_devices), once
                node_gpus = local_gpus(_driver_gpus(entry, "gpu"), nodes, 1, None)
        else:
            nodes = distributor_nodes(self.num_processes, self.use_gpu,
                                      task_gpu_amount(_task_conf(entry, "gpu")) if self.use_gpu else None)
        logger.info("TFDistributor: %d process(es) on %d node(s)%s", self.num_processes, nodes,
                    " on this machine" if self.local_mode else "")
        return _run(entry, train_object, args, kwargs, nodes, self.local_mode, node_gpus,
                    None if self.use_gpu else 0, False, self.reserve_options)


class MirroredStrategyRunner:
    """spark-tensorflow-distributor's ``MirroredStrategyRunner`` on tfos.

    ``num_slots``: GPUs (``use_gpu=True``: ``ceil(num_slots / spark.task.resource.gpu.amount)``
    tasks, each pinned to its share of its task's GPUs through ``CUDA_VISIBLE_DEVICES``, read
    through the executor's own ``CUDA_VISIBLE_DEVICES`` when it sets one) or CPU tasks
    (``use_gpu=False``, every GPU hidden). ``run(train_fn, **kwargs)`` calls ``train_fn(**kwargs)``
    on every task inside a MultiWorkerMirroredStrategy scope (unless ``use_custom_strategy``: then
    train_fn makes its own strategy, from ``TF_CONFIG``) and returns rank 0's return value.

    ``local_mode=True`` runs ``train_fn`` in this process on ``num_slots`` of the driver's GPUs
    (``spark.driver.resource.<gpu_resource_name>``; the caller's ``CUDA_VISIBLE_DEVICES`` is read
    through and restored) under a MirroredStrategy, or on the CPU with ``num_slots=1``.

    Where the original refuses clusters with ``spark.ssl.enabled``, tfos runs: its channels, TF's
    gRPC and the collectives are authenticated and encrypted (docs/security.md). Extra keyword
    arguments go to :meth:`TFCluster.reserve`.
    """

    def __init__(self, *, num_slots: int, local_mode: bool = False, use_gpu: bool = True,
                 gpu_resource_name: str = "gpu", use_custom_strategy: bool = False, spark=None, **reserve_options):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"num_slots is set to {num_slots!r} but must be a positive int")
        self.num_slots = num_slots
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.gpu_resource_name = gpu_resource_name
        self.use_custom_strategy = bool(use_custom_strategy)
        self.spark = spark
        self.reserve_options = reserve_options
        self._tasks = None
        if not self.local_mode:
            from tfos.cluster.driver.spark import spark_entry

            entry = spark_entry(_session(spark))
            amount = task_gpu_amount(_task_conf(entry, gpu_resource_name), gpu_resource_name) if use_gpu else None
            self._tasks = runner_tasks(num_slots, self.use_gpu, amount, gpu_resource_name)

    @property
    def num_tasks(self) -> int | None:
        """Spark tasks (TF nodes) a distributed run uses; None in local mode."""
        return None if self._tasks is None else len(self._tasks)

    def get_num_tasks(self) -> int:
        """The original's method: the Spark tasks a distributed run uses (``ceil(num_slots / GPUs per
        task)`` with GPUs, ``num_slots`` on CPU), also asked in local mode."""
        if self._tasks is not None:
            return len(self._tasks)
        from tfos.cluster.driver.spark import spark_entry

        amount = None
        if self.use_gpu:
            entry = spark_entry(_session(self.spark))
            amount = task_gpu_amount(_task_conf(entry, self.gpu_resource_name), self.gpu_resource_name)
        return len(runner_tasks(self.num_slots, self.use_gpu, amount, self.gpu_resource_name))

    @property
    def sc(self):
        """The original's attribute: the SparkContext of the session the runner uses. A Spark
        Connect client has none (ConfigError: its session's ``conf`` answers the same questions)."""
        session = _session(self.spark)
        try:
            return session.sparkContext
        except Exception as e:  # Connect: [JVM_ATTRIBUTE_NOT_SUPPORTED]
            raise ConfigError(f"runner.sc: a Spark Connect session has no SparkContext ({type(e).__name__}); read "
                              "settings with spark.conf.get(...) instead") from None

    def run(self, train_fn, **kwargs):
        if self.local_mode:
            return self._run_local(train_fn, kwargs)
        gpus = [g if self.use_gpu else 0 for g in self._tasks]
        if self.gpu_resource_name != "gpu" and self.use_gpu:
            raise ConfigError(f"gpu_resource_name={self.gpu_resource_name!r}: tfos nodes take Spark's 'gpu' resource; "
                              "name your GPUs 'gpu' in Spark's resource configuration")
        return _run(self.spark, train_fn, (), kwargs, len(self._tasks), False, None, gpus,
                    not self.use_custom_strategy, self.reserve_options)

    def _run_local(self, train_fn, kwargs):
        from tfos.cluster.driver.spark import spark_entry

        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            if self.use_gpu:
                entry = spark_entry(_session(self.spark))
                (devices,) = local_gpus(_driver_gpus(entry, self.gpu_resource_name), 1, self.num_slots, saved)
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
            else:
                if self.num_slots > 1:
                    raise ValueError(f"num_slots={self.num_slots} CPU slots in local mode: local CPU training is one "
                                     "process; use num_slots=1, or local_mode=False for several tasks")
                os.environ["CUDA_VISIBLE_DEVICES"] = ""
            if self.use_custom_strategy:
                return train_fn(**kwargs)
            import tensorflow as tf

            with tf.distribute.MirroredStrategy().scope():
                return train_fn(**kwargs)
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
