"""Keras callbacks for main_fun (TF process): progress reporting to the driver and timeline spans.

    model.fit(..., callbacks=[tfos.callbacks.progress(ctx)])

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


def _numbers(logs) -> dict[str, float]:
    """The entries of Keras ``logs`` that are numbers, as floats."""
    out = {}
    for k, v in (logs or {}).items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            pass
    return out
