"""Helpers imported only inside the TF process (``main_fun`` and the code tfos runs around it),
never on the Spark driver or in the Spark tasks that feed data: the parts behind the public TF
modules, which live at their documented names (:mod:`tfos.keras_dist`, :mod:`tfos.distribute`,
:mod:`tfos.callbacks`).

Importing this package (or any of its modules) does not import TensorFlow: every module imports
it inside the functions that need it, so ``import tfos.keras_dist`` stays cheap and
``init_collectives()`` can still run before TensorFlow initialises.

* :mod:`tfos.tf.workers` (rank, size, the collective runtime, the per-process state),
  :mod:`tfos.tf.primitives` (all-reduce, broadcast), :mod:`tfos.tf.optimizer`
  (``DistributedOptimizer``) and :mod:`tfos.tf.keras_callbacks`: what ``tfos.keras_dist`` is made of.
* :mod:`tfos.tf.compat`: TensorFlowOnSpark migration helpers (re-exported by ``tfos.compat``).
* :mod:`tfos.tf.collectives`: ``CommunicationOptions`` and the MWMS cluster resolver.
* :mod:`tfos.tf.compression`: the fp16 all-reduce compression of both all-reduce paths.
* :mod:`tfos.tf.gloo`, :mod:`tfos.tf.gloo_kernel`, :mod:`tfos.tf.gloo_store`: Gloo all-reduce.
"""
