"""fp16/bf16 compression of all-reduced tensors, shared by :mod:`tfos.keras_dist` and
:func:`tfos.distribute.allreduce_gradients`.

float32/float64 tensors go over the wire as float16 (``'fp16'``) or bfloat16 (``'bf16'``),
pre-divided by the number of replicas, so that their sum over the replicas is the mean and cannot
overflow where the float32 mean would not. Other dtypes, and ``compression=None``, go over the
wire unchanged. float16 keeps ~3 significant digits, bfloat16 ~2 with float32's range; Gloo sums
bfloat16 faster than float16 on CPUs (bench/allreduce.py), TF's collectives only float16.
"""

from __future__ import annotations


def check(compression: str | None) -> str | None:
    """``compression`` as None, ``"fp16"`` or ``"bf16"`` (``"none"`` means None); ValueError otherwise."""
    if compression not in (None, "none", "fp16", "bf16"):
        raise ValueError(f"compression must be None, 'fp16' or 'bf16', not {compression!r}")
    return None if compression == "none" else compression


def compress(tensor, compression: str | None, num_replicas: int):
    """``(wire tensor, True)`` if ``tensor`` is sent compressed, else ``(tensor, False)``.

    Sum the wire tensors over the replicas, then :func:`decompress` the compressed ones.
    """
    import tensorflow as tf

    if compression in ("fp16", "bf16") and tensor.dtype in (tf.float32, tf.float64):
        wire = tf.float16 if compression == "fp16" else tf.bfloat16
        return tf.cast(tensor / num_replicas, wire), True
    return tensor, False


def decompress(summed, dtype, num_replicas: int, average: bool = True):
    """The mean (or, ``average=False``, the sum) in ``dtype`` of the tensors whose compressed
    wire tensors summed to ``summed``."""
    import tensorflow as tf

    out = tf.cast(summed, dtype)
    return out if average else out * num_replicas
