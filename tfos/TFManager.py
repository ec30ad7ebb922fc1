"""TensorFlowOnSpark's ``TFManager`` module name: :mod:`tfos.feed.node.manager` (local, in-process feeds)."""

from tfos.feed.node.manager import LocalManager, connect, start

TFManager = LocalManager  # TensorFlowOnSpark's manager class name (in-process here)

__all__ = ["start", "connect", "LocalManager", "TFManager"]
