"""TensorFlowOnSpark's ``TFParallel`` module name: ``TFParallel.run`` is :func:`tfos.cluster.driver.parallel.run`."""

from tfos.cluster.driver.parallel import run

__all__ = ["run"]
