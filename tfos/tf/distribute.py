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
"""

from __future__ import annotations

from tfos.tf import compression as _compression


def allreduce_gradients(grads, compression: str | None = None):
    """Sum ``grads`` (a list; None entries pass through) over all replicas of the current
    strategy, in one batched collective. ``compression='fp16'`` casts float32/float64 gradients to
    float16 for the transfer and back afterwards (pre-scaled by 1/replicas to avoid overflow)."""
    import tensorflow as tf

    compression = _compression.check(compression)
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise RuntimeError("allreduce_gradients must run inside strategy.run (a replica context)")
    present = [(i, tf.convert_to_tensor(g)) for i, g in enumerate(grads) if g is not None]  # IndexedSlices: dense
    if not present:
        return list(grads)
    n = ctx.num_replicas_in_sync
    wire = [_compression.compress(g, compression, n) for _, g in present]
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [w for w, _ in wire])
    out = list(grads)
    for (i, g), (_, compressed), r in zip(present, wire, reduced):
        out[i] = _compression.decompress(r, g.dtype, n, average=False) if compressed else r
    return out
