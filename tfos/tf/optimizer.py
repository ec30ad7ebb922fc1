"""``DistributedOptimizer`` of :mod:`tfos.keras_dist`: a Keras 3 optimizer that averages its
gradients across the workers before applying them, and the same-plan check of the callbacks."""

from __future__ import annotations

import logging

from tfos.tf import compression as _compression
from tfos.tf.primitives import _all_reduce_list, allreduce
from tfos.tf.workers import _require_init, _state

logger = logging.getLogger(__name__)



def DistributedOptimizer(optimizer, num_workers: int | None = None, compression: str | None = None,  # noqa: N802
                         bytes_per_pack: int = 0, device: str | None = None):
    """Make a Keras 3 optimizer average its gradients across all workers before applying them.

    The optimizer's class is replaced (in place; the same object is returned) by a subclass whose
    ``apply`` (which ``apply_gradients`` and ``model.fit`` go through) first all-reduces the
    gradients with ``CollectiveReduceV2`` (or Gloo). Under ``model.fit`` the loss passes through
    the optimizer's ``scale_loss``, which divides it by the number of workers: the gradients then
    come out pre-divided and are summed, the mean without a pass over them. Custom loops that call
    ``apply`` without ``scale_loss`` get the mean computed after the sum. Hyper-parameters, state
    and serialization are those of the original optimizer (``get_config``/``model.save`` record
    the original class).

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

    def scale_loss(self, loss):
        # Keras 3's train_step (model.fit) passes the loss through here before taking its gradient:
        # dividing it by the number of workers makes the gradients arrive pre-divided, and apply()
        # then sums them, which is the mean without a pass over the reduced gradients
        self._tfos_prescaled = True  # read by the apply() of the same step (trace or eager call)
        loss = base.scale_loss(self, loss)
        return loss / _state.size if _state.size > 1 else loss

    def apply(self, grads, trainable_variables=None):
        prescaled, self._tfos_prescaled = self._tfos_prescaled, False
        grads = _all_reduce_list(list(grads), average=not prescaled, compression=self._tfos_compression,
                                 bytes_per_pack=self._tfos_bytes_per_pack, device=self._tfos_device)
        return base.apply(self, grads, trainable_variables)

    apply.__doc__ = "All-reduce (mean) the gradients across workers, then " + (base.apply.__doc__ or "apply them.")
    dist_cls = type(base.__name__, (base,), {
        "apply": apply,
        "scale_loss": scale_loss,
        "_tfos_distributed": True,
        "__module__": base.__module__,  # serialization records the original optimizer
        "__doc__": base.__doc__,
    })
    optimizer.__class__ = dist_cls
    optimizer._tfos_compression = compression
    optimizer._tfos_bytes_per_pack = int(bytes_per_pack)
    optimizer._tfos_device = device
    optimizer._tfos_prescaled = False
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
