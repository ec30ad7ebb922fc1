"""The collectives of :mod:`tfos.keras_dist`: all-reduce of tensor lists (packed, optionally
compressed; TF's ``CollectiveReduceV2`` or Gloo) and broadcast of variables and models. Keys and
ordering come from the per-process state in :mod:`tfos.tf.workers`."""

from __future__ import annotations

import contextlib
import logging

from tfos.tf import collectives
from tfos.tf import compression as _compression
from tfos.tf.workers import GROUP_KEY, _require_init, _state

logger = logging.getLogger(__name__)



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
    if _state.gloo is not None:  # one call to Gloo; big tensors in their own memory, small ones packed
        def reduce_flats(flats, owned):
            return _state.gloo.reduce_flats(flats, owned, average, compression)

        groups = collectives.packs(dense, bytes_per_pack, alone_bytes=collectives.ALONE_BYTES)
    else:
        def reduce_flats(flats, owned):
            return [_all_reduce_flat(f, average, device, compression) for f in flats]

        groups = collectives.packs(dense, bytes_per_pack)
    for i, r in zip(present, collectives.reduce_packed(dense, groups, reduce_flats)):
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
