"""``BarrierTaskContext.get()`` inside a TFDistributor or MirroredStrategyRunner function (TF process).

spark-tensorflow-distributor runs ``train_fn`` inside Spark's barrier task, so programs written for
it call ``BarrierTaskContext.get().allGather(...)`` there. tfos runs the function in the node's TF
process, outside Spark's task, where pyspark would raise ``NOT_IN_BARRIER_STAGE``. While the
function runs, :func:`installed` makes pyspark's ``TaskContext.get()`` / ``BarrierTaskContext.get()``
return a :class:`NodeBarrierContext`: the same methods, answered from the node's own context, with
``allGather`` and ``barrier`` carried over tfos's control channel (the driver's all-gather, typed
and authenticated; no socket of Spark's). Outside the function pyspark is left as it was.
"""

from __future__ import annotations

import contextlib
import itertools

#: Spark's own timeout for a barrier() or allGather() (spark.barrier.sync.timeout: a year); ours
#: is one day: every rank calls them the same number of times, and a lost rank fails the cluster.
SYNC_TIMEOUT = 86400.0
_UNSET = object()  # a class without a _taskContext of its own


def task_infos(nodes) -> list[str]:
    """Pure: the ``host:port`` of each node, by node index (a barrier stage's partition order)."""
    return [f"{n['host']}:{n['tf_port']}" for n in sorted(nodes, key=lambda n: n["node_index"])]


def _context_class():
    from pyspark.resource import ResourceInformation
    from pyspark.taskcontext import BarrierTaskContext, BarrierTaskInfo

    class NodeBarrierContext(BarrierTaskContext):
        """pyspark's BarrierTaskContext for one tfos node: the partition is the node's index."""

        def __new__(cls, ctx):  # pyspark's __new__ returns its per-process singleton: one per call here
            return object.__new__(cls)

        def __init__(self, ctx):
            self._ctx = ctx
            self._calls = itertools.count()
            self._partitionId = ctx.node_index
            self._attemptNumber = ctx.attempt
            self._stageId = 0
            self._taskAttemptId = ctx.node_index
            self._cpus = 1
            self._localProperties = {}
            gpus = [str(g) for g in ctx.gpus]
            self._resources = {"gpu": ResourceInformation("gpu", gpus)} if gpus else {}

        def allGather(self, message: str = "") -> list[str]:
            if not isinstance(message, str):
                raise TypeError("Argument `message` must be of type `str`")
            return self._ctx.all_gather_text(f"tfos.barrier.{next(self._calls)}", message, SYNC_TIMEOUT)

        def barrier(self) -> None:
            self._ctx.all_gather(f"tfos.barrier.{next(self._calls)}", 0, SYNC_TIMEOUT)

        def getTaskInfos(self):
            return [BarrierTaskInfo(address) for address in task_infos(self._ctx.nodes)]

    return NodeBarrierContext


@contextlib.contextmanager
def installed(ctx):
    """While the block runs, pyspark's ``TaskContext.get()`` and ``BarrierTaskContext.get()`` return
    this node's context; before and after, pyspark's own (None in a TF process). Without pyspark
    (a TF process whose Python has none) it does nothing."""
    try:
        from pyspark.taskcontext import BarrierTaskContext, TaskContext
    except ImportError:
        yield None
        return
    context = _context_class()(ctx)
    # each class's get() reads cls._taskContext: BarrierTaskContext may hold one of its own
    saved = [(c, c.__dict__.get("_taskContext", _UNSET)) for c in (TaskContext, BarrierTaskContext)]
    for c, _ in saved:
        c._taskContext = context
    try:
        yield context
    finally:
        for c, value in saved:
            if value is _UNSET:
                del c._taskContext
            else:
                c._taskContext = value
