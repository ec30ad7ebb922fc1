"""The TF process's place in the data-parallel group of :mod:`tfos.keras_dist`: its rank and size
from ``TF_CONFIG``, the collective runtime it starts (TF's, or Gloo's), and the one per-process
state that the primitives, the optimizer and the callbacks share (``_state``)."""

from __future__ import annotations

import json
import logging
import os
from typing import NamedTuple

from tfos.tf import collectives
from tfos.tf.gloo import GLOO_TIMEOUT_SECONDS  # noqa: F401 (this module's name for it, as before)
from tfos.topology import TRAINING_JOBS, rank_and_size

logger = logging.getLogger(__name__)

#: Collective group key used by this module. MWMS numbers its own groups from 1 upwards, so a
#: large constant does not collide with a strategy that the program might also use.
GROUP_KEY = 0x7F05


class _State:
    def __init__(self):
        self.initialized = False
        self.rank = 0
        self.size = 1
        self.strategy = None  # keeps the MWMS (its server and health checks) alive
        self.communication = "auto"
        self.timeout_seconds = 0.0
        self.key_counter = None  # tf.Variable, created on first use
        self._tokens = {}
        self.implementation = "tf"  # or "gloo", "reduction_server": see init_collectives
        self.gloo = None  # tfos.tf.gloo.Group (or tfos.tf.reduction.WorkerGroup) unless implementation == "tf"
        self.hint_logged = False


_state = _State()


class _Task(NamedTuple):
    type: str | None
    index: int
    cluster: dict
    rank: int
    size: int


def _task(tf_config) -> _Task:
    """This task and its rank/size (tfos.topology: the chief or master is rank 0, then the
    workers); ``(None, 0, {}, 0, 1)`` without TF_CONFIG. ValueError for ps/evaluator tasks."""
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG")
    if not tf_config:
        return _Task(None, 0, {}, 0, 1)
    if isinstance(tf_config, str):
        tf_config = json.loads(tf_config)
    cluster = tf_config.get("cluster", {}) or {}
    task = tf_config.get("task", {}) or {}
    task_type, task_index = task.get("type"), int(task.get("index", 0))
    if task_type is None:
        return _Task(None, 0, cluster, 0, 1)
    return _Task(task_type, task_index, cluster, *rank_and_size(task_type, task_index, cluster))


def _coordinated_jobs(cluster) -> list[tuple[str, int]]:
    """``(job, number of tasks)`` of the training jobs in ``cluster``, rank 0's job first."""
    return [(job, len(cluster[job])) for job in TRAINING_JOBS if job in cluster]


def init_collectives(tf_config=None, method: str = "strategy", communication: str = "auto",
                     timeout_seconds: float | None = None, implementation: str = "auto") -> tuple[int, int]:
    """Start the TF server and collective runtime of this worker; return ``(rank, size)``.

    Must be called once per process, before any other TensorFlow operation runs (TF can only
    enable collectives at program start-up) and before the model is built.

    Args:
        tf_config: the TF_CONFIG (dict or JSON string); default: the ``TF_CONFIG`` environment
            variable (tfos sets it before ``main_fun``). Only ``chief`` (or ``master``) and
            ``worker`` tasks take part; the chief, if any, is rank 0.
        method: ``"strategy"`` (default) constructs a ``tf.distribute.MultiWorkerMirroredStrategy``
            only for its side effects (gRPC server, collective executor, coordination service
            with peer-failure detection) and keeps it referenced. Do NOT enter its ``scope()``.
            ``"context"`` does the same configuration directly via the eager context
            (``configure_collective_ops``, ``configure_coordination_service``,
            ``enable_collective_ops``) without creating a strategy object.
        communication: ``"auto"``, ``"ring"`` or ``"nccl"``: the communication hint of the
            collectives issued by this module (NCCL needs GPUs).
        timeout_seconds: if set, every collective of this module fails with
            ``DeadlineExceededError`` after this long instead of waiting forever for a peer
            (Gloo: ``CollectiveError``; its default is ``GLOO_TIMEOUT_SECONDS``).
        implementation: who runs the collectives. ``"auto"`` (default): Gloo on CPU-only hosts
            when PyTorch is installed (``pip install 'tfos[gloo]'``; several times TF's RING
            bandwidth), otherwise TensorFlow's collective ops (GPU hosts: NCCL through TF).
            ``"reduction_server"``: through the cluster's reducers (``reserve(...,
            num_reducers=R)``, :mod:`tfos.tf.reduction`; 'auto' picks it when there are reducers).
            ``"tf"``, ``"gloo"`` or ``"reduction_server"`` force one. With Gloo no TF server is started and ``method``
            is not used; the ranks meet through the driver in a tfos node, else at a TCPStore
            that rank 0 hosts on its own TF_CONFIG port.

    Returns:
        ``(rank, size)``; ``(0, 1)`` when there is no TF_CONFIG or only one training task, in
        which case nothing is started and all collectives are no-ops.
    """
    if _state.initialized:
        return _state.rank, _state.size
    task = _task(tf_config)
    if method not in ("strategy", "context"):
        raise ValueError(f"method must be 'strategy' or 'context', not {method!r}")
    _state.communication = collectives.check_communication(communication)
    _state.timeout_seconds = float(timeout_seconds or 0.0)
    _state.rank, _state.size = task.rank, task.size
    if _state.size > 1:
        _state.implementation = _choose_implementation(implementation, _state.communication)
    if _state.size > 1 and _state.implementation in ("gloo", "reduction_server"):
        _start_gloo(task, timeout_seconds, _state.implementation == "reduction_server")
    elif _state.size > 1:
        if method == "strategy":
            _start_with_strategy(tf_config)
        else:
            _start_with_context(task)
    _state.initialized = True
    logger.info("keras_dist: rank %d of %d (task %s:%s, implementation=%s, method=%s, communication=%s)",
                _state.rank, _state.size, task.type, task.index, _state.implementation, method, _state.communication)
    return _state.rank, _state.size


def _choose_implementation(requested: str, communication: str) -> str:
    from tfos.tf import gloo

    installed = gloo.installed()
    num_gpus = 0
    if requested != "tf" and communication == "auto":
        import tensorflow as tf

        num_gpus = len(tf.config.list_physical_devices("GPU"))
    from tfos.tf.reduction import reducers_here

    name = collectives.choose_implementation(requested, communication, installed, num_gpus, reducers_here()[0])
    if name == "tf" and not installed and num_gpus == 0 and not _state.hint_logged:
        _state.hint_logged = True
        logger.warning("keras_dist: all-reducing with TensorFlow's RING on CPU; Gloo is several times faster: %s",
                       gloo.INSTALL_HINT)
    return name


def _split_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _start_gloo(task: _Task, timeout_seconds, reduction_server: bool = False) -> None:
    from tfos.tf import gloo

    timeout = timeout_seconds or GLOO_TIMEOUT_SECONDS
    leader_job = _coordinated_jobs(task.cluster)[0][0]
    leader = _split_address(task.cluster[leader_job][0])  # rank 0's TCPStore outside a tfos node
    host, _ = _split_address(task.cluster[task.type][task.index])
    if reduction_server:
        from tfos.tf import reduction

        _state.gloo = reduction.worker_group(_state.rank, _state.size, host, timeout, store_address=leader)
        return
    store = gloo.node_store("keras_dist", timeout)  # in a tfos node: through the driver
    _state.gloo = gloo.Group(_state.rank, _state.size, None if store is not None else leader, host, timeout,
                             store=store)


def _start_with_strategy(tf_config) -> None:
    import tensorflow as tf

    if tf_config is not None:
        os.environ["TF_CONFIG"] = tf_config if isinstance(tf_config, str) else json.dumps(tf_config)
    _state.strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=collectives.mwms_cluster_resolver(),
        communication_options=collectives.communication_options(_state.communication))
    collectives.stop_on_sigterm()  # TF's coordination service took SIGTERM over
    resolver = _state.strategy.cluster_resolver
    logger.debug("MWMS started for task %s:%s", resolver.task_type, resolver.task_id)


def _start_with_context(task: _Task) -> None:
    import tensorflow as tf
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    spec = tf.train.ClusterSpec(task.cluster)
    ctx = context.context()
    jobs = _coordinated_jobs(task.cluster)
    leader = f"/job:{jobs[0][0]}/replica:0/task:0"  # rank 0
    ctx.configure_collective_ops(collective_leader=leader,
                                 scoped_allocator_enabled_ops=("CollectiveReduce",),
                                 use_nccl_communication=_state.communication == "nccl",
                                 device_filters=(f"/job:{task.type}/task:{task.index}",))
    if ctx.coordination_service is None:
        try:
            from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        except ImportError:  # older TF layouts
            from tensorflow.tsl.protobuf import coordination_config_pb2

        ctx.configure_coordination_service(
            service_type="standalone", service_leader=leader.replace("/replica:0", ""),
            coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=j, num_tasks=n) for j, n in jobs])
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=spec.as_cluster_def(), default_session_config=ctx.config, job_name=task.type,
        task_index=task.index, protocol="grpc", port=0)
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()
    collectives.stop_on_sigterm()  # the coordination service took SIGTERM over


def rank() -> int:
    """This worker's rank (0 = chief or worker 0). Call :func:`init_collectives` first."""
    return _state.rank


def size() -> int:
    """Number of training workers (chief + workers)."""
    return _state.size


def _require_init() -> None:
    if not _state.initialized:
        raise RuntimeError("call tfos.keras_dist.init_collectives() first, before building the model")
