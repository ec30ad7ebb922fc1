"""tfos: turn a Spark cluster into a distributed TensorFlow cluster.

The public API, re-exported lazily: importing ``tfos`` loads neither the driver modules nor
pyspark nor TensorFlow, so node agents and TF processes stay light.

* on the driver: :class:`TFCluster` (``tfos.api``), :class:`TFDistributor`
  (TorchDistributor's shape), :class:`InputMode`, reserve()'s settings in groups
  (:class:`ScalingConfig`, :class:`FailureConfig`, :class:`SecurityConfig`,
  :class:`DistributionConfig`, :class:`RunConfig`);
* in ``main_fun(args, ctx)``: :class:`NodeContext` (``ctx``), :class:`DataFeed`, ``TFNode``;
* everywhere: the errors, all derived from :class:`TFOSError`.
"""

from typing import TYPE_CHECKING

from tfos.errors import (AuthenticationError, ClusterStateError, CollectiveError, ConfigError, FeedError,
                         FeedTimeoutError, NodeFailedError, NodeFailure, NonRetryable, ProtocolError,
                         ReservationTimeoutError, StallError, TFOSError, TFOSTimeoutError, UnevenDataError)
from tfos.host.versions import TFOS_VERSION as __version__
from tfos import lazy
from tfos.topology import InputMode

#: the public names loaded on first use, and where each lives (tfos.lazy)
_LAZY = {
    "TFCluster": "tfos.api",
    "TFDistributor": "tfos.distributor",
    "NodeContext": "tfos.cluster.node.context",
    "DataFeed": "tfos.feed.node.datafeed",
    # reserve()'s settings in groups (tfos.cluster.driver.options)
    **{name: "tfos.cluster.driver.options" for name in ("ScalingConfig", "FailureConfig", "SecurityConfig",
                                                        "DistributionConfig", "RunConfig")},
    # TensorFlowOnSpark's module names (docs/migration.md §5), each a module of tfos's own
    **{name: f"tfos.{name}" for name in ("TFNode", "TFManager", "TFParallel", "pipeline", "dfutil")},
}
__getattr__, __dir__ = lazy.exports(__name__, globals(), _LAZY)

if TYPE_CHECKING:  # the same names for type checkers and IDEs (never run; tests/unit/test_public_names.py)
    from tfos import TFManager as TFManager, TFNode as TFNode, TFParallel as TFParallel  # noqa: F401
    from tfos import dfutil as dfutil, pipeline as pipeline  # noqa: F401
    from tfos.api import TFCluster as TFCluster  # noqa: F401
    from tfos.cluster.driver.options import (DistributionConfig as DistributionConfig,  # noqa: F401
                                             FailureConfig as FailureConfig, RunConfig as RunConfig,
                                             ScalingConfig as ScalingConfig, SecurityConfig as SecurityConfig)
    from tfos.cluster.node.context import NodeContext as NodeContext  # noqa: F401
    from tfos.distributor import TFDistributor as TFDistributor  # noqa: F401
    from tfos.feed.node.datafeed import DataFeed as DataFeed  # noqa: F401

__all__ = ["InputMode", "TFOSError", "ConfigError", "ProtocolError", "AuthenticationError", "TFOSTimeoutError",
           "ReservationTimeoutError", "FeedTimeoutError", "FeedError", "ClusterStateError", "CollectiveError",
           "NodeFailedError", "NodeFailure", "NonRetryable", "UnevenDataError", "StallError", "__version__",
           *_LAZY]
