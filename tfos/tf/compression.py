"""fp16 compression of all-reduced tensors, shared by :mod:`tfos.tf.keras_dist` and
:func:`tfos.tf.distribute.allreduce_gradients`.

float32/float64 tensors go over the wire as float16, pre-divided by the number of replicas, so
that their sum over the replicas is the mean and cannot overflow where the float32 mean would
not. Other dtypes, and ``compression=None``, go over the wire unchanged.
"""

from __future__ import annotations


def check(compression: str | None) -> str | None:
    """``compression`` as None or ``"fp16"`` (``"none"`` means None); ValueError otherwise."""
    if compression not in (None, "none", "fp16"):
        raise ValueError(f"compression must be None or 'fp16', not {compression!r}")
    return None if compression == "none" else compression


def compress(tensor, compression: str | None, num_replicas: int):
    """``(wire tensor, True)`` if ``tensor`` is sent compressed, else ``(tensor, False)``.

    Sum the wire tensors over the replicas, then :func:`decompress` the compressed ones.
    """
    import tensorflow as tf

    if compression == "fp16" and tensor.dtype in (tf.float32, tf.float64):
        return tf.cast(tensor / num_replicas, tf.float16), True
    return tensor, False


def decompress(summed, dtype, num_replicas: int, average: bool = True):
    """The mean (or, ``average=False``, the sum) in ``dtype`` of the tensors whose compressed
    wire tensors summed to ``summed``."""
    import tensorflow as tf

    out = tf.cast(summed, dtype)
    return out if average else out * num_replicas
