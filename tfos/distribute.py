"""Gradient all-reduce with optional fp16 compression for custom loops under
MultiWorkerMirroredStrategy. Runs in the TF process, inside ``strategy.run``.

TF's ``CommunicationOptions`` has no compression. With an optimizer that can skip its own
aggregation (tf_keras: ``apply_gradients(..., skip_gradients_aggregation=True)``), a custom loop
all-reduces its gradients here, in float16, which halves the bytes each all-reduce moves::

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = tfos.distribute.allreduce_gradients(grads, compression="fp16")
        optimizer.apply_gradients(zip(grads, model.trainable_variables), skip_gradients_aggregation=True)

Keras 3 optimizers always aggregate inside ``apply_gradients``; for Keras 3 use
``tfos.keras_dist`` (which has the same ``compression='fp16'`` option) instead of a strategy.

On CPU-only hosts with PyTorch installed, the MWMS backend's ``ctx.strategy()`` also starts a
Gloo group (:func:`init_gloo`), and ``allreduce_gradients`` then all-reduces over Gloo
(:mod:`tfos.tf.gloo`) instead of TF's RING; on a cluster with reducers (``reserve(...,
num_reducers=R)``) it all-reduces through them (:mod:`tfos.tf.reduction`). Keras ``fit`` under
the strategy still all-reduces through TF.
"""

from __future__ import annotations

import logging

from tfos.tf import compression as _compression

logger = logging.getLogger(__name__)

_gloo = None  # the tfos.tf.gloo.Group (or tfos.tf.reduction.WorkerGroup) of init_gloo


def _reduction_class():
    from tfos.tf.reduction import WorkerGroup

    return WorkerGroup


def init_gloo(strategy, implementation: str = "auto", timeout_seconds: float | None = None,
              communication: str = "auto") -> bool:
    """Start a Gloo group beside a MultiWorkerMirroredStrategy so that :func:`allreduce_gradients`
    all-reduces over Gloo; True if it did. Every worker calls it, eagerly, after creating the
    strategy. ``implementation`` and ``communication`` (the strategy's): as in
    ``tfos.keras_dist.init_collectives`` ('auto' = Gloo on CPU-only hosts when PyTorch is installed
    and the communication is 'auto'). In a tfos node the ranks meet through the driver; elsewhere
    rank 0 hosts the rendezvous on a free port, which the others learn through one all-reduce of
    the strategy."""
    global _gloo
    import tensorflow as tf

    from tfos.tf import gloo, workers

    cluster, task, host = _place(strategy)
    chosen = workers._choose_implementation(implementation, communication) if task.size > 1 else "tf"
    if chosen == "tf":
        return False
    timeout = timeout_seconds or workers.GLOO_TIMEOUT_SECONDS
    if chosen == "reduction_server":
        _gloo = _reduction_group(task, host, timeout)
        logger.info("allreduce_gradients: the reduction server, worker %d of %d", task.rank, task.size)
        return True
    store = gloo.node_store("distribute", timeout)  # in a tfos node: through the driver
    address = None
    if store is None:  # rank 0's TCPStore on a free port, which the others learn through the strategy
        store = gloo.store_on_free_port(task.size, timeout) if task.rank == 0 else None
        mine = tf.constant(store.port if store is not None else 0, tf.int64)
        port = int(strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(mine)), axis=None))
        leader_job = workers._coordinated_jobs(cluster)[0][0]
        address = (workers._split_address(cluster[leader_job][0])[0], port)
    _gloo = gloo.Group(task.rank, task.size, address, host, timeout, store=store,
                       timeout_setting="backend_options={'timeout_seconds': ...}")
    logger.info("allreduce_gradients: Gloo, rank %d of %d", task.rank, task.size)
    return True


def _place(strategy):
    """``(cluster, task, host)`` of this worker in ``strategy``'s cluster (tfos.tf.workers' rank rule);
    host None without a cluster (a single worker)."""
    from tfos.tf import workers

    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    task = workers._task({"cluster": cluster, "task": {"type": resolver.task_type, "index": resolver.task_id}})
    addresses = cluster.get(task.type) or []
    return cluster, task, workers._split_address(addresses[task.index])[0] if task.index < len(addresses) else None


def _reduction_group(task, host: str, timeout: float):
    """The process's reduction-server group (:mod:`tfos.tf.reduction`); in a tfos node only (outside
    one, MWMS's TF server holds the port where worker 0 would host the rendezvous)."""
    from tfos.cluster.node.control import node_config
    from tfos.errors import ConfigError
    from tfos.tf import reduction

    if node_config() is None:
        raise ConfigError("MWMS with the reduction server runs in a tfos cluster (reserve(..., num_reducers=R)); "
                          "outside one use tfos.keras_dist.init_collectives(implementation='reduction_server')")
    return reduction.worker_group(task.rank, task.size, host, timeout,
                                  timeout_setting="backend_options={'timeout_seconds': ...}")


def allreduce_gradients(grads, compression: str | None = None, implementation: str | None = None):
    """Sum ``grads`` (a list; None entries pass through) over all replicas of the current
    strategy, in one batched collective. ``compression='fp16'`` (or 'bf16') casts float32/float64
    gradients for the transfer and back afterwards (pre-scaled by 1/replicas to avoid overflow).

    ``implementation``: None (what the strategy's backend started: Gloo, the reducers, or TF's
    own), or ``'reduction_server'``: through the cluster's reducers (``reserve(...,
    num_reducers=R)``), starting the group on first use if the backend did not."""
    import tensorflow as tf

    global _gloo
    compression = _compression.check(compression)
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise RuntimeError("allreduce_gradients must run inside strategy.run (a replica context)")
    if implementation not in (None, "reduction_server"):
        raise ValueError(f"implementation must be None or 'reduction_server', not {implementation!r}")
    if implementation == "reduction_server" and not isinstance(_gloo, _reduction_class()):
        from tfos.tf import workers

        _, task, host = _place(tf.distribute.get_strategy())
        _gloo = _reduction_group(task, host, workers.GLOO_TIMEOUT_SECONDS)
    present = [(i, tf.convert_to_tensor(g)) for i, g in enumerate(grads) if g is not None]  # IndexedSlices: dense
    if not present:
        return list(grads)
    n = ctx.num_replicas_in_sync
    if _gloo is not None and n == _gloo.size:  # one replica per worker (CPU hosts)
        from tfos.tf.collectives import ALONE_BYTES, packs, reduce_packed

        dense = [g for _, g in present]
        reduced = reduce_packed(dense, packs(dense, 0, alone_bytes=ALONE_BYTES),
                                lambda flats, owned: _gloo.reduce_flats(flats, owned, False, compression))
        out = list(grads)
        for (i, _), r in zip(present, reduced):
            out[i] = r
        return out
    wire = [_compression.compress(g, compression, n) for _, g in present]
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [w for w, _ in wire])
    out = list(grads)
    for (i, g), (_, compressed), r in zip(present, wire, reduced):
        out[i] = _compression.decompress(r, g.dtype, n, average=False) if compressed else r
    return out
