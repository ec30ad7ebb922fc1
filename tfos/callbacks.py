"""Alias of :mod:`tfos.tf.callbacks` (the same module object), kept for user code."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("tfos.tf.callbacks")
