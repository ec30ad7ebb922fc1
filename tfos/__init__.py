"""tfos: turn a Spark cluster into a distributed TensorFlow cluster.

Importing tfos on the driver does not import TensorFlow.
"""

from tfos.cluster.decisions import InputMode
from tfos.cluster.driver import TFCluster
from tfos.errors import (AuthenticationError, ClusterStateError, ConfigError, FeedError, FeedTimeoutError,
                         NodeFailedError, ProtocolError, ReservationTimeoutError, TFOSError, TFOSTimeoutError)

__version__ = "0.1.0"

__all__ = ["TFCluster", "InputMode", "TFOSError", "ConfigError", "ProtocolError", "AuthenticationError",
           "TFOSTimeoutError", "ReservationTimeoutError", "FeedTimeoutError", "FeedError", "ClusterStateError",
           "NodeFailedError", "__version__"]
