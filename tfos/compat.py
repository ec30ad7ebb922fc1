"""Migration names: TensorFlowOnSpark's helpers (:mod:`tfos.tf.compat`: ``export_saved_model``,
``disable_auto_shard``, ``is_gpu_available``, ``TFNode``) and spark-tensorflow-distributor's
``MirroredStrategyRunner`` (:mod:`tfos.cluster.driver.distributor`, loaded when first named: the
TF processes that import this module for the helpers never load the driver)."""

from tfos.tf.compat import TFNode, disable_auto_shard, export_saved_model, is_gpu_available  # noqa: F401


def __getattr__(name):
    if name == "MirroredStrategyRunner":
        from tfos.cluster.driver.distributor import MirroredStrategyRunner

        globals()[name] = MirroredStrategyRunner
        return MirroredStrategyRunner
    raise AttributeError(f"module 'tfos.compat' has no attribute {name!r}")


__all__ = ["TFNode", "disable_auto_shard", "export_saved_model", "is_gpu_available", "MirroredStrategyRunner"]
