"""tfos: turn a Spark cluster into a distributed TensorFlow cluster.

Importing tfos on the driver does not import TensorFlow.
"""

from tfos.cluster.decisions import InputMode
from tfos.cluster.driver import TFCluster
from tfos.errors import (AuthenticationError, ClusterStateError, ConfigError, FeedError, FeedTimeoutError,
                         NodeFailedError, ProtocolError, ReservationTimeoutError, TFOSError, TFOSTimeoutError)

__version__ = "0.1.0"


def __getattr__(name):
    if name == "TFNode":  # TensorFlowOnSpark compatibility: `from tfos import TFNode`
        from tfos.compat import TFNode

        return TFNode
    raise AttributeError(f"module 'tfos' has no attribute {name!r}")

__all__ = ["TFCluster", "InputMode", "TFOSError", "ConfigError", "ProtocolError", "AuthenticationError",
           "TFOSTimeoutError", "ReservationTimeoutError", "FeedTimeoutError", "FeedError", "ClusterStateError",
           "NodeFailedError", "TFNode", "__version__"]
