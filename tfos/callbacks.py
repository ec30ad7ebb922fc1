"""Keras callbacks for main_fun (TF process): progress reporting to the driver and timeline spans,
and a save before a node of the cluster must go.

    model.fit(..., callbacks=[tfos.callbacks.progress(ctx)])
    model.fit(..., callbacks=[backup, tfos.callbacks.save_before_eviction(ctx, backup)])

Works with Keras 3 (``import keras``) and Keras 2 / tf_keras: pass ``keras_module`` (default:
``tf.keras``, which honours TF_USE_LEGACY_KERAS).
"""

from __future__ import annotations

import time


def progress(ctx, every_n_batches: int = 1, keras_module=None):
    """A callback sending step, loss/metrics and examples/s to the driver (rate-bounded by tfos)
    and recording each training step on the cluster timeline."""
    if keras_module is None:
        import tensorflow as tf

        keras_module = tf.keras
    base = keras_module.callbacks.Callback

    class TFOSProgress(base):
        def __init__(self):
            super().__init__()
            self.step = 0
            self.epoch = 0
            self._t0 = None
            self._batch_start = None
            self._examples = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self._batch_start = time.time()
            if self._t0 is None:
                self._t0 = self._batch_start

        def on_train_batch_end(self, batch, logs=None):
            now = time.time()
            self.step += 1
            size = (logs or {}).get("size") or getattr(self, "batch_size", None)
            if size:
                self._examples += int(size)
            if self._batch_start is not None:
                ctx.reporter.event("step", "step", self._batch_start, now, {"step": self.step})
            if self.step % every_n_batches == 0:
                values = dict(_numbers(logs), step=self.step, epoch=self.epoch)
                if self._examples and now > self._t0:
                    values["examples_per_sec"] = self._examples / (now - self._t0)
                ctx.report(**values)

        def on_epoch_end(self, epoch, logs=None):
            ctx.report(**dict(_numbers(logs), step=self.step, epoch=epoch + 1))

    return TFOSProgress()


def save_before_eviction(ctx, backup, keras_module=None):
    """A callback that asks ``ctx.should_checkpoint`` after every batch, with the optimizer's step
    count (the same on every rank), and when a node of the cluster must go saves there on every
    rank and says ``ctx.checkpoint_saved(step)``; the cluster then goes on without that node from
    this save (docs/elastic.md). ``backup``: the fit's ``tfos.keras_dist.BackupAndRestore`` (or
    Keras' own ``BackupAndRestore``), whose backup is written then, or any ``save(step)`` callable.
    Keras restores such a backup at the start of the epoch it was in: that epoch's batches before
    the save are fed again, on the saved weights and optimizer step.

    tf_keras' ``BackupAndRestore(save_before_preemption=True)`` (under MultiWorkerMirroredStrategy):
    TF's PreemptionCheckpointHandler agrees on the step and saves instead, driven by tfos's notice
    (:mod:`tfos.cluster.node.preemption`); tf_keras resumes at the batch after that save. Put this
    callback after ``backup`` in ``callbacks=[...]``."""
    if keras_module is None:
        if type(backup).__module__.startswith("tf_keras"):
            import tf_keras as keras_module
        else:
            import keras as keras_module
    if getattr(backup, "save_before_preemption", False):
        return _save_before_preemption(ctx, backup, keras_module)
    if type(backup).__module__.startswith("tf_keras"):
        from tfos.errors import ConfigError

        raise ConfigError("with tf_keras's BackupAndRestore, pass save_before_preemption=True: tf_keras restores "
                          "a backup made mid-epoch at the epoch after it unless it counts batches")
    save = backup if callable(backup) and not hasattr(backup, "_save_model") else (lambda step: backup._save_model())

    class SaveBeforeEviction(keras_module.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if ctx.should_checkpoint(step):
                if hasattr(backup, "_last_batch_seen"):
                    backup._last_batch_seen = batch
                save(step)
                ctx.checkpoint_saved(step)

    return SaveBeforeEviction()


def _save_before_preemption(ctx, backup, keras_module):
    from tfos.cluster.node.preemption import PreemptionBridge

    class SaveBeforePreemption(keras_module.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.bridge = None

        def on_train_begin(self, logs=None):
            self.bridge = PreemptionBridge(ctx, lambda: self.model.optimizer.iterations.numpy())
            self.bridge.attach(self.model, backup)

        def on_train_batch_end(self, batch, logs=None):
            pass  # so that tf_keras calls batch hooks: TF's handler checks in backup's after every batch

        def on_train_end(self, logs=None):
            if self.bridge is not None:
                self.bridge.close()

    return SaveBeforePreemption()


def _numbers(logs) -> dict[str, float]:
    """The entries of Keras ``logs`` that are numbers, as floats."""
    out = {}
    for k, v in (logs or {}).items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            pass
    return out
