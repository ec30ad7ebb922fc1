"""tfos: turn a Spark cluster into a distributed TensorFlow cluster.

The public API, re-exported lazily: importing ``tfos`` loads neither the driver modules nor
pyspark nor TensorFlow, so node agents and TF processes stay light.

* on the driver: :class:`TFCluster` (``tfos.cluster.driver``), :class:`TFDistributor`
  (TorchDistributor's shape), :class:`InputMode`;
* in ``main_fun(args, ctx)``: :class:`NodeContext` (``ctx``), :class:`DataFeed`, ``TFNode``;
* everywhere: the errors, all derived from :class:`TFOSError`.
"""

from tfos.errors import (AuthenticationError, ClusterStateError, CollectiveError, ConfigError, FeedError,
                         FeedTimeoutError, NodeFailedError, NodeFailure, NonRetryable, ProtocolError,
                         ReservationTimeoutError, StallError, TFOSError, TFOSTimeoutError, UnevenDataError)
from tfos.host.versions import TFOS_VERSION as __version__
from tfos.topology import InputMode

_LAZY = {
    "TFCluster": ("tfos.cluster.driver.api", "TFCluster"),
    "TFDistributor": ("tfos.cluster.driver.distributor", "TFDistributor"),
    "NodeContext": ("tfos.cluster.node.context", "NodeContext"),
    "DataFeed": ("tfos.feed.node.datafeed", "DataFeed"),
    "TFNode": ("tfos.tf.compat", "TFNode"),  # TensorFlowOnSpark compatibility: `from tfos import TFNode`
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfos' has no attribute {name!r}")


__all__ = ["TFCluster", "TFDistributor", "InputMode", "NodeContext", "DataFeed", "TFNode", "TFOSError", "ConfigError",
           "ProtocolError", "AuthenticationError", "TFOSTimeoutError", "ReservationTimeoutError",
           "FeedTimeoutError", "FeedError", "ClusterStateError", "CollectiveError", "NodeFailedError", "NodeFailure",
           "NonRetryable", "UnevenDataError", "StallError",
           "__version__"]
