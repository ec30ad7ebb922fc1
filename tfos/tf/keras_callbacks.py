"""The Keras callbacks of :mod:`tfos.keras_dist` (TF process): imported when one is first named,
so that importing ``tfos.keras_dist`` does not import Keras."""

from __future__ import annotations

import keras
import numpy as np

from tfos.tf.optimizer import _check_same_plan
from tfos.tf.primitives import allreduce, broadcast_model
from tfos.tf.workers import _state

__all__ = ["BroadcastInitialWeights", "MetricAverageCallback", "BackupAndRestore"]


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
