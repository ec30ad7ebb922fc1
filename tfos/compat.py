"""Migration names: TensorFlowOnSpark's helpers (:mod:`tfos.tf.compat`: ``export_saved_model``,
``disable_auto_shard``, ``is_gpu_available``, ``TFNode``) and spark-tensorflow-distributor's
``MirroredStrategyRunner`` (:mod:`tfos.distributor`, loaded when first named: the
TF processes that import this module for the helpers never load the driver)."""

from tfos import lazy
from tfos import TFNode  # noqa: F401 (TensorFlowOnSpark's module)
from tfos.tf.compat import disable_auto_shard, export_saved_model, is_gpu_available  # noqa: F401


__getattr__, __dir__ = lazy.exports(__name__, globals(),
                                    {"MirroredStrategyRunner": "tfos.distributor"})


__all__ = ["TFNode", "disable_auto_shard", "export_saved_model", "is_gpu_available", "MirroredStrategyRunner"]
