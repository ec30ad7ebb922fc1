"""TensorFlowOnSpark's ``TFParallel.run``: independent single-node TF instances on the executors.

For work that needs no TF cluster, typically inference or hyper-parameter sweeps: each of
``num_executors`` Spark tasks calls ``map_fun(tf_args, ctx)`` once (see
:mod:`tfos.cluster.executor.instance`). With ``use_barrier=True`` (the default) the tasks are gang
scheduled in one barrier stage, so all instances start together and ``ctx.nodes`` lists their
addresses. Failures come back as one :class:`~tfos.errors.NodeFailedError` naming every failed
instance, its host and traceback.
"""

from __future__ import annotations

import logging

from tfos.errors import ConfigError, NodeFailedError, NodeFailure

logger = logging.getLogger(__name__)


def barrier_check_seconds(get_conf) -> float:
    """How long Spark retries a barrier stage that lacks task slots (its defaults: 15 s x 40)."""
    interval = get_conf("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "15s")
    failures = get_conf("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "40")
    return _seconds(interval) * int(failures)


def _seconds(value: str) -> float:
    """A Spark time setting (``15s``, ``2min``, ``500ms``, bare numbers are seconds) in seconds."""
    value = str(value).strip().lower()
    for suffix, scale in (("ms", 0.001), ("min", 60.0), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if value.endswith(suffix):
            return float(value[:-len(suffix)]) * scale
    return float(value)


def run(sc, map_fun, tf_args, num_executors: int, use_barrier: bool = True,
        reservation_timeout: float | None = None) -> None:
    """Run ``map_fun(tf_args, ctx)`` once on each of ``num_executors`` executors, in parallel.

    With ``use_barrier``, waits up to ``reservation_timeout`` seconds for ``num_executors`` task
    slots (ReservationTimeoutError after that, as :meth:`TFCluster.reserve`). Its default is how
    long Spark itself would retry a barrier stage that lacks slots (TensorFlowOnSpark relied on
    that check): ``spark.scheduler.barrier.maxConcurrentTasksCheck.interval`` times ``.maxFailures``."""
    from tfos.cluster.driver.spark import spark_entry, wait_for_slots
    from tfos.data.fs import spark_default_fs
    from tfos.cluster.executor.instance import make_task

    if isinstance(num_executors, bool) or not isinstance(num_executors, int) or num_executors < 1:
        raise ConfigError(f"num_executors must be a positive int, got {num_executors!r}")
    entry = spark_entry(sc)
    if entry.connect:
        raise ConfigError("TFParallel.run needs a SparkContext (it runs an RDD barrier stage), which a Spark Connect "
                          "session does not have: use TFCluster.run(spark, map_fun, args, n, 0) instead, which "
                          "runs map_fun once per node over Spark Connect too")
    sc = entry.sc
    if use_barrier:
        if reservation_timeout is None:
            reservation_timeout = barrier_check_seconds(sc.getConf().get)
        wait_for_slots(sc, num_executors, timeout=reservation_timeout)
    task = make_task(map_fun, tf_args, num_executors, spark_default_fs(sc), use_barrier)
    rdd = sc.parallelize(range(num_executors), num_executors)
    rdd = rdd.barrier().mapPartitionsWithIndex(task) if use_barrier else rdd.mapPartitionsWithIndex(task)
    previous = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription(f"tfos TFParallel: {num_executors} instances")
    try:
        results = rdd.collect()
    finally:
        sc.setJobDescription(previous)
    failed = [r for r in results if r.error]
    if failed:
        raise NodeFailedError([NodeFailure(node_index=r.index, job_name="worker", task_index=r.index, host=r.host,
                                           reason=r.error, traceback=r.traceback) for r in sorted(failed, key=lambda r: r.index)])
    logger.info("TFParallel: %d instances finished", len(results))
