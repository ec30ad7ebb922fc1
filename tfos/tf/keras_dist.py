"""Horovod-style data-parallel training of Keras 3 models with plain ``model.fit``.

Keras 3 ``model.fit`` does not work under ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585:
``ValueError: Attempt to convert a value (PerReplica...)``). This module avoids ``strategy.scope()``
altogether and follows Horovod's model instead: every process builds the same model under the
*default* strategy, trains on its own data shard, and an optimizer wrapper averages the gradients
of all workers with TensorFlow's own collective ops (``CollectiveReduceV2``, the ops that MWMS uses
internally) before applying them. Initial weights are broadcast from one rank so every replica
starts identical; from then on identical averaged gradients keep them identical.

Runs in the TF process (``main_fun``), never on the Spark driver. It is one module of about 600
lines on purpose: the primitives, the optimizer wrapper and the callbacks share one module state
(rank, size, the collective key counter and ordering tokens) that must exist once per process.

Usage::

    def main_fun(args, ctx):
        from tfos import keras_dist                   # = tfos.tf.keras_dist
        rank, size = keras_dist.init_collectives()   # FIRST, before any other TF/Keras call
        import keras

        model = build_model()                         # no strategy.scope()
        opt = keras_dist.DistributedOptimizer(keras.optimizers.Adam(1e-3 * size))
        model.compile(optimizer=opt, loss=..., metrics=[...])   # jit_compile=False on GPU hosts
        model.fit(my_shard_x, my_shard_y, batch_size=32, epochs=5,
                  callbacks=[keras_dist.BroadcastInitialWeights(root_rank=0),
                             keras_dist.MetricAverageCallback()],
                  verbose=2 if rank == 0 else 0)

Rules every worker must follow (as with Horovod), otherwise training hangs until the collective
``timeout_seconds`` (or the peer-failure detection of the coordination service) fires:

* All workers run the same program and make the same collective calls in the same order:
  the same model, the same optimizer wrapping, the same number of ``fit``/``broadcast``/
  ``allreduce`` calls.
* All workers run the same number of training steps per epoch. Give every rank a shard of the
  same size (or pass ``steps_per_epoch`` with a repeated dataset); a rank whose data ends early
  leaves the others blocked in the all-reduce. ``evaluate``/``predict`` do no collectives and may
  differ per rank.
* No XLA around the train step: collectives cannot be compiled by XLA. Keras already disables
  ``jit_compile`` on CPU-only hosts; on GPU hosts pass ``model.compile(..., jit_compile=False)``.
  The optimizer raises a clear error otherwise.

Instance keys for the collectives come from a counter variable incremented when each collective
runs, so retracing (e.g. for a partial last batch) on one worker only cannot desynchronise the
keys, and collectives inside ``tf.while_loop``/``tf.cond`` (``steps_per_execution > 1``) work.
Collectives within one process are ordered by an ordering token (a resource variable, as in
MWMS), so their order is identical on every worker.

Outside a TF cluster (no TF_CONFIG, or a single worker), everything degrades to a no-op, so the
same script runs on one machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import NamedTuple

from tfos.tf import collectives
from tfos.tf import compression as _compression
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
        self.implementation = "tf"  # or "gloo": see init_collectives
        self.gloo = None  # tfos.tf.gloo.Group when implementation == "gloo"
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


#: Gloo's deadline for its rendezvous and for every collective when timeout_seconds is not given.
GLOO_TIMEOUT_SECONDS = 600.0


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
            ``"tf"`` or ``"gloo"`` force one. With Gloo no TF server is started: rank 0 hosts
            Gloo's rendezvous on its own TF_CONFIG port, and ``method`` is not used.

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
    if _state.size > 1 and _state.implementation == "gloo":
        _start_gloo(task, timeout_seconds)
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
    name = collectives.choose_implementation(requested, communication, installed, num_gpus)
    if name == "tf" and not installed and num_gpus == 0 and not _state.hint_logged:
        _state.hint_logged = True
        logger.warning("keras_dist: all-reducing with TensorFlow's RING on CPU; Gloo is several times faster: %s",
                       gloo.INSTALL_HINT)
    return name


def _split_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _start_gloo(task: _Task, timeout_seconds) -> None:
    from tfos.tf import gloo

    leader_job = _coordinated_jobs(task.cluster)[0][0]
    store = _split_address(task.cluster[leader_job][0])
    host, _ = _split_address(task.cluster[task.type][task.index])
    _state.gloo = gloo.Group(_state.rank, _state.size, store, host, timeout_seconds or GLOO_TIMEOUT_SECONDS)


def _start_with_strategy(tf_config) -> None:
    import tensorflow as tf

    if tf_config is not None:
        os.environ["TF_CONFIG"] = tf_config if isinstance(tf_config, str) else json.dumps(tf_config)
    _state.strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=collectives.mwms_cluster_resolver(),
        communication_options=collectives.communication_options(_state.communication))
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


def rank() -> int:
    """This worker's rank (0 = chief or worker 0). Call :func:`init_collectives` first."""
    return _state.rank


def size() -> int:
    """Number of training workers (chief + workers)."""
    return _state.size


def _require_init() -> None:
    if not _state.initialized:
        raise RuntimeError("call tfos.keras_dist.init_collectives() first, before building the model")


# ---------------------------------------------------------------------------------------------
# collective primitives


def _instance_key():
    """A fresh collective instance key, as an int32 tensor.

    The key comes from a resource-variable counter incremented at *run* time (``assign_add``),
    not from a Python counter at trace time: every worker runs the same collectives in the same
    order, so the n-th collective gets key n everywhere, whenever and however often each worker
    (re)traces its functions, and also inside ``tf.while_loop``/``tf.cond`` and nested
    ``tf.function`` (Keras 3 ``steps_per_execution > 1``), where TF's call-time captures (the
    mechanism MWMS uses) cannot be fed.
    """
    import tensorflow as tf

    counter = _state.key_counter
    if counter is None:
        from tensorflow.python.framework import ops

        with ops.init_scope(), tf.device("CPU:0"):
            counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfos_collective_instance_key")
        _state.key_counter = counter
    with tf.device("CPU:0"):
        n = counter.assign_add(1, read_value=True)
        return tf.cast(tf.math.floormod(n - 1, 2 ** 31 - 2) + 1, tf.int32)


def _ordering_token(device):
    """A resource handle that orders this module's collectives on ``device`` (auto control deps)."""
    import tensorflow as tf
    from tensorflow.python.framework import ops

    key = device or ""
    tok = _state._tokens.get(key)
    if tok is None:
        with ops.init_scope(), _on(device):
            tok = tf.Variable(0.0, trainable=False, name="tfos_collective_ordering_token")
        _state._tokens[key] = tok
    return tok.handle


def _on(device):
    """``tf.device(device)``, or no device scope if ``device`` is None."""
    import tensorflow as tf

    return tf.device(device) if device else contextlib.nullcontext()


def _check_not_xla() -> None:
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
        raise RuntimeError("tfos.keras_dist collectives cannot run under XLA: compile the model with "
                           "model.compile(..., jit_compile=False)")


def _all_reduce_flat(flat, average: bool, device, compression):
    """All-reduce one 1-D tensor across the workers (sum, or mean if ``average``)."""
    from tensorflow.python.ops import collective_ops

    n = _state.size
    x, compressed = _compression.compress(flat, compression, n)
    with _on(device):
        y = collective_ops.all_reduce_v2(
            x, group_size=n, group_key=GROUP_KEY, instance_key=_instance_key(),
            merge_op="Add", final_op="Div" if average and not compressed else "Id",
            communication_hint=_state.communication, timeout=_state.timeout_seconds,
            ordering_token=_ordering_token(device))
    return _compression.decompress(y, flat.dtype, n, average) if compressed else y


def _all_reduce_list(tensors, average=True, compression=None, bytes_per_pack=0, device=None):
    """All-reduce a list of tensors (None entries pass through), packing them into few collectives."""
    import tensorflow as tf

    if _state.size == 1:
        return list(tensors)
    _check_not_xla()
    out = list(tensors)
    present = [i for i, t in enumerate(tensors) if t is not None]
    # IndexedSlices (e.g. Embedding gradients) are reduced as dense tensors
    dense = [tf.convert_to_tensor(tensors[i]) for i in present]
    if _state.gloo is not None:
        def reduce_flat(flat, owned):
            return _state.gloo.reduce_flat(flat, owned, average, compression)
    else:
        def reduce_flat(flat, owned):
            return _all_reduce_flat(flat, average, device, compression)
    for i, r in zip(present, collectives.reduce_packed(dense, collectives.packs(dense, bytes_per_pack), reduce_flat)):
        out[i] = r
    return out


def allreduce(value, average: bool = True, compression=None):
    """All-reduce a tensor, array or number across all workers (mean by default).

    Every worker must call it, in the same order relative to this module's other collectives.
    Works eagerly and inside ``tf.function``.
    """
    import tensorflow as tf

    _require_init()
    t = tf.convert_to_tensor(value)
    return _all_reduce_list([t], average=average, compression=_compression.check(compression))[0]


def broadcast_variables(variables, root_rank: int = 0, device=None) -> None:
    """Overwrite ``variables`` on every worker with their values on ``root_rank``.

    Variables are packed by dtype, so this is one collective per dtype. Accepts Keras 3 and
    tf.Variables. Every worker must pass the same variables (same shapes/dtypes, same order).
    """
    import tensorflow as tf
    from tensorflow.python.ops import collective_ops

    _require_init()
    variables = list(variables)
    if _state.size == 1 or not variables:
        return
    if not 0 <= root_rank < _state.size:
        raise ValueError(f"root_rank {root_rank} out of range for {_state.size} workers")
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(tf.as_dtype(v.dtype), []).append(v)
    for dtype, vs in by_dtype.items():
        sizes = [int(tf.TensorShape(v.shape).num_elements()) for v in vs]
        total = sum(sizes)
        if _state.gloo is not None:
            flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in vs], axis=0)
            flat = _state.gloo.broadcast(flat, root_rank)
            if _state.rank != root_rank:
                for v, part in zip(vs, tf.split(flat, sizes)):
                    v.assign(tf.reshape(part, tuple(v.shape)))
            continue
        with _on(device):
            if _state.rank == root_rank:
                flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in vs], axis=0)
                collective_ops.broadcast_send_v2(
                    flat, group_size=_state.size, group_key=GROUP_KEY, instance_key=_instance_key(),
                    communication_hint=_state.communication, timeout=_state.timeout_seconds)
            else:
                flat = collective_ops.broadcast_recv_v2(
                    tf.constant([total], tf.int32), dtype, group_size=_state.size, group_key=GROUP_KEY,
                    instance_key=_instance_key(), communication_hint=_state.communication,
                    timeout=_state.timeout_seconds)
                for v, part in zip(vs, tf.split(flat, sizes)):
                    v.assign(tf.reshape(part, tuple(v.shape)))
    logger.debug("broadcast %d variables from rank %d", len(variables), root_rank)


def broadcast_model(model, root_rank: int = 0, include_optimizer: bool = True) -> None:
    """Broadcast a built model's weights (and its built optimizer's variables) from ``root_rank``.

    ``model.weights`` covers trainable and non-trainable weights (e.g. BatchNormalization moving
    statistics) but not the random-seed states of Dropout & co., so each rank keeps its own
    randomness. Non-trainable weights that the forward pass updates (BatchNormalization moving
    statistics) drift apart across ranks during training, as in Horovod; call this again after
    ``fit`` if every rank must hold rank 0's values.
    """
    variables = list(model.weights)
    opt = getattr(model, "optimizer", None)
    if include_optimizer and opt is not None and getattr(opt, "built", False):
        variables += list(opt.variables)
    broadcast_variables(variables, root_rank)


# ---------------------------------------------------------------------------------------------
# Keras integration


def DistributedOptimizer(optimizer, num_workers: int | None = None, compression: str | None = None,  # noqa: N802
                         bytes_per_pack: int = 0, device: str | None = None):
    """Make a Keras 3 optimizer average its gradients across all workers before applying them.

    The optimizer's class is replaced (in place; the same object is returned) by a subclass whose
    ``apply`` (which ``apply_gradients`` and ``model.fit`` go through) first all-reduces the
    gradients with ``CollectiveReduceV2``. Hyper-parameters, state and serialization are those of
    the original optimizer (``get_config``/``model.save`` record the original class).

    Args:
        optimizer: a Keras 3 optimizer instance (or a name such as ``"adam"``), created outside any
            ``strategy.scope()``. To use mixed precision, wrap the outer ``LossScaleOptimizer``.
        num_workers: expected number of workers; checked against TF_CONFIG if given.
        compression: ``None``, ``"fp16"`` or ``"bf16"``: float32/float64 gradients are pre-divided
            by the number of workers, cast to float16 (bfloat16) for the all-reduce and cast back
            (half the traffic, ~3 (~2) significant digits). With Gloo, bf16 is the faster one.
        bytes_per_pack: 0 (default) packs all gradients of a dtype into one all-reduce per step;
            a positive value splits them into packs of about that many bytes (more, smaller
            collectives).
        device: device for the collectives (default: where TF places them, i.e. next to the
            gradients). All workers must use the same device type.

    Sparse gradients (``IndexedSlices``, e.g. from ``Embedding``) are reduced as dense tensors.
    """
    import keras

    _require_init()
    compression = _compression.check(compression)
    if num_workers is not None and int(num_workers) != _state.size:
        raise ValueError(f"num_workers={num_workers} but TF_CONFIG has {_state.size} training workers")
    optimizer = keras.optimizers.get(optimizer)
    if getattr(optimizer, "_tfos_distributed", False):
        return optimizer
    base = type(optimizer)

    def apply(self, grads, trainable_variables=None):
        grads = _all_reduce_list(list(grads), average=True, compression=self._tfos_compression,
                                 bytes_per_pack=self._tfos_bytes_per_pack, device=self._tfos_device)
        return base.apply(self, grads, trainable_variables)

    apply.__doc__ = "All-reduce (mean) the gradients across workers, then " + (base.apply.__doc__ or "apply them.")
    dist_cls = type(base.__name__, (base,), {
        "apply": apply,
        "_tfos_distributed": True,
        "__module__": base.__module__,  # serialization records the original optimizer
        "__doc__": base.__doc__,
    })
    optimizer.__class__ = dist_cls
    optimizer._tfos_compression = compression
    optimizer._tfos_bytes_per_pack = int(bytes_per_pack)
    optimizer._tfos_device = device
    logger.info("DistributedOptimizer(%s): %d workers, compression=%s", base.__name__, _state.size,
                optimizer._tfos_compression)
    return optimizer


def _check_same_plan(params) -> None:
    """Raise ValueError on every worker if the workers' (epochs, steps per epoch) differ."""
    import numpy as np

    if _state.size == 1:
        return
    params = params or {}
    plan = np.array([-1 if params.get(k) is None else int(params[k]) for k in ("epochs", "steps")], "int64")
    sums = allreduce(np.concatenate([plan, plan * plan]), average=False).numpy()
    n = _state.size
    if np.any(n * sums[2:] != sums[:2] * sums[:2]):  # equality iff every worker has the same value
        raise ValueError(
            f"workers plan different training lengths (this worker: epochs={plan[0]}, steps per epoch="
            f"{plan[1]}; mean over workers: epochs={sums[0] / n:g}, steps={sums[1] / n:g}). Every worker "
            "must run the same number of steps: give all ranks equal-sized shards or pass steps_per_epoch.")


def _make_callbacks():
    """Define the Keras callback classes on first use (keeps Keras out of this module's import)."""
    import keras
    import numpy as np

    class BroadcastInitialWeights(keras.callbacks.Callback):
        """Keras callback: at the start of the first ``fit``, copy the model's (and its built
        optimizer's) variables from ``root_rank`` to all workers, so all replicas start identical
        even if they were initialised with different seeds or only the root restored a checkpoint.

        At the start of every ``fit`` it also checks that all workers plan the same number of
        epochs and steps per epoch (Keras' ``params``), and raises the same ``ValueError`` on
        every worker otherwise: unequal step counts would pair unrelated collectives and end in
        a hang or a crash.
        """

        def __init__(self, root_rank: int = 0):
            super().__init__()
            self.root_rank = root_rank
            self.broadcast_done = False

        def on_train_begin(self, logs=None):
            _check_same_plan(self.params)
            if not self.broadcast_done:
                broadcast_model(self.model, self.root_rank)
                self.broadcast_done = True

    class MetricAverageCallback(keras.callbacks.Callback):
        """Keras callback: at each epoch end, replace the epoch's scalar logs (loss, accuracy,
        val_*) by their mean over all workers (one all-reduce). Put it first in the callback list
        so that checkpointing / early stopping / History see the averaged values. Every worker
        must report the same metric names."""

        def on_epoch_end(self, epoch, logs=None):
            if not logs or _state.size == 1:
                return
            keys = []
            for k in sorted(logs):
                try:
                    if np.ndim(logs[k]) == 0:
                        float(logs[k])
                        keys.append(k)
                except (TypeError, ValueError):
                    pass
            if keys:
                vals = np.array([float(logs[k]) for k in keys], dtype=np.float64)
                for k, a in zip(keys, allreduce(vals, average=True).numpy()):
                    logs[k] = float(a)

    class BackupAndRestore(keras.callbacks.BackupAndRestore):
        """``keras.callbacks.BackupAndRestore`` for keras_dist training, for restarts
        (``max_restarts``): only ``root_rank`` writes the backup, to ``backup_dir`` (give
        ``ctx.checkpoint_dir``, which every node reads), and every rank restores from it when
        ``fit`` begins, so all ranks resume at the same epoch with the same weights and optimizer
        state. Per-rank backups could stop at different epochs when a rank dies mid-save, and
        ranks resuming at different epochs would wait for each other in the all-reduce forever.
        The backup is kept after ``fit`` (``delete_checkpoint=False``): a restart after ``fit``
        ended resumes with nothing left to train."""

        def __init__(self, backup_dir, save_freq="epoch", root_rank: int = 0, double_checkpoint: bool = True):
            super().__init__(str(backup_dir).replace("file://", "", 1), save_freq=save_freq,
                             double_checkpoint=double_checkpoint, delete_checkpoint=False)
            self.root_rank = root_rank

        def _save_model(self):
            if _state.rank == self.root_rank:
                super()._save_model()

    for cls in (BroadcastInitialWeights, MetricAverageCallback, BackupAndRestore):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return {"BroadcastInitialWeights": BroadcastInitialWeights, "MetricAverageCallback": MetricAverageCallback,
            "BackupAndRestore": BackupAndRestore}


_callbacks = None


def __getattr__(name):
    # BroadcastInitialWeights(root_rank=0), MetricAverageCallback(), BackupAndRestore(dir): Keras callback
    # subclasses, created on first access so that importing this module does not import Keras.
    global _callbacks
    if name in ("BroadcastInitialWeights", "MetricAverageCallback", "BackupAndRestore"):
        if _callbacks is None:
            _callbacks = _make_callbacks()
        return _callbacks[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["init_collectives", "rank", "size", "DistributedOptimizer", "BroadcastInitialWeights",
           "MetricAverageCallback", "BackupAndRestore", "broadcast_variables", "broadcast_model", "allreduce",
           "GROUP_KEY"]
