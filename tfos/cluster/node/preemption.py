"""tf_keras' ``BackupAndRestore(save_before_preemption=True)`` driven by tfos's eviction notice (runs
in the TF process, behind ``tfos.callbacks.save_before_eviction``).

TF's ``PreemptionCheckpointHandler`` does the saving: when one worker learns it must go, the
workers agree through TF's coordination service on the step after the one that worker finished,
each saves there (the chief into the backup directory) and calls the handler's exit function.
tf_keras makes such a handler only on Google Cloud (its GCE metadata watcher), so elsewhere
``save_before_preemption=True`` does nothing by itself; and a TF process of tfos never hears the
notice (its node agent does). The callback's ``on_train_begin`` (after the BackupAndRestore's, which
made the training state) attaches a handler of tfos's making to tf_keras's training state, as
tf_keras attaches its own on Google Cloud, through TF's public ``TerminationConfig``:

* ``termination_watcher_fn``: True on rank 0 once the driver opened a save round (a node told to
  go); this rank polls the driver's rounds (:class:`~tfos.cluster.node.saving.SavePoint`), so the
  driver counts it among the ranks that can save;
* ``exit_fn``: after the save, ``ctx.checkpoint_saved(step)`` (rank 0's tells the driver) and a wait
  for the driver's stop, a planned restart without the evicted node, as after a save that
  ``ctx.should_checkpoint`` asked for; no stop within ``eviction_grace``: TFOSError (a failure,
  restarted from that save by ``max_restarts``).

tf_keras restores such a save at the batch after it (its batch-level counters), so no step is lost.
On Google Cloud tf_keras's own handler is left alone: it watches the GCE maintenance notice itself.
"""

from __future__ import annotations

import logging
import threading

from tfos.errors import ConfigError, TFOSError

logger = logging.getLogger(__name__)


class PreemptionBridge:
    """One fit's link between the driver's save rounds and TF's PreemptionCheckpointHandler."""

    def __init__(self, ctx, step_fn):
        self.ctx = ctx
        self.step_fn = step_fn  # the optimizer's step count (the same on every rank)
        self.save_point = None
        self.handler = None
        self._noticed = threading.Event()  # a round opened and rank 0 has not handed it to TF yet

    def attach(self, model, backup) -> bool:
        """Make and attach the handler (``on_train_begin``). False when tf_keras made one already
        (Google Cloud: its own watcher)."""
        state = getattr(model, "_training_state", None)
        if state is None or getattr(backup, "_training_state", None) is not state:
            raise ConfigError("tfos.callbacks.save_before_eviction(ctx, backup) must come after `backup` (the "
                              "BackupAndRestore) in fit's callbacks=[...]: it needs the training state that "
                              "BackupAndRestore makes as training begins")
        if getattr(model, "_preemption_handler", None) is not None:
            logger.info("tf_keras made its own PreemptionCheckpointHandler (Google Cloud): it watches the "
                        "platform's notice itself; tfos's eviction notices are not handed to it")
            return False
        for name in ("_enable_save_before_preemption", "read_checkpoint_manager"):
            if not hasattr(state, name):
                raise TFOSError(f"this tf_keras's training state has no {name}: tfos cannot attach TF's "
                                "PreemptionCheckpointHandler to it; use BackupAndRestore(save_before_preemption="
                                "False) and ctx.should_checkpoint, or the tf_keras version tfos is tested with")
        if self.ctx.rank is None:
            raise ConfigError(f"save_before_eviction is for the training ranks (chief and workers), not "
                              f"{self.ctx.job_name}")
        import tensorflow as tf

        manager = state.read_checkpoint_manager  # the chief's backups, which every rank restores
        config = tf.distribute.experimental.TerminationConfig(termination_watcher_fn=self._watch,
                                                              exit_fn=self._after_save, grace_period=0)
        # a Checkpoint and its directory: the handler restores from there on every rank (its run
        # counter included) and has non-chief ranks write beside it, in a directory it removes
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            getattr(model.distribute_strategy, "cluster_resolver", None), manager.checkpoint, manager.directory,
            config)
        state._enable_save_before_preemption = True
        state.preemption_handler = self.handler
        model._preemption_handler = self.handler
        self.save_point = self.ctx._new_save_point(on_round=self._on_round)
        self.save_point.start()
        logger.info("tfos: a node told to go makes every rank save here through TF's PreemptionCheckpointHandler "
                    "(tf_keras BackupAndRestore(save_before_preemption=True))")
        return True

    def _on_round(self, _round: int) -> None:
        """The driver opened a save round (SavePoint's poll thread): rank 0 tells TF."""
        if self.ctx.rank == 0:
            self._noticed.set()

    def _watch(self) -> bool:
        """TF's termination_watcher_fn (its own thread, once a second)."""
        if self._noticed.is_set():
            self._noticed.clear()
            return True
        return False

    def _after_save(self) -> None:
        """TF's exit_fn, on every rank after the agreed save (main thread, inside fit)."""
        step = int(self.step_fn())
        if self.save_point is None or not self.save_point.saved_by_handler():
            raise TFOSError(f"TF's PreemptionCheckpointHandler saved at step {step} without a save round of the "
                            "driver open; restart from that save")
        logger.warning("tfos: TF's PreemptionCheckpointHandler saved at step %d; waiting for the restart", step)
        self.ctx.checkpoint_saved(step)
        self.save_point.after_save(step)  # returns if the driver's stop did not come
        raise TFOSError(f"TF's PreemptionCheckpointHandler saved at step {step} before a node of the cluster goes, "
                        f"but the cluster did not restart within eviction_grace "
                        f"({self.ctx._cfg.cluster.eviction_grace:.0f}s); restarting from that save")

    def close(self) -> None:
        if self.save_point is not None:
            self.save_point.close()
