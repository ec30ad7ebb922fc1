"""TensorFlowOnSpark's ``TFParallel`` module name: ``TFParallel.run`` is :func:`tfos.cluster.driver.tfparallel.run`."""

from tfos.cluster.driver.tfparallel import run

__all__ = ["run"]
