"""Alias of :mod:`tfos.ml.pipeline` (the same module object): TensorFlowOnSpark's ``pipeline``."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tfos.ml.pipeline")
