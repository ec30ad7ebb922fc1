"""Horovod-style data-parallel training of Keras 3 models with plain ``model.fit``.

Keras 3 ``model.fit`` does not work under ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585:
``ValueError: Attempt to convert a value (PerReplica...)``). This module avoids ``strategy.scope()``
altogether and follows Horovod's model instead: every process builds the same model under the
*default* strategy, trains on its own data shard, and an optimizer wrapper averages the gradients
of all workers with TensorFlow's own collective ops (``CollectiveReduceV2``, the ops that MWMS uses
internally) before applying them. Initial weights are broadcast from one rank so every replica
starts identical; from then on identical averaged gradients keep them identical.

Runs in the TF process (``main_fun``), never on the Spark driver. This module is the public face;
the parts live beside it and share one state per process (rank, size, the collective key counter
and ordering tokens, ``tfos.tf.workers._state``): ``workers`` (the process's place in the group:
``init_collectives``, ``rank``, ``size``), ``primitives`` (``allreduce``, ``broadcast_variables``,
``broadcast_model``), ``optimizer`` (``DistributedOptimizer``); the Keras callbacks are here.

Usage::

    def main_fun(args, ctx):
        from tfos import keras_dist
        rank, size = keras_dist.init_collectives()   # FIRST, before any other TF/Keras call
        import keras

        model = build_model()                         # no strategy.scope()
        opt = keras_dist.DistributedOptimizer(keras.optimizers.Adam(1e-3 * size))
        model.compile(optimizer=opt, loss=..., metrics=[...])   # jit_compile=False on GPU hosts
        model.fit(my_shard_x, my_shard_y, batch_size=32, epochs=5,
                  callbacks=[keras_dist.BroadcastInitialWeights(root_rank=0),
                             keras_dist.MetricAverageCallback()],
                  verbose=2 if rank == 0 else 0)

Rules every worker must follow (as with Horovod), otherwise training hangs until the collective
``timeout_seconds`` (or the peer-failure detection of the coordination service) fires:

* All workers run the same program and make the same collective calls in the same order:
  the same model, the same optimizer wrapping, the same number of ``fit``/``broadcast``/
  ``allreduce`` calls.
* All workers run the same number of training steps per epoch. Give every rank a shard of the
  same size (or pass ``steps_per_epoch`` with a repeated dataset); a rank whose data ends early
  leaves the others blocked in the all-reduce. ``evaluate``/``predict`` do no collectives and may
  differ per rank.
* No XLA around the train step: collectives cannot be compiled by XLA. Keras already disables
  ``jit_compile`` on CPU-only hosts; on GPU hosts pass ``model.compile(..., jit_compile=False)``.
  The optimizer raises a clear error otherwise.

Instance keys for the collectives come from a counter variable incremented when each collective
runs, so retracing (e.g. for a partial last batch) on one worker only cannot desynchronise the
keys, and collectives inside ``tf.while_loop``/``tf.cond`` (``steps_per_execution > 1``) work.
Collectives within one process are ordered by an ordering token (a resource variable, as in
MWMS), so their order is identical on every worker.

Outside a TF cluster (no TF_CONFIG, or a single worker), everything degrades to a no-op, so the
same script runs on one machine.
"""
from __future__ import annotations

from tfos import lazy
from tfos.tf.optimizer import DistributedOptimizer, _check_same_plan  # noqa: F401
from tfos.tf.primitives import allreduce, broadcast_model, broadcast_variables
from tfos.tf.workers import GROUP_KEY, _state, init_collectives, rank, size

# for tests and benchmarks that reach inside: the same objects as in the modules that define them
from tfos.tf.primitives import _all_reduce_list  # noqa: E402,F401
from tfos.tf.workers import GLOO_TIMEOUT_SECONDS, _coordinated_jobs, _task  # noqa: E402,F401

# BroadcastInitialWeights(root_rank=0), MetricAverageCallback(), BackupAndRestore(dir): Keras callbacks,
# imported when first named so that importing this module does not import Keras
__getattr__, __dir__ = lazy.exports(__name__, globals(), {
    name: "tfos.tf.keras_callbacks" for name in ("BroadcastInitialWeights", "MetricAverageCallback", "BackupAndRestore")})

__all__ = ["init_collectives", "rank", "size", "DistributedOptimizer", "BroadcastInitialWeights",
           "MetricAverageCallback", "BackupAndRestore", "broadcast_variables", "broadcast_model", "allreduce",
           "GROUP_KEY"]
