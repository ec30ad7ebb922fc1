"""TensorFlowOnSpark's ``TFParallel`` module name: ``TFParallel.run`` is :func:`tfos.driver.parallel.run`."""

from tfos.driver.parallel import run

__all__ = ["run"]
