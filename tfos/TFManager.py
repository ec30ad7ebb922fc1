"""TensorFlowOnSpark's ``TFManager`` module name: :mod:`tfos.node.manager` (local, in-process feeds)."""

from tfos.node.manager import LocalManager, connect, start

__all__ = ["start", "connect", "LocalManager"]
