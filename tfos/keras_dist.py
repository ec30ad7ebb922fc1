"""Alias of :mod:`tfos.tf.keras_dist` (the same module object), kept for user code."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tfos.tf.keras_dist")
