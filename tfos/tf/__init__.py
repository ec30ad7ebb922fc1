"""Helpers imported only inside the TF process (``main_fun`` and the code tfos runs around it),
never on the Spark driver or in the Spark tasks that feed data.

Importing this package (or any of its modules) does not import TensorFlow: every module imports
it inside the functions that need it, so ``import tfos.keras_dist`` stays cheap and
``init_collectives()`` can still run before TensorFlow initialises.

* :mod:`tfos.tf.keras_dist`: Horovod-style data-parallel Keras 3 ``model.fit`` (``tfos.keras_dist``),
  made of :mod:`tfos.tf.workers` (rank, size, the collective runtime, the per-process state),
  :mod:`tfos.tf.primitives` (all-reduce, broadcast) and :mod:`tfos.tf.optimizer`
  (``DistributedOptimizer``); the Keras callbacks are in ``keras_dist`` itself.
* :mod:`tfos.tf.distribute`: fp16 gradient all-reduce for custom loops (``tfos.distribute``).
* :mod:`tfos.tf.callbacks`: Keras progress callback (``tfos.callbacks``).
* :mod:`tfos.tf.compat`: TensorFlowOnSpark migration helpers (``tfos.compat``).
* :mod:`tfos.tf.collectives`: ``CommunicationOptions`` and the MWMS cluster resolver.
* :mod:`tfos.tf.compression`: the fp16 all-reduce compression of both all-reduce paths.
* :mod:`tfos.data.datasets`: ``no_autoshard(ds)``.

The old paths (``tfos.keras_dist`` ...) are aliases of these modules (the same module objects).
"""
