"""The programs TFDistributor and MirroredStrategyRunner hand to the nodes (TF process).

Each is a picklable ``main_fun(args, ctx)``: it calls the user's function with the arguments
given to ``run()`` (not tfos's ``(args, ctx)``) and hands rank 0's return value to the driver
(:meth:`NodeContext.send_result`, no pickle on the way back). While it runs, pyspark's
``BarrierTaskContext.get()`` answers for the node (:mod:`tfos.cluster.node.barrier`).
"""

from __future__ import annotations

import dataclasses
import logging

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RankFunction:
    """``fn(*args, **kwargs)`` on every rank; ``strategy_scope``: inside the backend's strategy
    (MultiWorkerMirroredStrategy) scope, as MirroredStrategyRunner does unless told otherwise."""

    fn: object
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    strategy_scope: bool = False

    def __call__(self, _tf_args, ctx):
        from tfos.cluster.node.barrier import installed

        with installed(ctx):  # BarrierTaskContext.get() in fn, as in spark-tensorflow-distributor's task
            if self.strategy_scope:
                with ctx.strategy().scope():
                    value = self.fn(*self.args, **self.kwargs)
            else:
                value = self.fn(*self.args, **self.kwargs)
        if ctx.rank == 0:
            ctx.send_result(value)
        return None
