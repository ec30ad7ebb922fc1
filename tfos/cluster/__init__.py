"""The cluster manager: reserve Spark executors as TF nodes, start one TF process per node with
its role, ``TF_CONFIG`` and GPUs, watch it, restart or stop it. One sub-package per process:

* ``driver``: the Spark driver's side: the public ``TFCluster`` (``api``), the phase loop and
  failure policy (``supervisor``, ``lifecycle``), the node registry and control service
  (``registry``, ``service``), the user's Spark entry point (``spark``), settings, progress,
  TensorBoard, MLflow (``tracking``) and ``TFParallel`` (``parallel``);
* ``executor``: code that runs in Spark tasks: the barrier task that starts a node agent
  (``bootstrap``) and ``TFParallel``'s task (``parallel``);
* ``agent``: the node agent (``python -m tfos.cluster.agent``), owner of the TF process;
* ``node``: the TF process (``python -m tfos.cluster.node``): start-up, rendezvous, ``ctx``.

The data path lives in :mod:`tfos.feed`, organised the same way. Which package may import which
is a table in ``tests/unit/test_import_rules.py``.
"""
