"""Alias of :mod:`tfos.data.dfutil` (the same module object): TensorFlowOnSpark's ``dfutil``."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tfos.data.dfutil")
