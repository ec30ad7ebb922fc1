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


def allreduce_gradients(grads, compression: str | None = None):
    """Sum ``grads`` (a list; None entries pass through) over all replicas of the current
    strategy, in one batched collective. ``compression='fp16'`` casts float32/float64 gradients to
    float16 for the transfer and back afterwards (pre-scaled by 1/replicas to avoid overflow)."""
    import tensorflow as tf

    if compression not in (None, "none", "fp16"):
        raise ValueError(f"compression must be None or 'fp16', got {compression!r}")
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise RuntimeError("allreduce_gradients must run inside strategy.run (a replica context)")
    present = [(i, g) for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    n = ctx.num_replicas_in_sync
    send = []
    for _, g in present:
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        if compression == "fp16" and g.dtype in (tf.float32, tf.float64):
            g = tf.cast(g / n, tf.float16)
        send.append(g)
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, send)
    out = list(grads)
    for (i, g), r in zip(present, reduced):
        if compression == "fp16" and r.dtype == tf.float16 and g.dtype != tf.float16:
            r = tf.cast(r, g.dtype) * n
        out[i] = r
    return out
